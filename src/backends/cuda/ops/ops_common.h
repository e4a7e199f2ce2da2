// Internals shared by the ops translation units: the op range, element-type
// dispatch and launch helpers. Not part of the ops interface.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include "attnprof/backend.h"
#include "attnprof/error.h"
#include "attnprof/profiler.h"
#include "attnprof/tensor.h"
#include "core/cuda_check.h"

namespace attnprof::cuda::ops::detail {

// A RecordFunction that formats its input dtypes and dims only while a profiler
// records, so an unprofiled forward pays for no string building.
class OpRange {
 public:
  OpRange(std::string_view name, std::initializer_list<const Tensor*> inputs, bool scalar = false) {
    Profiler* prof = Profiler::current();
    if (prof == nullptr || !prof->recording()) {
      range_.emplace(name);
      return;
    }
    std::string dtypes, dims;
    for (const Tensor* t : inputs) {
      if (!dtypes.empty()) dtypes += ", ", dims += ", ";
      dtypes += dtype_name(t->dtype());
      dims += t->dims_string();
    }
    if (scalar) dtypes += dtypes.empty() ? "Scalar" : ", Scalar", dims += dims.empty() ? "[]" : ", []";
    range_.emplace(name, dtypes, dims);
  }

 private:
  std::optional<RecordFunction> range_;
};

inline cudaStream_t stream_of(const RunContext& ctx) { return static_cast<cudaStream_t>(ctx.stream); }

// Strides that read `t` as if expanded to `sizes` (0 on broadcast dims).
inline Dims broadcast_strides(const Tensor& t, const Dims& sizes) {
  Dims s{};
  for (int d = 0; d < 4; ++d) {
    const std::int64_t n = t.size(d);
    if (n != sizes[static_cast<std::size_t>(d)] && n != 1) {
      fail(ErrorKind::Internal, "cannot broadcast " + t.describe() + " to the scores' shape");
    }
    s[static_cast<std::size_t>(d)] = n == 1 ? 0 : t.stride(d);
  }
  return s;
}

inline void require_cuda(const Tensor& t, const char* what) {
  if (t.device() != Device::Cuda) fail(ErrorKind::Internal, std::string(what) + " must be a CUDA tensor");
}

inline void require_contiguous(const Tensor& t, const char* op) {
  require_cuda(t, op);
  if (!t.is_contiguous())
    fail(ErrorKind::Internal, std::string(op) + " expects a contiguous tensor, got " + t.describe());
}

// Grid for `work` items at 256 threads a block; kernels loop grid-stride, so
// the grid is capped rather than the work.
constexpr int kThreads = 256;
inline unsigned grid_for(std::int64_t work) {
  const std::int64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > (1 << 20) ? (1 << 20) : blocks));
}

inline void check_launch() { ATTNPROF_CUDA_CHECK(cudaGetLastError()); }

}  // namespace attnprof::cuda::ops::detail

// Device element types by DType; conversions go through float.
namespace attnprof::cuda::ops::dev {

template <class T>
__device__ __forceinline__ float load(const T* p, std::int64_t i) {
  if constexpr (std::is_same_v<T, float>)
    return p[i];
  else if constexpr (std::is_same_v<T, __half>)
    return __half2float(p[i]);
  else
    return __bfloat162float(p[i]);
}

template <class T>
__device__ __forceinline__ void store(T* p, std::int64_t i, float v) {
  if constexpr (std::is_same_v<T, float>)
    p[i] = v;
  else if constexpr (std::is_same_v<T, __half>)
    p[i] = __float2half_rn(v);
  else
    p[i] = __float2bfloat16_rn(v);
}

// The 4-d index of element e of a contiguous tensor of sizes n; at(s) is its
// offset in a tensor of strides s (a broadcast view has zeros there).
struct Index4 {
  std::int64_t i0, i1, i2, i3;
  __device__ __forceinline__ Index4(std::int64_t e, const Dims& n) {
    i3 = e % n[3];
    e /= n[3];
    i2 = e % n[2];
    e /= n[2];
    i1 = e % n[1];
    i0 = e / n[1];
  }
  __device__ __forceinline__ std::int64_t at(const Dims& s) const {
    return i0 * s[0] + i1 * s[1] + i2 * s[2] + i3 * s[3];
  }
};

// Packs of N elements moved as one aligned load/store (16 bytes for 16-bit N = 8).
template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

}  // namespace attnprof::cuda::ops::dev

// Calls the lambda passed last with T aliased to the device type of a floating
// DType, so one body serves float, half and bfloat16.
#define ATTNPROF_DISPATCH_FLOAT(dtype, T, ...)                                     \
  [&] {                                                                            \
    switch (dtype) {                                                               \
      case ::attnprof::DType::F32: {                                               \
        using T = float;                                                           \
        return __VA_ARGS__();                                                      \
      }                                                                            \
      case ::attnprof::DType::F16: {                                               \
        using T = __half;                                                          \
        return __VA_ARGS__();                                                      \
      }                                                                            \
      case ::attnprof::DType::BF16: {                                              \
        using T = __nv_bfloat16;                                                   \
        return __VA_ARGS__();                                                      \
      }                                                                            \
      default:                                                                     \
        ::attnprof::fail(::attnprof::ErrorKind::Internal, "not a floating dtype"); \
    }                                                                              \
  }()
