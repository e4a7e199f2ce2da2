// The AMX tile products of the CPU flash bf16 kernels (flash_bf16_kernels.h,
// which includes this inside its ISA namespace once <immintrin.h> or the
// tests' stand-ins are in): the tile configuration every kernel loads and
// amx_block, a 2 x 2 (or 1 x 2) block of 16 x 16 FP32 tiles over bf16 A and
// B in pairs, and amx_gemm, a whole product of them, only where the level
// has AMX (ATTNPROF_FLASH_AMX); and the AMX forward's epilogue, O^T into
// bf16 rows (AVX-512, compiled with every bf16 level).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>

namespace attnprof::cpu::flash::ATTNPROF_ISA_NS {

// ---- AMX: 16 x 16 FP32 tiles, all eight 16 rows of 64 bytes ----------------

#if ATTNPROF_FLASH_AMX

// ldtilecfg's 64 bytes: palette 1, then per tile its bytes per row and rows.
struct alignas(64) TileConfig {
  std::uint8_t palette = 1;
  std::uint8_t start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};
  std::uint8_t rows[16] = {};
};

constexpr TileConfig tile_config() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  return cfg;
}

// GCC 12's tile loads and ldtilecfg are asm statements that declare no (or
// only 8 bytes of) memory read: without a barrier the compiler may leave the
// stores that fill a tile's source (or the configuration) until after them.
inline void compiler_barrier() {
#if !defined(ATTNPROF_FLASH_EMULATE)
  __asm__ volatile("" ::: "memory");
#endif
}

// Every tile 16 rows of 64 bytes: A (16 x 32 bf16), B (16 pairs x 16 columns)
// and C (16 x 16 FP32) alike. Tile state is per thread: each item loads it.
// The configuration is a constant, so no store of it can be left out.
inline void load_tile_config() {
  alignas(64) static constexpr TileConfig cfg = tile_config();
  compiler_barrier();
  _tile_loadconfig(&cfg);
}

// C[2 x 2 tiles] = A (2 row tiles at a, a + 16 lda) B (2 column tiles at b, b + 16), depth/32 steps;
// A rows lda bytes apart, B rows ldb bytes apart, C rows ldc bytes apart. kLoadC: start from C.
template <int kRowTiles, bool kLoadC>
inline void amx_block(const void* a, std::int64_t lda, std::int64_t a_step, const void* b, std::int64_t ldb,
                      std::int64_t b_step, std::int64_t steps, float* c, std::int64_t ldc) {
  const auto* ab = static_cast<const char*>(a);
  const auto* bb = static_cast<const char*>(b);
  char* cb = reinterpret_cast<char*>(c);
  compiler_barrier();  // every store to A, B and C before the tile loads read them
  if constexpr (kLoadC) {
    _tile_loadd(0, cb, ldc);
    _tile_loadd(1, cb + 64, ldc);
    if constexpr (kRowTiles == 2) {
      _tile_loadd(2, cb + 16 * ldc, ldc);
      _tile_loadd(3, cb + 16 * ldc + 64, ldc);
    }
  } else {
    _tile_zero(0);
    _tile_zero(1);
    if constexpr (kRowTiles == 2) {
      _tile_zero(2);
      _tile_zero(3);
    }
  }
  for (std::int64_t t = 0; t < steps; ++t) {
    _tile_loadd(4, ab + t * a_step, lda);
    _tile_loadd(6, bb + t * b_step, ldb);
    _tile_loadd(7, bb + t * b_step + 64, ldb);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if constexpr (kRowTiles == 2) {
      _tile_loadd(5, ab + 16 * lda + t * a_step, lda);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, cb, ldc);
  _tile_stored(1, cb + 64, ldc);
  if constexpr (kRowTiles == 2) {
    _tile_stored(2, cb + 16 * ldc, ldc);
    _tile_stored(3, cb + 16 * ldc + 64, ldc);
  }
}

// C[rows x cols] (+)= A[rows x 2 pairs] B[pairs x cols], every product of
// the bf16 kernels on tiles: A bf16 rows lda elements apart (pairs along the
// depth), B pairs in VNNI order, rows ldb pairs apart, C FP32 rows ldc apart.
// rows a multiple of 16, cols of 32, pairs of 16: the callers pad A's depth
// and B's pairs with zeros (rows of A past theirs may hold anything; so do
// the C rows they give). Column strips outermost, row tiles two at a time.
template <bool kLoadC>
inline void amx_gemm(const std::uint16_t* a, std::int64_t lda, const std::uint32_t* b, std::int64_t ldb,
                     std::int64_t rows, std::int64_t cols, std::int64_t pairs, float* c, std::int64_t ldc) {
  for (std::int64_t col = 0; col < cols; col += 32) {
    std::int64_t r = 0;
    for (; r + 32 <= rows; r += 32)
      amx_block<2, kLoadC>(a + r * lda, lda * 2, 64, b + col, ldb * 4, 16 * ldb * 4, pairs / 16, c + r * ldc + col,
                           ldc * 4);
    if (r < rows)
      amx_block<1, kLoadC>(a + r * lda, lda * 2, 64, b + col, ldb * 4, 16 * ldb * 4, pairs / 16, c + r * ldc + col,
                           ldc * 4);
  }
}

#endif

// ---- The AMX forward's epilogue --------------------------------------------

// The 16 x 16 transpose of 32-bit words, v[r] lane c <-> v[c] lane r: four
// butterfly stages of VPERMT2D, stage b swapping the off-diagonal b x b
// blocks of each pair of rows (r, r + b).
inline void transpose16(__m512i (&v)[16]) {
  struct Stage {
    std::int32_t lo[16], hi[16];
  };
  static constexpr auto kStages = [] {
    std::array<Stage, 4> st{};
    for (int s = 0; s < 4; ++s) {
      const int b = 8 >> s;
      for (int c = 0; c < 16; ++c) {
        st[s].lo[c] = (c & b) ? 16 + c - b : c;  // row r keeps its lanes without b, takes row r + b's
        st[s].hi[c] = (c & b) ? 16 + c : c + b;  // row r + b the other way round
      }
    }
    return st;
  }();
  for (int s = 0; s < 4; ++s) {
    const int b = 8 >> s;
    const __m512i lo = _mm512_loadu_si512(kStages[s].lo), hi = _mm512_loadu_si512(kStages[s].hi);
    for (int r = 0; r < 16; ++r) {
      if (r & b) continue;
      const __m512i x = v[r], y = v[r + b];
      v[r] = _mm512_permutex2var_epi32(x, lo, y);
      v[r + b] = _mm512_permutex2var_epi32(x, hi, y);
    }
  }
}

// O^T [D][kBlockQ] (the AMX product's layout) normalised into the block's
// output rows. A bf16 output with unit-stride rows (every AMX problem's, but
// a strided view) takes 16 queries by 32 dims at a time: rows 2p and 2p + 1
// of O^T, contiguous over the queries, scaled and paired to bf16 are the
// 32-bit words at dims (2p, 2p + 1) of the 16 output rows; transposed in
// registers they are 16 row pieces of 64 bytes. store_rows, gathering each
// query's column of O^T and rounding element by element, took 2.5% of the
// head dim 128 forward's time (a scatter of the words, 2.35%).
inline void store_rows_amx(const ForwardJob& job, const Sequence& s, std::int64_t h, std::int64_t i0, std::int64_t nq,
                           const float* ot, const float* m, const float* l) {
  const Tensor& out = job.out;
  const std::int64_t D = job.p.head_dim, ld = out.stride(2);
  if (out.dtype() != DType::BF16 || out.stride(3) != 1 || D % 32 != 0) {
    store_rows(job, s, h, i0, nq, ot, 1, kBlockQ, m, l);
    return;
  }
  store_lse(job, s, h, i0, nq, m, l);
  alignas(64) float inv[kBlockQ] = {};
  for (std::int64_t i = 0; i < nq; ++i) inv[i] = l[i] != 0.0f ? job.o_scale / l[i] : 0.0f;  // NaN stays NaN
  auto* first = out.data_as<std::uint16_t>() + out.index(s.tb, h, s.q0 + i0, 0);
  for (std::int64_t c = 0; c < nq; c += 16) {
    const __m512 sc = _mm512_loadu_ps(inv + c);
    const std::int64_t rows = std::min<std::int64_t>(16, nq - c);
    for (std::int64_t d = 0; d < D; d += 32) {
      __m512i w[16];
      for (int k = 0; k < 16; ++k) {
        const __m512 lo = _mm512_mul_ps(_mm512_loadu_ps(ot + (d + 2 * k) * kBlockQ + c), sc);
        const __m512 hi = _mm512_mul_ps(_mm512_loadu_ps(ot + (d + 2 * k + 1) * kBlockQ + c), sc);
        w[k] = pair_bf16(lo, hi);
      }
      transpose16(w);
      for (std::int64_t i = 0; i < rows; ++i) _mm512_storeu_si512(first + (c + i) * ld + d, w[i]);
    }
  }
}

}  // namespace attnprof::cpu::flash::ATTNPROF_ISA_NS
