// What leaves the sm90a backward's registers (flash_bwd_sm90.cuh): each query
// tile's dQ share, staged in shared memory and added into the FP32
// accumulator by one bulk reduce-add (TMA) per tile, which the kernel's dQ
// writer warp issues (FlashBwdSm90::write_dq; at head dim 256, with no
// room to stage: by 16-byte vector reductions from registers), in
// whatever order the key tiles finish or (deterministic) in key-tile order,
// each key tile waiting on a semaphore for the one before; and dK and dV once
// per key tile (epilogue_bwd_sm80.cuh's store_rows). The accumulators have
// mma.m16n8k16's C layout (wgmma_sm90.cuh).
//
// The staged tile, and so the accumulator's 64-row tiles, are in register
// order: [consumer][warp][n-tile][lane][4 floats] (kBlockM x kPadDim floats),
// so that every thread writes 16-byte pieces without bank conflicts and the
// whole tile is one contiguous bulk operation, as FlashAttention-3 does; the
// conversion kernel (flash_bwd_postprocess.cuh) reads that order back.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "backends/cuda/kernels/bwd_args.cuh"
#include "backends/cuda/kernels/epilogue_bwd_sm80.cuh"
#include "backends/cuda/kernels/tma_sm90.cuh"
#include "backends/cuda/kernels/utils.cuh"
#include "backends/cuda/kernels/wgmma_sm90.cuh"

namespace attnprof::cuda::kernels {

// Where fragment (consumer wg, warp, n-tile nt, lane) of a tile's dQ sits, in
// floats from the tile's start: DqTileLayout::offset (both the kernel and the
// conversion use it).
template <int kDqTiles>
struct DqTileLayout {
  __host__ __device__ static constexpr int offset(int wg, int warp, int nt, int lane) {
    return (((wg * 4 + warp) * kDqTiles + nt) * 32 + lane) * 4;
  }
};

// The first column of consumer wg's n-tile nt of dQ (and, wide, of dK and
// dV) at padded head dim kPadDim: the consumer's half of the columns, in
// order (at 192 whole 32-column regions: mainloop_bwd_sm90.cuh).
template <int kPadDim>
__host__ __device__ constexpr int consumer_column(int wg, int nt) {
  return wg * (kPadDim / 2) + 8 * nt;
}

template <class Cfg>
struct EpilogueBwdSm90 {
  static_assert(Cfg::kBlockM == 64, "a dQ tile of 64 rows: four warps of 16 a consumer");
  using Layout = DqTileLayout<Cfg::kDqTiles>;
  static constexpr int kDqBytes = Cfg::kBlockM * Cfg::kPadDim * 4;

  // The tile's semaphore (deterministic): its key tiles' turns, in order.
  __device__ __forceinline__ static int* semaphore(const BwdArgs& a, std::int64_t bh, int m0) {
    return a.dq_semaphore + bh * (a.rows_pad / 64) + m0 / 64;
  }
  __device__ __forceinline__ static bool has_turn(const int* sem, int turn) {
    int seen;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(seen) : "l"(sem) : "memory");
    return seen == turn;
  }
  __device__ __forceinline__ static void wait_turn(const int* sem, int turn) {
    while (!has_turn(sem, turn)) {
    }
  }
  __device__ __forceinline__ static void pass_turn(int* sem) {
    asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(sem) : "memory");
  }

  // This thread's dQ fragments of n-tiles [nt0, nt0 + kNTiles) (times the
  // softmax scale) into the staged tile.
  template <int kNTiles>
  __device__ __forceinline__ static void stage_dq(float* tile, const float (&dq)[kNTiles][4], float scale, int wg,
                                                  int warp_in_wg, int lane, int nt0 = 0) {
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
      *reinterpret_cast<float4*>(tile + Layout::offset(wg, warp_in_wg, nt0 + nt, lane)) =
          make_float4(dq[nt][0] * scale, dq[nt][1] * scale, dq[nt][2] * scale, dq[nt][3] * scale);
    }
  }

  // Wide (no staging): this thread's dQ fragments of n-tiles [nt0, nt0 +
  // kNTiles) (times the softmax scale) added into the accumulator's tile at
  // m0 where stage_dq would have put them, one 16-byte vector reduction each.
  template <int kNTiles>
  __device__ __forceinline__ static void reduce_dq(const BwdArgs& a, const float (&dq)[kNTiles][4], std::int64_t bh,
                                                   int m0, int nt0, int wg, int warp_in_wg, int lane) {
    // One base address a chunk, the n-tiles at immediate offsets from it
    // (Layout: 512 bytes apart): with an address kept per n-tile, ptxas held
    // them across the query loop and, at head dim 192, ran out of registers
    // for the in-flight accumulators (every wgmma serialized, dK spilled).
    const float* const dst =
        a.dq_accum + (bh * a.rows_pad + m0) * Cfg::kPadDim + Layout::offset(wg, warp_in_wg, nt0, lane);
    constexpr int kStepBytes = (Layout::offset(0, 0, 1, 0) - Layout::offset(0, 0, 0, 0)) * 4;
    [&]<int... kNt>(std::integer_sequence<int, kNt...>) { (red_add_v4<kNt * kStepBytes>(dst, dq[kNt], a.scale), ...); }
    (std::make_integer_sequence<int, kNTiles>{});
  }
  template <int kOffsetBytes>
  __device__ __forceinline__ static void red_add_v4(const float* dst, const float (&x)[4], float scale) {
    asm volatile("red.global.add.v4.f32 [%0+%5], {%1, %2, %3, %4};\n" ::"l"(dst), "f"(x[0] * scale), "f"(x[1] * scale),
                 "f"(x[2] * scale), "f"(x[3] * scale), "n"(kOffsetBytes)
                 : "memory");
  }
  // Deterministic and wide: around a tile's reduce_dq calls, every consumer
  // thread waits until the leader has seen the tile's turn, and the leader
  // passes the turn on once every thread's adds are fenced (named barriers of
  // the consumers, id `barrier`).
  __device__ __forceinline__ static void take_dq_turn(const BwdArgs& a, std::int64_t bh, int m0, int turn, bool leader,
                                                      int barrier) {
    if (leader) wait_turn(semaphore(a, bh, m0), turn);
    sm90::named_barrier_sync(barrier, Cfg::kConsumerThreads);
  }
  __device__ __forceinline__ static void pass_dq_turn(const BwdArgs& a, std::int64_t bh, int m0, bool leader,
                                                      int barrier) {
    __threadfence();
    sm90::named_barrier_sync(barrier, Cfg::kConsumerThreads);
    if (leader) pass_turn(semaphore(a, bh, m0));
  }

  // dK (times the softmax scale) and dV of this consumer's keys and columns
  // (its 64 keys whole; wide: the CTA's 64 keys, its half of the head dim);
  // padding columns are not stored, nor keys past the sequence's seq_k (a
  // dense batch's rows outside its sequence's keys get their zeros from
  // zero_dkdv_rows_outside). Where the group is split
  // (BwdArgs::group_split), this part's FP32 sums instead, into its slice of
  // dkv_partial (every padded column, at the tensor's rows: k_row0 on), which
  // launch_bwd_sum_dkv adds up (the scale applied there).
  template <Half16 Element>
  __device__ __forceinline__ static void store_dkdv(const BwdArgs& a, const float (&dk)[1][Cfg::kDkvTiles][4],
                                                    const float (&dv)[1][Cfg::kDkvTiles][4], int n0, int kv_head,
                                                    int batch, int part, int wg, int warp_in_wg, int lane) {
    const int row0 = (Cfg::kWide ? 0 : 64 * wg) + 16 * warp_in_wg, valid = a.f.seq_k - n0;
    // A run of kN n-tiles at column col of both, through `store`.
    // kStored: the n-tiles stored unwide (the head dim's, or every padded one).
    const auto each_run = [&]<int kStored>(auto&& store) {
      if constexpr (!Cfg::kWide) {
        using Stored = const float(&)[kStored][4];
        store.template operator()<kStored>(0, reinterpret_cast<Stored>(dk[0]), reinterpret_cast<Stored>(dv[0]));
      } else {
        // The consumer's columns in runs of contiguous n-tiles (consumer_column).
        sm90::for_tile_chunks<0, Cfg::kDkvTiles, 8>([&]<int kFirst, int kN>() {
          using Run = const float(&)[kN][4];
          store.template operator()<kN>(consumer_column<Cfg::kPadDim>(wg, kFirst), reinterpret_cast<Run>(dk[0][kFirst]),
                                        reinterpret_cast<Run>(dv[0][kFirst]));
        });
      }
    };
    if (a.group_split > 1) {
      const int kv_heads = a.f.heads / a.f.group;
      // Dense only (packed batches are not split): k_rows is the keys of every sequence's rows.
      const std::int64_t slice = static_cast<std::int64_t>(a.f.batch) * kv_heads * a.f.k_rows * Cfg::kPadDim;
      float* const dk_at =
          a.dkv_partial + part * slice +
          ((static_cast<std::int64_t>(batch) * kv_heads + kv_head) * a.f.k_rows + a.f.k_row0 + n0) * Cfg::kPadDim;
      float* const dv_at = dk_at + a.group_split * slice;
      each_run.template operator()<Cfg::kDkvTiles>(
          [&]<int kN>(int col, const float(&k)[kN][4], const float(&v)[kN][4]) {
            store_rows_f32(dk_at + col, Cfg::kPadDim, k, row0, valid, lane);
            store_rows_f32(dv_at + col, Cfg::kPadDim, v, row0, valid, lane);
          });
      return;
    }
    std::uint16_t* const dk_at = a.dk + batch * a.dk_batch_stride + kv_head * a.dk_head_stride + n0 * a.dk_row_stride;
    std::uint16_t* const dv_at = a.dv + batch * a.dv_batch_stride + kv_head * a.dv_head_stride + n0 * a.dv_row_stride;
    each_run.template operator()<Cfg::kHeadDim / 8>(
        [&]<int kN>(int col, const float(&k)[kN][4], const float(&v)[kN][4]) {
          using Run = const float(&)[1][kN][4];
          store_rows<Element>(dk_at + col, a.dk_row_stride, reinterpret_cast<Run>(k), a.scale, row0, valid, lane);
          store_rows<Element>(dv_at + col, a.dv_row_stride, reinterpret_cast<Run>(v), 1.f, row0, valid, lane);
        });
  }

  // A dense batch's key rows (FwdArgs::kv_spans): the rows of the tensor's
  // key tile at n0 outside sequence `seq`'s keys as zeros, in dK and dV or,
  // where the group is split, in this part's FP32 partial sums (which
  // launch_bwd_sum_dkv adds up over every row). `args`: the batch's.
  __device__ __forceinline__ static void zero_dkdv_rows_outside(const BwdArgs& args, const BwdArgs& seq, int n0,
                                                                int kv_head, int batch, int part, int tid) {
    if (args.f.kv_spans == nullptr) return;
    if (args.group_split == 1) {
      args.zero_dkdv_rows_outside(seq, batch, kv_head, n0, Cfg::kBlockN, tid, Cfg::kConsumerThreads);
      return;
    }
    const int kv_heads = args.f.heads / args.f.group;
    const std::int64_t slice = static_cast<std::int64_t>(args.f.batch) * kv_heads * args.f.k_rows * Cfg::kPadDim;
    float* const dk_at = args.dkv_partial + part * slice +
                         (static_cast<std::int64_t>(batch) * kv_heads + kv_head) * args.f.k_rows * Cfg::kPadDim;
    const auto outside = [&](int row) { return seq.f.k_row_outside(row); };
    for (float* at : {dk_at, dk_at + args.group_split * slice}) {
      zero_rows_outside(at, Cfg::kPadDim, Cfg::kPadDim, n0, Cfg::kBlockN, args.f.k_rows, outside, tid,
                        Cfg::kConsumerThreads);
    }
  }

  // A warp's 16 rows of kN n-tiles (rows row0 + lane / 4 and 8 below) as
  // FP32, rows at or past `valid` skipped.
  template <int kN>
  __device__ __forceinline__ static void store_rows_f32(float* base, int row_stride, const float (&acc)[kN][4],
                                                        int row0, int valid, int lane) {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + g + 8 * h;
      if (row >= valid) continue;
#pragma unroll
      for (int nt = 0; nt < kN; ++nt) {
        *reinterpret_cast<float2*>(base + static_cast<std::int64_t>(row) * row_stride + nt * 8 + 2 * t) =
            make_float2(acc[nt][2 * h], acc[nt][2 * h + 1]);
      }
    }
  }
};

}  // namespace attnprof::cuda::kernels
