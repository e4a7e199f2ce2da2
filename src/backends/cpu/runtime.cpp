// The CPU as a profiling device: the tracked CPU allocator, OpenMP and
// OpenBLAS thread counts, and a measured matrix-product ceiling per dtype
// (sgemm for fp32 and fp16, the best bf16 product the machine has for bf16).
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "attnprof/device_runtime.h"
#include "attnprof/error.h"
#include "backends/cpu/blas.h"
#include "backends/cpu/cpu_backends.h"
#include "backends/cpu/cpu_isa.h"
#include "backends/cpu/flash_kernels.h"

namespace attnprof {
namespace {

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto pos = line.find(':');
      if (pos != std::string::npos) return line.substr(pos + 2);
    }
  }
  return "CPU";
}

constexpr std::int64_t kUnlimited = std::numeric_limits<std::int64_t>::max();

// A figure from /proc/self/status ("VmSize:  123 kB"), in bytes; -1 if absent.
std::int64_t status_bytes(const char* key) {
  std::ifstream f("/proc/self/status");
  const std::string_view k(key);
  for (std::string line; std::getline(f, line);) {
    if (line.compare(0, k.size(), k) == 0) return std::atoll(line.c_str() + k.size()) * 1024;
  }
  return -1;
}

// Bytes the process may still map under its limits: RLIMIT_AS less the
// address space it holds, RLIMIT_DATA less its data; kUnlimited without limits.
std::int64_t left_under_limits() {
  std::int64_t left = kUnlimited;
  const auto under = [&](int resource, const char* held_key) {
    rlimit r{};
    if (::getrlimit(resource, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return;
    const std::int64_t held = status_bytes(held_key);
    const auto cap = static_cast<std::int64_t>(std::min<rlim_t>(r.rlim_cur, static_cast<rlim_t>(kUnlimited)));
    left = std::min(left, std::max<std::int64_t>(0, cap - std::max<std::int64_t>(held, 0)));
  };
  under(RLIMIT_AS, "VmSize:");
  under(RLIMIT_DATA, "VmData:");
  return left;
}

// What a thread that runs BLAS and OpenMP work maps the first time it does:
// OpenBLAS's per-thread buffer (128 MiB in Debian's DYNAMIC_ARCH build; it
// retries a failed map of it forever, so it must never fail), glibc's arena
// for the thread (64 MiB reserved) and a stack.
constexpr std::int64_t kPerThreadBytes = (128 + 64 + 8) << 20;
// Slack kept under a limit for what no estimate counts (the profiler's
// records, the reference check, libraries' own allocations).
constexpr std::int64_t kLimitSlackBytes = 96 << 20;

// The CPUs online, read once: std::thread::hardware_concurrency() opens
// /sys/devices/system/cpu/online on every call, and set_threads runs on every
// call that sets other thread counts than its caller's (the bindings put the
// caller's back after each call): a file opened and read per attention call.
int hardware_threads() {
  static const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return hw;
}

class CpuRuntime final : public DeviceRuntime {
 public:
  explicit CpuRuntime(int threads) { set_threads(threads); }

  void set_threads(int threads) {
    const int hw = hardware_threads();
    const int want = threads > 0 ? threads : hw;
    // More BLAS threads than the address-space limit leaves room for would
    // hang in OpenBLAS's allocator: refused while nothing has started them.
    if (want > threads_ && want > warm_threads_) {
      const std::int64_t left = left_under_limits();
      const std::int64_t need = static_cast<std::int64_t>(want - std::max(threads_, warm_threads_)) * kPerThreadBytes;
      if (left != kUnlimited && left < need + kLimitSlackBytes) refuse_threads(want, need, left);
    }
    threads_ = want;
    omp_set_num_threads(threads_);
    cpu::blas_set_threads(threads_);
  }

  Device device() const override { return Device::Cpu; }
  Allocator& allocator() override { return cpu_allocator(); }

  // Free RAM, or under an address-space or data limit (ulimit -v, -d) what
  // is left under it, whichever is less. Under a limit, OpenBLAS's and the
  // threads' own needs come first: they are taken now, by one small product
  // on every thread, while they fit; if they do not, nothing is left (the
  // runner then refuses the run rather than hang in OpenBLAS).
  std::int64_t available_bytes() const override {
    std::int64_t free = kUnlimited;
    std::ifstream f("/proc/meminfo");
    std::string key;
    std::int64_t kb = 0;
    std::string unit;
    while (f >> key >> kb >> unit) {
      if (key == "MemAvailable:") {
        free = kb * 1024;
        break;
      }
    }
    std::int64_t left = left_under_limits();
    if (left == kUnlimited) return free;
    if (warm_threads_ < threads_) {
      const std::int64_t need = static_cast<std::int64_t>(threads_) * kPerThreadBytes;
      if (left < need + kLimitSlackBytes) refuse_threads(threads_, need, left);
      warm_up();
      left = left_under_limits();
    }
    return std::min(free, std::max<std::int64_t>(0, left - kLimitSlackBytes));
  }

  Inputs upload(const Inputs& host) override { return host; }
  Tensor upload(const Tensor& host) override { return host; }
  Tensor download(const Tensor& t) override { return t; }

  void poison(Tensor& t) override {
    for (std::int64_t b = 0; b < t.size(0); ++b)
      for (std::int64_t h = 0; h < t.size(1); ++h)
        for (std::int64_t i = 0; i < t.size(2); ++i)
          for (std::int64_t d = 0; d < t.size(3); ++d) t.set(b, h, i, d, std::numeric_limits<float>::quiet_NaN());
  }

  // The best of a few 1024^3 products on this many threads, per dtype. fp32
  // and fp16 (which every CPU kernel computes in FP32): OpenBLAS's sgemm. bf16:
  // the fastest of sgemm (what bf16 costs where nothing multiplies bf16),
  // OpenBLAS's cblas_sbgemm when the library exports it, and our own bf16
  // product on the best kernel level (AMX tiles, or AVX512-BF16 dot
  // products: flash_bf16_kernels.h), so "% ceiling" on an AMX machine is
  // judged against the AMX roof, not FP32's.
  double ceiling_tflops(DType dtype) override {
    // e4m3 inputs: every value is a bf16 one (flash's products are bf16; no
    // CPU multiplies e4m3), so their ceiling is bf16's.
    const bool bf16 = dtype == DType::BF16 || dtype == DType::F8E4M3;
    const auto key = std::make_pair(threads_, bf16);
    if (auto it = ceiling_.find(key); it != ceiling_.end()) return it->second;
    const int n = 1024;
    double best = 0;
    {
      std::vector<float> a(static_cast<std::size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size());
      best = best_of([&] { cpu::sgemm(false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n); }, n);
    }
    if (bf16) {
      std::vector<std::uint16_t> a(static_cast<std::size_t>(n) * n, 0x3f00), b(a.size(), 0x3e80);  // 0.5, 0.25
      std::vector<float> c(a.size());
      if (cpu::has_sbgemm()) {
        best = std::max(best, best_of([&] { cpu::sbgemm(n, n, n, a.data(), b.data(), c.data()); }, n));
      }
      const auto& k = cpu::flash::kernels_of(cpu::best_isa());
      if (k.bf16_gemm) {
        // Row blocks of 32 over the threads (each thread its own tile state).
        const auto* bv = reinterpret_cast<const std::uint32_t*>(b.data());
        const int blocks = n / 32;
        best = std::max(best, best_of(
                                  [&] {
#pragma omp parallel for num_threads(threads_) schedule(static)
                                    for (int blk = 0; blk < blocks; ++blk)
                                      k.bf16_gemm(a.data() + static_cast<std::size_t>(blk) * 32 * n, bv,
                                                  c.data() + static_cast<std::size_t>(blk) * 32 * n, 32, n, n);
                                  },
                                  n));
      }
    }
    ceiling_[key] = best;
    return best;
  }

  // What the bf16 ceiling is measured with, for the description.
  static std::string bf16_ceiling_source() {
    const auto& k = cpu::flash::kernels_of(cpu::best_isa());
    std::string s = "bf16 ceiling: the best of OpenBLAS sgemm";
    s += cpu::has_sbgemm() ? ", cblas_sbgemm" : " (this OpenBLAS exports no cblas_sbgemm)";
    if (k.bf16_gemm) s += std::string(", our ") + std::string(cpu::isa_name(k.isa)) + " bf16 product";
    return s;
  }

  // TFLOP/s of the best of three timed runs of `product` (one n^3 GEMM) after one untimed.
  template <class F>
  static double best_of(F&& product, int n) {
    double best = 0;
    for (int rep = 0; rep < 4; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      product();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (rep > 0 && s > 0) best = std::max(best, 2.0 * n * n * static_cast<double>(n) / s / 1e12);
    }
    return best;
  }

  double copy_bandwidth_gbs() override {
    // A memcpy split over this many threads (as the backends run), 128 MiB
    // each way: past the last-level cache of most CPUs, and small enough that
    // every process that profiles a run (each test, say) pays little for it
    // (about 0.2 s on two cores, most of it the first touch of the pages,
    // which each thread makes on the part it copies). Counted as the bytes
    // read plus the bytes written, as the GPU's copy is, over the best of a
    // few copies.
    if (auto it = copy_.find(threads_); it != copy_.end()) return it->second;
    const std::size_t bytes = std::size_t{128} << 20;
    const std::unique_ptr<char[]> src(new char[bytes]), dst(new char[bytes]);
    const auto pass = [&](bool first_touch) {
#pragma omp parallel num_threads(threads_)
      {
        const auto n = static_cast<std::size_t>(omp_get_num_threads());
        const auto t = static_cast<std::size_t>(omp_get_thread_num());
        const std::size_t lo = bytes / n * t, hi = t + 1 == n ? bytes : bytes / n * (t + 1);
        if (first_touch) {
          std::memset(src.get() + lo, 1, hi - lo);
          std::memset(dst.get() + lo, 0, hi - lo);
        } else {
          std::memcpy(dst.get() + lo, src.get() + lo, hi - lo);
        }
      }
    };
    pass(true);
    double best = 0;
    for (int rep = 0; rep < 4; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      pass(false);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s > 0) best = std::max(best, 2.0 * static_cast<double>(bytes) / s / 1e9);
    }
    copy_[threads_] = best;
    return best;
  }

  // One product big enough for OpenBLAS to split over every thread, and an
  // OpenMP region that allocates on each: every buffer, arena and stack the
  // runs will use is mapped now.
  void warm_up() const {
    const int n = 256;
    std::vector<float> a(static_cast<std::size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size());
    cpu::sgemm(false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
#pragma omp parallel num_threads(threads_)
    {
      volatile char* p = static_cast<char*>(std::malloc(4096));
      if (p) p[0] = 1;
      std::free(const_cast<char*>(p));
    }
    warm_threads_ = threads_;
  }

  [[noreturn]] static void refuse_threads(int threads, std::int64_t need, std::int64_t left) {
    fail(ErrorKind::OutOfMemory, std::to_string(threads) + " CPU thread" + (threads == 1 ? " needs" : "s need") +
                                     " about " + gib_str(need + kLimitSlackBytes) +
                                     " of address space for OpenBLAS's buffers, but only " + gib_str(left) +
                                     " is left under the process's memory limit (ulimit -v or -d): use fewer "
                                     "threads or raise the limit");
  }

  static std::string gib_str(std::int64_t bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(bytes) / (1024.0 * 1024 * 1024));
    return buf;
  }

  std::string description() const override {
    std::string cfg = cpu::blas_config();
    const cpu::IsaChoice isa = cpu::choose_isa();
    const std::string kernel =
        isa.error.empty() ? "flash cpu kernel: " + isa.why : "flash cpu kernel: refused (" + isa.error + ")";
    // OpenBLAS caps its own count at its build's MAX_THREADS: said where it runs fewer than the kernels' threads.
    const int blas = cpu::blas_threads();
    const std::string threads = std::to_string(threads_) + " threads" +
                                (blas > 0 && blas < threads_ ? " (OpenBLAS " + std::to_string(blas) + ")" : "");
    return cpu_model() + ", " + threads + ", " + cfg + ", " + kernel + ", " + bf16_ceiling_source();
  }

 private:
  int threads_ = 1;
  mutable int warm_threads_ = 0;                    // threads whose buffers warm_up() has mapped
  std::map<std::pair<int, bool>, double> ceiling_;  // TFLOP/s by (threads, bf16)
  std::map<int, double> copy_;                      // GB/s, by thread count
};

}  // namespace

namespace cpu {

DeviceRuntime& runtime(int threads) {
  static CpuRuntime rt(threads);
  rt.set_threads(threads);
  return rt;
}

}  // namespace cpu
}  // namespace attnprof
