// Eight-lane float vectors for the CPU flash kernels: AVX2/FMA/F16C when the
// library is built for x86-64-v3 (the default), plain arrays otherwise, so the
// micro-kernels are written once and the choice is made at compile time.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "attnprof/dtype.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define ATTNPROF_FLASH_AVX2 1
#endif

namespace attnprof::cpu::flash {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

#if ATTNPROF_FLASH_AVX2

struct F8 {
  __m256 v;
};

inline F8 zeros() { return {_mm256_setzero_ps()}; }
inline F8 splat(float x) { return {_mm256_set1_ps(x)}; }
inline F8 load(const float* p) { return {_mm256_loadu_ps(p)}; }
inline F8 broadcast(const float* p) { return {_mm256_broadcast_ss(p)}; }
inline void store(float* p, F8 a) { _mm256_storeu_ps(p, a.v); }
inline F8 fma(F8 a, F8 b, F8 c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
inline F8 add(F8 a, F8 b) { return {_mm256_add_ps(a.v, b.v)}; }
inline F8 sub(F8 a, F8 b) { return {_mm256_sub_ps(a.v, b.v)}; }
inline F8 mul(F8 a, F8 b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline F8 max(F8 a, F8 b) { return {_mm256_max_ps(a.v, b.v)}; }
// x where x > -inf, else 0: the running max used as the exponent's shift, so a
// row that has seen only masked keys computes exp2(-inf - 0) = 0, never NaN.
inline F8 finite_or_zero(F8 x) {
  const __m256 is_neg_inf = _mm256_cmp_ps(x.v, _mm256_set1_ps(kNegInf), _CMP_EQ_OQ);
  return {_mm256_andnot_ps(is_neg_inf, x.v)};
}

// 2^x for x <= 0 (softmax exponents after the max shift), relative error about
// 2e-7: x = n + f with |f| <= 1/2, 2^f by the Cephes exp2f polynomial, 2^n
// built in the exponent bits. Inputs below -127 (and -inf) give exactly 0,
// because n = -127 produces a zero bit pattern.
inline F8 exp2(F8 x) {
  const __m256 xc = _mm256_max_ps(x.v, _mm256_set1_ps(-127.0f));
  const __m256 n = _mm256_round_ps(xc, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(xc, n);
  __m256 p = _mm256_set1_ps(1.535336188319500e-4f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.339887440266574e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618437357674640e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550332471162809e-2f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402264791363012e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931472028550421e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return {_mm256_mul_ps(p, _mm256_castsi256_ps(bits))};
}

// tanh(x) for soft-capping, relative error a few 1e-7: for |x| >= 0.1,
// (1 - e) / (1 + e) with e = 2^(-2 log2(e) |x|) (exp2 above takes only
// exponents <= 0), |x| past 44 giving exactly 1; below 0.1, where 1 - e would
// cancel (and a large cap puts every score there), the odd Taylor series to
// x^7 (the next term is under 3e-11). The sign is put back.
inline F8 tanh(F8 x) {
  const __m256 sign = _mm256_and_ps(x.v, _mm256_set1_ps(-0.0f));
  const __m256 ax = _mm256_xor_ps(x.v, sign);
  const __m256 e = exp2({_mm256_mul_ps(ax, _mm256_set1_ps(-2.0f * 1.4426950408889634f))}).v;
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 big = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
  const __m256 x2 = _mm256_mul_ps(ax, ax);
  __m256 p = _mm256_set1_ps(-17.0f / 315.0f);
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(2.0f / 15.0f));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-1.0f / 3.0f));
  p = _mm256_fmadd_ps(p, x2, one);
  const __m256 small = _mm256_mul_ps(ax, p);
  const __m256 is_small = _mm256_cmp_ps(ax, _mm256_set1_ps(0.1f), _CMP_LT_OQ);
  return {_mm256_or_ps(_mm256_blendv_ps(big, small, is_small), sign)};
}

// Eight 16-bit values widened to FP32 (F16C for fp16, a 16-bit shift for bf16).
inline F8 load_f16(const std::uint16_t* p) {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))};
}
inline F8 load_bf16(const std::uint16_t* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(w, 16))};
}

#else

struct F8 {
  float v[8];
};

template <class Fn>
inline F8 lanes(Fn fn) {
  F8 r;
  for (int i = 0; i < 8; ++i) r.v[i] = fn(i);
  return r;
}
inline F8 splat(float x) {
  return lanes([x](int) { return x; });
}
inline F8 zeros() { return splat(0.0f); }
inline F8 load(const float* p) {
  return lanes([p](int i) { return p[i]; });
}
inline F8 broadcast(const float* p) { return splat(*p); }
inline void store(float* p, F8 a) {
  for (int i = 0; i < 8; ++i) p[i] = a.v[i];
}
inline F8 fma(F8 a, F8 b, F8 c) {
  return lanes([&](int i) { return std::fma(a.v[i], b.v[i], c.v[i]); });
}
inline F8 add(F8 a, F8 b) {
  return lanes([&](int i) { return a.v[i] + b.v[i]; });
}
inline F8 sub(F8 a, F8 b) {
  return lanes([&](int i) { return a.v[i] - b.v[i]; });
}
inline F8 mul(F8 a, F8 b) {
  return lanes([&](int i) { return a.v[i] * b.v[i]; });
}
inline F8 max(F8 a, F8 b) {
  return lanes([&](int i) { return a.v[i] > b.v[i] ? a.v[i] : b.v[i]; });
}
inline F8 finite_or_zero(F8 x) {
  return lanes([&](int i) { return x.v[i] == kNegInf ? 0.0f : x.v[i]; });
}
inline F8 exp2(F8 x) {
  return lanes([&](int i) { return std::exp2(x.v[i]); });
}
inline F8 tanh(F8 x) {
  return lanes([&](int i) { return std::tanh(x.v[i]); });
}
inline F8 load_f16(const std::uint16_t* p) {
  return lanes([p](int i) { return f16_to_float(p[i]); });
}
inline F8 load_bf16(const std::uint16_t* p) {
  return lanes([p](int i) { return bf16_to_float(p[i]); });
}

#endif

}  // namespace attnprof::cpu::flash
