// The CUDA device runtime: device 0, one non-blocking stream, the caching
// allocator, CUPTI (or device-event) collectors, the cuBLAS ceiling and the
// device-to-device copy ceiling.
#include "backends/cuda/runtime.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include "attnprof/error.h"
#include "backends/cuda/caching_allocator.h"
#include "backends/cuda/cuda_backends.h"
#include "core/cuda_check.h"
#include "profiler/cupti/cupti_collector.h"
#include "profiler/cupti/event_timing_collector.h"

#ifdef ATTNPROF_WITH_CUDNN
// Declared here rather than through cudnn.h: only the version is needed, and
// this file should not depend on where cuDNN's headers live.
extern "C" std::size_t cudnnGetVersion(void);
#endif

namespace attnprof::cuda {
namespace {

constexpr int kDevice = 0;

// The kernel module's version ("580.65.06"); the runtime API only knows the
// CUDA version the driver supports.
std::string driver_version() {
  std::ifstream f("/proc/driver/nvidia/version");
  std::string line;
  if (std::getline(f, line)) {
    std::istringstream words(line);
    std::string w, previous;
    while (words >> w) {
      if (previous == "Module" && !w.empty() && std::isdigit(static_cast<unsigned char>(w[0]))) return w;
      previous = w;
    }
  }
  int v = 0;
  cudaDriverGetVersion(&v);
  return "for CUDA " + std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
}

// Element range [lo, hi] a strided view touches, relative to its first
// element, so a copy of that range keeps every stride (including the 0
// strides of expanded masks) without materialising anything.
std::pair<std::int64_t, std::int64_t> extent(const Tensor& t) {
  std::int64_t lo = 0, hi = 0;
  for (int d = 0; d < 4; ++d) {
    if (t.size(d) == 0) return {0, -1};
    const std::int64_t span = (t.size(d) - 1) * t.stride(d);
    (span < 0 ? lo : hi) += span;
  }
  return {lo, hi};
}

// A tensor of `like`'s sizes and strides on `allocator`, whose storage is
// exactly `like`'s extent; returns it and the byte pointers to copy between.
struct Mirror {
  Tensor tensor;
  char* dst = nullptr;
  const char* src = nullptr;
  std::size_t bytes = 0;
};

Mirror mirror(const Tensor& like, Allocator& allocator) {
  const auto [lo, hi] = extent(like);
  const std::int64_t n = hi - lo + 1;
  const auto es = static_cast<std::int64_t>(element_size(like.dtype()));
  Tensor storage = Tensor::empty({std::max<std::int64_t>(n, 0), 1, 1, 1}, like.dtype(), allocator);
  Mirror m;
  m.tensor = storage.as_strided(like.sizes(), like.strides(), -lo);
  m.dst = static_cast<char*>(storage.data());
  m.src = static_cast<const char*>(like.data()) + lo * es;
  m.bytes = static_cast<std::size_t>(std::max<std::int64_t>(n, 0) * es);
  return m;
}

}  // namespace

Tensor download_on(const Tensor& t, cudaStream_t stream) {
  if (!t.defined()) return {};
  if (t.device() != Device::Cuda) return t;
  Mirror m = mirror(t, cpu_allocator());
  if (m.bytes) ATTNPROF_CUDA_CHECK(cudaMemcpyAsync(m.dst, m.src, m.bytes, cudaMemcpyDeviceToHost, stream));
  ATTNPROF_CUDA_CHECK(cudaStreamSynchronize(stream));
  return m.tensor;
}

namespace {

class CudaRuntime final : public DeviceRuntime {
 public:
  CudaRuntime() {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
      cudaGetLastError();
      throw Error(ErrorKind::Unsupported, std::string("no CUDA device: ") +
                                              (e != cudaSuccess ? cudaGetErrorString(e) : "none found") +
                                              "; use device=cpu");
    }
    ATTNPROF_CUDA_CHECK(cudaSetDevice(kDevice));
    ATTNPROF_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    properties_ = cupti::query_device_properties(kDevice);
    cupti::install_nvtx_ranges();
  }

  Device device() const override { return Device::Cuda; }
  Allocator& allocator() override { return allocator_; }
  void* stream() override { return stream_; }
  void synchronize() override { ATTNPROF_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

  std::int64_t available_bytes() const override {
    std::size_t free_bytes = 0, total = 0;
    ATTNPROF_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    return static_cast<std::int64_t>(free_bytes) + allocator_.cached_bytes();
  }

  std::vector<std::unique_ptr<Collector>> make_collectors() override {
    std::vector<std::unique_ptr<Collector>> out;
    // ATTNPROF_NO_CUPTI=1 takes the device-event path on purpose (under
    // compute-sanitizer, which cannot share the GPU with CUPTI, say).
    if (const char* off = std::getenv("ATTNPROF_NO_CUPTI"); off && *off && std::string(off) != "0") {
      out.push_back(std::make_unique<cupti::EventTimingCollector>(stream_, "disabled by ATTNPROF_NO_CUPTI"));
    } else if (std::string reason = cupti::probe(); reason.empty()) {
      out.push_back(std::make_unique<cupti::CuptiCollector>());
    } else {
      out.push_back(std::make_unique<cupti::EventTimingCollector>(stream_, std::move(reason)));
    }
    return out;
  }

  Inputs upload(const Inputs& host) override {
    Inputs d;
    d.q = to_device(host.q);
    d.k = to_device(host.k);
    d.v = to_device(host.v);
    d.mask = to_device(host.mask);
    d.bias = to_device(host.bias);
    d.k_pages = to_device(host.k_pages);
    d.v_pages = to_device(host.v_pages);
    d.block_table = to_device(host.block_table);
    d.q_rows = to_device(host.q_rows);
    d.kv_rows = to_device(host.kv_rows);
    // FP8 inputs' descales travel with their tensors (real = e4m3 x descale).
    d.q_descale = host.q_descale;
    d.k_descale = host.k_descale;
    d.v_descale = host.v_descale;
    synchronize();  // the host buffers may be freed as soon as we return
    return d;
  }

  Tensor upload(const Tensor& host) override {
    Tensor d = to_device(host);
    synchronize();
    return d;
  }

  // Same sizes and strides on the host (a strided view when the device tensor
  // was one); element access through Tensor::get works either way.
  Tensor download(const Tensor& t) override { return download_on(t, stream_); }
  Tensor download(const Tensor& t, void* stream) override { return download_on(t, static_cast<cudaStream_t>(stream)); }

  void poison(Tensor& t) override {
    if (!t.defined()) return;
    const auto [lo, hi] = extent(t);
    if (hi < lo) return;
    const auto es = static_cast<std::int64_t>(element_size(t.dtype()));
    // All-ones bytes are a NaN in fp32, fp16, bf16 and e4m3 alike.
    ATTNPROF_CUDA_CHECK(cudaMemsetAsync(static_cast<char*>(t.data()) + lo * es, 0xFF,
                                        static_cast<std::size_t>((hi - lo + 1) * es), stream_));
  }

  double ceiling_tflops(DType dtype) override {
    std::lock_guard lock(ceiling_mutex_);
    if (auto it = ceiling_.find(dtype); it != ceiling_.end()) return it->second;
    const double tflops = measure_gemm(dtype);
    ceiling_.emplace(dtype, tflops);
    return tflops;
  }

  double copy_bandwidth_gbs() override {
    std::lock_guard lock(ceiling_mutex_);
    if (!copy_gbs_) copy_gbs_ = measure_copy();
    return *copy_gbs_;
  }

  std::string description() const override {
    int runtime = 0;
    cudaRuntimeGetVersion(&runtime);
    int major = 0, minor = 0, patch = 0;
    cublasGetProperty(MAJOR_VERSION, &major);
    cublasGetProperty(MINOR_VERSION, &minor);
    cublasGetProperty(PATCH_LEVEL, &patch);
    std::string s = properties_.name + ", driver " + driver_version() + ", CUDA runtime " +
                    std::to_string(runtime / 1000) + "." + std::to_string(runtime % 1000 / 10) + ", cuBLAS " +
                    std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
#ifdef ATTNPROF_WITH_CUDNN
    const std::size_t v = cudnnGetVersion();  // 9.x: major * 10000 + minor * 100 + patch
    s += ", cuDNN " + std::to_string(v / 10000) + "." + std::to_string(v % 10000 / 100) + "." + std::to_string(v % 100);
#endif
    return s;
  }

  std::optional<DeviceProperties> properties() const override { return properties_; }

 private:
  Tensor to_device(const Tensor& h) {
    if (!h.defined()) return {};
    Mirror m = mirror(h, allocator_);
    if (m.bytes) ATTNPROF_CUDA_CHECK(cudaMemcpyAsync(m.dst, m.src, m.bytes, cudaMemcpyHostToDevice, stream_));
    return m.tensor;
  }

  // Median TFLOP/s of square GEMMs on random data, after warm-up: 16-bit types
  // on tensor cores with FP32 accumulation (as the attention GEMMs run), FP32
  // as plain SGEMM (CUBLAS_DEFAULT_MATH, so TF32 stays off).
  double measure_gemm(DType dtype);
  // Best GB/s of large device-to-device copies (read plus written bytes).
  double measure_copy();

  CachingAllocator allocator_{kDevice};
  cudaStream_t stream_ = nullptr;
  DeviceProperties properties_;
  std::mutex ceiling_mutex_;
  std::map<DType, double> ceiling_;
  std::optional<double> copy_gbs_;
};

// Raw device buffers for the ceilings' GEMM and copy: kept off the tracked
// allocator so that measuring a ceiling never shows in a run's memory figures.
class Scratch {
 public:
  explicit Scratch(std::size_t bytes) { ATTNPROF_CUDA_CHECK(cudaMalloc(&ptr_, bytes)); }
  ~Scratch() { cudaFree(ptr_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

class BlasHandle {
 public:
  BlasHandle() { ATTNPROF_CUBLAS_CHECK(cublasCreate(&h_)); }
  ~BlasHandle() { cublasDestroy(h_); }
  BlasHandle(const BlasHandle&) = delete;
  BlasHandle& operator=(const BlasHandle&) = delete;
  cublasHandle_t get() const { return h_; }

 private:
  cublasHandle_t h_ = nullptr;
};

// A timing event, destroyed however the timing ends.
class Event {
 public:
  Event() { ATTNPROF_CUDA_CHECK(cudaEventCreate(&e_)); }
  ~Event() { cudaEventDestroy(e_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

// Milliseconds of each of `reps` runs of `work` on `stream`, timed with events.
template <class Work>
std::vector<float> time_ms(cudaStream_t stream, int reps, Work&& work) {
  Event begin, end;
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) {
    ATTNPROF_CUDA_CHECK(cudaEventRecord(begin.get(), stream));
    work();
    ATTNPROF_CUDA_CHECK(cudaEventRecord(end.get(), stream));
    ATTNPROF_CUDA_CHECK(cudaEventSynchronize(end.get()));
    float t = 0;
    ATTNPROF_CUDA_CHECK(cudaEventElapsedTime(&t, begin.get(), end.get()));
    ms.push_back(t);
  }
  return ms;
}

double CudaRuntime::measure_gemm(DType dtype) {
  if (dtype == DType::Bool) throw Error(ErrorKind::InvalidArgument, "no matrix-product ceiling for bool");
  if (is_fp8(dtype)) {
    // cublasGemmEx takes no FP8 (cuBLASLt's FP8 GEMM is not measured here):
    // the dense e4m3 tensor-core rate is twice bf16's from sm89 on (Ada,
    // Hopper), so the measured bf16 ceiling doubled stands for it; before
    // sm89 there are no FP8 tensor cores and bf16's is the ceiling.
    const bool fp8_cores =
        properties_.compute_major > 8 || (properties_.compute_major == 8 && properties_.compute_minor >= 9);
    return (fp8_cores ? 2.0 : 1.0) * measure_gemm(DType::BF16);
  }
  const std::size_t es = element_size(dtype);
  std::size_t free_bytes = 0, total = 0;
  ATTNPROF_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  // 8192^3 saturates an H200; smaller sizes when memory is held by a run.
  std::int64_t n = 8192;
  while (n > 1024 && 3 * static_cast<std::size_t>(n * n) * es > free_bytes / 2) n /= 2;
  const std::size_t elems = static_cast<std::size_t>(n * n);
  Scratch a(elems * es), b(elems * es), c(elems * es);
  fill_uniform(a.get(), static_cast<std::int64_t>(elems), dtype, 1, stream_);
  fill_uniform(b.get(), static_cast<std::int64_t>(elems), dtype, 2, stream_);

  BlasHandle blas;
  ATTNPROF_CUBLAS_CHECK(cublasSetStream(blas.get(), stream_));
  ATTNPROF_CUBLAS_CHECK(cublasSetMathMode(blas.get(), CUBLAS_DEFAULT_MATH));
  const cudaDataType_t type = dtype == DType::F32 ? CUDA_R_32F : dtype == DType::F16 ? CUDA_R_16F : CUDA_R_16BF;
  const float alpha = 1.0f, beta = 0.0f;
  const int ni = static_cast<int>(n);
  auto gemm = [&] {
    ATTNPROF_CUBLAS_CHECK(cublasGemmEx(blas.get(), CUBLAS_OP_N, CUBLAS_OP_N, ni, ni, ni, &alpha, a.get(), type, ni,
                                       b.get(), type, ni, &beta, c.get(), type, ni, CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT));
  };
  for (int i = 0; i < 3; ++i) gemm();  // heuristics, clocks and caches settle

  std::vector<float> ms = time_ms(stream_, 7, gemm);
  std::sort(ms.begin(), ms.end());
  const double median_s = static_cast<double>(ms[ms.size() / 2]) * 1e-3;
  const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  return median_s > 0 ? flops / median_s / 1e12 : 0.0;
}

// 512 MiB each way, eight times the H200's 60 MiB L2, so the copy streams
// through DRAM; halved while a run holds the memory. A device-to-device copy
// reads every byte once and writes it once: both are counted, 2 x size over
// the time, as CUDA's bandwidthTest counts one. The best of ten, after an
// untimed copy. Measured on the H200 this way (2026-12-01): 4.14 TB/s at
// 512 MiB (4.18 at 1 GiB, 3.94 at 128 MiB), against its 4.8 TB/s peak.
double CudaRuntime::measure_copy() {
  std::size_t free_bytes = 0, total = 0;
  ATTNPROF_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
  std::size_t bytes = std::size_t{512} << 20;
  while (bytes > (std::size_t{32} << 20) && 2 * bytes > free_bytes / 2) bytes /= 2;
  Scratch src(bytes), dst(bytes);
  ATTNPROF_CUDA_CHECK(cudaMemsetAsync(src.get(), 0x3c, bytes, stream_));
  const auto copy = [&] {
    ATTNPROF_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, stream_));
  };
  copy();
  const std::vector<float> ms = time_ms(stream_, 10, copy);
  const double best_s = static_cast<double>(*std::min_element(ms.begin(), ms.end())) * 1e-3;
  return best_s > 0 ? 2.0 * static_cast<double>(bytes) / best_s / 1e9 : 0.0;
}

}  // namespace

DeviceRuntime& runtime() {
  // Leaked on purpose: tensors may outlive static destruction order, and the
  // CUDA runtime may already be unloading by then. A constructor that throws
  // (no GPU) leaves it unset, so a later call tries again.
  static CudaRuntime* instance = new CudaRuntime();
  return *instance;
}

}  // namespace attnprof::cuda
