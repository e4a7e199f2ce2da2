// run_ring (attnprof/parallel.h): the ring under the profiler, as run_backend
// runs one backend.
#include <chrono>
#include <cstdlib>
#include <string>

#include "analysis/metrics.h"
#include "attnprof/error.h"
#include "attnprof/parallel.h"
#include "attnprof/runner.h"
#include "backends/cuda/plugin.h"
#include "parallel/sharding.h"

namespace attnprof {

void check_ring(const Problem& p, int gpus, std::string_view backend) {
  if (gpus < 1) fail(ErrorKind::InvalidArgument, "gpus must be at least 1, got " + std::to_string(gpus), {"gpus"});
  if (backend != kRingBackend) {
    fail(ErrorKind::Unsupported,
         "gpus runs " + std::string(kRingBackend) + " only, not " + std::string(backend) +
             ": use backend=" + kRingBackend,
         {"gpus"});
  }
  if (p.varlen()) {
    fail(ErrorKind::Unsupported,
         "gpus shards one dense sequence per batch entry: a packed batch (seq_lens) is not "
         "built for ring attention yet",
         {"gpus", "seq_lens"});
  }
  if (is_fp8(p.dtype)) {
    fail(ErrorKind::Unsupported,
         "gpus: ring attention merges bf16 or fp16 partial outputs; dtype fp8 is not built for it yet (use one GPU)",
         {"gpus", "dtype"});
  }
  parallel::check_ring_problem(p, gpus);
  // The ring lives in the CUDA plugin, built there only with NCCL.
  if (!cuda_built() || !cuda::plugin().make_ring) {
    fail(ErrorKind::Unsupported,
         "gpus needs GPUs through a build with CUDA and NCCL; this one has neither (CMake's configure output says why)",
         {"gpus"});
  }
  std::string why;
  const int have = cuda::plugin().device_count(&why);
  if (have == 0) {
    fail(ErrorKind::Unsupported,
         "gpus " + std::to_string(gpus) + " needs " + std::to_string(gpus) +
             " CUDA GPU(s) but this machine has no usable GPU" + (why.empty() ? std::string() : " (" + why + ")"),
         {"gpus"});
  }
  if (gpus > have) {
    fail(ErrorKind::Unsupported,
         "gpus " + std::to_string(gpus) + " asks for more GPUs than this machine has (" + std::to_string(have) + ")",
         {"gpus"});
  }
}

RunResult run_ring(const Problem& p, int gpus, const RunOptions& options) {
  RunResult r;
  r.backend = kRingBackend;
  r.problem = p;
  r.eligibility = {true, "ring attention over " + std::to_string(gpus) + " GPU(s)"};
  // flash's traits; its expectation (one kernel a forward) is not the
  // ring's, whose kernel count depends on the pairs and on NCCL: unknown.
  if (Backend* b = find_backend(kRingBackend, p.device)) r.traits = b->traits();
  r.trace.name = p.file_stem() + "_" + r.backend;
  r.trace.world_size = gpus;
  try {
    check_ring(p, gpus);
    DeviceRuntime& rt = device_runtime(Device::Cuda, options.threads);
    const ProgressFn& progress = options.progress;
    const std::string label = r.backend + " x" + std::to_string(gpus);
    if (progress) progress(label + ": preparing inputs (" + p.describe() + ")");
    const Inputs host = make_inputs(p, options.seed, cpu_allocator(), false);
    if (progress) progress(label + ": starting NCCL and sharding over " + std::to_string(gpus) + " GPU(s)");
    const std::unique_ptr<cuda::Ring> ring = cuda::plugin().make_ring(p, gpus, host);
    ring->forward();  // NCCL's first calls connect the ring: not profiled
    ring->synchronize();

    Profiler prof(options.schedule);
    for (auto& c : rt.make_collectors()) prof.add_collector(std::move(c));
    const int steps = options.schedule.total_steps();
    prof.start();
    for (int s = 0; s < steps; ++s) {
      if (progress) progress(label + ": step " + std::to_string(s + 1) + "/" + std::to_string(steps));
      {
        RecordFunction range(pass_name(p.pass), dtype_name(p.dtype), p.shape_key(), ActivityType::UserAnnotation);
        ring->forward();
      }
      ring->synchronize();
      prof.step();
    }
    prof.stop();
    r.trace = std::move(prof.trace());
    r.trace.name = p.file_stem() + "_" + r.backend;
    r.trace.world_size = gpus;
    if (!r.trace.device) r.trace.device = rt.properties();

    std::optional<Spread> unprofiled;
    if (options.unprofiled_calls > 0) {
      if (progress) progress(label + ": timing calls without the profiler");
      std::vector<double> us;
      for (int i = 0; i < options.unprofiled_calls; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        ring->forward();
        us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      }
      ring->synchronize();
      unprofiled = spread_of(std::move(us));
    }

    if (progress) progress(label + ": checking the gathered output against float64");
    r.error = check_against_reference(p, host, ring->gather_output(), sample_rows(p, options.check_rows));
    r.acceptance = accept(p.dtype, *r.error, std::nullopt, r.traits.nan_on_fully_masked);
    // One GPU's ceilings: measure() holds the run against world_size of them.
    const double copy_gbs = copy_ceiling_gbs(rt);
    if (r.trace.device) r.trace.device->copy_bandwidth_gbs = copy_gbs;
    r.metrics = analysis::measure(r.trace, p, ceiling_tflops(rt, p.dtype), copy_gbs);
    if (unprofiled) {
      r.metrics.host_time_unprofiled_us = unprofiled->p50;
      r.metrics.host_time_unprofiled_p10_us = unprofiled->p10;
      r.metrics.host_time_unprofiled_p90_us = unprofiled->p90;
    }
  } catch (const Error& e) {
    r.failure = e.what();
  } catch (const std::bad_alloc&) {
    r.failure = "out of host memory: use a smaller batch, heads or seq";
  }
  return r;
}

}  // namespace attnprof
