#include <algorithm>
#include <concepts>
#include <cstdint>

#include "attnprof/error.h"
#include "backends/cuda/kernels/element.cuh"
#include "backends/cuda/runtime.h"
#include "core/cuda_check.h"

namespace attnprof::cuda {
namespace {

// splitmix64: a good mix of the counter for one multiply-xorshift chain.
__device__ std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

__device__ float uniform(std::uint64_t seed, std::int64_t i) {
  const auto bits = static_cast<std::uint32_t>(mix(seed ^ mix(static_cast<std::uint64_t>(i))) >> 40);  // 24 bits
  return static_cast<float>(bits) * (2.0f / 16777216.0f) - 1.0f;
}

// Element: float, or an element tag of element.cuh (Bf16, Fp16), whose
// conversion rounds the f32 draw to nearest.
template <class Element>
__global__ void fill_uniform_kernel(void* data, std::int64_t n, std::uint64_t seed) {
  const std::int64_t stride = static_cast<std::int64_t>(gridDim.x) * blockDim.x;
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if constexpr (std::same_as<Element, float>) {
      static_cast<float*>(data)[i] = uniform(seed, i);
    } else {
      static_cast<typename Element::Storage*>(data)[i] = kernels::from_float<Element>(uniform(seed, i));
    }
  }
}

template <class Element>
void launch(void* data, std::int64_t n, std::uint64_t seed, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const std::int64_t blocks = std::min<std::int64_t>((n + kThreads - 1) / kThreads, 65536);
  if (blocks == 0) return;
  fill_uniform_kernel<Element><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(data, n, seed);
  ATTNPROF_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void fill_uniform(void* data, std::int64_t n, DType dtype, std::uint64_t seed, cudaStream_t stream) {
  switch (dtype) {
    case DType::F32:
      return launch<float>(data, n, seed, stream);
    case DType::F16:
      return launch<kernels::Fp16>(data, n, seed, stream);
    case DType::BF16:
      return launch<kernels::Bf16>(data, n, seed, stream);
    case DType::Bool:
    case DType::I32:
      break;
  }
  throw Error(ErrorKind::Internal, "fill_uniform: a floating dtype is required");
}

}  // namespace attnprof::cuda
