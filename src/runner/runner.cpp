// Runs one backend under the profiler: refuse what cannot fit, make fresh
// inputs, poison the output, step through the schedule, check against float64.
#include "attnprof/runner.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "analysis/metrics.h"
#include "attnprof/environment.h"
#include "attnprof/error.h"
#include "attnprof/key_averages.h"
#include "attnprof/mask_tensor.h"
#include "attnprof/plan.h"
#include "attnprof/reference.h"
#include "backends/cpu/cpu_backends.h"
#include "backends/cuda/plugin.h"

namespace attnprof {

DeviceRuntime& device_runtime(Device d, int threads) {
  if (d == Device::Cpu) return cpu::runtime(threads);
  return cuda::plugin().runtime();  // loads the CUDA plugin, or says why it cannot
}

namespace {

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
  return buf;
}

// Where the CPU's free memory is an address-space or data limit's, saying so.
std::string limit_note(Device d) {
  if (d != Device::Cpu) return {};
  for (const int resource : {RLIMIT_AS, RLIMIT_DATA}) {
    rlimit r{};
    if (::getrlimit(resource, &r) == 0 && r.rlim_cur != RLIM_INFINITY) {
      return " under the process's memory limit (ulimit -v or -d)";
    }
  }
  return {};
}

std::size_t input_bytes(const Problem& p) {
  std::size_t masks = 0;
  if (p.mask == MaskKind::Boolean) masks = static_cast<std::size_t>(p.seq * p.kv_seq);
  if (p.mask == MaskKind::Bias)
    masks = static_cast<std::size_t>(p.seq * p.kv_seq) * element_size(output_dtype(p.dtype));
  // q, k, v, mask, O (and dO, dQ, dK, dV), and a paged cache's copies of K and V.
  std::size_t n = p.q_bytes() + p.o_bytes() + 2 * p.kv_bytes() + masks + p.gradient_bytes() + 2 * p.kv_page_bytes();
  // FP8: the real (bf16) values stay beside their e4m3 copies for the check.
  if (is_fp8(p.dtype)) {
    const Problem real = fp8_real_problem(p);
    n += real.q_bytes() + 2 * real.kv_bytes() + 2 * real.kv_page_bytes();
  }
  return n;
}

// What one call of the pass reads and writes: the inputs and O always; for
// a backward, dO, the saved tensors and the gradients.
struct PassTensors {
  Inputs in;
  Tensor out;
  Tensor dout;
  Saved saved;
  Gradients grads;
  // A forward's plan of this backend and problem (attnprof/plan.h), made
  // once before the steps: every step is then Plan::run, as a program's
  // planned call is. Empty for the other passes (plans run forwards).
  Plan plan;
};

// One call of the pass. Backward reuses the saved tensors of the forward made
// before the steps; a training step makes its own (the last step's are
// released first, as a training loop releases them).
void call(Backend& backend, const Problem& p, PassTensors& t, RunContext& ctx) {
  switch (p.pass) {
    case Pass::Forward:
      if (t.plan.valid()) {
        t.plan.run(t.in, t.out, ctx.stream);
      } else {
        backend.forward(p, t.in, t.out, ctx);  // a backward run's forward alone (no plan of it)
      }
      break;
    case Pass::Backward:
      backend.backward(p, t.in, t.out, t.dout, t.saved, t.grads, ctx);
      break;
    case Pass::Train:
      t.saved = {};
      backend.forward_train(p, t.in, t.out, t.saved, ctx);
      backend.backward(p, t.in, t.out, t.dout, t.saved, t.grads, ctx);
      break;
  }
}

// Bytes an event of the trace holds: the record and its strings while it is
// recorded, and what writing the trace file and indexing it for the rules add
// on top. The file is streamed an event at a time, so that is small: measured
// on synthetic traces of a million events (peak RSS, VmHWM reset before each
// step, 2026-12-06), writing added 2 B an event to a CPU trace and 47-54 B to
// a GPU-shaped one (the writer's launch and flow maps), the rules' index 38 B
// and 14 B. 128 B covers both with room; the whole document held as one JSON
// value, before the writer streamed it, took about 2 KiB an event.
double event_bytes(const Activity& a) {
  constexpr double kWritingBytes = 128;
  return static_cast<double>(sizeof(Activity) + a.name.capacity() + a.input_dtypes.capacity() +
                             a.input_dims.capacity()) +
         kWritingBytes;
}

// Recorded steps a run's trace keeps: a longer schedule's trace holds its
// last kTraceSteps, and each older step is folded into the run's figures
// (analysis::MetricSums) and table rows (merge_key_averages) as it leaves,
// so a run's memory is flat for any number of steps and its figures still
// cover all of them. 100 is above every schedule the tests and the
// documentation use (their traces are whole), and a trace a viewer opens
// at once. Device collectors are flushed for it (Profiler::fold_steps_beyond).
constexpr int kTraceSteps = 100;

// The trace grows by each recorded step's events until it holds the steps it
// keeps: once the first recorded steps are in, the most it will hold is
// estimated from them and refused if host memory cannot hold it (with a
// collector that cannot flush, --active 1000 --repeat 100 would otherwise
// grow until the machine swaps or the kernel kills us).
void check_trace_fits(const Trace& trace, int recorded, int to_hold, const Schedule& schedule, int threads) {
  if (trace.activities.empty()) return;
  double bytes = 0;
  for (const Activity& a : trace.activities) bytes += event_bytes(a);
  const double per_step = bytes / recorded;
  const double need = per_step * to_hold;
  const double have = static_cast<double>(device_runtime(Device::Cpu, threads).available_bytes());
  if (need <= 0.8 * have) return;
  fail(ErrorKind::OutOfMemory, "the trace holds " + std::to_string(to_hold) + " steps (active " +
                                   std::to_string(schedule.active) + " x repeat " + std::to_string(schedule.repeat) +
                                   "); at about " +
                                   std::to_string(trace.activities.size() / static_cast<std::size_t>(recorded)) +
                                   " events a step that is a trace of about " + gib(need) + ", more than the " +
                                   gib(have) + " of host memory free: use a smaller active or repeat");
}

// What profiling the schedule leaves: the trace (its last recorded steps),
// and the figures' sums and the table's rows of the steps folded out of it.
struct Profiled {
  Trace trace;
  analysis::MetricSums folded;
  std::vector<KeyAverage> folded_rows;
};

// The schedule's steps of the pass under a fresh profiler with the runtime's
// collectors.
Profiled profile_calls(Backend& backend, const Problem& p, PassTensors& t, RunContext& ctx, DeviceRuntime& rt,
                       const Schedule& schedule, const ProgressFn& progress, const std::string& label) {
  Profiled out;
  Profiler prof(schedule);
  for (auto& c : rt.make_collectors()) prof.add_collector(std::move(c));
  prof.observe(rt.allocator());
  prof.fold_steps_beyond(kTraceSteps, [&](Trace&& step) {
    analysis::add_to(out.folded, analysis::TraceIndex(step), p);
    merge_key_averages(out.folded_rows, key_averages(step));
  });
  const int steps = schedule.total_steps();
  int recorded = 0, to_record = 0;
  for (int s = 0; s < steps; ++s)
    to_record += schedule.at(s) != Schedule::Action::None && schedule.at(s) != Schedule::Action::Warmup;
  bool estimated = false;
  prof.start();
  const int to_hold = prof.folds_steps() ? std::min(to_record, kTraceSteps + 1) : to_record;
  for (int s = 0; s < steps; ++s) {
    if (!estimated && recorded > 0) {
      check_trace_fits(prof.trace(), recorded, to_hold, schedule, ctx.threads);
      estimated = true;
    }
    const Schedule::Action action = schedule.at(s);
    recorded += action != Schedule::Action::None && action != Schedule::Action::Warmup;
    if (progress) progress(label + ": step " + std::to_string(s + 1) + "/" + std::to_string(steps));
    {
      // The range covers the call alone, so on a GPU its length is the host
      // cost per call; the device work is waited for after it.
      RecordFunction range(pass_name(p.pass), dtype_name(p.dtype), p.shape_key(), ActivityType::UserAnnotation);
      call(backend, p, t, ctx);
    }
    rt.synchronize();
    prof.step();
  }
  prof.stop();
  out.trace = std::move(prof.trace());
  return out;
}

// The run's figures: the steps folded out of the trace, and the trace.
Metrics measure_profiled(const Profiled& run, const Trace& trace, const Problem& p, double ceiling, double copy_gbs) {
  analysis::MetricSums sums = run.folded;
  analysis::add_to(sums, analysis::TraceIndex(trace), p);
  return analysis::finish(sums, p, ceiling, copy_gbs);
}

// Host time of `calls` calls on an asynchronous device, no profiler
// attached, made back to back as a program makes them: the device works
// through the earlier calls while later ones are enqueued, so each timing is
// the call's own CPU cost (a call that waits on the device counts the wait, as
// it should). Waiting for an idle device between calls instead made the next
// call run on cold caches after the thread slept: on an H200 that read 9-20 us
// for a cuDNN call whose back-to-back cost is lower.
Spread time_unprofiled_calls(Backend& backend, const Problem& p, PassTensors& t, RunContext& ctx, DeviceRuntime& rt,
                             int calls) {
  std::vector<double> us;
  us.reserve(static_cast<std::size_t>(calls));
  rt.synchronize();
  // A few untimed calls first: the first calls after the profiler detaches,
  // on a thread that just slept in a device wait, are not the steady state.
  const int warmup = std::max(2, calls / 4);
  for (int i = 0; i < warmup + calls; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    call(backend, p, t, ctx);
    const double call_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (i >= warmup) us.push_back(call_us);
  }
  rt.synchronize();
  return spread_of(std::move(us));
}

// dQ, dK and dV against float64 on sampled rows; the worst of the three (by
// relative error, NaN first) stands for the run.
void check_gradients(const Problem& p, const Inputs& host, const Tensor& host_dout, PassTensors& t, DeviceRuntime& rt,
                     std::int64_t check_rows, RunResult& r) {
  const Gradients g{rt.download(t.grads.dq), rt.download(t.grads.dk), rt.download(t.grads.dv)};
  r.gradient_errors = check_gradients_against_reference(p, host, host_dout, g, sample_rows(p, check_rows),
                                                        sample_kv_rows(p, check_rows));
  const GradientErrors& e = *r.gradient_errors;
  const ErrorStats* worst = &e.dq;
  for (const ErrorStats* x : {&e.dk, &e.dv}) {
    if (x->nan_rows > worst->nan_rows || (x->nan_rows == worst->nan_rows && x->rel > worst->rel)) worst = x;
  }
  r.error = *worst;
}

// An FP8 run's yardstick: the same backend's forward on the real (bf16)
// inputs the FP8 ones were quantized from, checked against float64 the same
// way but not profiled, so the table can show what FP8 adds to its error.
// Where the backend takes no bf16, or the forward cannot run, the record
// says why instead.
void check_bf16_forward(Backend& backend, const Problem& p, const Inputs& host_real, DeviceRuntime& rt,
                        const RunOptions& options, Fp8Record& record) {
  const Problem real = fp8_real_problem(p);
  const std::string name(backend.name());
  if (const Eligibility e = eligibility_of(backend, real); !e.eligible) {
    record.bf16_note = name + " takes no bf16 inputs here: " + e.reason;
    return;
  }
  const double need = static_cast<double>(input_bytes(real) + backend.workspace_bytes(real));
  if (need > 0.9 * static_cast<double>(rt.available_bytes())) {
    record.bf16_note = "the bf16 forward was skipped: it needs about " + gib(need) + " on " + device_name(p.device);
    return;
  }
  try {
    if (options.progress) options.progress(name + ": the bf16 forward on the same real inputs, for its error");
    Inputs in = rt.upload(host_real);
    Tensor out = Tensor::empty(real.q_dims(), real.dtype, rt.allocator());
    rt.poison(out);
    RunContext ctx{rt.allocator(), rt.stream(), options.threads};
    backend.forward(real, in, out, ctx);
    rt.synchronize();
    record.bf16_error =
        check_against_reference(real, host_real, rt.download(out), sample_rows(real, options.check_rows));
  } catch (const Error& e) {
    record.bf16_note = std::string("the bf16 forward failed: ") + e.what();
  } catch (const std::bad_alloc&) {
    record.bf16_note = "the bf16 forward ran out of host memory";
  }
}

}  // namespace

// The device's matrix-product ceiling: measured once, unless
// ATTNPROF_CEILING_TFLOPS gives a known one (measuring it under a sanitizer
// or a debugger would take minutes). The variable is the 16-bit (fp16, bf16)
// ceiling; fp8's on CUDA is twice it, the dense e4m3 tensor-core rate, as the
// CUDA runtime derives its own from bf16's. A CPU multiplies e4m3 values as
// bf16 ones (no CPU has an e4m3 product), so there fp8's is bf16's.
double ceiling_tflops(DeviceRuntime& rt, DType dtype) {
  if (const auto v = environment_real("ATTNPROF_CEILING_TFLOPS", kMaxCeilingTflops, "TFLOP/s")) {
    return is_fp8(dtype) && rt.device() == Device::Cuda ? 2 * *v : *v;
  }
  return rt.ceiling_tflops(dtype);
}

// The device's copy ceiling (GB/s), the same way: measured once, unless
// ATTNPROF_COPY_GBS gives it.
double copy_ceiling_gbs(DeviceRuntime& rt) {
  if (const auto v = environment_real("ATTNPROF_COPY_GBS", kMaxCopyGbs, "GB/s")) return *v;
  return rt.copy_bandwidth_gbs();
}

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
  r.eligibility = eligibility_of(backend, p);
  r.expectation = backend.expectation(p);
  r.traits = backend.traits();
  r.trace.name = p.file_stem() + "_" + r.backend;
  if (!r.eligibility.eligible) return r;
  try {
    DeviceRuntime& rt = device_runtime(p.device, options.threads);
    const double need = static_cast<double>(input_bytes(p) + backend.workspace_bytes(p));
    const double have = static_cast<double>(rt.available_bytes());
    if (need > 0.9 * have) {
      fail(ErrorKind::OutOfMemory, r.backend + " needs about " + gib(need) + " on " + device_name(p.device) +
                                       " but only " + gib(have) + " is free" + limit_note(p.device) +
                                       ": use a smaller batch, heads or seq");
    }
    if (options.progress) options.progress(r.backend + ": preparing inputs (" + p.describe() + ")");
    // FP8: the real values a bf16 run of this shape and seed draws (what the
    // float64 check reads), and their e4m3 copies (what the backend reads).
    Inputs host, host_real;
    if (is_fp8(p.dtype)) {
      const Problem real = fp8_real_problem(p);
      host_real = make_inputs(real, options.seed, cpu_allocator(), options.bshd_inputs);
      if (options.mask.defined()) attach_mask(real, options.mask, host_real, "the mask file");
      Fp8Quantized q = quantize_inputs(p, host_real, options.fp8_descale, cpu_allocator());
      host = std::move(q.in);
      r.fp8.emplace();
      r.fp8->tensors = std::move(q.tensors);
      r.fp8->auto_descale = !options.fp8_descale;
    } else {
      host = make_inputs(p, options.seed, cpu_allocator(), options.bshd_inputs);
      if (options.mask.defined()) attach_mask(p, options.mask, host, "the mask file");
    }
    PassTensors t;
    t.in = rt.upload(host);
    // p.q_dims() and p.kv_dims(): [B, H, S, D] and [B, Hkv, Skv, D], or a
    // packed batch's [1, H, total_q, D] and [1, Hkv, total_kv, D]; O and the
    // gradients in the output's dtype (bf16 for fp8 inputs).
    const auto empty = [&](const Dims& dims) {
      Tensor x = Tensor::empty(dims, output_dtype(p.dtype), rt.allocator());
      rt.poison(x);
      return x;
    };
    t.out = empty(p.q_dims());
    RunContext ctx{rt.allocator(), rt.stream(), options.threads};
    // The forward's plan, before the profiler starts: what the backend sizes
    // and allocates once per problem (its prepare) is then outside the
    // steps, as it is for a program that plans its call. A paged problem's
    // runs here have no per-sequence lengths (every sequence is full), which
    // a paged plan takes on every run, so those call the backend directly.
    if (p.pass == Pass::Forward && p.kv_cache != KvCache::Paged) {
      t.plan = plan(p, layout_of(p, t.in), backend, options.threads);
    }
    Tensor host_dout;
    if (p.pass != Pass::Forward) {
      host_dout = make_dout(p, options.seed, cpu_allocator());
      t.dout = rt.upload(host_dout);
      t.grads = {empty(p.q_dims()), empty(p.kv_dims()), empty(p.kv_dims())};
      if (p.pass == Pass::Backward) {
        if (options.progress) options.progress(r.backend + ": the forward whose saved tensors the backward reads");
        backend.forward_train(p, t.in, t.out, t.saved, ctx);
      }
    }
    rt.synchronize();

    Profiled profiled = profile_calls(backend, p, t, ctx, rt, options.schedule, options.progress, r.backend);
    std::optional<Spread> unprofiled;
    if (p.device != Device::Cpu && options.unprofiled_calls > 0) {
      if (options.progress) options.progress(r.backend + ": timing calls without the profiler");
      unprofiled = time_unprofiled_calls(backend, p, t, ctx, rt, options.unprofiled_calls);
    }
    r.trace = std::move(profiled.trace);
    r.trace.name = p.file_stem() + "_" + r.backend;
    if (!r.trace.device) r.trace.device = rt.properties();

    if (options.progress) options.progress(r.backend + ": checking against float64");
    if (p.pass == Pass::Forward) {
      r.error =
          check_against_reference(p, r.fp8 ? host_real : host, rt.download(t.out), sample_rows(p, options.check_rows));
    } else {
      check_gradients(p, host, host_dout, t, rt, options.check_rows, r);
    }
    r.acceptance = accept(p.dtype, *r.error, std::nullopt, r.traits.nan_on_fully_masked);
    const double copy_gbs = copy_ceiling_gbs(rt);
    if (r.trace.device) r.trace.device->copy_bandwidth_gbs = copy_gbs;
    r.metrics = measure_profiled(profiled, r.trace, p, ceiling_tflops(rt, p.dtype), copy_gbs);
    // What the plan holds (a CPU flash's scratch, a GPU's split-KV
    // workspace) each forward would otherwise allocate for itself: held
    // across the calls, it is still memory the call needs, so the peak
    // counts it (the trace's forward ranges show no allocation for it).
    if (t.plan.valid()) r.metrics.peak_bytes += static_cast<std::int64_t>(t.plan.workspace_bytes());
    if (r.trace.steps_folded > 0) {
      r.key_averages = std::move(profiled.folded_rows);
      merge_key_averages(r.key_averages, key_averages(r.trace));
    }
    if (p.pass != Pass::Forward) {
      r.metrics.saved_bytes = static_cast<double>(t.saved.bytes());
      // The forward alone, profiled the same way, for backward time over
      // forward time: a short schedule of its own.
      if (options.progress) options.progress(r.backend + ": the forward alone, for the backward/forward ratio");
      Problem forward = p;
      forward.pass = Pass::Forward;
      forward.deterministic = false;
      const Schedule short_schedule{.wait = 0, .warmup = 1, .active = 2, .repeat = 1};
      const Profiled ft = profile_calls(backend, forward, t, ctx, rt, short_schedule, {}, r.backend);
      r.metrics.forward_device_time_us =
          measure_profiled(ft, ft.trace, forward, ceiling_tflops(rt, p.dtype), 0).device_time_us;
    }
    if (unprofiled) {
      r.metrics.host_time_unprofiled_us = unprofiled->p50;
      r.metrics.host_time_unprofiled_p10_us = unprofiled->p10;
      r.metrics.host_time_unprofiled_p90_us = unprofiled->p90;
    }
    // What the backend's own FP8 graph measured (cudnn's amax outputs), read
    // once the timed calls are done.
    if (r.fp8) r.fp8->measured_amax = backend.read_fp8_amax();
    if (r.fp8 && options.fp8_bf16_forward) {
      t = {};  // the FP8 run's tensors go before the bf16 forward's are made
      check_bf16_forward(backend, p, host_real, rt, options, *r.fp8);
    }
  } catch (const Error& e) {
    r.failure = e.what();
  } catch (const std::bad_alloc&) {
    r.failure = "out of host memory: use a smaller batch, heads or seq";
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
