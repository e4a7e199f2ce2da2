// FlashAttention backward on sm90a (FlashAttention-3 class): TMA loads, wgmma,
// a producer warpgroup that gives its registers to two consumer warpgroups.
// Three kernels a call, as on sm80 (flash_bwd_sm80.cuh):
//   1. bwd_preprocess (flash_bwd_preprocess.cuh): D = rowsum(dO * O) and the
//      LSE in log2 units, both over padded rows; the dQ accumulator and the
//      ordered-dQ semaphores zeroed;
//   2. flash_bwd_sm90_kernel: one CTA per (key tile, kv head, batch): 128
//      keys, 64 past head dim 128,
//      K and V resident in shared memory, Q, dO, LSE and D streamed query tile
//      after query tile, for every query head of its grouped-query group (dK
//      and dV summed in registers, no atomics for them); dQ added into the FP32
//      accumulator by one bulk reduce-add a query tile, which a warp of the
//      producer warpgroup issues (deterministic: in key-tile order);
//   3. bwd_convert_dq_tiled (flash_bwd_postprocess.cuh): the accumulator
//      (in its tiles' register order) to dQ.
// This file lays out shared memory and the barriers and splits the CTA by
// role; the roles live in
//   mainloop_bwd_sm90.cuh    loads (producer), the five products (consumers)
//   pipeline_sm90.cuh        the mbarrier stages between them
//   epilogue_bwd_sm90.cuh    dQ staged (the writer warp here reduce-adds it), the wide
//                            path's dQ reductions and turns; dK and dV out
//   bwd_order_sm90.cuh       the grid's order and (deterministic) the dQ turns
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels/bwd_args.cuh"
#include "backends/cuda/kernels/bwd_launch.cuh"
#include "backends/cuda/kernels/bwd_order_sm90.cuh"
#include "backends/cuda/kernels/element.cuh"
#include "backends/cuda/kernels/epilogue_bwd_sm90.cuh"
#include "backends/cuda/kernels/flash_bwd_postprocess.cuh"
#include "backends/cuda/kernels/flash_bwd_preprocess.cuh"
#include "backends/cuda/kernels/fwd_args.cuh"
#include "backends/cuda/kernels/fwd_launch.cuh"
#include "backends/cuda/kernels/mainloop_bwd_sm90.cuh"
#include "backends/cuda/kernels/pipeline_sm90.cuh"
#include "backends/cuda/kernels/utils.cuh"
#include "backends/cuda/kernels/wgmma_sm90.cuh"

namespace attnprof::cuda::kernels {

template <class Cfg, MaskMode kMask, Half16 Element>
struct FlashBwdSm90 : BwdOrderSm90<Cfg, kMask> {
  using Order = BwdOrderSm90<Cfg, kMask>;
  using Mainloop = MainloopBwdSm90<Cfg, kMask, Element>;
  using Epilogue = EpilogueBwdSm90<Cfg>;
  using Params = typename Mainloop::Params;
  static constexpr int kKVPipeOffset = Mainloop::kSmemBytes;
  static constexpr int kQPipeOffset = kKVPipeOffset + Mainloop::KVPipeline::kBarrierBytes;
  // 1024 bytes of slack: the swizzled buffers must start 1024-byte aligned.
  static constexpr int kSmemBytes = kQPipeOffset + Mainloop::QPipeline::kBarrierBytes + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an sm90 CTA may have");
  // Named barriers of the two consumers: both halves of dS^T are in shared
  // memory; (wide, dQ not staged, deterministic) the tile's dQ turn is seen,
  // then passed. Between the consumers and the dQ writer (dQ staged), per
  // staging buffer:
  // the staged dQ tile is whole (kDqFull + b); its buffer is free again
  // (kDqEmpty + b).
  static constexpr int kDsReady = 1, kDqReady = 2, kDqFull = 3, kDqEmpty = 5;
  static constexpr int kDqBuffers = Mainloop::kDqBuffers;
  static constexpr bool kDqStaged = Mainloop::kDqStaged;
  static constexpr int kDqHandshake = Cfg::kConsumerThreads + 32;

  // The dQ writer (dQ staged): the producer warpgroup's second warp. For each
  // query tile the consumers walk, once they have staged its dQ (in buffer
  // t % kDqBuffers), one bulk reduce-add of it into the accumulator by its
  // first lane, and the buffer handed back as soon as the copy has read it.
  // Deterministic: the tile's turn (dq_turn) waited for first and passed on
  // once the adds have landed, both off the consumers' path: they stall only
  // when the writer is kDqBuffers tiles behind. A tile's turn is passed
  // after the next tile's adds are issued when that tile's turn is already
  // there, so that one tile's adds land while the next one's go out (a
  // writer that waited for each tile's adds to land before the next took a
  // round trip to L2 a tile); when it is not there yet, the turn in hand is
  // passed first (nothing held while waiting on another CTA: no new waits).
  template <bool kDeterministic>
  __device__ static void write_dq(const BwdArgs& a, const typename Mainloop::Smem& smem, const QueryWalk& walk,
                                  BwdArgs::Heads heads, int batch, int n_block, int lane) {
    using Epilogue = EpilogueBwdSm90<Cfg>;
    const FwdArgs& f = a.f;
    const int tiles = heads.count * walk.count();
    wait_prior_grid();    // the accumulator and semaphores are the preprocess's (launch_after_prior)
    int* held = nullptr;  // deterministic: the semaphore of the tile whose adds are out, its turn not yet passed
    const auto pass_held = [&]<int kInFlight>() {
      sm90::bulk_wait<kInFlight>();
      asm volatile("fence.proxy.async.global;\n" ::: "memory");
      Epilogue::pass_turn(held);
      held = nullptr;
    };
#pragma unroll
    for (int b = 0; b < kDqBuffers; ++b) sm90::named_barrier_arrive(kDqEmpty + b, kDqHandshake);  // free at first
    for (int t = 0; t < tiles; ++t) {
      const int b = kDqBuffers == 2 ? t % 2 : 0;
      const int m0 = walk.at(t % walk.count()) * Cfg::kBlockM;
      const std::int64_t bh = static_cast<std::int64_t>(batch) * f.heads + heads.first + t / walk.count();
      int* const sem = Epilogue::semaphore(a, bh, m0);
      sm90::named_barrier_sync(kDqFull + b, kDqHandshake);
      if (lane == 0) {
        if constexpr (kDeterministic) {
          const int turn = Order::dq_turn(f, walk, m0, n_block, a.key_tile_fastest);
          if (!Epilogue::has_turn(sem, turn)) {
            if (held != nullptr) pass_held.template operator()<0>();
            Epilogue::wait_turn(sem, turn);
          }
        }
        sm90::bulk_reduce_add_f32(a.dq_accum + (bh * a.rows_pad + m0) * Cfg::kPadDim, smem.dq(b), Epilogue::kDqBytes);
        sm90::bulk_commit();
        if constexpr (kDeterministic) {
          if (held != nullptr) pass_held.template operator()<1>();  // the tile before this one has landed
          held = sem;
        }
        sm90::bulk_wait_read<0>();
      }
      __syncwarp();
      // No arrival the consumers would not wait for: none after a buffer's last tile.
      if (t + kDqBuffers < tiles) sm90::named_barrier_arrive(kDqEmpty + b, kDqHandshake);
    }
    if (lane == 0) {
      if (held != nullptr) pass_held.template operator()<0>();
      sm90::bulk_wait<0>();  // the last reduce-add has landed
    }
  }
};

// kSoftcap: the scores are soft-capped (FwdArgs::softcap_in): P from
// tanh(S scale / c) c, and dS times tanh's derivative 1 - tanh^2.
template <class Cfg, MaskMode kMask, Half16 Element, bool kDeterministic, bool kSoftcap>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    flash_bwd_sm90_kernel(const __grid_constant__ BwdArgs args,
                          const __grid_constant__ typename FlashBwdSm90<Cfg, kMask, Element>::Params p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Kernel = FlashBwdSm90<Cfg, kMask, Element>;
  using Mainloop = typename Kernel::Mainloop;
  using Epilogue = typename Kernel::Epilogue;
  constexpr int kBM = Cfg::kBlockM, kBN = Cfg::kBlockN, kMT = Cfg::kMTiles;
  extern __shared__ __align__(128) unsigned char smem_raw[];  // aligned to 1024 below
  const std::uint32_t raw = smem_u32(smem_raw);
  const std::uint32_t base = (raw + 1023) & ~1023u;
  const typename Mainloop::Smem smem{base, smem_raw + (base - raw)};
  const typename Mainloop::KVPipeline kv_pipe(base + Kernel::kKVPipeOffset);
  const typename Mainloop::QPipeline q_pipe(base + Kernel::kQPipeOffset);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int kv_heads = args.f.heads / args.f.group;
  const bool fastest = args.key_tile_fastest;  // the grid's order (the header)
  // The grid's pairs are (kv head, batch) pairs times the group's parts
  // (BwdArgs::group_split), the parts of one pair adjacent.
  int n_block = blockIdx.x, pair = blockIdx.y;
  if (!fastest) {
    Kernel::chunked_cta(blockIdx.x, (args.f.seq_k + kBN - 1) / kBN, kv_heads * args.f.batch * args.group_split,
                        args.chunks, n_block, pair);
  }
  const int part = pair % args.group_split, kv_pair = pair / args.group_split;
  const int kv_head = kv_pair % kv_heads, batch = kv_pair / kv_heads;
  const BwdArgs::Heads heads = args.heads_of(kv_head, part);
  const int n0 = n_block * kBN;
  // The CTA's sequence (packed batches, key counts; args itself when dense):
  // its key tiles past the sequence's keys have no query tiles.
  const BwdArgs a = args.sequence(batch);
  const FwdArgs& f = a.f;
  const QueryTiles tiles = query_tiles<kMask, kBM, kBN>(f, n0);
  QueryWalk walk{tiles};
  walk.shift = Kernel::walk_shift(f, walk, n_block, fastest);
  if (tid == 0) {
    kv_pipe.init(Cfg::kConsumerThreads);
    q_pipe.init(Cfg::kConsumerThreads);
    sm90::mbar_fence_init();
  }
  __syncthreads();

  typename Mainloop::QPipeline::State q_state;
  if (warp >= Cfg::kConsumerThreads / 32) {  // the producer warpgroup: the loads, and the dQ writer
    sm90::setmaxnreg_dec<Cfg::kProducerRegs>();
    const int role = warp - Cfg::kConsumerThreads / 32;
    if (tiles.begin < tiles.end) {
      if (role == 0 && lane == 0) {
        Mainloop::load(p, a, smem, n0, kv_head, heads, batch, walk, kv_pipe, q_pipe, q_state);
      }
      if constexpr (Kernel::kDqStaged) {
        if (role == 1) Kernel::template write_dq<kDeterministic>(a, smem, walk, heads, batch, n_block, lane);
      }
    }
    return;
  }

  sm90::setmaxnreg_inc<Cfg::kConsumerRegs>();
  // The consumers touch what the preprocess wrote only at head dim 256 (the
  // accumulator's adds, the turns), but all wait: they wait for Q anyway.
  wait_prior_grid();
  const int wg = warp / 4, warp_in_wg = warp % 4;
  // This warp's first row of the key tile, and the warpgroup's first query
  // of S^T in the query tile (wide: both warpgroups share the keys and split
  // the queries; mainloop_bwd_sm90.cuh).
  const int key_row0 = (Cfg::kWide ? 0 : 64 * wg) + 16 * warp_in_wg;
  const int query_col0 = Cfg::kWide ? wg * Cfg::kScoreCols : 0;
  const int t = lane % 4;
  const bool leader = tid == 0;  // wide, dQ not staged, deterministic: waits for the dQ turns and passes them on
  float dk[1][Cfg::kDkvTiles][4], dv[1][Cfg::kDkvTiles][4];
  zero(dk);
  zero(dv);
  if (tiles.begin < tiles.end) {
    kv_pipe.consumer_wait(typename Mainloop::KVPipeline::State{});
    using QState = typename Mainloop::QPipeline::State;
    // The walk's t-th tile, over the group's heads: its query tile's first row.
    const auto tile_m0 = [&](int t) { return walk.at(t % walk.count()) * kBM; };
    // P^T and dS^T of the tile in hand, packed as the A fragments of the
    // products that take them.
    std::uint32_t pt[kMT / 2][4], dst[kMT / 2][4];
    // S^T = K Q^T and dP^T = V dO^T of the tile in stage qs, issued.
    const auto issue_scores = [&](const QState& qs, float(&s)[kMT][4], float(&dp)[kMT][4]) {
      q_pipe.consumer_wait(qs, Mainloop::kPartQ);
      Mainloop::issue_transposed_scores(smem.k(), smem.q(qs.index()), s, wg);
      q_pipe.consumer_wait(qs, Mainloop::kPartDo);
      Mainloop::issue_transposed_scores(smem.v(), smem.dout(qs.index()), dp, wg);
    };
    // Then P^T and dS^T from them (the tile at m0): the only products in
    // flight are these two.
    const auto finish_scores = [&](const QState& qs, int m0, float(&s)[kMT][4], float(&dp)[kMT][4]) {
      const int st = qs.index();
      // P^T = exp2(S^T scale - LSE) while dP^T works.
      sm90::wgmma_wait<1>();
      sm90::fence_operands(s);
      if constexpr (kSoftcap) softcap_scores(s, f.softcap_in);  // tanh(S^T scale / c), before the mask
      if (tile_needs_mask<kMask, kBM, kBN>(f, m0, n0)) {
        Mainloop::mask(f, s, n0 + key_row0 + lane / 4, m0 + query_col0 + 2 * t);
      }
      const float2* lse = smem.template at<const float2>(smem.lse(st)) + query_col0 / 2;
      const float2* dsum = smem.template at<const float2>(smem.dsum(st)) + query_col0 / 2;
      // Soft-capped: g = P^T (1 - tanh^2), dS^T's factor beside P^T (a
      // masked score's tanh is -inf: its P and g are 0).
      float g[kMT][4];  // unused (and gone) without a cap
#pragma unroll
      for (int nt = 0; nt < kMT; ++nt) {
        const float2 l = lse[nt * 4 + t];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float x = s[nt][e];
          s[nt][e] = ex2(fmaf(x, f.scale_log2, e % 2 == 0 ? -l.x : -l.y));
          if constexpr (kSoftcap) g[nt][e] = s[nt][e] * fmaxf(fmaf(-x, x, 1.f), 0.f);
        }
      }
#pragma unroll
      for (int kk = 0; kk < kMT / 2; ++kk) pack_p<Element>(pt[kk], s, kk);

      // dS^T = P^T (dP^T - D).
      sm90::wgmma_wait<0>();
      sm90::fence_operands(dp);
#pragma unroll
      for (int nt = 0; nt < kMT; ++nt) {
        const float2 d = dsum[nt * 4 + t];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          dp[nt][e] = (kSoftcap ? g[nt][e] : s[nt][e]) * (dp[nt][e] - (e % 2 == 0 ? d.x : d.y));
        }
      }
#pragma unroll
      for (int kk = 0; kk < kMT / 2; ++kk) pack_p<Element>(dst[kk], dp, kk);
    };
    // Scores ahead (Cfg::kScoresAhead): the next tile's S^T and dP^T are
    // issued right behind this tile's dQ, so that they run while dQ is
    // staged and the stage handed back, and the next P^T and dS^T are
    // made before the loop turns (no product in flight across it: ptxas
    // serializes every wgmma when one is).
    constexpr bool kAhead = Cfg::kScoresAhead;
    int buf = 0;
    const int n_tiles = heads.count * walk.count();
    // The walk's t-th tile; kNext: the next tile's scores issued ahead
    // (not from the last: no stage to wait for).
    const auto step = [&]<bool kNext>(int t) {
      const std::int64_t bh = static_cast<std::int64_t>(batch) * f.heads + heads.first + t / walk.count();
      const int m0 = tile_m0(t), st = q_state.index();
      if constexpr (!kAhead) {
        float s[kMT][4], dp[kMT][4];
        issue_scores(q_state, s, dp);
        finish_scores(q_state, m0, s, dp);
      }

      // Deterministic: this key tile's turn among those that add into the query tile.
      const auto turn = [&] { return Kernel::dq_turn(f, walk, m0, n_block, fastest); };
      if constexpr (Cfg::kWide) {
        // P^T and dS^T to shared memory, this warpgroup's queries; once
        // both halves are there, dQ = dS K a chunk at a time, each staged
        // for the writer (as below) or, with no room to stage it, added
        // into the accumulator from registers before the next is issued;
        // the first chunk goes before dV += P^T dO and dK += dS^T Q (its
        // columns), so that its adds overlap their products.
        Mainloop::store_transposed(smem, smem.pt(buf), pt, key_row0, query_col0, lane);
        Mainloop::store_transposed(smem, smem.ds(buf), dst, key_row0, query_col0, lane);
        sm90::fence_view_async_shared();
        sm90::named_barrier_sync(Kernel::kDsReady, Cfg::kConsumerThreads);
        constexpr int kChunk = Cfg::kDqChunkTiles;
        const auto add_dq = [&]<int kFirst, int kN>(const float(&dq)[kN][4]) {
          if constexpr (Kernel::kDqStaged) {
            if constexpr (kFirst == 0) sm90::named_barrier_sync(Kernel::kDqEmpty, Kernel::kDqHandshake);
            Epilogue::stage_dq(smem.template at<float>(smem.dq(0)), dq, a.scale, wg, warp_in_wg, lane, kFirst);
          } else {
            Epilogue::reduce_dq(a, dq, bh, m0, kFirst, wg, warp_in_wg, lane);
          }
        };
        float dq0[kChunk][4];
        Mainloop::issue_dq(smem, buf, dq0, wg, 0);
        Mainloop::issue_accumulate_ss(smem.pt(buf), smem.dout(st), dv, wg);
        Mainloop::issue_accumulate_ss(smem.ds(buf), smem.q(st), dk, wg);
        constexpr bool kTurns = kDeterministic && !Kernel::kDqStaged;
        if constexpr (kTurns) Epilogue::take_dq_turn(a, bh, m0, turn(), leader, Kernel::kDqReady);
        sm90::wgmma_wait<2>();  // the first chunk, dV's and dK's still in flight
        sm90::fence_operands(dq0);
        add_dq.template operator()<0, kChunk>(dq0);
        sm90::for_tile_chunks<kChunk, Cfg::kDqTiles, kChunk>([&]<int kFirst, int kN>() {
          float dq[kN][4];
          Mainloop::issue_dq(smem, buf, dq, wg, kFirst);
          sm90::wgmma_wait<0>();
          sm90::fence_operands(dq);
          add_dq.template operator()<kFirst, kN>(dq);
        });
        sm90::fence_operands(dv[0]);
        sm90::fence_operands(dk[0]);
        q_pipe.consumer_release(q_state, Mainloop::kPartQ);
        q_pipe.consumer_release(q_state, Mainloop::kPartDo);
        if constexpr (Kernel::kDqStaged) {
          sm90::fence_view_async_shared();
          sm90::named_barrier_arrive(Kernel::kDqFull, Kernel::kDqHandshake);
        }
        if constexpr (kTurns) Epilogue::pass_dq_turn(a, bh, m0, leader, Kernel::kDqReady);
      } else {
        // dS^T to shared memory for dQ (both consumers read both halves),
        // then dV += P^T dO and dK += dS^T Q from registers, then dQ = dS K.
        Mainloop::store_transposed(smem, smem.ds(buf), dst, key_row0, 0, lane);
        sm90::fence_view_async_shared();
        Mainloop::issue_accumulate(smem.dout(st), dv, pt);
        Mainloop::issue_accumulate(smem.q(st), dk, dst);
        sm90::named_barrier_sync(Kernel::kDsReady, Cfg::kConsumerThreads);
        float dq[Cfg::kDqTiles][4];
        Mainloop::issue_dq(smem, buf, dq, wg, 0);
        float s[kMT][4], dp[kMT][4];  // ahead: the next tile's
        QState next = q_state;
        next.advance();
        if constexpr (kNext) {
          issue_scores(next, s, dp);
          sm90::wgmma_wait<2>();  // dV, dK and dQ; the next S^T and dP^T in flight
        } else {
          sm90::wgmma_wait<0>();
        }
        sm90::fence_operands(dv[0]);
        sm90::fence_operands(dk[0]);
        sm90::fence_operands(dq);
        sm90::fence_operands(pt);
        sm90::fence_operands(dst);
        q_pipe.consumer_release(q_state, Mainloop::kPartQ);
        q_pipe.consumer_release(q_state, Mainloop::kPartDo);
        // dQ: staged once the writer has the buffer free again, then
        // handed to it for the bulk reduce-add.
        const int dq_buf = Kernel::kDqBuffers == 2 ? buf : 0;  // buf: the tile's index mod 2
        sm90::named_barrier_sync(Kernel::kDqEmpty + dq_buf, Kernel::kDqHandshake);
        Epilogue::stage_dq(smem.template at<float>(smem.dq(dq_buf)), dq, a.scale, wg, warp_in_wg, lane);
        sm90::fence_view_async_shared();
        sm90::named_barrier_arrive(Kernel::kDqFull + dq_buf, Kernel::kDqHandshake);
        if constexpr (kNext) finish_scores(next, tile_m0(t + 1), s, dp);
      }
      q_state.advance();
      buf ^= 1;
    };
    if constexpr (kAhead) {
      float s[kMT][4], dp[kMT][4];
      issue_scores(q_state, s, dp);
      finish_scores(q_state, tile_m0(0), s, dp);
      for (int t = 0; t + 1 < n_tiles; ++t) step.template operator()<true>(t);
      step.template operator()<false>(n_tiles - 1);
    } else {
      for (int t = 0; t < n_tiles; ++t) step.template operator()<false>(t);
    }
  }
  // The sequence read again for the stores, so that its addresses and rows
  // are not held in registers through the loop (ptxas at head dim 128,
  // deterministic and masked: 104 -> 92 bytes of spill loads).
  const BwdArgs out = args.sequence(batch);
  Epilogue::template store_dkdv<Element>(out, dk, dv, n0, kv_head, batch, part, wg, warp_in_wg, lane);
  Epilogue::zero_dkdv_rows_outside(args, out, n0, kv_head, batch, part, tid);  // a dense batch's key rows
#endif
}

// The three kernels of one backward on `stream`; cudaErrorNotSupported,
// before anything is launched, when ptxas did not give the kernel the
// registers its setmaxnreg split assumes (the caller runs the sm80 kernel).
template <class Cfg, MaskMode kMask, Half16 Element>
cudaError_t run_flash_bwd_sm90(const BwdArgs& a, cudaStream_t stream) {
  using Kernel = FlashBwdSm90<Cfg, kMask, Element>;
  typename Kernel::Params p;
  if (const cudaError_t e = Kernel::Mainloop::to_params(a, p); e != cudaSuccess) return e;
  const bool capped = a.f.softcap_in != 0.f;
  const auto kernel = a.deterministic ? (capped ? flash_bwd_sm90_kernel<Cfg, kMask, Element, true, true>
                                                : flash_bwd_sm90_kernel<Cfg, kMask, Element, true, false>)
                                      : (capped ? flash_bwd_sm90_kernel<Cfg, kMask, Element, false, true>
                                                : flash_bwd_sm90_kernel<Cfg, kMask, Element, false, false>);
  static const bool budget_holds = [] {
    for (const auto k : {flash_bwd_sm90_kernel<Cfg, kMask, Element, true, false>,
                         flash_bwd_sm90_kernel<Cfg, kMask, Element, false, false>,
                         flash_bwd_sm90_kernel<Cfg, kMask, Element, true, true>,
                         flash_bwd_sm90_kernel<Cfg, kMask, Element, false, true>}) {
      cudaFuncAttributes attr{};
      if (cudaFuncGetAttributes(&attr, k) != cudaSuccess || attr.numRegs != Cfg::kLaunchRegs) return false;
    }
    return true;
  }();
  if (!budget_holds) return cudaErrorNotSupported;
  if (const cudaError_t e = opt_in_shared_memory(kernel, Kernel::kSmemBytes); e != cudaSuccess) return e;
  if (const cudaError_t e = launch_bwd_preprocess<Element>(a, stream); e != cudaSuccess) return e;
  const FwdArgs& f = a.f;
  const int n_tiles = (f.seq_k + Cfg::kBlockN - 1) / Cfg::kBlockN;
  const int pairs = f.heads / f.group * f.batch * a.group_split;
  int device = 0, multiprocessors = 0;
  for (const cudaError_t e :
       {cudaGetDevice(&device), fixed_device_attribute(multiprocessors, cudaDevAttrMultiProcessorCount, device)}) {
    if (e != cudaSuccess) return e;
  }
  BwdArgs ordered = a;
  ordered.key_tile_fastest = Kernel::key_tile_fastest(a.deterministic, n_tiles, multiprocessors);
  ordered.chunks = Kernel::chunks(a.deterministic, n_tiles, pairs, multiprocessors);
  if (ordered.key_tile_fastest ? pairs > 65535 : static_cast<std::int64_t>(n_tiles) * pairs > 0x7fffffff) {
    return cudaErrorInvalidConfiguration;  // the grid's y, or x
  }
  const dim3 grid = ordered.key_tile_fastest ? dim3(n_tiles, pairs) : dim3(n_tiles * pairs);
  // Launched to start while the preprocess finishes (which lets it): the
  // CTAs' setup and K and V's loads overlap its last blocks; each role waits
  // (wait_prior_grid) before what it needs of the preprocess.
  if (const cudaError_t e = launch_after_prior(kernel, grid, Cfg::kThreads, Kernel::kSmemBytes, stream, ordered, p);
      e != cudaSuccess) {
    return e;
  }
  if (const cudaError_t e = launch_bwd_convert_dq_tiled<Element, Cfg::kPadDim>(a, stream); e != cudaSuccess) return e;
  return a.group_split > 1 ? launch_bwd_sum_dkv<Element, Cfg::kPadDim>(a, stream) : cudaSuccess;
}

template <int kHeadDim, MaskMode kMask, Half16 Element>
cudaError_t launch_flash_bwd_sm90(const BwdArgs& a, cudaStream_t stream) {
  return run_flash_bwd_sm90<FlashBwdSm90DefaultCfg<kHeadDim>, kMask, Element>(a, stream);
}

}  // namespace attnprof::cuda::kernels
