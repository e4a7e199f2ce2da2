// Runs one backend under the profiler: refuse what cannot fit, make fresh
// inputs, poison the output, step through the schedule, check against float64.
#include "attnprof/runner.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "analysis/metrics.h"
#include "attnprof/dispatch.h"
#include "attnprof/error.h"
#include "backends/cpu/cpu_backends.h"
#ifdef ATTNPROF_WITH_CUDA
#include "backends/cuda/cuda_backends.h"
#endif

namespace attnprof {

DeviceRuntime& device_runtime(Device d, int threads) {
  if (d == Device::Cpu) return cpu::runtime(threads);
#ifdef ATTNPROF_WITH_CUDA
  return cuda::runtime();
#else
  fail(ErrorKind::Unsupported, "this build has no CUDA support: use --device cpu, or rebuild with a CUDA toolkit");
#endif
}

namespace {

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
  return buf;
}

std::size_t input_bytes(const Problem& p) {
  std::size_t masks = 0;
  if (p.mask == MaskKind::Boolean) masks = static_cast<std::size_t>(p.seq * p.kv_seq);
  if (p.mask == MaskKind::Bias) masks = static_cast<std::size_t>(p.seq * p.kv_seq) * element_size(p.dtype);
  return 2 * p.q_bytes() + 2 * p.kv_bytes() + masks;  // q, k, v, mask and the output
}

// The device's matrix-product ceiling: measured once, unless
// ATTNPROF_CEILING_TFLOPS gives a known one (measuring it under a sanitizer
// or a debugger would take minutes).
double ceiling(DeviceRuntime& rt, DType dtype) {
  if (const char* known = std::getenv("ATTNPROF_CEILING_TFLOPS")) {
    const double v = std::atof(known);
    if (v > 0) return v;
  }
  return rt.ceiling_tflops(dtype);
}

// Host time of `calls` forward calls on an asynchronous device, no profiler
// attached, made back to back as a program makes them: the device works
// through the earlier calls while later ones are enqueued, so each timing is
// the call's own CPU cost (a call that waits on the device counts the wait, as
// it should). Waiting for an idle device between calls instead made the next
// call run on cold caches after the thread slept: on an H200 that read 9-20 us
// for a cuDNN call whose back-to-back cost is lower.
Spread time_unprofiled_calls(Backend& backend, const Problem& p, const Inputs& in, Tensor& out, RunContext& ctx,
                             DeviceRuntime& rt, int calls) {
  std::vector<double> us;
  us.reserve(static_cast<std::size_t>(calls));
  rt.synchronize();
  // A few untimed calls first: the first calls after the profiler detaches,
  // on a thread that just slept in a device wait, are not the steady state.
  const int warmup = std::max(2, calls / 4);
  for (int i = 0; i < warmup + calls; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    backend.forward(p, in, out, ctx);
    const double call_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (i >= warmup) us.push_back(call_us);
  }
  rt.synchronize();
  return spread_of(std::move(us));
}

}  // namespace

Spread spread_of(std::vector<double> samples) {
  if (samples.empty()) fail(ErrorKind::Internal, "spread_of: no samples");
  std::sort(samples.begin(), samples.end());
  const auto at = [&](std::size_t pct) { return samples[(pct * (samples.size() - 1) + 50) / 100]; };
  return {at(10), at(50), at(90)};
}

RunResult run_backend(Backend& backend, const Problem& p, const RunOptions& options) {
  RunResult r;
  r.backend = std::string(backend.name());
  r.problem = p;
  r.eligibility = backend.eligibility(p);
  r.expectation = backend.expectation(p);
  r.traits = backend.traits();
  r.trace.name = p.shape_key() + "_" + r.backend;
  if (!r.eligibility.eligible) return r;
  try {
    DeviceRuntime& rt = device_runtime(p.device, options.threads);
    const double need = static_cast<double>(input_bytes(p) + backend.workspace_bytes(p));
    const double have = static_cast<double>(rt.available_bytes());
    if (need > 0.9 * have) {
      fail(ErrorKind::OutOfMemory, r.backend + " needs about " + gib(need) + " on " + device_name(p.device) +
                                       " but only " + gib(have) + " is free: use a smaller --batch, --heads or --seq");
    }
    if (options.progress) options.progress(r.backend + ": preparing inputs (" + p.describe() + ")");
    const Inputs host = make_inputs(p, options.seed, cpu_allocator(), options.bshd_inputs);
    const Inputs in = rt.upload(host);
    Tensor out = Tensor::empty({p.batch, p.heads, p.seq, p.head_dim}, p.dtype, rt.allocator());
    rt.poison(out);
    rt.synchronize();

    Profiler prof(options.schedule);
    for (auto& c : rt.make_collectors()) prof.add_collector(std::move(c));
    prof.observe(rt.allocator());
    RunContext ctx{rt.allocator(), rt.stream(), options.threads};
    const int steps = options.schedule.total_steps();
    prof.start();
    for (int s = 0; s < steps; ++s) {
      if (options.progress)
        options.progress(r.backend + ": step " + std::to_string(s + 1) + "/" + std::to_string(steps));
      {
        // The range covers the call alone, so on a GPU its length is the host
        // cost per call; the device work is waited for after it.
        RecordFunction fwd(analysis::kForwardRange, dtype_name(p.dtype), p.shape_key(), ActivityType::UserAnnotation);
        backend.forward(p, in, out, ctx);
      }
      rt.synchronize();
      prof.step();
    }
    prof.stop();
    std::optional<Spread> unprofiled;
    if (p.device != Device::Cpu && options.unprofiled_calls > 0) {
      if (options.progress) options.progress(r.backend + ": timing calls without the profiler");
      unprofiled = time_unprofiled_calls(backend, p, in, out, ctx, rt, options.unprofiled_calls);
    }
    r.trace = std::move(prof.trace());
    r.trace.name = p.shape_key() + "_" + r.backend;
    if (!r.trace.device) r.trace.device = rt.properties();

    if (options.progress) options.progress(r.backend + ": checking against float64");
    const Tensor host_out = rt.download(out);
    r.error = check_against_reference(p, host, host_out, sample_rows(p, options.check_rows));
    r.acceptance = accept(p.dtype, *r.error, std::nullopt, r.traits.nan_on_fully_masked);
    r.metrics = analysis::measure(r.trace, p, ceiling(rt, p.dtype));
    if (unprofiled) {
      r.metrics.host_time_unprofiled_us = unprofiled->p50;
      r.metrics.host_time_unprofiled_p10_us = unprofiled->p10;
      r.metrics.host_time_unprofiled_p90_us = unprofiled->p90;
    }
  } catch (const Error& e) {
    r.failure = e.what();
  } catch (const std::bad_alloc&) {
    r.failure = "out of host memory: use a smaller --batch, --heads or --seq";
  }
  return r;
}

std::vector<RunResult> run_backends(const Problem& p, const RunOptions& options, const std::vector<std::string>& only) {
  std::vector<RunResult> results;
  for (const Explanation& e : explain(p)) {
    if (!only.empty() && std::find(only.begin(), only.end(), e.backend) == only.end()) continue;
    Backend* b = find_backend(e.backend, p.device);
    if (!e.eligible || !b) {
      RunResult r;
      r.backend = e.backend;
      r.problem = p;
      r.eligibility = {false, e.reason};
      results.push_back(std::move(r));
      continue;
    }
    results.push_back(run_backend(*b, p, options));
  }
  return results;
}

}  // namespace attnprof
