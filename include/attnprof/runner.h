// Running a problem: the backends there are and which of them can take it
// (explain, auto), the device's runtime, and one backend run under the
// profiler and measured into a run record (attnprof/record.h). The report
// layer's compare and profile (attnprof/report.h) add findings and outputs.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/batch_layout.h"
#include "attnprof/device_runtime.h"
#include "attnprof/profiler.h"
#include "attnprof/record.h"

namespace attnprof {

// ---- the backends ------------------------------------------------------------------

// The backend object for (name, device), or null when this build has none
// (a GPU-only backend on the CPU, or CUDA backends in a CPU-only build).
Backend* find_backend(std::string_view name, Device d);

struct Explanation {
  std::string backend;
  bool eligible = false;
  std::string reason;
};

// Every backend name, with whether it can take `p` and why (GPU-only backends
// on the CPU answer "not eligible on CPU: ..."); each refusal ends with the
// backends that can ("; eligible here: flash, math", or "none").
std::vector<Explanation> explain(const Problem& p);

// `auto`: the first backend of auto_order(p.device) that can take `p` (a
// fixed rule, nothing measured, so every call and every process picks the
// same backend for the same problem); the reason names the rule and the
// backends it passed over.
struct AutoChoice {
  std::string backend;
  std::string reason;
};
AutoChoice choose_auto(const Problem& p);
// The same rule for p in layout l (a padded batch's rows, a paged cache's
// key counts: eligibility_of with the layout) and, with `recompute`, among
// the backends whose backward keeps only the log-sum-exp (autograd).
AutoChoice choose_auto(const Problem& p, const BatchLayout& l, bool recompute = false);

// auto's order of preference on a device: on CUDA flash, cudnn, efficient,
// math, naive_inplace, naive; on the CPU flash, math, naive_inplace, naive.
const std::vector<std::string_view>& auto_order(Device d);

// The backend that runs `p` when `requested` is asked for ("auto" picks one):
// the one place a name becomes a backend. Throws Error(InvalidArgument) for
// a name that is no backend, Error(Unsupported) with explain()'s reason for
// one that cannot take `p` (not built, another device, this problem).
Backend& resolve_backend(const Problem& p, std::string_view requested);
// The same for p in layout l: the refusal is eligibility_of's for the
// layout, and names the backends that take it.
Backend& resolve_backend(const Problem& p, const BatchLayout& l, std::string_view requested);
// How many times resolve_backend() has been asked in this process: the tests
// read it to show that a plan's runs resolve nothing (attnprof/plan.h).
std::uint64_t backend_resolutions();

bool cuda_built();  // compiled with CUDA support
// What this build has on CUDA, one line for explain: the architectures and
// the plugin file the CUDA backends were loaded from, why it cannot be
// loaded, or "CPU only" (a wheel built where no CUDA toolkit was found).
std::string cuda_build();

// ---- one run -----------------------------------------------------------------------

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
  // A caller's mask (the CLI's --mask-file) in place of the generated one:
  // a CPU tensor, Bool for a Boolean problem or the problem's float dtype for
  // a Bias one, each dimension the problem's or 1 (mask_tensor.h). It goes
  // into the same Inputs slot the generated masks do (attach_mask).
  Tensor mask;
  // FP8 problems: one descale for each of q, k and v, the real values
  // divided by it and saturated at +-448; unset, each tensor's amax / 448
  // (reference.h: quantize_inputs).
  std::optional<double> fp8_descale;
  // FP8 problems: the backend's checked bf16 forward on the same real inputs
  // (RunResult::fp8's bf16 error); auto's timing runs leave it out.
  bool fp8_bf16_forward = true;
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
// ATTNPROF_CEILING_TFLOPS is the 16-bit (fp16, bf16) ceiling, which every
// dtype but fp8 is held to; fp8's is twice it (e4m3's dense tensor-core rate).
double ceiling_tflops(DeviceRuntime& rt, DType dtype);  // the matrix product's, TFLOP/s
double copy_ceiling_gbs(DeviceRuntime& rt);             // a device-to-device copy's, read + written, GB/s

// The runtime for a device; throws Error(Unsupported) for CUDA without a GPU or
// in a build without CUDA.
DeviceRuntime& device_runtime(Device d, int threads = 0);

// Profiles `backend` on `p`: fresh inputs, poisoned output, the schedule's
// steps, the float64 check. Never throws for a backend failure: it lands in
// RunResult::failure. FP8: the inputs are the bf16 problem's quantized
// (options.fp8_descale), the float64 check reads the real (bf16) values, and
// one more forward on those (checked, not profiled) gives RunResult::fp8's
// bf16 error where the backend takes bf16.
RunResult run_backend(Backend& backend, const Problem& p, const RunOptions& options);

// `compare`'s runs: every backend explain() lists, or those named in `only`,
// in that order; eligible ones through run_backend, the others as results
// that carry explain()'s reason.
std::vector<RunResult> run_backends(const Problem& p, const RunOptions& options,
                                    const std::vector<std::string>& only = {});

}  // namespace attnprof
