// Per-forward figures read off a recorded trace.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "analysis/trace_index.h"
#include "attnprof/problem.h"
#include "attnprof/record.h"

namespace attnprof::analysis {

// What the figures are made of, summed over the traces added so far: every
// figure is a mean over forwards or a maximum, so they fold exactly, in
// memory that does not grow with the calls (no per-call list is kept: no
// figure is a median). The runner folds a long schedule's steps in here one
// at a time as the profiler drops them from the trace.
struct MetricSums {
  struct KernelTime {
    double ns = 0;
    std::optional<double> occupancy_pct;  // the kernel's latest record's
  };
  std::int64_t forwards = 0;
  double host_ns = 0;
  double ops = 0;
  double copies = 0;
  double memsets = 0;
  double device_activities = 0;
  double device_union_ns = 0;
  std::vector<double> rank_union_ns;  // --gpus: by device
  double gpu_annotation_ns = 0;       // the device-event fallback's spans, where no activity was recorded
  double gpu_annotations = 0;
  std::map<std::string, KernelTime> kernels;  // by name: one entry a kernel, however many calls
  std::int64_t peak_bytes = 0;
  double allocated = 0;
  int world_size = 1;
};

// Adds one trace (a whole run, or one step of it) to `sums`. Traces added
// to the same sums must not overlap in device time (steps the runner
// synchronized between).
void add_to(MetricSums& sums, const TraceIndex& index, const Problem& p);
// The figures of everything added. `ceiling_tflops` and `copy_gbs` are one
// device's measured matrix-product and copy ceilings (DeviceRuntime); 0
// where unknown, and then no figure is read against them.
Metrics finish(const MetricSums& sums, const Problem& p, double ceiling_tflops, double copy_gbs = 0);

// One trace's figures: add_to then finish.
Metrics measure(const TraceIndex& index, const Problem& p, double ceiling_tflops, double copy_gbs = 0);
// The same, indexing the trace first.
Metrics measure(const Trace& t, const Problem& p, double ceiling_tflops, double copy_gbs = 0);

}  // namespace attnprof::analysis
