// The sm90 backward's deterministic dQ order (flash_bwd_sm90.cuh,
// FlashBwdSm90::dq_turn), computed on the GPU by the kernel's own functions
// for every key tile and query tile of a problem, and checked on the host:
// - the turns of the key tiles that add into a query tile are 0, 1, ... once
//   each (a missing turn hangs the kernel, a repeated one races);
// - in key-tile order, no key tile waits on one launched after it (a wait
//   on a CTA that is not resident could hang);
// - with the key tile fastest (rotated walks unmasked, adds from the highest
//   key tile down under a mask at head dim 256), the key tile with turn t + 1 reaches the
//   query tile no earlier in its own walk than the one with turn t (else it
//   would wait each time), and a head's key tiles fit one a multiprocessor
//   (FlashBwdSm90::key_tile_fastest), since they wait on ones launched
//   after them.
// Masks (top-left and bottom-right causal, windows, none), more query tiles
// than key tiles and fewer, and every tile shape the kernel uses.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backends/cuda/kernels/flash_bwd_sm90.cuh"

namespace {

namespace kern = attnprof::cuda::kernels;
using kern::MaskMode;

#define CUDA_OK(call)                                                          \
  do {                                                                         \
    const cudaError_t err_ = (call);                                           \
    ASSERT_EQ(err_, cudaSuccess) << #call << ": " << cudaGetErrorString(err_); \
  } while (0)

// One thread a key tile: its walk's query tiles, and for each the step it
// reaches it at and its turn ([n_tiles][m_tiles], -1 where it adds nothing).
template <class Cfg, MaskMode kMask>
__global__ void order_kernel(kern::FwdArgs f, bool fastest, int n_tiles, int m_tiles, int* turns, int* steps) {
  using Kernel = kern::FlashBwdSm90<Cfg, kMask, kern::Bf16>;
  const int n_block = blockIdx.x * blockDim.x + threadIdx.x;
  if (n_block >= n_tiles) return;
  kern::QueryWalk walk{kern::query_tiles<kMask, Cfg::kBlockM, Cfg::kBlockN>(f, n_block * Cfg::kBlockN)};
  walk.shift = Kernel::walk_shift(f, walk, n_block, fastest);
  for (int k = 0; k < walk.count(); ++k) {
    const int mt = walk.at(k);
    turns[n_block * m_tiles + mt] = Kernel::dq_turn(f, walk, mt * Cfg::kBlockM, n_block, fastest);
    steps[n_block * m_tiles + mt] = k;
  }
}

struct Case {
  std::string label;
  MaskMode mask;
  int seq_q, seq_k, window;
  bool bottom_right;
};

template <class Cfg, MaskMode kMask>
void check_order(const Case& c, int multiprocessors) {
  using Kernel = kern::FlashBwdSm90<Cfg, kMask, kern::Bf16>;
  kern::FwdArgs f{};
  f.seq_q = c.seq_q;
  f.seq_k = c.seq_k;
  f.window = c.window;
  f.diag_offset = c.bottom_right ? c.seq_k - c.seq_q : 0;
  const int n_tiles = (c.seq_k + Cfg::kBlockN - 1) / Cfg::kBlockN,
            m_tiles = (c.seq_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  const std::string what = c.label + " (key tile " + std::to_string(Cfg::kBlockN) + ")";
  const bool fastest = Kernel::key_tile_fastest(true, n_tiles, multiprocessors);
  if (fastest) EXPECT_LE(n_tiles, multiprocessors) << what << ": a cycle of waits wider than the GPU";
  const std::size_t cells = static_cast<std::size_t>(n_tiles) * m_tiles;
  int *turns = nullptr, *steps = nullptr;
  CUDA_OK(cudaMalloc(&turns, cells * sizeof(int)));
  CUDA_OK(cudaMalloc(&steps, cells * sizeof(int)));
  CUDA_OK(cudaMemset(turns, 0xff, cells * sizeof(int)));
  order_kernel<Cfg, kMask><<<(n_tiles + 127) / 128, 128>>>(f, fastest, n_tiles, m_tiles, turns, steps);
  CUDA_OK(cudaGetLastError());
  std::vector<int> t(cells), s(cells);
  CUDA_OK(cudaMemcpy(t.data(), turns, cells * sizeof(int), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(s.data(), steps, cells * sizeof(int), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaFree(turns));
  CUDA_OK(cudaFree(steps));
  int checked = 0;
  for (int m = 0; m < m_tiles; ++m) {
    std::vector<int> by_turn;  // key tiles in turn order
    for (int n = 0; n < n_tiles; ++n) {
      const int turn = t[static_cast<std::size_t>(n) * m_tiles + m];
      if (turn < 0) continue;
      if (turn >= static_cast<int>(by_turn.size())) by_turn.resize(turn + 1, -1);
      ASSERT_EQ(by_turn[turn], -1) << what << ": query tile " << m << " gives turn " << turn << " twice";
      by_turn[turn] = n;
    }
    for (std::size_t k = 0; k < by_turn.size(); ++k) {
      ASSERT_NE(by_turn[k], -1) << what << ": query tile " << m << " has no key tile at turn " << k << " of "
                                << by_turn.size() << " (the next would wait forever)";
      if (k == 0) continue;
      const int prev = by_turn[k - 1], next = by_turn[k];
      if (fastest) {
        EXPECT_LE(s[static_cast<std::size_t>(prev) * m_tiles + m], s[static_cast<std::size_t>(next) * m_tiles + m])
            << what << ": query tile " << m << ": key tile " << next << " waits on " << prev
            << ", which reaches the tile later in its walk";
      } else {
        EXPECT_LT(prev, next) << what << ": query tile " << m << ": key tile " << next << " waits on " << prev
                              << ", launched after it";
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 0) << what << ": no query tile has two key tiles";
}

template <class Cfg>
void check_every_case(int multiprocessors) {
  const std::vector<Case> cases = {
      {"causal 1000", MaskMode::Causal, 1000, 1000, 0, false},
      {"causal 8192", MaskMode::Causal, 8192, 8192, 0, false},
      {"causal 20000 (more key tiles than multiprocessors)", MaskMode::Causal, 20000, 20000, 0, false},
      {"window 700 of 20000", MaskMode::Window, 20000, 20000, 700, false},
      {"causal 700 over 1900 bottom-right", MaskMode::Causal, 700, 1900, 0, true},
      {"causal 1900 over 700 top-left", MaskMode::Causal, 1900, 700, 0, false},
      {"window 300 of 2000", MaskMode::Window, 2000, 2000, 300, false},
      {"window 90 of 500 over 1300 bottom-right", MaskMode::Window, 500, 1300, 90, true},
      {"none 1000", MaskMode::None, 1000, 1000, 0, false},
      {"none 8192 (rotated walks)", MaskMode::None, 8192, 8192, 0, false},
      {"none 200 over 3000", MaskMode::None, 200, 3000, 0, false},
      {"none 3000 over 200", MaskMode::None, 3000, 200, 0, false},
      {"none 20000 (more key tiles than multiprocessors)", MaskMode::None, 20000, 20000, 0, false},
  };
  for (const Case& c : cases) {
    switch (c.mask) {
      case MaskMode::None:
        check_order<Cfg, MaskMode::None>(c, multiprocessors);
        break;
      case MaskMode::Causal:
        check_order<Cfg, MaskMode::Causal>(c, multiprocessors);
        break;
      case MaskMode::Window:
        check_order<Cfg, MaskMode::Window>(c, multiprocessors);
        break;
    }
  }
}

TEST(FlashBwdSm90Order, DeterministicTurnsAreCompleteOrderedAndLaunchSafe) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) GTEST_SKIP() << "no CUDA device";
  int sms = 0;
  CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  check_every_case<kern::FlashBwdSm90DefaultCfg<64>>(sms);   // 128-key tiles
  check_every_case<kern::FlashBwdSm90DefaultCfg<192>>(sms);  // 64-key tiles (wide)
  check_every_case<kern::FlashBwdSm90DefaultCfg<256>>(sms);  // wide, the consumers' own turns
}

// The key-tile-slowest grid in chunks of pairs (FlashBwdSm90::chunked_cta):
// every (key tile, pair) once, a pair's key tiles launched in order
// (deterministic: key tile n waits on n - 1, which must have started first),
// and chunks of consecutive pairs whose widths differ by one at most.
// Host-side: the function is the kernel's own.
TEST(FlashBwdSm90Order, ChunkedGridLaunchesEveryKeyTileOnceInOrder) {
  using Kernel = kern::FlashBwdSm90<kern::FlashBwdSm90DefaultCfg<128>, MaskMode::Causal, kern::Bf16>;
  for (const int n_tiles : {1, 5, 32}) {
    for (const int pairs : {1, 7, 128}) {
      for (const int chunks : {1, 2, 3, 14, pairs}) {
        if (chunks > pairs) continue;
        const std::string what = std::to_string(n_tiles) + " key tiles, " + std::to_string(pairs) + " pairs, " +
                                 std::to_string(chunks) + " chunks";
        std::vector<int> last(pairs, -1);
        int prev_pair = -1, pairs_started = 0;
        for (int id = 0; id < n_tiles * pairs; ++id) {
          int n_block = -1, pair = -1;
          Kernel::chunked_cta(id, n_tiles, pairs, chunks, n_block, pair);
          ASSERT_TRUE(pair >= 0 && pair < pairs && n_block >= 0 && n_block < n_tiles)
              << what << ": CTA " << id << " -> key tile " << n_block << " of pair " << pair;
          ASSERT_EQ(n_block, last[pair] + 1) << what << ": CTA " << id << " of pair " << pair << " out of order";
          if (n_block == 0) {
            ASSERT_EQ(pair, prev_pair + 1) << what << ": pairs start in order, chunk after chunk";
            prev_pair = pair;
            ++pairs_started;
          }
          last[pair] = n_block;
        }
        EXPECT_EQ(pairs_started, pairs) << what;
        for (int p = 0; p < pairs; ++p) EXPECT_EQ(last[p], n_tiles - 1) << what << ": pair " << p;
      }
    }
  }
}

// How many chunks (FlashBwdSm90::chunks): one to the pairs; each chunk
// (pairs / chunks pairs, or one more) at least two waves of CTAs, and no
// more chunks than that allows; one when deterministic.
TEST(FlashBwdSm90Order, ChunksHoldAtLeastTwoWaves) {
  using Kernel = kern::FlashBwdSm90<kern::FlashBwdSm90DefaultCfg<128>, MaskMode::Causal, kern::Bf16>;
  for (const int sms : {108, 132}) {
    for (const int n_tiles : {1, 8, 32, 64, 300}) {
      for (const int pairs : {1, 16, 32, 128, 4096}) {
        const std::string what = std::to_string(n_tiles) + " key tiles, " + std::to_string(pairs) + " pairs";
        const int chunks = Kernel::chunks(false, n_tiles, pairs, sms);
        ASSERT_TRUE(chunks >= 1 && chunks <= pairs) << what << ": " << chunks;
        if (chunks > 1) {
          EXPECT_GE(pairs / chunks * n_tiles, 2 * sms) << what;
          EXPECT_LT(pairs / (chunks + 1) * n_tiles, 2 * sms) << what << ": one more chunk would still fit";
        }
        EXPECT_EQ(Kernel::chunks(true, n_tiles, pairs, sms), 1) << what;
      }
    }
  }
}

}  // namespace
