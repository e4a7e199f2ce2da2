// The element types of the fused kernels, as types: a kernel is instantiated
// for an element tag (Bf16, Fp16), never for a flag. A tag says how its values
// are stored in global and shared memory and which PTX type the tensor-core
// instructions name. E4m3 (FP8) is the 8-bit tag: a 1-byte Storage that
// only flash's sm90a forward takes (its inputs; O is bf16), the others
// constrained to Half16.
//
// Below the tags, the one set of conversions between f32 and an element that
// every kernel uses (the fused kernels, the runtime's fills, ring attention's
// merge): to_float, from_float and pack2, all rounding to nearest even.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <concepts>
#include <cstdint>

namespace attnprof::cuda::kernels {

struct Bf16 {
  using Storage = std::uint16_t;
  static constexpr const char* kName = "bf16";
};

struct Fp16 {
  using Storage = std::uint16_t;
  static constexpr const char* kName = "fp16";
};

// FP8 e4m3 (OCP "fn"), the tensor cores' .e4m3.
struct E4m3 {
  using Storage = std::uint8_t;
  static constexpr const char* kName = "e4m3";
};

// The 16-bit floating-point elements that every kernel here takes.
template <class T>
concept Half16 = std::same_as<T, Bf16> || std::same_as<T, Fp16>;

// What a TMA-fed sm90 forward reads its inputs in: a 16-bit type or e4m3.
template <class T>
concept InputElement = Half16<T> || std::same_as<T, E4m3>;
template <class T>
inline constexpr bool kIsFp8 = std::same_as<T, E4m3>;

// Four f32 values rounded to nearest (saturating to +-448) into one register
// of four e4m3 bytes, x0 in the lowest byte.
__device__ __forceinline__ std::uint32_t pack4_e4m3(float x0, float x1, float x2, float x3) {
  std::uint16_t lo, hi;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;\n" : "=h"(lo) : "f"(x0), "f"(x1));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %2, %1;\n" : "=h"(hi) : "f"(x2), "f"(x3));
  return static_cast<std::uint32_t>(lo) | (static_cast<std::uint32_t>(hi) << 16);
}

// An element's stored bits as f32 (exact: a bf16 is the top half of an f32).
template <Half16 Element>
__device__ __forceinline__ float to_float(typename Element::Storage x) {
  if constexpr (std::same_as<Element, Bf16>) {
    return __uint_as_float(static_cast<std::uint32_t>(x) << 16);
  } else {
    return __half2float(__ushort_as_half(x));
  }
}

// An f32 rounded to nearest into an element's bits.
template <Half16 Element>
__device__ __forceinline__ typename Element::Storage from_float(float x) {
  if constexpr (std::same_as<Element, Bf16>) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  } else {
    return __half_as_ushort(__float2half_rn(x));
  }
}

// Two f32 values rounded to nearest into one register of two elements; the
// lower column sits in the low half.
template <Half16 Element>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi) {
  if constexpr (std::same_as<Element, Bf16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const std::uint32_t*>(&v);
  }
}

}  // namespace attnprof::cuda::kernels
