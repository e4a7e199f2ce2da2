// cpu_isa_bench: one timing of the CPU flash backend with one kernel level
// (ATTNPROF_CPU_ISA), for bench/cpu_isa_vs_torch.py, which runs it per row and
// level next to PyTorch's CPU SDPA (scripts/cpu_isa_dev.sh). Prints one line:
//   ms <median> gflops <rate> kernel <flash's story of the kernel>
// or, when the level cannot run here, "refused <the one-line reason>" (exit 3).
//
//   cpu_isa_bench --isa LEVEL --batch B --heads H --seq S --head-dim D
//                 --dtype fp32|bf16 --mask causal|none [--pass forward|backward]
//                 [--threads N] [--repeats R] [--warmup-ms M] [--ftz]
//     --warmup-ms: untimed calls until M ms have passed (at least one; 500
//            by default). A fresh process on the Xeon VMs runs its first
//            ~100 ms at a third of the speed whatever it does: the 1k row's
//            first three calls 20-27 ms, then 7.4-9 ms, and a 300 ms sleep
//            before the first call removes the slow calls
//            (docs/perf/cpu-flash.md, "A fresh process's first 100 ms").
//            PyTorch, timed in a long-lived Python process, never pays it.
//     --ftz: denormals flushed to zero (MXCSR FTZ and DAZ) on every thread
//            first, to tell whether denormal operands cost the row time
//   cpu_isa_bench --levels     each level and what this CPU lacks for it
//   cpu_isa_bench --ceilings   the fp32 and bf16 ceilings (TFLOP/s) and their sources
//
// The backward is timed alone: one forward_train, then the median of R backwards.
#include <omp.h>
#include <xmmintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/error.h"
#include "attnprof/reference.h"
#include "backends/cpu/cpu_backends.h"
#include "backends/cpu/cpu_isa.h"

namespace {

using namespace attnprof;

double seconds() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

template <class Fn>
double median_seconds(int repeats, double warmup_seconds, Fn&& fn) {
  // Warm-up: page faults, thread pools, the kernels' repacked K and V, and
  // the process's slow first ~100 ms (--warmup-ms).
  const double warm_until = seconds() + warmup_seconds;
  do fn();
  while (seconds() < warm_until);
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    const double start = seconds();
    fn();
    t.push_back(seconds() - start);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

[[noreturn]] void usage(const char* argv0, int code) {
  std::fprintf(
      stderr,
      "usage: %s --isa LEVEL --batch B --heads H --seq S --head-dim D --dtype fp32|bf16 --mask causal|none "
      "[--pass forward|backward] [--threads N] [--repeats R] [--warmup-ms M] [--ftz] | --levels | --ceilings\n",
      argv0);
  std::exit(code);
}

}  // namespace

int main(int argc, char** argv) {
  Problem p;
  p.batch = 1;
  p.heads = 1;
  p.seq = 128;
  p.head_dim = 64;
  p.device = Device::Cpu;
  p.dtype = DType::F32;
  p.mask = MaskKind::Causal;
  std::string isa = "auto";
  int threads = 2, repeats = 5;
  double warmup_seconds = 0.5;
  bool levels = false, ceilings = false, ftz = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(argv[0], 2);
      return argv[++i];
    };
    if (a == "--levels") {
      levels = true;
    } else if (a == "--ceilings") {
      ceilings = true;
    } else if (a == "--ftz") {
      ftz = true;
    } else if (a == "--isa") {
      isa = value();
    } else if (a == "--batch") {
      p.batch = std::stoll(value());
    } else if (a == "--heads") {
      p.heads = std::stoll(value());
    } else if (a == "--seq") {
      p.seq = std::stoll(value());
    } else if (a == "--head-dim") {
      p.head_dim = std::stoll(value());
    } else if (a == "--dtype") {
      const std::string d = value();
      p.dtype = d == "bf16" ? DType::BF16 : d == "fp16" ? DType::F16 : DType::F32;
    } else if (a == "--mask") {
      p.mask = value() == "causal" ? MaskKind::Causal : MaskKind::None;
    } else if (a == "--pass") {
      p.pass = value() == "backward" ? Pass::Backward : Pass::Forward;
    } else if (a == "--threads") {
      threads = std::stoi(value());
    } else if (a == "--repeats") {
      repeats = std::max(1, std::stoi(value()));
    } else if (a == "--warmup-ms") {
      warmup_seconds = std::max(0, std::stoi(value())) * 1e-3;
    } else {
      usage(argv[0], a == "--help" ? 0 : 2);
    }
  }
  if (levels) {
    for (cpu::CpuIsa level : cpu::kAllCpuIsas) {
      const std::string miss = cpu::isa_missing(level);
      std::printf("%s %s\n", std::string(cpu::isa_name(level)).c_str(),
                  miss.empty() ? "ok" : ("lacks " + miss).c_str());
    }
    std::printf("flags %s\n", cpu::isa_flags_present().c_str());
    return 0;
  }
  if (ceilings) {
    DeviceRuntime& rt = cpu::runtime(threads);
    std::printf("fp32 %.3f TFLOP/s\nbf16 %.3f TFLOP/s\ndevice %s\n", rt.ceiling_tflops(DType::F32),
                rt.ceiling_tflops(DType::BF16), rt.description().c_str());
    return 0;
  }
  ::setenv("ATTNPROF_CPU_ISA", isa.c_str(), 1);
  p.normalize();
  p.validate();
  cpu::runtime(threads);  // OpenMP and OpenBLAS threads
  if (ftz) {
#pragma omp parallel num_threads(threads)
    _mm_setcsr(_mm_getcsr() | 0x8040u);  // FTZ (bit 15) and DAZ (bit 6), kept by the pool's threads
  }
  auto flash = cpu::make_flash();
  const Eligibility el = flash->eligibility(p);
  if (!el.eligible) {
    std::printf("refused %s\n", el.reason.c_str());
    return 3;
  }
  Allocator& alloc = cpu_allocator();
  const Inputs in = make_inputs(p, 0x5eed, alloc);
  Tensor out = Tensor::empty({p.batch, p.heads, p.seq, p.head_dim}, p.dtype, alloc);
  RunContext ctx{.allocator = alloc, .threads = threads};
  double t = 0;
  try {
    if (p.pass == Pass::Forward) {
      t = median_seconds(repeats, warmup_seconds, [&] { flash->forward(p, in, out, ctx); });
    } else {
      const Tensor dout = make_dout(p, 0x5eed, alloc);
      Saved saved;
      flash->forward_train(p, in, out, saved, ctx);
      Gradients g{Tensor::empty(p.q_dims(), p.dtype, alloc), Tensor::empty(p.kv_dims(), p.dtype, alloc),
                  Tensor::empty(p.kv_dims(), p.dtype, alloc)};
      t = median_seconds(repeats, warmup_seconds, [&] { flash->backward(p, in, out, dout, saved, g, ctx); });
    }
  } catch (const Error& e) {
    std::printf("refused %s\n", e.what());
    return 3;
  }
  const double flops = p.flops();
  const std::string reason = el.reason.substr(el.reason.find("flash cpu kernel: "));
  std::printf("ms %.3f gflops %.1f kernel %s\n", t * 1e3, flops / t / 1e9, reason.c_str());
  return 0;
}
