// cpu_flash_bench: the CPU flash backend against the machine's own ceiling
// (OpenBLAS sgemm on the same threads) and against naive_inplace, plus flash's
// peak memory over sequence length. Prints the tables docs/perf/cpu-flash.md
// records. Every timing is the median of --repeats runs after one warmup.
//
//   cpu_flash_bench [--threads N] [--repeats R] [--quick]
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/reference.h"
#include "backends/composite/composite.h"
#include "backends/cpu/blas.h"
#include "backends/cpu/cpu_backends.h"

namespace {

using namespace attnprof;

struct Options {
  int threads = 0;
  int repeats = 5;
  bool quick = false;  // smaller sizes, for a smoke run
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) {
      o.threads = std::stoi(argv[++i]);
    } else if (a == "--repeats" && i + 1 < argc) {
      o.repeats = std::max(1, std::stoi(argv[++i]));
    } else if (a == "--quick") {
      o.quick = true;
    } else {
      std::fprintf(stderr, "usage: %s [--threads N] [--repeats R] [--quick]\n", argv[0]);
      std::exit(a == "--help" ? 0 : 2);
    }
  }
  if (o.threads <= 0) o.threads = omp_get_num_procs();
  return o;
}

double seconds() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

template <class Fn>
double median_seconds(int repeats, Fn&& fn) {
  fn();  // warmup: page faults, thread pools, caches
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    const double start = seconds();
    fn();
    t.push_back(seconds() - start);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

double sgemm_gflops(std::int64_t n, int repeats) {
  std::vector<float> a(static_cast<std::size_t>(n * n)), b(a.size()), c(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = static_cast<float>(i % 17) * 0.01f + 0.1f;
    b[i] = static_cast<float>(i % 13) * 0.02f - 0.1f;
  }
  const int N = static_cast<int>(n);
  const double t = median_seconds(
      repeats, [&] { attnprof::cpu::sgemm(false, N, N, N, 1.0f, a.data(), N, b.data(), N, 0.0f, c.data(), N); });
  return 2.0 * static_cast<double>(n) * n * n / t / 1e9;
}

Problem attention(std::int64_t seq) {
  Problem p;
  p.batch = 1;
  p.heads = 16;
  p.seq = seq;
  p.head_dim = 64;
  p.dtype = DType::F32;
  p.device = Device::Cpu;
  p.mask = MaskKind::Causal;
  p.normalize();
  return p;
}

struct Measured {
  double ms = 0;
  double gflops = 0;
  std::int64_t peak_bytes = 0;  // allocated during forward beyond inputs and output
};

Measured measure(Backend& backend, const Problem& p, int threads, int repeats) {
  Allocator& alloc = cpu_allocator();
  const Inputs in = make_inputs(p, 0x5eed, alloc);
  Tensor out = Tensor::empty({p.batch, p.heads, p.seq, p.head_dim}, p.dtype, alloc);
  RunContext ctx{.allocator = alloc, .threads = threads};
  Measured m;
  const double t = median_seconds(repeats, [&] { backend.forward(p, in, out, ctx); });
  m.ms = t * 1e3;
  m.gflops = p.flops() / t / 1e9;
  alloc.reset_peak();
  const std::int64_t before = alloc.stats().allocated;
  backend.forward(p, in, out, ctx);
  m.peak_bytes = alloc.stats().peak_allocated - before;
  return m;
}

double mib(std::int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  omp_set_num_threads(o.threads);
  attnprof::cpu::blas_set_threads(o.threads);
  auto flash = cpu::make_flash();
  auto naive = composite::make_naive_inplace(cpu::make_ops());

  std::printf("cpu_flash_bench: %s, %d threads, %s, g++ %s, median of %d after 1 warmup\n\n", cpu_model().c_str(),
              o.threads, attnprof::cpu::blas_config(), __VERSION__, o.repeats);

  std::printf("(a) OpenBLAS sgemm, square fp32\n  %6s  %10s\n", "n", "GFLOP/s");
  double sgemm_best = 0;
  for (std::int64_t n : o.quick ? std::vector<std::int64_t>{1024} : std::vector<std::int64_t>{2048, 4096}) {
    const double g = sgemm_gflops(n, o.repeats);
    sgemm_best = std::max(sgemm_best, g);
    std::printf("  %6lld  %10.1f\n", static_cast<long long>(n), g);
  }

  const std::int64_t headline_seq = o.quick ? 1024 : 4096;
  const Measured head = measure(*flash, attention(headline_seq), o.threads, o.repeats);
  std::printf("\n(b) flash, (1, 16, %lld, 64) causal fp32 (FLOPs of visible pairs only)\n", (long long)headline_seq);
  std::printf("  %10.2f ms  %8.1f GFLOP/s  = %.2f x best sgemm (target >= 0.50)\n", head.ms, head.gflops,
              head.gflops / sgemm_best);

  std::printf("\n(c) flash vs naive_inplace, (1, 16, S, 64) causal fp32\n");
  std::printf("  %6s  %12s  %10s  %12s  %10s  %8s\n", "S", "naive_ip ms", "GFLOP/s", "flash ms", "GFLOP/s", "speedup");
  for (std::int64_t s : o.quick ? std::vector<std::int64_t>{512, 1024} : std::vector<std::int64_t>{1024, 2048, 4096}) {
    const Problem p = attention(s);
    const Measured n = measure(*naive, p, o.threads, std::max(1, o.repeats / 2));
    const Measured f = measure(*flash, p, o.threads, o.repeats);
    std::printf("  %6lld  %12.2f  %10.1f  %12.2f  %10.1f  %7.2fx\n", static_cast<long long>(s), n.ms, n.gflops, f.ms,
                f.gflops, n.ms / f.ms);
  }

  std::printf("\n(d) peak memory allocated inside forward (beyond inputs and output), (1, 16, S, 64) causal fp32\n");
  std::printf("  %6s  %12s  %14s  %16s  %18s\n", "S", "flash MiB", "naive_ip MiB", "q+k+v+out MiB", "flash total MiB");
  for (std::int64_t s :
       o.quick ? std::vector<std::int64_t>{512, 1024, 2048} : std::vector<std::int64_t>{1024, 2048, 4096, 8192}) {
    const Problem p = attention(s);
    const Measured f = measure(*flash, p, o.threads, 1);
    // naive_inplace at 8192 would need several 4 GiB score tensors.
    char naive_mib[32] = "(skipped)";
    if (s <= 4096) std::snprintf(naive_mib, sizeof naive_mib, "%.1f", mib(measure(*naive, p, o.threads, 1).peak_bytes));
    const std::int64_t io = static_cast<std::int64_t>(2 * p.q_bytes() + 2 * p.kv_bytes());
    std::printf("  %6lld  %12.3f  %14s  %16.1f  %18.1f\n", static_cast<long long>(s), mib(f.peak_bytes), naive_mib,
                mib(io), mib(io + f.peak_bytes));
  }
  return 0;
}
