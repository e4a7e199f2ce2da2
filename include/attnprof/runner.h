// Runs one backend under the profiler on one problem and measures it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/device_runtime.h"
#include "attnprof/findings.h"
#include "attnprof/profiler.h"
#include "attnprof/reference.h"

namespace attnprof {

using ProgressFn = std::function<void(std::string_view)>;

struct RunOptions {
  Schedule schedule;
  std::uint64_t seed = 0x5eed;
  int threads = 0;                 // CPU threads (0 = all cores)
  bool bshd_inputs = false;        // inputs laid out [B, S, H, D] (strided views)
  std::int64_t check_rows = 2048;  // query rows checked against float64
  // GPU only: forward calls made back to back after the profiled steps, with
  // no profiler attached; their median is the host cost a program pays per
  // call (API tracing inflates the profiled figure). 0 = skip.
  int unprofiled_calls = 32;
  ProgressFn progress;  // called with one-line updates on long work
};

// p10, p50 and p90 of timed samples: the sample at rank round(p (n - 1)) of
// the sorted list, so one sample reads the same at every percentile and p50
// is the upper median. Requires at least one sample.
struct Spread {
  double p10, p50, p90;
};
Spread spread_of(std::vector<double> samples);

// The device's ceilings the metrics are held against, each measured once per
// runtime unless the environment gives a known one (ATTNPROF_CEILING_TFLOPS,
// ATTNPROF_COPY_GBS: measuring under a sanitizer or a debugger takes minutes).
double ceiling_tflops(DeviceRuntime& rt, DType dtype);  // the matrix product's, TFLOP/s
double copy_ceiling_gbs(DeviceRuntime& rt);             // a device-to-device copy's, read + written, GB/s

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

struct RunResult {
  std::string backend;
  Problem problem;
  Eligibility eligibility;
  Expectation expectation;
  Traits traits;
  Trace trace;
  Metrics metrics;
  // Against float64: the output's error for a forward; for a backward or
  // train pass, the worst of dQ, dK and dV (by relative error), each kept in
  // gradient_errors.
  std::optional<ErrorStats> error;
  std::optional<GradientErrors> gradient_errors;
  std::optional<Acceptance> acceptance;
  std::vector<Finding> findings;       // filled by the analysis rule table
  std::optional<std::string> failure;  // set when the run threw (message)
  // analyze and diff: the trace file this result was read from (its
  // "backend" is then the step's label); empty for a run attnprof made.
  std::string source;
};

// The runtime for a device; throws Error(Unsupported) for CUDA without a GPU or
// in a build without CUDA.
DeviceRuntime& device_runtime(Device d, int threads = 0);

// Profiles `backend` on `p`: fresh inputs, poisoned output, the schedule's
// steps, the float64 check. Never throws for a backend failure: it lands in
// RunResult::failure.
RunResult run_backend(Backend& backend, const Problem& p, const RunOptions& options);

// `compare`'s runs: every backend explain() lists, or those named in `only`,
// in that order; eligible ones through run_backend, the others as results
// that carry explain()'s reason.
std::vector<RunResult> run_backends(const Problem& p, const RunOptions& options,
                                    const std::vector<std::string>& only = {});

}  // namespace attnprof
