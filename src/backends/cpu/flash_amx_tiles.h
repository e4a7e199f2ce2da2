// The AMX tile products of the CPU flash bf16 kernels (flash_bf16_kernels.h,
// which includes this inside its ISA namespace once <immintrin.h> or the
// tests' stand-ins are in): the tile configuration every kernel loads and
// amx_block, a 2 x 2 (or 1 x 2) block of 16 x 16 FP32 tiles over bf16 A and
// B in pairs, and amx_gemm, a whole product of them. Only where the level
// has AMX (ATTNPROF_FLASH_AMX).
#pragma once

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

}  // namespace attnprof::cpu::flash::ATTNPROF_ISA_NS
