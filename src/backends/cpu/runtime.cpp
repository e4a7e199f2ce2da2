// The CPU as a profiling device: the tracked CPU allocator, OpenMP and
// OpenBLAS thread counts, and a measured sgemm ceiling.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "attnprof/device_runtime.h"
#include "attnprof/error.h"
#include "backends/cpu/blas.h"
#include "backends/cpu/cpu_backends.h"

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

class CpuRuntime final : public DeviceRuntime {
 public:
  explicit CpuRuntime(int threads) { set_threads(threads); }

  void set_threads(int threads) {
    const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    threads_ = threads > 0 ? threads : hw;
    omp_set_num_threads(threads_);
    cpu::blas_set_threads(threads_);
  }

  Device device() const override { return Device::Cpu; }
  Allocator& allocator() override { return cpu_allocator(); }

  std::int64_t available_bytes() const override {
    std::ifstream f("/proc/meminfo");
    std::string key;
    std::int64_t kb = 0;
    std::string unit;
    while (f >> key >> kb >> unit) {
      if (key == "MemAvailable:") return kb * 1024;
    }
    return std::numeric_limits<std::int64_t>::max();
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

  double ceiling_tflops(DType) override {
    // 16-bit values are computed in FP32 on the CPU, so one sgemm ceiling
    // serves every dtype: the best of a few 1024^3 products on this many threads.
    if (auto it = ceiling_.find(threads_); it != ceiling_.end()) return it->second;
    const int n = 1024;
    std::vector<float> a(static_cast<std::size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size());
    double best = 0;
    for (int rep = 0; rep < 4; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      cpu::sgemm(false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (rep > 0) best = std::max(best, 2.0 * n * n * n / s / 1e12);
    }
    ceiling_[threads_] = best;
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

  std::string description() const override {
    std::string cfg = cpu::blas_config();
    return cpu_model() + ", " + std::to_string(threads_) + " threads, " + cfg;
  }

 private:
  int threads_ = 1;
  std::map<int, double> ceiling_;
  std::map<int, double> copy_;  // GB/s, by thread count
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
