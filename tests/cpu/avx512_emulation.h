// Plain C++ stand-ins for the AVX-512, AVX512-BF16 and AMX-BF16 intrinsics the
// CPU flash kernels use (flash_simd.h's AVX-512 branch, flash_bf16_kernels.h),
// so a test on a machine without them (the AVX2 dev box, CI) runs those
// kernels' code, their layouts, tiles and tails, against float64
// (flash_emulated_test.h). Included by the kernel headers in place of
// <immintrin.h> when ATTNPROF_FLASH_EMULATE is defined, which only the test
// translation units do. Each stand-in follows Intel's description of the
// instruction; rounding is the default (to nearest even).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "attnprof/dtype.h"

// NOLINTBEGIN: the intrinsics' own names.
struct __m512 {
  float f[16];
};
struct __m512i {
  std::uint32_t u[16];
};
struct __m512bh {
  std::uint16_t h[32];
};
struct __m256i {
  std::uint16_t h[16];
};
struct __m256bh {
  std::uint16_t h[16];
};
using __mmask16 = std::uint16_t;

constexpr int _CMP_EQ_OQ = 0x00;
constexpr int _CMP_LT_OQ = 0x11;
constexpr int _CMP_NLT_UQ = 0x15;
constexpr int _CMP_GE_OQ = 0x1d;
constexpr int _CMP_GT_OQ = 0x1e;
constexpr int _MM_FROUND_TO_NEG_INF = 0x01;

namespace attnprof::emulation {
template <class T, class F>
inline T map16(F f) {
  T r{};
  for (int i = 0; i < 16; ++i) f(r, i);
  return r;
}
inline std::uint32_t bits(float x) {
  std::uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
}
inline float from_bits(std::uint32_t b) {
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}
}  // namespace attnprof::emulation

inline __m512 _mm512_setzero_ps() { return __m512{}; }
inline __m512 _mm512_set1_ps(float x) {
  __m512 r;
  for (float& v : r.f) v = x;
  return r;
}
inline __m512 _mm512_loadu_ps(const void* p) {
  __m512 r;
  std::memcpy(r.f, p, 64);
  return r;
}
inline void _mm512_storeu_ps(void* p, __m512 a) { std::memcpy(p, a.f, 64); }
inline __m512i _mm512_loadu_si512(const void* p) {
  __m512i r;
  std::memcpy(r.u, p, 64);
  return r;
}
inline void _mm512_storeu_si512(void* p, __m512i a) { std::memcpy(p, a.u, 64); }
inline __m256i _mm256_loadu_si256(const __m256i* p) {
  __m256i r;
  std::memcpy(r.h, p, 32);
  return r;
}

#define ATTNPROF_EMU_BINARY(name, expr)                                                    \
  inline __m512 name(__m512 a, __m512 b) {                                                 \
    return attnprof::emulation::map16<__m512>([&](__m512& r, int i) { r.f[i] = (expr); }); \
  }
ATTNPROF_EMU_BINARY(_mm512_add_ps, a.f[i] + b.f[i])
ATTNPROF_EMU_BINARY(_mm512_sub_ps, a.f[i] - b.f[i])
ATTNPROF_EMU_BINARY(_mm512_mul_ps, a.f[i] * b.f[i])
ATTNPROF_EMU_BINARY(_mm512_div_ps, a.f[i] / b.f[i])
// vmaxps returns the second operand when either is NaN or both are zeros.
ATTNPROF_EMU_BINARY(_mm512_max_ps, a.f[i] > b.f[i] ? a.f[i] : b.f[i])
ATTNPROF_EMU_BINARY(_mm512_and_ps, attnprof::emulation::from_bits(attnprof::emulation::bits(a.f[i]) &
                                                                  attnprof::emulation::bits(b.f[i])))
ATTNPROF_EMU_BINARY(_mm512_or_ps, attnprof::emulation::from_bits(attnprof::emulation::bits(a.f[i]) |
                                                                 attnprof::emulation::bits(b.f[i])))
ATTNPROF_EMU_BINARY(_mm512_xor_ps, attnprof::emulation::from_bits(attnprof::emulation::bits(a.f[i]) ^
                                                                  attnprof::emulation::bits(b.f[i])))
#undef ATTNPROF_EMU_BINARY

inline __m512 _mm512_fmadd_ps(__m512 a, __m512 b, __m512 c) {
  return attnprof::emulation::map16<__m512>([&](__m512& r, int i) { r.f[i] = std::fma(a.f[i], b.f[i], c.f[i]); });
}
inline __mmask16 _mm512_cmp_ps_mask(__m512 a, __m512 b, int pred) {
  __mmask16 k = 0;
  for (int i = 0; i < 16; ++i) {
    const bool t = pred == _CMP_EQ_OQ    ? a.f[i] == b.f[i]
                   : pred == _CMP_LT_OQ  ? a.f[i] < b.f[i]
                   : pred == _CMP_GE_OQ  ? a.f[i] >= b.f[i]
                   : pred == _CMP_NLT_UQ ? !(a.f[i] < b.f[i])
                   : pred == _CMP_GT_OQ  ? a.f[i] > b.f[i]
                                         : throw 0;
    if (t) k = static_cast<__mmask16>(k | (1u << i));
  }
  return k;
}
inline __m512 _mm512_maskz_mov_ps(__mmask16 k, __m512 a) {
  return attnprof::emulation::map16<__m512>([&](__m512& r, int i) { r.f[i] = (k >> i) & 1 ? a.f[i] : 0.0f; });
}
inline __m512 _mm512_mask_blend_ps(__mmask16 k, __m512 a, __m512 b) {
  return attnprof::emulation::map16<__m512>([&](__m512& r, int i) { r.f[i] = (k >> i) & 1 ? b.f[i] : a.f[i]; });
}
// VREDUCEPS with no fraction bits kept, rounding down (the only form used):
// x - floor(x), 0 for infinities.
inline __m512 _mm512_reduce_ps(__m512 a, int imm) {
  if (imm != _MM_FROUND_TO_NEG_INF) throw 0;
  return attnprof::emulation::map16<__m512>(
      [&](__m512& r, int i) { r.f[i] = std::isinf(a.f[i]) ? 0.0f : a.f[i] - std::floor(a.f[i]); });
}
// VSCALEFPS zero-masked: a * 2^floor(b) where k's bit is set, else 0; NaN
// where a or b is NaN.
inline __m512 _mm512_maskz_scalef_ps(__mmask16 k, __m512 a, __m512 b) {
  return attnprof::emulation::map16<__m512>([&](__m512& r, int i) {
    if (!((k >> i) & 1)) {
      r.f[i] = 0.0f;
    } else if (std::isnan(a.f[i]) || std::isnan(b.f[i])) {
      r.f[i] = std::numeric_limits<float>::quiet_NaN();
    } else {
      r.f[i] = std::ldexp(a.f[i], static_cast<int>(std::floor(b.f[i])));
    }
  });
}
inline __m512i _mm512_set1_epi32(std::int32_t x) {
  return attnprof::emulation::map16<__m512i>([&](__m512i& r, int i) { r.u[i] = static_cast<std::uint32_t>(x); });
}
inline __m512i _mm512_or_si512(__m512i a, __m512i b) {
  return attnprof::emulation::map16<__m512i>([&](__m512i& r, int i) { r.u[i] = a.u[i] | b.u[i]; });
}
inline __m512i _mm512_slli_epi32(__m512i a, unsigned n) {
  return attnprof::emulation::map16<__m512i>([&](__m512i& r, int i) { r.u[i] = n > 31 ? 0 : a.u[i] << n; });
}
inline __m512 _mm512_castsi512_ps(__m512i a) {
  __m512 r;
  std::memcpy(r.f, a.u, 64);
  return r;
}
inline __m512i _mm512_permutex2var_epi32(__m512i a, __m512i idx, __m512i b) {
  __m512i r;
  for (int i = 0; i < 16; ++i) {
    const std::uint32_t sel = idx.u[i] & 31u;
    r.u[i] = sel < 16 ? a.u[sel] : b.u[sel - 16];
  }
  return r;
}
inline __m512i _mm512_cvtepu16_epi32(__m256i a) {
  return attnprof::emulation::map16<__m512i>([&](__m512i& r, int i) { r.u[i] = a.h[i]; });
}
inline __m512 _mm512_cvtph_ps(__m256i a) {
  return attnprof::emulation::map16<__m512>([&](__m512& r, int i) { r.f[i] = attnprof::f16_to_float(a.h[i]); });
}
// VCVTNEPS2BF16: round to nearest even.
inline __m256bh _mm512_cvtneps_pbh(__m512 a) {
  __m256bh r;
  for (int i = 0; i < 16; ++i) r.h[i] = attnprof::float_to_bf16(a.f[i]);
  return r;
}
// VCVTNE2PS2BF16: 32 values rounded to nearest even, b's in the low 16 words, a's in the high.
inline __m512bh _mm512_cvtne2ps_pbh(__m512 a, __m512 b) {
  __m512bh r;
  for (int i = 0; i < 16; ++i) {
    r.h[i] = attnprof::float_to_bf16(b.f[i]);
    r.h[16 + i] = attnprof::float_to_bf16(a.f[i]);
  }
  return r;
}
// VPERMW: word i of the result is word idx[i] mod 32 of a.
inline __m512i _mm512_permutexvar_epi16(__m512i idx, __m512i a) {
  std::uint16_t iw[32], aw[32], rw[32];
  std::memcpy(iw, &idx, sizeof iw);
  std::memcpy(aw, &a, sizeof aw);
  for (int i = 0; i < 32; ++i) rw[i] = aw[iw[i] & 31];
  __m512i r;
  std::memcpy(&r, rw, sizeof r);
  return r;
}
// VDPBF16PS: each FP32 lane adds the products of its pair of bf16 values,
// the even (low) element first.
inline __m512 _mm512_dpbf16_ps(__m512 src, __m512bh a, __m512bh b) {
  return attnprof::emulation::map16<__m512>([&](__m512& r, int i) {
    r.f[i] = src.f[i] + attnprof::bf16_to_float(a.h[2 * i]) * attnprof::bf16_to_float(b.h[2 * i]) +
             attnprof::bf16_to_float(a.h[2 * i + 1]) * attnprof::bf16_to_float(b.h[2 * i + 1]);
  });
}

// ---- AMX: eight tiles of 16 rows by 64 bytes (the configuration the kernels load) ----
namespace attnprof::emulation {
struct Tiles {
  unsigned char t[8][16][64];
  bool configured = false;
};
inline Tiles& tiles() {
  thread_local Tiles t;
  return t;
}
inline void require_config() {
  if (!tiles().configured) throw std::logic_error("AMX tile used before ldtilecfg");
}
}  // namespace attnprof::emulation

inline void _tile_loadconfig(const void* cfg) {
  const auto* b = static_cast<const unsigned char*>(cfg);
  if (b[0] != 1) throw std::logic_error("tile config: palette must be 1");
  for (int t = 0; t < 8; ++t) {
    std::uint16_t colsb;
    std::memcpy(&colsb, b + 16 + 2 * t, 2);
    if (colsb != 64 || b[48 + t] != 16) throw std::logic_error("tile config: the kernels use 16 rows of 64 bytes");
  }
  attnprof::emulation::tiles().configured = true;
}
inline void _tile_release() { attnprof::emulation::tiles().configured = false; }
inline void _tile_loadd(int t, const void* base, long stride) {
  attnprof::emulation::require_config();
  for (int r = 0; r < 16; ++r)
    std::memcpy(attnprof::emulation::tiles().t[t][r], static_cast<const char*>(base) + r * stride, 64);
}
inline void _tile_stored(int t, void* base, long stride) {
  attnprof::emulation::require_config();
  for (int r = 0; r < 16; ++r)
    std::memcpy(static_cast<char*>(base) + r * stride, attnprof::emulation::tiles().t[t][r], 64);
}
inline void _tile_zero(int t) {
  attnprof::emulation::require_config();
  std::memset(attnprof::emulation::tiles().t[t], 0, sizeof attnprof::emulation::tiles().t[t]);
}
// TDPBF16PS: C[m][n] += sum_k A[m][2k] B[k][2n] + A[m][2k + 1] B[k][2n + 1],
// A 16 rows of 32 bf16, B 16 rows (pairs of K) of 16 bf16 pairs, C FP32.
inline void _tile_dpbf16ps(int c, int a, int b) {
  attnprof::emulation::require_config();
  auto& T = attnprof::emulation::tiles().t;
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 16; ++n) {
      float acc;
      std::memcpy(&acc, &T[c][m][4 * n], 4);
      for (int k = 0; k < 16; ++k)
        for (int e = 0; e < 2; ++e) {
          std::uint16_t av, bv;
          std::memcpy(&av, &T[a][m][2 * (2 * k + e)], 2);
          std::memcpy(&bv, &T[b][k][2 * (2 * n + e)], 2);
          acc += attnprof::bf16_to_float(av) * attnprof::bf16_to_float(bv);
        }
      std::memcpy(&T[c][m][4 * n], &acc, 4);
    }
}
// NOLINTEND
