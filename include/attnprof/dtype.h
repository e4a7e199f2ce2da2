// Element types. 16-bit types are stored as 16 bits and computed in FP32 on the CPU.
// F8E4M3 (FP8, OCP e4m3 "fn": no infinity, 448 the largest finite value) is a
// problem's input dtype only: q, k and v are stored in it with a per-tensor
// descale each (Inputs::q_descale ...: the real value is stored x descale),
// and the output is bf16 (output_dtype()), as FlashAttention-3 and cuDNN's
// FP8 graphs take it.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace attnprof {

// I32 holds indices only (a paged KV cache's block table): never a problem's dtype.
enum class DType : std::uint8_t { F32, F16, BF16, Bool, I32, F8E4M3 };

// Per-dtype facts, in the enum's order (F32, F16, BF16, Bool, I32, F8E4M3).
namespace detail {
struct DTypeInfo {
  std::string_view name;
  std::size_t size;
  double max_finite;  // the largest finite value (0 for bool and int32)
};
inline constexpr std::array<DTypeInfo, 6> kDTypes{{
    {"fp32", 4, 3.4028234663852886e38},
    {"fp16", 2, 65504.0},
    {"bf16", 2, 3.3895313892515355e38},  // (2 - 2^-7) x 2^127
    {"bool", 1, 0},
    {"int32", 4, 0},
    {"fp8", 1, 448.0},  // e4m3: 1.75 x 2^8
}};
constexpr const DTypeInfo& info(DType t) { return kDTypes[static_cast<std::size_t>(t)]; }
}  // namespace detail

constexpr std::size_t element_size(DType t) { return detail::info(t).size; }
constexpr std::string_view dtype_name(DType t) { return detail::info(t).name; }

constexpr bool is_16bit(DType t) { return t == DType::F16 || t == DType::BF16; }
constexpr bool is_fp8(DType t) { return t == DType::F8E4M3; }

// The dtype a problem's output (O, and the gradients) is stored in: bf16 for
// FP8 inputs, the input dtype otherwise.
constexpr DType output_dtype(DType t) { return is_fp8(t) ? DType::BF16 : t; }

// The largest finite value a floating dtype holds (0 for bool).
constexpr double max_finite(DType t) { return detail::info(t).max_finite; }

// Parses the user-facing names fp32, fp16, bf16, fp8 (and float32, float16,
// bfloat16, e4m3, float8_e4m3fn).
std::optional<DType> parse_dtype(std::string_view name);

// Round-to-nearest-even conversions, NaN and infinity preserved.
inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

inline float bf16_to_float(std::uint16_t h) { return std::bit_cast<float>(static_cast<std::uint32_t>(h) << 16); }

inline std::uint16_t float_to_f16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t mant = x & 0x007fffffu;
  const int exp = static_cast<int>((x >> 23) & 0xffu);
  if (exp == 0xff) return static_cast<std::uint16_t>(sign | 0x7c00u | (mant ? 0x200u : 0u));
  int e = exp - 127 + 15;
  if (e >= 0x1f) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow to infinity
  if (e <= 0) {                                                      // subnormal or zero
    if (e < -10) return static_cast<std::uint16_t>(sign);
    mant |= 0x00800000u;
    const int shift = 14 - e;
    std::uint32_t half = mant >> shift;
    const std::uint32_t rem = mant & ((1u << shift) - 1u);
    const std::uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1u))) ++half;
    return static_cast<std::uint16_t>(sign | half);
  }
  std::uint32_t half = sign | (static_cast<std::uint32_t>(e) << 10) | (mant >> 13);
  const std::uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // may carry into the exponent: correct
  return static_cast<std::uint16_t>(half);
}

inline float f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    if (mant == 0) return std::bit_cast<float>(sign);
    int e = -1;
    do {  // normalise the subnormal
      ++e;
      mant <<= 1;
    } while ((mant & 0x400u) == 0);
    return std::bit_cast<float>(sign | (static_cast<std::uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13));
  }
  return std::bit_cast<float>(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

// e4m3 (OCP "fn"): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no
// infinity, 0x7f / 0xff the NaNs. Round to nearest even, saturating: a
// finite value past 448 (and an infinity) becomes +-448, as the tensor
// cores' cvt.rn.satfinite does; NaN stays NaN.
inline std::uint8_t float_to_e4m3(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint8_t sign = static_cast<std::uint8_t>((x >> 24) & 0x80u);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint8_t>(sign | 0x7fu);
  const float a = std::bit_cast<float>(x & 0x7fffffffu);
  if (a >= 464.0f) return static_cast<std::uint8_t>(sign | 0x7eu);  // 464 rounds past 448: saturate
  const int exp = static_cast<int>((x >> 23) & 0xffu) - 127;
  if (exp < -6) {                // subnormal (or zero): multiples of 2^-9
    const float q = a * 512.0f;  // exact
    std::uint32_t m = static_cast<std::uint32_t>(q);
    const float rem = q - static_cast<float>(m);
    if (rem > 0.5f || (rem == 0.5f && (m & 1u))) ++m;  // m == 8 carries into the smallest normal: correct
    return static_cast<std::uint8_t>(sign | m);
  }
  const std::uint32_t mant = x & 0x007fffffu;
  std::uint32_t bits = (static_cast<std::uint32_t>(exp + 7) << 3) | (mant >> 20);
  const std::uint32_t rem = mant & 0xfffffu;
  if (rem > 0x80000u || (rem == 0x80000u && (bits & 1u))) ++bits;
  if (bits > 0x7eu) bits = 0x7eu;
  return static_cast<std::uint8_t>(sign | bits);
}

inline float e4m3_to_float(std::uint8_t b) {
  const float sign = (b & 0x80u) ? -1.0f : 1.0f;
  const int exp = (b >> 3) & 0xf;
  const int mant = b & 0x7;
  if (exp == 0xf && mant == 0x7) return std::bit_cast<float>(0x7fc00000u);
  if (exp == 0) return sign * static_cast<float>(mant) * 0x1p-9f;
  return sign * (1.0f + static_cast<float>(mant) * 0.125f) *
         std::bit_cast<float>(static_cast<std::uint32_t>(exp - 7 + 127) << 23);
}

// Loads element i of a buffer of type t as float (t must be a floating type).
inline float load_as_float(const void* base, DType t, std::int64_t i) {
  switch (t) {
    case DType::F32:
      return static_cast<const float*>(base)[i];
    case DType::F16:
      return f16_to_float(static_cast<const std::uint16_t*>(base)[i]);
    case DType::BF16:
      return bf16_to_float(static_cast<const std::uint16_t*>(base)[i]);
    case DType::Bool:
      return static_cast<const std::uint8_t*>(base)[i] ? 1.0f : 0.0f;
    case DType::I32:
      return static_cast<float>(static_cast<const std::int32_t*>(base)[i]);
    case DType::F8E4M3:
      return e4m3_to_float(static_cast<const std::uint8_t*>(base)[i]);
  }
  return 0.0f;
}

inline void store_from_float(void* base, DType t, std::int64_t i, float v) {
  switch (t) {
    case DType::F32:
      static_cast<float*>(base)[i] = v;
      break;
    case DType::F16:
      static_cast<std::uint16_t*>(base)[i] = float_to_f16(v);
      break;
    case DType::BF16:
      static_cast<std::uint16_t*>(base)[i] = float_to_bf16(v);
      break;
    case DType::Bool:
      static_cast<std::uint8_t*>(base)[i] = v != 0.0f;
      break;
    case DType::I32:
      static_cast<std::int32_t*>(base)[i] = static_cast<std::int32_t>(v);
      break;
    case DType::F8E4M3:
      static_cast<std::uint8_t*>(base)[i] = float_to_e4m3(v);
      break;
  }
}

// n elements of type t from element i of a buffer, `inc` elements apart,
// widened to float (load) or rounded from float (store). With inc 1 each
// dtype is one typed loop the compiler vectorizes: rows of 16-bit tensors
// convert at memory speed instead of an element-by-element switch.
inline void load_run_as_float(const void* base, DType t, std::int64_t i, std::int64_t n, std::int64_t inc, float* dst) {
  if (inc == 1 && t == DType::F32) {
    const float* src = static_cast<const float*>(base) + i;
    std::copy(src, src + n, dst);
  } else if (inc == 1 && t == DType::BF16) {
    const std::uint16_t* src = static_cast<const std::uint16_t*>(base) + i;
    for (std::int64_t c = 0; c < n; ++c) dst[c] = bf16_to_float(src[c]);
  } else if (inc == 1 && t == DType::F16) {
    const std::uint16_t* src = static_cast<const std::uint16_t*>(base) + i;
    for (std::int64_t c = 0; c < n; ++c) dst[c] = f16_to_float(src[c]);
  } else {
    for (std::int64_t c = 0; c < n; ++c) dst[c] = load_as_float(base, t, i + c * inc);
  }
}

inline void store_run_from_float(void* base, DType t, std::int64_t i, std::int64_t n, std::int64_t inc,
                                 const float* src) {
  if (inc == 1 && t == DType::F32) {
    std::copy(src, src + n, static_cast<float*>(base) + i);
  } else if (inc == 1 && t == DType::BF16) {
    std::uint16_t* dst = static_cast<std::uint16_t*>(base) + i;
    for (std::int64_t c = 0; c < n; ++c) dst[c] = float_to_bf16(src[c]);
  } else if (inc == 1 && t == DType::F16) {
    std::uint16_t* dst = static_cast<std::uint16_t*>(base) + i;
    for (std::int64_t c = 0; c < n; ++c) dst[c] = float_to_f16(src[c]);
  } else {
    for (std::int64_t c = 0; c < n; ++c) store_from_float(base, t, i + c * inc, src[c]);
  }
}

}  // namespace attnprof
