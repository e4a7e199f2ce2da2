// fp8_output.h: cuDNN's e4m3 O into the bf16 output. Memory-bound: O is read
// once (1 byte an element) and written once (2 bytes), B * H * S * D
// elements next to an attention that does S * Skv * D multiply-adds per head
// and row block. Eight elements a thread where the output's rows allow it
// (an 8-byte load, a 16-byte store), one otherwise.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attnprof/error.h"
#include "backends/cuda/ops/fp8_output.h"
#include "backends/cuda/ops/ops_common.h"

namespace attnprof::cuda {
namespace {

__device__ __forceinline__ float2 e4m3x2_to_float2(std::uint16_t two) {
  const __half2 h(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two), __NV_E4M3));
  return __half22float2(h);
}

// Element e of the contiguous `in` goes to out at its index's offset; each
// thread takes N consecutive elements of one row (N divides D; with N = 8 the
// output's rows start 16-byte aligned, checked by the launcher).
template <int N>
__global__ void e4m3_to_bf16_kernel(const std::uint8_t* in, __nv_bfloat16* out, Dims sizes, Dims out_strides,
                                    std::int64_t packs, float descale, const float* descale_device) {
  // A device descale (the caller's tensor) times `descale`, read here: the
  // product the host takes for a float descale, so the bits agree.
  if (descale_device != nullptr) descale *= *descale_device;
  for (std::int64_t c = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; c < packs;
       c += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t e = c * N;
    __nv_bfloat16* dst = out + ops::dev::Index4(e, sizes).at(out_strides);
    if constexpr (N == 8) {
      const uint2 raw = reinterpret_cast<const uint2*>(in)[c];
      ops::dev::Pack<__nv_bfloat16, 8> o;
      const std::uint32_t words[2] = {raw.x, raw.y};
#pragma unroll
      for (int w = 0; w < 2; ++w) {
        const float2 lo = e4m3x2_to_float2(static_cast<std::uint16_t>(words[w] & 0xffffu));
        const float2 hi = e4m3x2_to_float2(static_cast<std::uint16_t>(words[w] >> 16));
        o.v[4 * w + 0] = __float2bfloat16_rn(lo.x * descale);
        o.v[4 * w + 1] = __float2bfloat16_rn(lo.y * descale);
        o.v[4 * w + 2] = __float2bfloat16_rn(hi.x * descale);
        o.v[4 * w + 3] = __float2bfloat16_rn(hi.y * descale);
      }
      *reinterpret_cast<ops::dev::Pack<__nv_bfloat16, 8>*>(dst) = o;
    } else {
      const __half h(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(in[e]), __NV_E4M3));
      *dst = __float2bfloat16_rn(__half2float(h) * descale);
    }
  }
}

template <int N>
void launch(const Tensor& in, Tensor& out, float descale, const float* descale_device, cudaStream_t stream) {
  const std::int64_t packs = in.numel() / N;
  e4m3_to_bf16_kernel<N><<<ops::detail::grid_for(packs), ops::detail::kThreads, 0, stream>>>(
      in.data_as<std::uint8_t>(), out.data_as<__nv_bfloat16>(), in.sizes(), out.strides(), packs, descale,
      descale_device);
  ops::detail::check_launch();
}

// Whether each thread's eight elements are one 16-byte-aligned run of `out`.
bool packs_of_eight(const Tensor& in, const Tensor& out) {
  if (out.size(3) % 8 != 0 || (out.size(3) > 1 && out.stride(3) != 1)) return false;
  for (int d = 0; d < 3; ++d) {
    if (out.stride(d) % 8 != 0) return false;
  }
  return reinterpret_cast<std::uintptr_t>(out.data()) % 16 == 0 && reinterpret_cast<std::uintptr_t>(in.data()) % 8 == 0;
}

// The graph's six input scalars, each `stride` floats apart: slot i is
// device[i] where given, else host[i]; with o_headroom > 0, slot 5 (scale_o)
// is 1 / (o_headroom x V's descale) from the descale slot 2 took. One thread.
__global__ void fp8_graph_scalars_kernel(Fp8GraphScalars s, float* slots, int stride, float o_headroom) {
  float v[6];
#pragma unroll
  for (int i = 0; i < 6; ++i) v[i] = i < 3 && s.device[i] != nullptr ? *s.device[i] : s.host[i];
  if (o_headroom > 0.f) v[5] = 1.0f / (o_headroom * v[2]);
#pragma unroll
  for (int i = 0; i < 6; ++i) slots[i * stride] = v[i];
}

}  // namespace

void fp8_graph_scalars(const Fp8GraphScalars& s, float* slots, int stride, float o_headroom, void* stream) {
  fp8_graph_scalars_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(s, slots, stride, o_headroom);
  ops::detail::check_launch();
}

void e4m3_to_bf16(const Tensor& in, float descale, Tensor& out, void* stream) {
  e4m3_to_bf16(in, descale, nullptr, out, stream);
}

void e4m3_to_bf16(const Tensor& in, float descale, const float* descale_device, Tensor& out, void* stream) {
  if (in.dtype() != DType::F8E4M3 || !in.is_contiguous() || in.device() != Device::Cuda || out.dtype() != DType::BF16 ||
      out.device() != Device::Cuda || out.sizes() != in.sizes()) {
    fail(ErrorKind::Internal, "e4m3_to_bf16: a contiguous CUDA e4m3 tensor into a bf16 one of its sizes, got " +
                                  in.describe() + " into " + out.describe());
  }
  if (in.numel() == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  if (packs_of_eight(in, out)) return launch<8>(in, out, descale, descale_device, s);
  launch<1>(in, out, descale, descale_device, s);
}

}  // namespace attnprof::cuda
