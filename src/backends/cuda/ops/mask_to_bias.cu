// mask_to_bias.h: a boolean mask as cuDNN's additive bias, or as a compact
// copy. Memory-bound and one element a thread: the mask is read once and the
// bias written once, S * Skv elements for the usual [S, Skv] mask, next to an
// attention that reads Q, K and V and does S * Skv * D multiply-adds per head.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "attnprof/error.h"
#include "backends/cuda/ops/mask_to_bias.h"
#include "backends/cuda/ops/ops_common.h"

namespace attnprof::cuda {
namespace {

// out[e] = mask[index of e] ? if_true : if_false, out contiguous of sizes n.
template <class T>
__global__ void mask_to_bias_kernel(const std::uint8_t* mask, Dims ms, T* out, Dims n, std::int64_t total,
                                    float if_true, float if_false) {
  for (std::int64_t e = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; e < total;
       e += std::int64_t{gridDim.x} * blockDim.x) {
    const float v = mask[ops::dev::Index4(e, n).at(ms)] ? if_true : if_false;
    if constexpr (std::is_same_v<T, std::uint8_t>) {
      out[e] = static_cast<std::uint8_t>(v);
    } else {
      ops::dev::store(out, e, v);
    }
  }
}

template <class T>
void launch(const Tensor& mask, Tensor& out, cudaStream_t stream, float if_true, float if_false) {
  const Dims n = out.sizes();
  // A dimension the mask broadcasts (size 1) is read at its index 0 for
  // every index of out's.
  Dims ms = mask.strides();
  for (int d = 0; d < 4; ++d) {
    if (mask.size(d) == 1) ms[static_cast<std::size_t>(d)] = 0;
  }
  mask_to_bias_kernel<T><<<ops::detail::grid_for(out.numel()), ops::detail::kThreads, 0, stream>>>(
      mask.data_as<std::uint8_t>(), ms, out.data_as<T>(), n, out.numel(), if_true, if_false);
  ops::detail::check_launch();
}

}  // namespace

Dims compact_sizes(const Tensor& mask) {
  Dims sizes = mask.sizes();
  for (int d = 0; d < 4; ++d) {
    if (mask.stride(d) == 0) sizes[static_cast<std::size_t>(d)] = 1;
  }
  return sizes;
}

void mask_to_bias(const Tensor& mask, Tensor& out, void* stream) {
  const Dims compact = compact_sizes(mask);
  bool broadcasts = true;
  for (std::size_t d = 0; d < 4; ++d) broadcasts = broadcasts && (out.sizes()[d] == compact[d] || compact[d] == 1);
  if (mask.dtype() != DType::Bool || mask.device() != Device::Cuda || out.device() != Device::Cuda || !broadcasts ||
      !out.is_contiguous()) {
    fail(ErrorKind::Internal,
         "mask_to_bias: a CUDA bool mask into a contiguous tensor of its compact shape or one it broadcasts to, got " +
             mask.describe() + " into " + out.describe());
  }
  if (out.numel() == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  const float inf = INFINITY;
  switch (out.dtype()) {
    case DType::BF16:
      return launch<__nv_bfloat16>(mask, out, s, 0.0f, -inf);
    case DType::F16:
      return launch<__half>(mask, out, s, 0.0f, -inf);
    case DType::Bool:
      return launch<std::uint8_t>(mask, out, s, 1.0f, 0.0f);
    default:
      fail(ErrorKind::Internal, "mask_to_bias: a 16-bit bias or a bool copy, got " + out.describe());
  }
}

}  // namespace attnprof::cuda
