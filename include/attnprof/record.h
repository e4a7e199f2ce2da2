// The run record: what one run of a backend, or one profiler step of a trace
// read from a file, leaves behind (its trace, the figures read off it, the
// error against float64, the findings). The runner fills it from a run, the
// trace reader's analysis from a file; analysis and the report read it and
// nothing above it (Kineto's layering: writers see only records).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "attnprof/activity.h"
#include "attnprof/backend.h"
#include "attnprof/findings.h"
#include "attnprof/key_averages.h"
#include "attnprof/problem.h"
#include "attnprof/reference.h"

namespace attnprof {

// Per-forward figures read off the recorded trace (null where they do not apply).
struct Metrics {
  int steps = 0;
  std::optional<double> device_time_us;               // GPU: busy time of device activities; CPU: forward wall time
  double host_time_us = 0;                            // CPU time of the forward call on the host, profiled
  std::optional<double> host_time_unprofiled_us;      // GPU: the same with no profiler attached (median)
  std::optional<double> host_time_unprofiled_p10_us;  // and its spread over the calls
  std::optional<double> host_time_unprofiled_p90_us;
  std::optional<double> kernels_per_forward;  // GPU activities: kernels + memcpys + memsets
  double ops_per_forward = 0;                 // top-level CPU ops inside forward
  double copies_per_forward = 0;              // memcpys on GPU, copy ops on CPU
  double memsets_per_forward = 0;             // GPU memsets (libraries zeroing workspaces)
  std::int64_t peak_bytes = 0;                // above the inputs and output
  double allocated_bytes_per_forward = 0;     // sum of allocations inside one forward
  std::optional<double> tflops;
  std::optional<double> ceiling_pct;
  // The problem's minimum traffic per call (Problem::io_bytes) over the
  // device time, in GB/s, and that against the measured copy ceiling: the
  // memory side of the roofline, beside TFLOP/s and % of the matmul ceiling.
  std::optional<double> gbs;
  std::optional<double> copy_ceiling_pct;
  // The ceilings those were read against, one GPU's (measured, or given by
  // ATTNPROF_CEILING_TFLOPS and ATTNPROF_COPY_GBS); unset where unknown.
  std::optional<double> ceiling_tflops;
  std::optional<double> copy_ceiling_gbs;
  std::optional<double> occupancy_pct;  // of the longest kernel
  std::optional<double> reserved_bytes;
  // Backward and train: the bytes the forward keeps for the backward
  // (probabilities, or the log-sum-exp), beyond the inputs and O.
  std::optional<double> saved_bytes;
  // Backward and train: the device time of the forward alone (profiled the
  // same way, on a short schedule), for backward time over forward time.
  std::optional<double> forward_device_time_us;
  // --gpus: GPUs the run was sharded over, and each one's busy time per
  // forward (every device activity on it, NCCL's included), by device.
  int world_size = 1;
  std::vector<double> device_time_per_rank_us;
};

// An FP8 run's inputs, and the same backend on the real values they were
// quantized from: what FP8 costs in error.
struct Fp8Record {
  // q, k and v: the descale each was stored with, its largest |real| value,
  // and how many of its values e4m3 saturated.
  std::vector<Fp8TensorQuantization> tensors;
  bool auto_descale = true;  // per tensor amax / 448; false: one fixed descale (--fp8-descale)
  // The backend's error against float64 on the real (bf16) inputs, from one
  // more checked forward (not profiled); unset where it takes no bf16, or
  // that forward failed: bf16_note says which.
  std::optional<ErrorStats> bf16_error;
  std::string bf16_note;
  // The amaxes the backend's FP8 forwards measured (cudnn's graph: the
  // largest probability and |O|), where it measures them.
  std::optional<Fp8Amax> measured_amax;
};

struct RunResult {
  std::string backend;
  Problem problem;
  Eligibility eligibility;
  Expectation expectation;
  Traits traits;
  // A long schedule's trace holds its last recorded steps only
  // (Trace::steps_folded); metrics and key_averages cover every step.
  Trace trace;
  Metrics metrics;
  // The profiler table's rows over every recorded step (the runner fills
  // them as steps are folded); empty where the trace holds every step, and
  // then the table is read off the trace (key_averages_table(trace)).
  std::vector<KeyAverage> key_averages;
  // Against float64: the output's error for a forward; for a backward or
  // train pass, the worst of dQ, dK and dV (by relative error), each kept in
  // gradient_errors.
  std::optional<ErrorStats> error;
  std::optional<GradientErrors> gradient_errors;
  std::optional<Acceptance> acceptance;
  // dtype fp8: the quantization and the bf16 error beside this run's.
  std::optional<Fp8Record> fp8;
  std::vector<Finding> findings;       // filled by the analysis rule table
  std::optional<std::string> failure;  // set when the run threw (message)
  // analyze and diff: the trace file this result was read from (its
  // "backend" is then the step's label); empty for a run attnprof made.
  std::string source;
};

}  // namespace attnprof
