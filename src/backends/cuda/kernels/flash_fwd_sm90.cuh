// FlashAttention forward on sm90a: TMA loads, wgmma, a producer (a warp, or
// a warpgroup that gives its registers away) and consumer warpgroups. This
// file lays out shared memory and the barriers and splits the CTA by role;
// the roles live in
//   mainloop_fwd_sm90_tma_wgmma_ws.cuh  loads (producer), matrix products and softmax (consumers)
//   pipeline_sm90.cuh                   the mbarrier stages between them
//   tile_scheduler.cuh                  which query tiles a CTA takes
//   epilogue_fwd.cuh                    O (and the log-sum-exp) out of registers
//
// Warp kConsumers * 4 is the producer (with its warpgroup, if Cfg says so):
// one thread loads Q once a tile, then K and V tile after tile into kStages
// shared-memory stages. Warpgroups 0 .. kConsumers-1 are the consumers, each
// owning 64 query rows.
//
// Cfg (mainloop_fwd_sm90_tma_wgmma_ws.cuh) picks FlashAttention-3's pieces:
// the producer warpgroup with setmaxnreg, each consumer's softmax overlapped
// with its own next matrix products (intra-warpgroup), pingpong (the two
// consumers take turns to issue them; without it nothing makes them wait for
// each other); Scheduler a static or persistent grid. The defaults per head
// dim are FlashSm90DefaultCfgOf and kFlashSm90PersistentDefault
// (docs/perf/fused-kernels.md, run 12).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "backends/cuda/kernels/element.cuh"
#include "backends/cuda/kernels/epilogue_fwd.cuh"
#include "backends/cuda/kernels/fwd_args.cuh"
#include "backends/cuda/kernels/fwd_launch.cuh"
#include "backends/cuda/kernels/mainloop_fwd_sm90_tma_wgmma_ws.cuh"
#include "backends/cuda/kernels/pipeline_sm90.cuh"
#include "backends/cuda/kernels/softmax_online.cuh"
#include "backends/cuda/kernels/tile_scheduler.cuh"
#include "backends/cuda/kernels/utils.cuh"

namespace attnprof::cuda::kernels {

template <class Cfg, MaskMode kMask, InputElement Element, bool kLse, class Scheduler>
struct FlashFwdSm90 {
  using Mainloop = MainloopFwdSm90TmaWgmmaWs<Cfg, kMask, Element>;
  // O's element: the input's, or bf16 for e4m3 inputs.
  using Out = std::conditional_t<kIsFp8<Element>, Bf16, Element>;
  using QPipeline = typename Mainloop::QPipeline;
  using KVPipeline = typename Mainloop::KVPipeline;
  using Params = typename Mainloop::Params;
  // Shared memory: the mainloop's buffers, then the Q and K/V barriers. (The
  // Q stage's "empty" barrier is waited on only when a CTA takes several tiles.)
  static constexpr int kQPipeOffset = Mainloop::kSmemBytes;
  static constexpr int kKVPipeOffset = kQPipeOffset + QPipeline::kBarrierBytes;
  // 1024 bytes of slack: the swizzled buffers must start 1024-byte aligned.
  static constexpr int kSmemBytes = kKVPipeOffset + KVPipeline::kBarrierBytes + 1024;
  static_assert(kSmemBytes <= 227 * 1024, "more shared memory than an sm90 CTA may have");
};

template <class Cfg, MaskMode kMask, InputElement Element, bool kLse, class Scheduler>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    flash_fwd_sm90_kernel(const __grid_constant__ FwdArgs a, const __grid_constant__
                          typename FlashFwdSm90<Cfg, kMask, Element, kLse, Scheduler>::Params p) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Kernel = FlashFwdSm90<Cfg, kMask, Element, kLse, Scheduler>;
  using Mainloop = typename Kernel::Mainloop;
  extern __shared__ __align__(128) unsigned char smem_raw[];  // aligned to 1024 below
  const std::uint32_t base = (smem_u32(smem_raw) + 1023) & ~1023u;
  const typename Mainloop::Smem smem{base};
  const typename Kernel::QPipeline q_pipe(base + Kernel::kQPipeOffset);
  const typename Kernel::KVPipeline kv_pipe(base + Kernel::kKVPipeOffset);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  Mainloop::fill_ones(smem, tid);
  if (tid == 0) {
    q_pipe.init(Cfg::kConsumerThreads);
    kv_pipe.init(Cfg::kConsumerThreads);
    sm90::mbar_fence_init();
  }
  __syncthreads();

  typename Kernel::QPipeline::State q_state;
  typename Kernel::KVPipeline::State kv_state;
  if (warp >= Cfg::kConsumerThreads / 32) {  // the producer
    if constexpr (Cfg::kWgProducer) sm90::setmaxnreg_dec<Cfg::kProducerRegs>();
    if (warp == Cfg::kConsumerThreads / 32 && lane == 0) {
      auto cta = Scheduler::first(a);
      do {
        const FwdArgs seq = a.sequence(cta.batch);
        const KeyTiles tiles = key_tiles<kMask, Cfg::kBlockM, Cfg::kBlockN>(seq, cta.m0);
        if (tiles.begin < tiles.end) {
          if constexpr (Scheduler::kPersistent) q_pipe.producer_acquire(q_state);  // the last tile's Q is read
          Mainloop::load(p, seq, smem, cta, tiles, q_pipe, q_state, kv_pipe, kv_state);
          q_state.advance();
        }
      } while (Scheduler::next(a, cta));
    }
    return;
  }

  if constexpr (Cfg::kWgProducer) sm90::setmaxnreg_inc<Cfg::kConsumerRegs>();
  const int wg = warp / 4;
  const int warp_row0 = wg * 64 + (warp % 4) * 16;  // this warp's first row of the query tile
  if constexpr (Cfg::kPingpong) {
    if (wg == 1) sm90::pass_turn(wg);  // warpgroup 0 takes the first turn
  }
  // FP8: the descales the caller left on the device, read here, once
  // (FwdArgs::fp8_scale_log2, fp8_o_scale); the host's otherwise.
  float fp8_scale_log2 = 0.f, o_scale = 1.f;
  if constexpr (kIsFp8<Element>) {
    fp8_scale_log2 = a.fp8_scale_log2();
    o_scale = a.fp8_o_scale(p.o_scale);
  }
  auto cta = Scheduler::first(a);
  do {
    // The tile's sequence (packed batches, key counts; a itself when dense).
    FwdArgs seq = a.sequence(cta.batch);
    if constexpr (kIsFp8<Element>) seq.scale_log2 = fp8_scale_log2;
    const KeyTiles tiles = key_tiles<kMask, Cfg::kBlockM, Cfg::kBlockN>(seq, cta.m0);
    float acc[1][Cfg::kAccTiles][4];
    zero(acc);
    typename Mainloop::Softmax softmax;
    softmax.init();
    if (tiles.begin < tiles.end) {
      Mainloop::mma(seq, smem, cta, tiles, q_pipe, q_state, kv_pipe, kv_state, acc, softmax, wg, warp_row0, lane);
      if constexpr (Scheduler::kPersistent) q_pipe.consumer_release(q_state);
      q_state.advance();
    }
    if constexpr (kIsFp8<Element>) scale_acc(acc, o_scale);
    EpilogueFwd<typename Kernel::Out, kLse>::template store_direct<Cfg::kHeadDim / 8>(seq, cta, acc, softmax, warp_row0,
                                                                                      lane);
    if (a.q_spans != nullptr) {  // a dense batch's query rows: the tile's rows outside the sequence's
      zero_query_rows_outside<kLse, Cfg::kBlockM, Cfg::kHeadDim>(a, seq, cta, tid, Cfg::kConsumerThreads);
    }
  } while (Scheduler::next(a, cta));
#endif
}

// kLse: the caller passes FwdArgs::lse (not null) and wants it written.
// o_scale: e4m3's Params::o_scale (V's descale); 1 otherwise.
template <class Cfg, MaskMode kMask, InputElement Element, bool kLse = false,
          class Scheduler = StaticTileScheduler<kMask, Cfg::kBlockM>>
cudaError_t run_flash_fwd_sm90(const FwdArgs& a, cudaStream_t stream, float o_scale = 1.f) {
  using Kernel = FlashFwdSm90<Cfg, kMask, Element, kLse, Scheduler>;
  typename Kernel::Params p;
  if (const cudaError_t e = Kernel::Mainloop::to_params(a, p); e != cudaSuccess) return e;
  p.o_scale = o_scale;
  const auto kernel = flash_fwd_sm90_kernel<Cfg, kMask, Element, kLse, Scheduler>;
  if constexpr (Cfg::kWgProducer) {
    // setmaxnreg's budget assumes ptxas gave every thread kLaunchRegs; with
    // fewer, the consumers' setmaxnreg.inc would wait forever. Checked once.
    static const bool budget_holds = [&] {
      cudaFuncAttributes attr{};
      return cudaFuncGetAttributes(&attr, kernel) == cudaSuccess && attr.numRegs == Cfg::kLaunchRegs;
    }();
    if (!budget_holds) return cudaErrorNotSupported;
  }
  return launch_fwd<Scheduler>(kernel, Cfg::kThreads, Kernel::kSmemBytes, a, stream, p);
}

// The soft-capped kernel's share of exponentials on the FMA pipe (of every
// 8 n-tiles) and its pingpong. Measured on the H200, cap 30, 2 x 16 x 4096,
// each choice against the others in one run (docs/perf/issue22-2026-12-04.md
// and -04c.md). With the row sums on the tensor cores (no FADD a score
// left):
// - head dim 128: none on the FMA pipe but under a causal mask, where one in
//   8 is 1.2% faster (279.4 -> 276.2 us) and costs the non-causal kernel
//   1.2% (451 -> 456); 2 or 3 in 8 cost 2-4%; without pingpong +0.3% (none)
//   to +2.7% (causal);
// - head dim 64, where two MUFU operations a score outweigh the tensor
//   cores' work: the consumers' softmaxes at once (no pingpong) and one in 8
//   on the FMA pipe, 2.4% (causal, 227.3 -> 221.8 us) and 3.9% (non-causal,
//   399 -> 384) faster than pingpong with none; two in 8 lose 3% causal.
// (Under a window mask neither choice was measured: it takes the non-causal
// choice at 128 and the above at 64.)
template <int kHeadDim, MaskMode kMask>
inline constexpr int kCapFmaExp2 = kHeadDim == 64 || (kHeadDim == 128 && kMask == MaskMode::Causal) ? 1 : 0;
template <int kHeadDim>
inline constexpr bool kCapPingpong = kHeadDim != 64 && FlashSm90DefaultCfg<kHeadDim>::kPingpong;

// The head dim's default kernel, or (bf16, a cap within the fixed base's
// bound) its soft-capped kernel.
template <int kHeadDim, MaskMode kMask, Half16 Element, bool kLse>
cudaError_t launch_flash_fwd_sm90(const FwdArgs& a, cudaStream_t stream) {
  const auto run = [&]<class Cfg>() {
    if constexpr (kFlashSm90PersistentDefault<kHeadDim>) {
      return run_flash_fwd_sm90<Cfg, kMask, Element, kLse, PersistentTileScheduler<kMask, Cfg::kBlockM, kHeadDim>>(
          a, stream);
    } else {
      return run_flash_fwd_sm90<Cfg, kMask, Element, kLse>(a, stream);
    }
  };
  using Cfg = FlashSm90DefaultCfg<kHeadDim>;
  if constexpr (std::same_as<Element, Bf16>) {
    if (softcap_on_fixed_base(a))
      return run.template operator()<FlashSm90CappedCfg<Cfg, kCapFmaExp2<kHeadDim, kMask>, kCapPingpong<kHeadDim>>>();
  }
  return run.template operator()<Cfg>();
}

}  // namespace attnprof::cuda::kernels
