// Architecture-neutral device helpers of the fused kernels: shared-memory
// addresses, the P operand of O += P V packed out of the S accumulators
// (element.cuh's pack2), the fast base-2 exponential and accumulator zeroing.
// Nothing here names an mma or wgmma instruction.
#pragma once

#include <cstdint>

#include "backends/cuda/kernels/element.cuh"

namespace attnprof::cuda::kernels {

__device__ __forceinline__ std::uint32_t smem_u32(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// The A fragment of key step kk of O += P V, from the S accumulators (f32, the
// C layout of mma.m16n8k16 and of wgmma's accumulators): n-tiles 2kk and 2kk+1
// hold exactly its rows and columns 2t and 2t+8, so P never leaves registers.
template <Half16 Element, int kNTiles>
__device__ __forceinline__ void pack_p(std::uint32_t (&a)[4], const float (&s)[kNTiles][4], int kk) {
  a[0] = pack2<Element>(s[2 * kk][0], s[2 * kk][1]);
  a[1] = pack2<Element>(s[2 * kk][2], s[2 * kk][3]);
  a[2] = pack2<Element>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
  a[3] = pack2<Element>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// Programmatic dependent launch (sm90): a kernel launched with
// launch_after_prior (fwd_launch.cuh) may start while the kernel before it on
// the stream finishes; it must wait_prior_grid() before it reads what that
// kernel writes (or writes what it reads), and the kernel before may let it
// start early with allow_dependents(). Both are no-ops below sm90 and for a
// kernel launched the ordinary way.
__device__ __forceinline__ void wait_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// 2^x in one MUFU instruction; ex2(-inf) = +0, which masked scores rely on.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// tanh in one MUFU instruction (relative error 2^-11, as FlashAttention-3's).
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Accumulator fragments to zero: one tile's n-tiles, or several tiles'.
template <int kN>
__device__ __forceinline__ void zero(float (&x)[kN][4]) {
#pragma unroll
  for (int j = 0; j < kN; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) x[j][e] = 0.f;
}
template <int kA, int kB>
__device__ __forceinline__ void zero(float (&x)[kA][kB][4]) {
#pragma unroll
  for (int i = 0; i < kA; ++i)
#pragma unroll
    for (int j = 0; j < kB; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) x[i][j][e] = 0.f;
}

// Accumulator fragments times c.
template <int kA, int kB>
__device__ __forceinline__ void scale_acc(float (&x)[kA][kB][4], float c) {
#pragma unroll
  for (int i = 0; i < kA; ++i)
#pragma unroll
    for (int j = 0; j < kB; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) x[i][j][e] *= c;
}

}  // namespace attnprof::cuda::kernels
