// The query loop of flash's sm90a backward (flash_bwd_sm90.cuh), split by
// role as the forward's mainloop is:
//   load: the producer thread brings the CTA's K and V once, then query tile
//         after query tile its Q with the LSE (log2 units) and its dO with
//         D = rowsum(dO O), by TMA and bulk copies, into the stages of a
//         PipelineTmaAsync (parts: Q, dO);
//   step: each consumer warpgroup, for its 64 keys of the CTA's key tile and
//         one query tile: S^T = K Q^T and dP^T = V dO^T (wgmma SS, both
//         operands K-major), P^T = exp2(S^T scale - LSE) and
//         dS^T = P^T (dP^T - D) in registers, dV += P^T dO and
//         dK += dS^T Q with P^T and dS^T straight from those registers
//         (wgmma RS, dO and Q read MN-major), and dS^T written to shared
//         memory, where both warpgroups read it for dQ = dS K (wgmma SS,
//         both operands MN-major), half of dQ's columns each.
// Working with S transposed (keys as rows) is what keeps dK and dV in the
// accumulators of the warpgroup that owns the keys, and P^T and dS^T in the A
// fragment layout that the next products take (FlashAttention-3's choice for
// its Hopper backward). Q, K, V, dO and dS^T sit in the 128-byte-swizzled
// layout that TMA writes and wgmma reads (wgmma_sm90.cuh).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels/bwd_args.cuh"
#include "backends/cuda/kernels/element.cuh"
#include "backends/cuda/kernels/epilogue_bwd_sm90.cuh"
#include "backends/cuda/kernels/fwd_args.cuh"
#include "backends/cuda/kernels/pipeline_sm90.cuh"
#include "backends/cuda/kernels/tma_sm90.cuh"
#include "backends/cuda/kernels/utils.cuh"
#include "backends/cuda/kernels/wgmma_sm90.cuh"

namespace attnprof::cuda::kernels {

// Tiles and roles of the sm90a backward: a CTA owns kBlockN keys and walks
// query tiles of kBlockM rows in kStages stages; two consumer warpgroups, and
// a producer warpgroup that gives its registers to them (setmaxnreg,
// FlashAttention-3's 24 + 240 split).
//
// Up to head dim 128 a consumer owns 64 of the CTA's 128 keys, whole: S^T and
// dP^T of its keys against the query tile, dK and dV over the padded head dim
// in its accumulators. Head dim 96 is padded to 128, as in the forward (TMA
// fills the columns past the tensor with zeros; they are never stored).
// Registers at head dim 128 (a consumer thread): dK and dV 64 f32 each, S^T
// and dP^T 32 each while they live, P^T and dS^T 16 each packed, dQ 32. (A
// 128-query tile at head dim 64 spilled 768 bytes: S^T and dP^T twice the size.)
//
// Past head dim 128 ("wide": 192, 256) dK and dV of 64 keys would take 192 or
// 256 f32 a thread alone, so both consumers work on the same 64 keys: each
// computes S^T and dP^T against half of the query tile (32 queries), writes
// its P^T and dS^T to shared memory, and accumulates dK and dV over half of
// the head dim from both halves there (wgmma SS), as FlashAttention-3 does at
// these head dims. At 256: dK and dV 64 f32 each, dQ 64, S^T and dP^T 16.
// At 192 dQ is staged, as up to 128 (two stages of Q and dO leave room); at
// 256 there is none (K, V and two stages fill shared memory), and it is
// added from registers by vector reductions.
//
// dQ = dS K is split between the consumers by columns in both: each takes
// half of the padded head dim.
//
// Q, K, V and dO sit in column regions of 64 elements (128-byte swizzled
// rows) except at head dim 192: there in regions of 32 (64-byte rows), so
// that a consumer's 96 columns of dK, dV and dQ are whole regions and each
// product is one wgmma of N = 96. (With 64-column regions the second
// consumer's columns start inside a region, each product went as N = 64 plus
// N = 32, and with those accumulators in flight ptxas ran out of registers:
// every wgmma serialized, dK spilled and reloaded each query tile.)
template <int kHeadDim_, int kBlockM_, int kStages_ = 3>
struct FlashBwdSm90Cfg {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kPadDim = (kHeadDim + 63) / 64 * 64;
  static constexpr bool kWide = kPadDim > 128;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kWide ? 64 : 128;
  static constexpr int kStages = kStages_;
  static constexpr int kConsumers = 2;
  static constexpr int kConsumerThreads = 128 * kConsumers;
  static constexpr int kProducerThreads = 128;
  static constexpr int kThreads = kConsumerThreads + kProducerThreads;
  // As the forward's FlashSm90Cfg: the consumers grow only into what the
  // producer gives back from the launch's kLaunchRegs a thread.
  static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegsFit =
      (kLaunchRegs * kThreads - kProducerThreads * kProducerRegs) / kConsumerThreads / 8 * 8;
  static constexpr int kConsumerRegs = kConsumerRegsFit < 240 ? kConsumerRegsFit : 240;
  static constexpr int kScoreCols = kWide ? kBlockM / 2 : kBlockM;  // a consumer's queries of S^T
  static constexpr int kMTiles = kScoreCols / 8;                    // n-tiles of S^T
  static constexpr int kDTiles = kPadDim / 8;
  static constexpr int kRegionCols = kPadDim == 192 ? 32 : 64;
  static constexpr int kTileRowBytes = 2 * kRegionCols;           // a region's swizzled row
  static constexpr int kDkvCols = kWide ? kPadDim / 2 : kPadDim;  // a consumer's columns of dK and dV
  static constexpr int kDkvTiles = kDkvCols / 8;
  static constexpr int kDqCols = kPadDim / 2;  // a consumer's columns of dQ
  static constexpr int kDqTiles = kDqCols / 8;
  // Wide: dQ's n-tiles a chunk (computed and added one after the other, so
  // that dK, dV and a chunk fit the registers; at 192 a chunk of 96 columns
  // spilled 576 bytes and serialized the wgmmas, 64 + 32 spills nothing).
  static constexpr int kDqChunkTiles = kWide ? 8 : kDqTiles;
  // The next query tile's S^T and dP^T issued behind this one's dQ (the
  // kernel's loop): where their 64 f32 a thread fit beside dK, dV, dQ, P^T
  // and dS^T (head dim 64: 176 of 240 registers).
  static constexpr bool kScoresAhead = kPadDim == 64;
  static_assert(kScoreCols == 32 || kScoreCols == 64 || kScoreCols == 128, "S^T's wgmma N: 32, 64 or 128 queries");
  static_assert(kDqCols % 32 == 0, "dQ's columns in 32-column chunks");
  static_assert(kBlockN == flash_sm90_bwd_block_n(kHeadDim), "the host's group split reads this tile");
};

// The tile each head dim runs with: three stages up to 128; two at 256 (all
// that fits); at 192 two stages, which leave room to stage dQ (MainloopBwdSm90::
// kDqStaged): the writer warp's bulk reduce-add (and, deterministic, the
// tile's turn) then leave the consumers' path. Measured on the H200
// (docs/perf/issue21-2026-12-03.md): 1.57 -> 1.36 ms against three stages
// with dQ added from registers, and deterministic 1.67 -> 1.29x the default.
// At 256 one stage would be the price of staging: 2.01 -> 2.44 ms.
template <int kHeadDim>
using FlashBwdSm90DefaultCfg = FlashBwdSm90Cfg<kHeadDim, 64, kHeadDim >= 192 ? 2 : 3>;

// The order a CTA walks its query tiles [begin, end): from begin + shift
// round to begin (`at`: the k-th tile walked).
struct QueryWalk {
  QueryTiles tiles;
  int shift = 0;
  __device__ __forceinline__ int count() const { return tiles.end - tiles.begin; }
  __device__ __forceinline__ int at(int k) const {
    const int j = k + shift;
    return tiles.begin + (j < count() ? j : j - count());
  }
};

template <class Cfg, MaskMode kMask, Half16 Element>
struct MainloopBwdSm90 {
  static constexpr int kBM = Cfg::kBlockM, kBN = Cfg::kBlockN, kD = Cfg::kPadDim;
  static constexpr int kMT = Cfg::kMTiles, kDT = Cfg::kDTiles;
  static constexpr int kRC = Cfg::kRegionCols, kRB = Cfg::kTileRowBytes, kRegions = kD / kRC;
  static constexpr int kStepsPerRegion = kRC / 16;  // K-major k-steps of 16 elements (32 bytes) a row
  static constexpr int kQBytes = kBM * kD * 2;      // a Q or dO tile
  static constexpr int kKBytes = kBN * kD * 2;      // K or V
  static constexpr int kDsBytes = kBN * kBM * 2;
  static constexpr int kRowBytes = kBM * 4;                       // a tile's LSE or D
  static constexpr int kDqBytes = kBM * kD * 4;                   // a staged FP32 dQ tile
  static constexpr int kPtBytes = Cfg::kWide ? 2 * kDsBytes : 0;  // P^T twice (wide)
  // K, V, the Q and dO stages, dS^T twice (a consumer may write the next
  // while the other still reads this one), P^T twice (wide), the staged dQ
  // tile(s) where they fit, the LSE and D stages; the swizzled buffers
  // 1024-byte aligned (sizes are multiples of 1024).
  static constexpr int kKOff = 0, kVOff = kKBytes, kQOff = 2 * kKBytes;
  static constexpr int kDoOff = kQOff + Cfg::kStages * kQBytes;
  static constexpr int kDsOff = kDoOff + Cfg::kStages * kQBytes;
  static constexpr int kPtOff = kDsOff + 2 * kDsBytes;
  static constexpr int kDqOff = kPtOff + kPtBytes;
  // dQ is staged for the writer warp's bulk reduce-add (flash_bwd_sm90.cuh)
  // where a tile fits beside the rest: always up to head dim 128, and at 192
  // (two stages); at 256 the consumers add it from registers. Two tiles
  // where they fit (head dim 64), so the consumers may run two tiles ahead of
  // the writer. The barriers and the alignment slack (flash_bwd_sm90.cuh)
  // take at most 1280 bytes, and 2 KiB are kept for them when the second
  // tile is weighed.
  static constexpr int kTailBytes = 2 * Cfg::kStages * kRowBytes;  // LSE and D
  static constexpr bool kDqStaged = kDqOff + kDqBytes + kTailBytes + 1280 <= 227 * 1024;
  static_assert(kDqStaged || Cfg::kWide, "up to head dim 128 dQ is always staged");
  static constexpr bool kTwoDqTiles = !Cfg::kWide && kDqOff + 2 * kDqBytes + kTailBytes + 2048 <= 227 * 1024;
  static constexpr int kDqBuffers = kDqStaged ? (kTwoDqTiles ? 2 : 1) : 0;
  static constexpr int kLseOff = kDqOff + kDqBuffers * kDqBytes;
  static constexpr int kDsumOff = kLseOff + Cfg::kStages * kRowBytes;
  static constexpr int kSmemBytes = kDsumOff + Cfg::kStages * kRowBytes;

  using KVPipeline = sm90::PipelineTmaAsync<1>;
  using QPipeline = sm90::PipelineTmaAsync<Cfg::kStages, 2>;  // parts: Q (+ LSE), dO (+ D)
  static constexpr int kPartQ = 0, kPartDo = 1;

  struct Params {
    CUtensorMap q, k, v, dout;
  };
  using MapKey = sm90::MapKeyOf<4>;

  // The descriptors of a tensor set, made on its first call and kept (the
  // forward's MapCache).
  static cudaError_t to_params(const BwdArgs& a, Params& p) {
    const FwdArgs& f = a.f;
    const MapKey key{
        {f.q, f.k, f.v, a.dout},
        {f.q_batch_stride, f.q_head_stride, f.q_row_stride, f.k_batch_stride, f.k_head_stride, f.k_row_stride,
         f.v_batch_stride, f.v_head_stride, f.v_row_stride, a.do_batch_stride, a.do_head_stride, a.do_row_stride},
        {f.q_rows, f.k_rows, f.heads, f.group, f.map_batch}};
    thread_local sm90::MapCache<Params, 4, MapKey> cache;
    if (const Params* hit = cache.find(key)) {
      p = *hit;
      return cudaSuccess;
    }
    const int kv_heads = f.heads / f.group;
    for (const cudaError_t e : {
             sm90::make_map<Element>(p.q, f.q, Cfg::kHeadDim, f.q_rows, f.heads, f.map_batch, f.q_row_stride,
                                     f.q_head_stride, f.q_batch_stride, kBM, kRB),
             sm90::make_map<Element>(p.dout, a.dout, Cfg::kHeadDim, f.q_rows, f.heads, f.map_batch, a.do_row_stride,
                                     a.do_head_stride, a.do_batch_stride, kBM, kRB),
             sm90::make_map<Element>(p.k, f.k, Cfg::kHeadDim, f.k_rows, kv_heads, f.map_batch, f.k_row_stride,
                                     f.k_head_stride, f.k_batch_stride, kBN, kRB),
             sm90::make_map<Element>(p.v, f.v, Cfg::kHeadDim, f.k_rows, kv_heads, f.map_batch, f.v_row_stride,
                                     f.v_head_stride, f.v_batch_stride, kBN, kRB),
         }) {
      if (e != cudaSuccess) return e;
    }
    cache.insert(key, p);
    return cudaSuccess;
  }

  // The shared buffers from their 1024-byte aligned base: shared-window
  // addresses for TMA and wgmma, a generic pointer for the threads' own reads
  // and writes.
  struct Smem {
    std::uint32_t base;
    unsigned char* ptr;
    __device__ __forceinline__ std::uint32_t k() const { return base + kKOff; }
    __device__ __forceinline__ std::uint32_t v() const { return base + kVOff; }
    __device__ __forceinline__ std::uint32_t q(int st) const { return base + kQOff + st * kQBytes; }
    __device__ __forceinline__ std::uint32_t dout(int st) const { return base + kDoOff + st * kQBytes; }
    __device__ __forceinline__ std::uint32_t ds(int buf) const { return base + kDsOff + buf * kDsBytes; }
    __device__ __forceinline__ std::uint32_t pt(int buf) const { return base + kPtOff + buf * kDsBytes; }
    __device__ __forceinline__ std::uint32_t dq(int buf) const { return base + kDqOff + buf * kDqBytes; }
    __device__ __forceinline__ std::uint32_t lse(int st) const { return base + kLseOff + st * kRowBytes; }
    __device__ __forceinline__ std::uint32_t dsum(int st) const { return base + kDsumOff + st * kRowBytes; }
    template <class T>
    __device__ __forceinline__ T* at(std::uint32_t addr) const {
      return reinterpret_cast<T*>(ptr + (addr - base));
    }
  };

  // Producer (one thread): K and V of the CTA's key tile, then for every
  // query head of `heads` (its group, or its part of it) the query tiles of
  // `walk`, in its order. a: the
  // CTA's sequence (BwdArgs::sequence), whose rows start at the maps' q_row0
  // and k_row0; rows read past it are masked (keys) or have an LSE of +inf
  // (queries), as the forward's (mainloop_fwd_sm90_tma_wgmma_ws.cuh).
  __device__ __forceinline__ static void load(const Params& p, const BwdArgs& a, const Smem& smem, int n0, int kv_head,
                                              BwdArgs::Heads heads, int batch, QueryWalk walk,
                                              const KVPipeline& kv_pipe, const QPipeline& q_pipe,
                                              typename QPipeline::State& q_state) {
    const FwdArgs& f = a.f;
    const int map_batch = f.map_batch_of(batch);
    const std::uint32_t kv_bar = kv_pipe.producer_expect(typename KVPipeline::State{}, 0, 2 * kKBytes);
    for (int r = 0; r < kRegions; ++r) {
      sm90::tma_load_4d(smem.k() + r * kBN * kRB, &p.k, kv_bar, kRC * r, f.k_row0 + n0, kv_head, map_batch);
      sm90::tma_load_4d(smem.v() + r * kBN * kRB, &p.v, kv_bar, kRC * r, f.k_row0 + n0, kv_head, map_batch);
    }
    wait_prior_grid();  // the LSE and D rows come from the preprocess (launch_after_prior)
    for (int g = 0; g < heads.count; ++g) {
      const int head = heads.first + g;
      const std::int64_t rows = (static_cast<std::int64_t>(batch) * f.heads + head) * a.rows_pad;
      for (int k = 0; k < walk.count(); ++k) {
        const int m0 = walk.at(k) * kBM, st = q_state.index();
        q_pipe.producer_acquire(q_state, kPartQ);
        const std::uint32_t q_bar = q_pipe.producer_expect(q_state, kPartQ, kQBytes + kRowBytes);
        for (int r = 0; r < kRegions; ++r) {
          sm90::tma_load_4d(smem.q(st) + r * kBM * kRB, &p.q, q_bar, kRC * r, f.q_row0 + m0, head, map_batch);
        }
        sm90::bulk_load(smem.lse(st), a.lse_log2 + rows + m0, kRowBytes, q_bar);
        q_pipe.producer_acquire(q_state, kPartDo);
        const std::uint32_t do_bar = q_pipe.producer_expect(q_state, kPartDo, kQBytes + kRowBytes);
        for (int r = 0; r < kRegions; ++r) {
          sm90::tma_load_4d(smem.dout(st) + r * kBM * kRB, &p.dout, do_bar, kRC * r, f.q_row0 + m0, head, map_batch);
        }
        sm90::bulk_load(smem.dsum(st), a.dsum + rows + m0, kRowBytes, do_bar);
        q_state.advance();
      }
    }
  }

  // X^T = K_w Y_w^T, issued (not waited for): this warpgroup's 64 rows of
  // `keys` (K or V; wide: the CTA's 64) against its columns of the query tile
  // `rows` (Q or dO; wide: its half), both K-major over the head dim's
  // k-steps (not the padding).
  __device__ __forceinline__ static void issue_transposed_scores(std::uint32_t keys, std::uint32_t rows,
                                                                 float (&x)[kMT][4], int wg) {
    const std::uint32_t key_rows = Cfg::kWide ? 0 : wg * 64 * kRB, query_rows = Cfg::kWide ? wg * kMT * 8 * kRB : 0;
    zero(x);
    sm90::fence_operands(x);
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Cfg::kHeadDim / 16; ++kk) {
      const std::uint32_t a_at = keys + (kk / kStepsPerRegion) * kBN * kRB + key_rows + (kk % kStepsPerRegion) * 32;
      const std::uint32_t b_at = rows + (kk / kStepsPerRegion) * kBM * kRB + query_rows + (kk % kStepsPerRegion) * 32;
      sm90::wgmma_ss<Element, kMT>(x, sm90::smem_desc_rows<kRB>(a_at, 0), sm90::smem_desc_rows<kRB>(b_at, 0), kk > 0);
    }
    sm90::wgmma_commit();
  }

  // acc += X^T Y, issued: X^T (P^T or dS^T) from registers, 16 queries a
  // k-step, Y (dO or Q) of the stage read MN-major, in 128-column chunks.
  __device__ __forceinline__ static void issue_accumulate(std::uint32_t rows, float (&acc)[1][kDT][4],
                                                          std::uint32_t (&x)[kMT / 2][4]) {
    sm90::fence_operands(acc[0]);
    sm90::fence_operands(x);
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kMT / 2; ++kk) {
      sm90::for_n_chunks<0, kDT>([&]<int kFirst, int kN>() {
        const std::uint32_t y_at = rows + column_at(8 * kFirst, kBM * kRB) + kk * 16 * kRB;
        sm90::wgmma_rs<Element, kN>(reinterpret_cast<float(&)[kN][4]>(acc[0][kFirst]), x[kk],
                                    sm90::smem_desc_rows<kRB>(y_at, kBM * kRB), true);
      });
    }
    sm90::wgmma_commit();
  }

  // The byte offset of column `col` in an MN-major operand of kRC-column
  // regions `region_bytes` apart (a chunk's descriptor starts at a region or,
  // 32 columns wide, 64 bytes into a 64-column one: sm90::wgmma_ss_tt).
  __device__ __forceinline__ static std::uint32_t column_at(int col, int region_bytes) {
    return (col / kRC) * region_bytes + (col % kRC) * 2;
  }

  // Wide: acc (this warpgroup's kDkvCols columns, consumer_column's order)
  // += X^T Y, issued: X^T (P^T or dS^T of all the tile's queries) from shared
  // memory K-major, Y (dO or Q) of the stage read MN-major, 16 queries a
  // k-step, in chunks of contiguous columns. The chunks' columns are offsets
  // at run time, the same instructions for both warpgroups (an instruction
  // stream a warpgroup made ptxas place the accumulators twice and spill).
  __device__ __forceinline__ static void issue_accumulate_ss(std::uint32_t x, std::uint32_t rows,
                                                             float (&acc)[1][Cfg::kDkvTiles][4], int wg) {
    sm90::fence_operands(acc[0]);
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBM / 16; ++kk) {
      sm90::for_tile_chunks<0, Cfg::kDkvTiles, 16>([&]<int kFirst, int kN>() {
        const std::uint32_t y_at =
            rows + column_at(consumer_column<Cfg::kPadDim>(wg, kFirst), kBM * kRB) + kk * 16 * kRB;
        sm90::wgmma_ss_km<Element, kN>(reinterpret_cast<float(&)[kN][4]>(acc[0][kFirst]),
                                       sm90::smem_desc(x + (kk / 4) * kBN * 128 + (kk % 4) * 32, 0),
                                       sm90::smem_desc_rows<kRB>(y_at, kBM * kRB), true);
      });
    }
    sm90::wgmma_commit();
  }

  // dQ's n-tiles [nt0, nt0 + kNTiles) of this warpgroup (contiguous columns
  // from consumer_column) = dS K, issued: dS^T from shared memory (rows =
  // keys) and K, both read MN-major, 16 keys a k-step. Not wide: all of the
  // warpgroup's kDqCols columns in one; wide: a chunk at a time, so that dK,
  // dV and only a chunk of dQ are in flight.
  template <int kNTiles>
  __device__ __forceinline__ static void issue_dq(const Smem& smem, int buf, float (&dq)[kNTiles][4], int wg, int nt0) {
    const std::uint32_t k = smem.k() + column_at(consumer_column<Cfg::kPadDim>(wg, nt0), kBN * kRB);
    zero(dq);
    sm90::fence_operands(dq);
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBN / 16; ++kk) {
      sm90::wgmma_ss_tt<Element, kNTiles>(dq, sm90::smem_desc(smem.ds(buf) + kk * 16 * 128, kBN * 128),
                                          sm90::smem_desc_rows<kRB>(k + kk * 16 * kRB, kBN * kRB), kk > 0);
    }
    sm90::wgmma_commit();
  }

  // Masks S^T (rows: keys key0 and key0 + 8; columns: queries from col0, the
  // accumulator's layout) where the tile needs it: keys past seq_k, the causal
  // diagonal, the window. Queries past seq_q need nothing: their LSE is +inf.
  __device__ __forceinline__ static void mask(const FwdArgs& f, float (&s)[kMT][4], int key0, int col0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int key = key0 + 8 * h;
      // Visible: lo <= c < hi, c = query - col0.
      int lo = key < f.seq_k ? -(1 << 30) : (1 << 30), hi = 1 << 30;
      if constexpr (kMask != MaskMode::None) lo = max(lo, key - f.diag_offset - col0);
      if constexpr (kMask == MaskMode::Window) hi = min(hi, key - f.diag_offset + f.window - col0);
#pragma unroll
      for (int nt = 0; nt < kMT; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int c = nt * 8 + e;
          if (c < lo || c >= hi) s[nt][2 * h + e] = -INFINITY;
        }
      }
    }
  }

  // dS^T's (wide: and P^T's) A fragments into shared memory as the
  // [key][query] tile at `tile` that issue_dq and issue_accumulate_ss read:
  // 64-query regions of 128-byte rows, chunks swizzled by the row
  // (conflict-free: the 8 rows of a store are 8 different chunks). col0: the
  // fragments' first query in the tile (wide: the warpgroup's half).
  __device__ __forceinline__ static void store_transposed(const Smem& smem, std::uint32_t tile,
                                                          const std::uint32_t (&ds)[kMT / 2][4], int key_row0, int col0,
                                                          int lane) {
    unsigned char* const base = smem.template at<unsigned char>(tile);
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int kk = 0; kk < kMT / 2; ++kk) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int c = col0 + kk * 16 + 8 * j;  // the fragment half's first query
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = key_row0 + g + 8 * h;
          const int chunk = ((c % 64) / 8) ^ (row % 8);
          *reinterpret_cast<std::uint32_t*>(base + (c / 64) * kBN * 128 + row * 128 + chunk * 16 + 4 * t) =
              ds[kk][2 * j + h];
        }
      }
    }
  }
};

}  // namespace attnprof::cuda::kernels
