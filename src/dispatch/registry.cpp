// The one place that knows which backends exist on which device, and the one
// place a CUDA build's backends are reached from.
#include <algorithm>
#include <map>
#include <memory>
#include <mutex>

#include "attnprof/error.h"
#include "attnprof/runner.h"
#include "backends/composite/composite.h"
#include "backends/cpu/cpu_backends.h"
#ifdef ATTNPROF_WITH_CUDA
#include "backends/cuda/cuda_backends.h"
#endif

namespace attnprof {
namespace {

struct Registry {
  std::map<std::string, std::unique_ptr<Backend>, std::less<>> cpu;
  std::map<std::string, std::unique_ptr<Backend>, std::less<>> cuda;

  Registry() {
    // The composite backends are written once; each instance owns the ops of
    // its device.
    cpu.emplace("naive", composite::make_naive(cpu::make_ops()));
    cpu.emplace("naive_inplace", composite::make_naive_inplace(cpu::make_ops()));
    cpu.emplace("math", composite::make_math(cpu::make_ops()));
    cpu.emplace("flash", cpu::make_flash());
#ifdef ATTNPROF_WITH_CUDA
    cuda.emplace("naive", composite::make_naive(cuda::make_ops()));
    cuda.emplace("naive_inplace", composite::make_naive_inplace(cuda::make_ops()));
    cuda.emplace("math", composite::make_math(cuda::make_ops()));
    cuda.emplace("efficient", cuda::make_efficient());
    cuda.emplace("flash", cuda::make_flash());
    if (auto b = cuda::make_cudnn()) cuda.emplace("cudnn", std::move(b));
#endif
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

bool cuda_built() {
#ifdef ATTNPROF_WITH_CUDA
  return true;
#else
  return false;
#endif
}

Backend* find_backend(std::string_view name, Device d) {
  auto& m = d == Device::Cpu ? registry().cpu : registry().cuda;
  auto it = m.find(name);
  return it == m.end() ? nullptr : it->second.get();
}

std::vector<Explanation> explain(const Problem& p) {
  std::vector<Explanation> out;
  for (std::string_view name : backend_names()) {
    Explanation e{std::string(name), false, {}};
    if (Backend* b = find_backend(name, p.device)) {
      const Eligibility el = eligibility_of(*b, p);
      e.eligible = el.eligible;
      e.reason = el.reason;
    } else if (p.device == Device::Cpu) {
      e.reason = std::string("not eligible on CPU: ") +
                 (name == "cudnn" ? "cuDNN runs on NVIDIA GPUs only"
                                  : "a fused CUDA kernel (sm80 and later); needs device=cuda");
    } else if (!cuda_built()) {
      e.reason = "not eligible: this build has no CUDA (configure with a CUDA toolkit, preset 'cuda')";
    } else {
      e.reason =
          "not eligible: not built (cuDNN or its frontend headers were missing at build time; run scripts/setup.sh)";
    }
    out.push_back(std::move(e));
  }
  return out;
}

Backend& resolve_backend(const Problem& p, std::string_view requested) {
  const std::string name = requested == "auto" ? choose_auto(p).backend : std::string(requested);
  if (!is_backend_name(name)) {
    std::string names;
    for (auto n : backend_names()) names += (names.empty() ? "" : ", ") + std::string(n);
    fail(ErrorKind::InvalidArgument, "unknown backend '" + name + "': use auto, " + names);
  }
  Backend* b = find_backend(name, p.device);
  if (b && eligibility_of(*b, p).eligible) return *b;
  for (const Explanation& e : explain(p)) {
    if (e.backend == name) fail(ErrorKind::Unsupported, "backend " + name + " cannot run this problem: " + e.reason);
  }
  fail(ErrorKind::Internal, "backend " + name + " is listed by no explanation");
}

AutoChoice choose_auto(const Problem& p) {
  static std::mutex mutex;
  static std::map<std::string, AutoChoice> cache;
  const std::string key = p.describe() + (p.scale ? std::to_string(*p.scale) : "");
  std::lock_guard lock(mutex);
  if (auto it = cache.find(key); it != cache.end()) return it->second;

  AutoChoice best;
  double best_us = 0;
  std::string tried;
  RunOptions opt;
  opt.schedule = {.wait = 0, .warmup = 1, .active = 2, .repeat = 1};
  opt.check_rows = 64;
  for (const Explanation& e : explain(p)) {
    if (!e.eligible) continue;
    Backend* b = find_backend(e.backend, p.device);
    RunResult r = run_backend(*b, p, opt);
    if (r.failure || !r.metrics.device_time_us) continue;
    const double us = *r.metrics.device_time_us;
    if (!tried.empty()) tried += ", ";
    tried += e.backend + " " + std::to_string(static_cast<long long>(us)) + " us";
    if (best.backend.empty() || us < best_us) {
      best.backend = e.backend;
      best_us = us;
    }
  }
  if (best.backend.empty()) fail(ErrorKind::Unsupported, "no backend can run " + p.describe());
  best.reason = "fastest measured (" + tried + ")";
  cache.emplace(key, best);
  return best;
}

}  // namespace attnprof
