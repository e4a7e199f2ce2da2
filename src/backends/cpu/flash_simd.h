// Float vectors of kLanes lanes for the CPU flash kernels, one implementation
// per instruction-set level: AVX-512 (16 lanes) when the translation unit is
// compiled with -mavx512f..., AVX2/FMA/F16C (8 lanes) with -mavx2 -mfma
// -mf16c, plain 8-float arrays (which the compiler turns into SSE2) without.
// The micro-kernels (flash_microkernels.h) are written once over Vf and
// kLanes; each kernel translation unit (isa/flash_*.cpp) includes this inside
// its own namespace, ATTNPROF_ISA_NS, so the levels never share a symbol and
// nothing compiled for AVX-512 is reached on a machine without it (the
// dispatch in flash.cpp asks cpu_isa.h first).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#include "attnprof/dtype.h"
#include "backends/cpu/flash_tiles.h"

#ifndef ATTNPROF_ISA_NS
#error "flash_simd.h is included by the kernel translation units (src/backends/cpu/isa/), which name ATTNPROF_ISA_NS"
#endif

#if defined(ATTNPROF_FLASH_EMULATE)
// Tests only (tests/cpu/flash_emulated_*_test.cpp, which include the plain
// C++ stand-ins of the intrinsics first): the AVX-512 code, on any machine.
#define ATTNPROF_FLASH_AVX512 1
#elif defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__) && defined(__AVX512VL__)
#include <immintrin.h>
#define ATTNPROF_FLASH_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define ATTNPROF_FLASH_AVX2 1
#endif

namespace attnprof::cpu::flash::ATTNPROF_ISA_NS {

#if ATTNPROF_FLASH_AVX512

constexpr int kLanes = 16;
// The FP32 FMA tiles: 8 rows, 8 x 2 accumulators (two FMA ports of 4-cycle
// latency need 8 in flight), so the forward's 64-key blocks and 128-row
// items, and the backward's 64-row blocks, split without a tail (on a Xeon
// 1-2% faster than 12 rows with a 4- or 8-row tail, docs/perf/cpu-flash.md).
constexpr int kTileRows = 8;
// The bf16 dot-product tiles (VDPBF16PS) keep 12 rows, 12 x 2 accumulators
// + 2 operands + 1 broadcast <= 32 zmm: 8 rows were 2-3% slower there.
constexpr int kBf16TileRows = 12;

struct Vf {
  __m512 v;
};

inline Vf zeros() { return {_mm512_setzero_ps()}; }
inline Vf splat(float x) { return {_mm512_set1_ps(x)}; }
inline Vf load(const float* p) { return {_mm512_loadu_ps(p)}; }
inline Vf broadcast(const float* p) { return {_mm512_set1_ps(*p)}; }
inline void store(float* p, Vf a) { _mm512_storeu_ps(p, a.v); }
inline Vf fma(Vf a, Vf b, Vf c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline Vf add(Vf a, Vf b) { return {_mm512_add_ps(a.v, b.v)}; }
inline Vf sub(Vf a, Vf b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline Vf mul(Vf a, Vf b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline Vf max(Vf a, Vf b) { return {_mm512_max_ps(a.v, b.v)}; }
// a > b ? x : y, lane by lane (false where either is NaN).
inline Vf select_greater(Vf a, Vf b, Vf x, Vf y) {
  return {_mm512_mask_blend_ps(_mm512_cmp_ps_mask(a.v, b.v, _CMP_GT_OQ), y.v, x.v)};
}
// The sum of the lanes (the decode kernel's dot products); the tests'
// stand-ins of the intrinsics have no reduction, so there it goes by memory.
inline float hsum(Vf a) {
#if defined(ATTNPROF_FLASH_EMULATE)
  alignas(64) float t[kLanes];
  _mm512_storeu_ps(t, a.v);
  float s = 0.0f;
  for (const float x : t) s += x;
  return s;
#else
  return _mm512_reduce_add_ps(a.v);
#endif
}
inline Vf finite_or_zero(Vf x) {
  const __mmask16 is_neg_inf = _mm512_cmp_ps_mask(x.v, _mm512_set1_ps(kNegInf), _CMP_EQ_OQ);
  return {_mm512_maskz_mov_ps(static_cast<__mmask16>(~is_neg_inf), x.v)};
}
// 2^x for x <= 0, 16 lanes, in eight vector operations: f = x - floor(x) in
// [0, 1) by VREDUCEPS, 2^f by a degree-5 minimax polynomial whose constant
// term is 1 (relative error 1.6e-7 in FP32 arithmetic; 2^0 is exactly 1, so
// an unmoved max rescales by exactly 1), and 2^f 2^floor(x) by VSCALEFPS.
// Lanes below -126 (and -inf) are exactly 0 by the scale's zero mask:
// VSCALEFPS would produce them as subnormals or underflow through a microcode
// assist (about 65x slower a vector on a Xeon without FTZ, docs/perf/cpu-flash.md).
// A NaN lane stays NaN (the mask's compare is unordered-true, and VSCALEFPS
// of a NaN is NaN): a NaN score must reach the row's sum, as it reaches the
// float64 reference's, not drop out as a zero probability.
// The AVX2 version's shifter, polynomial, shift and multiply take twelve.
// kBf16P: P is rounded to bf16 for P V (8 bits), so a degree-3 polynomial
// (relative error below 1e-4, as the GPU kernels' ex2_fma) does.
template <bool kBf16P = false>
inline Vf exp2(Vf x) {
  const __mmask16 normal = _mm512_cmp_ps_mask(x.v, _mm512_set1_ps(-126.0f), _CMP_NLT_UQ);  // x >= -126 or NaN
  const __m512 f = _mm512_reduce_ps(x.v, _MM_FROUND_TO_NEG_INF);
  __m512 p;
  if constexpr (kBf16P) {
    p = _mm512_set1_ps(7.7064635399e-2f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.2764859349e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9511550446e-1f));
  } else {
    p = _mm512_set1_ps(1.8671294531e-3f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.0170316321e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5799912188e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4016445039e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9315131179e-1f));
  }
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return {_mm512_maskz_scalef_ps(normal, p, x.v)};
}
inline Vf tanh(Vf x) {
  const __m512 sign = _mm512_and_ps(x.v, _mm512_set1_ps(-0.0f));
  const __m512 ax = _mm512_xor_ps(x.v, sign);
  const __m512 e = exp2({_mm512_mul_ps(ax, _mm512_set1_ps(-2.0f * 1.4426950408889634f))}).v;
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 big = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
  const __m512 x2 = _mm512_mul_ps(ax, ax);
  __m512 p = _mm512_set1_ps(-17.0f / 315.0f);
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(2.0f / 15.0f));
  p = _mm512_fmadd_ps(p, x2, _mm512_set1_ps(-1.0f / 3.0f));
  p = _mm512_fmadd_ps(p, x2, one);
  const __m512 small = _mm512_mul_ps(ax, p);
  const __mmask16 is_small = _mm512_cmp_ps_mask(ax, _mm512_set1_ps(0.1f), _CMP_LT_OQ);
  return {_mm512_or_ps(_mm512_mask_blend_ps(is_small, big, small), sign)};
}
inline Vf load_f16(const std::uint16_t* p) {
  return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
}
inline Vf load_bf16(const std::uint16_t* p) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return {_mm512_castsi512_ps(_mm512_slli_epi32(w, 16))};
}

#elif ATTNPROF_FLASH_AVX2

constexpr int kLanes = 8;
// 6 x 2 accumulators + 2 operands + 1 broadcast <= 16 ymm.
constexpr int kTileRows = 6;

struct Vf {
  __m256 v;
};

inline Vf zeros() { return {_mm256_setzero_ps()}; }
inline Vf splat(float x) { return {_mm256_set1_ps(x)}; }
inline Vf load(const float* p) { return {_mm256_loadu_ps(p)}; }
inline Vf broadcast(const float* p) { return {_mm256_broadcast_ss(p)}; }
inline void store(float* p, Vf a) { _mm256_storeu_ps(p, a.v); }
inline Vf fma(Vf a, Vf b, Vf c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
inline Vf add(Vf a, Vf b) { return {_mm256_add_ps(a.v, b.v)}; }
inline Vf sub(Vf a, Vf b) { return {_mm256_sub_ps(a.v, b.v)}; }
inline Vf mul(Vf a, Vf b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline Vf max(Vf a, Vf b) { return {_mm256_max_ps(a.v, b.v)}; }
inline float hsum(Vf a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline Vf select_greater(Vf a, Vf b, Vf x, Vf y) {
  return {_mm256_blendv_ps(y.v, x.v, _mm256_cmp_ps(a.v, b.v, _CMP_GT_OQ))};
}
// x where x > -inf, else 0: the running max used as the exponent's shift, so a
// row that has seen only masked keys computes exp2(-inf - 0) = 0, never NaN.
inline Vf finite_or_zero(Vf x) {
  const __m256 is_neg_inf = _mm256_cmp_ps(x.v, _mm256_set1_ps(kNegInf), _CMP_EQ_OQ);
  return {_mm256_andnot_ps(is_neg_inf, x.v)};
}

// 2^x for x <= 0 (softmax exponents after the max shift), relative error about
// 2e-7: x = n + f with |f| <= 1/2, 2^f by the Cephes exp2f polynomial, 2^n
// built in the exponent bits. Inputs below -127 (and -inf) give exactly 0,
// because n = -127 produces a zero bit pattern. A NaN gives NaN: VMAXPS
// returns its second operand when either is NaN, so the clamp takes x second
// and a NaN passes through it (and through the polynomial) at no cost.
template <bool kBf16P = false>  // (8 lanes: P stays FP32; the one polynomial)
inline Vf exp2(Vf x) {
  const __m256 shifter = _mm256_set1_ps(12583039.0f);  // round(x) + 127 in t's low bits (the AVX-512 exp2's trick)
  const __m256 xc = _mm256_max_ps(_mm256_set1_ps(-127.0f), x.v);
  const __m256 t = _mm256_add_ps(xc, shifter);
  const __m256 f = _mm256_sub_ps(xc, _mm256_sub_ps(t, shifter));
  __m256 p = _mm256_set1_ps(1.535336188319500e-4f);
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.339887440266574e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618437357674640e-3f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550332471162809e-2f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(2.402264791363012e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.931472028550421e-1f));
  p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
  const __m256i bits = _mm256_slli_epi32(_mm256_castps_si256(t), 23);
  return {_mm256_mul_ps(p, _mm256_castsi256_ps(bits))};
}

// tanh(x) for soft-capping, relative error a few 1e-7: for |x| >= 0.1,
// (1 - e) / (1 + e) with e = 2^(-2 log2(e) |x|) (exp2 above takes only
// exponents <= 0), |x| past 44 giving exactly 1; below 0.1, where 1 - e would
// cancel (and a large cap puts every score there), the odd Taylor series to
// x^7 (the next term is under 3e-11). The sign is put back.
inline Vf tanh(Vf x) {
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
inline Vf load_f16(const std::uint16_t* p) {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))};
}
inline Vf load_bf16(const std::uint16_t* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return {_mm256_castsi256_ps(_mm256_slli_epi32(w, 16))};
}

#else

// Baseline x86-64 (or another CPU): plain arrays; the loops below are simple
// enough for the compiler to turn into SSE2.
constexpr int kLanes = 8;
constexpr int kTileRows = 6;

struct Vf {
  float v[kLanes];
};

template <class Fn>
inline Vf lanes(Fn fn) {
  Vf r;
  for (int i = 0; i < kLanes; ++i) r.v[i] = fn(i);
  return r;
}
inline Vf splat(float x) {
  return lanes([x](int) { return x; });
}
inline Vf zeros() { return splat(0.0f); }
inline Vf load(const float* p) {
  return lanes([p](int i) { return p[i]; });
}
inline Vf broadcast(const float* p) { return splat(*p); }
inline void store(float* p, Vf a) {
  for (int i = 0; i < kLanes; ++i) p[i] = a.v[i];
}
inline Vf fma(Vf a, Vf b, Vf c) {
  return lanes([&](int i) { return a.v[i] * b.v[i] + c.v[i]; });
}
inline Vf add(Vf a, Vf b) {
  return lanes([&](int i) { return a.v[i] + b.v[i]; });
}
inline Vf sub(Vf a, Vf b) {
  return lanes([&](int i) { return a.v[i] - b.v[i]; });
}
inline Vf mul(Vf a, Vf b) {
  return lanes([&](int i) { return a.v[i] * b.v[i]; });
}
inline Vf max(Vf a, Vf b) {
  return lanes([&](int i) { return a.v[i] > b.v[i] ? a.v[i] : b.v[i]; });
}
inline float hsum(Vf a) {
  float s = 0.0f;
  for (const float x : a.v) s += x;
  return s;
}
inline Vf select_greater(Vf a, Vf b, Vf x, Vf y) {
  return lanes([&](int i) { return a.v[i] > b.v[i] ? x.v[i] : y.v[i]; });
}
inline Vf finite_or_zero(Vf x) {
  return lanes([&](int i) { return x.v[i] == kNegInf ? 0.0f : x.v[i]; });
}
template <bool kBf16P = false>
inline Vf exp2(Vf x) {
  return lanes([&](int i) { return std::exp2(x.v[i]); });
}
inline Vf tanh(Vf x) {
  return lanes([&](int i) { return std::tanh(x.v[i]); });
}
inline Vf load_f16(const std::uint16_t* p) {
  return lanes([p](int i) { return f16_to_float(p[i]); });
}
inline Vf load_bf16(const std::uint16_t* p) {
  return lanes([p](int i) { return bf16_to_float(p[i]); });
}

#endif

}  // namespace attnprof::cpu::flash::ATTNPROF_ISA_NS
