// The key loop of flash's sm90a forward, split by role (warp specialised):
//   load: the producer thread brings Q once a tile, then K and V key tile after
//         key tile, with TMA into the stages of a PipelineTmaAsync;
//   mma:  each consumer warpgroup, for its 64 query rows: S = Q K^T with both
//         operands in shared memory (wgmma SS), the mask and online softmax in
//         registers, O += P V with P straight from the S registers (wgmma RS).
// Q, K and V sit in the 128-byte-swizzled layout that TMA writes and wgmma
// reads (wgmma_sm90.cuh). Key tiles run from the last visible one down, as in
// the sm80 kernel, so a causal tile meets its diagonal first.
//
// FP8 (Element E4m3, head dims a multiple of 128): the same roles and
// pipeline, in e4m3 wgmma (k-steps of 32 keys or columns, 32 bytes as a 16-bit
// k16 step's). e4m3 has no transposed operand, so V comes as V^T [Hkv, D,
// keys] that a pre-pass wrote (flash_fwd_sm90_fp8.cuh), its keys permuted
// within every 16 so that the S accumulators, packed four to a register in
// their own order, are P V's register A fragment as they stand (no shuffles).
// P is packed as 256 p (the softmax's kLog2Offset: e4m3's normal range
// reaches down to 2^-6, p then down to 2^-14), the row sums carry the same
// 256, so O / sum needs nothing back; V's descale is Params::o_scale, Q's and
// K's are in FwdArgs::scale_log2.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels/element.cuh"
#include "backends/cuda/kernels/flash_fwd_sm90_cfg.cuh"
#include "backends/cuda/kernels/fwd_args.cuh"
#include "backends/cuda/kernels/pipeline_sm90.cuh"
#include "backends/cuda/kernels/softmax_online.cuh"
#include "backends/cuda/kernels/tma_sm90.cuh"
#include "backends/cuda/kernels/utils.cuh"
#include "backends/cuda/kernels/wgmma_sm90.cuh"

namespace attnprof::cuda::kernels {

template <class Cfg, MaskMode kMask, InputElement Element>
struct MainloopFwdSm90TmaWgmmaWs {
  static constexpr int kBM = Cfg::kBlockM, kBN = Cfg::kBlockN, kD = Cfg::kPadDim;
  static constexpr bool kFp8 = kIsFp8<Element>;
  static constexpr int kBytes = sizeof(typename Element::Storage);
  static constexpr int kRegionCols = 128 / kBytes;  // columns of one 128-byte swizzle region
  static constexpr int kKStep = 32 / kBytes;        // wgmma's k: 16 (16-bit) or 32 (e4m3)
  static constexpr int kNT = Cfg::kNTiles, kDT = Cfg::kDTiles, kRegions = kD * kBytes / 128;
  static constexpr int kAccT = Cfg::kAccTiles;
  // e4m3's wgmma adds its products to the accumulator with about 14 bits
  // kept: a row sum of thousands of keys in one accumulator loses the small
  // p outright (H200, 2 x 16 x 8192 keys: 0.15 relative error in O). So the
  // e4m3 ones-products start afresh each key tile and the softmax adds each
  // tile's sum into its fp32 row sums (two adds a thread a tile).
  static constexpr bool kFoldSums = Cfg::kTensorRowSums && kFp8;
  // P V's k-steps: the key tile in steps of kKStep keys, four registers of P each.
  static constexpr int kPSteps = kBN / kKStep;
  static_assert(!kFp8 || (kD % 128 == 0 && (kBN == 128 || kBN == 192)),
                "e4m3: whole 128-byte regions of Q and K; 128-key tiles (one region of V^T's rows) or 192 (one "
                "region, then 64 keys in the 64-byte swizzle)");
  static_assert(kFp8 || kNT != 24, "192-key tiles: e4m3 only");
  static_assert(!Cfg::kCapFixedBase || std::same_as<Element, Bf16>, "the fixed base wants bf16's P (fp32's range)");
  static constexpr bool kVtHi = kFp8 && kBN == 192;  // V^T's keys 128..191 in a 64-byte-swizzled region
  static constexpr int kQBytes = kBM * kD * kBytes;
  static constexpr int kKVBytes = kBN * kD * kBytes;  // K, or V (V^T for e4m3: kD rows of kBN keys)
  // The online softmax: e4m3's P is 2^8 p (kLog2Offset), and Cfg's share of
  // the exponentials on the FMA pipe.
  using Softmax = OnlineSoftmax<1, kFp8 ? 8 : 0, Cfg::kFmaExp2>;
  // Q, then K and V of each stage; every region 1024-byte aligned (the swizzle's period).
  // The tile of ones (the tensor cores' row sums' B operand), past the stages.
  static constexpr int kOnesBytes = Cfg::kTensorRowSums ? 1024 : 0;
  static constexpr int kSmemBytes = kQBytes + Cfg::kStages * 2 * kKVBytes + kOnesBytes;

  using QPipeline = sm90::PipelineTmaAsync<1>;
  using KVPipeline = sm90::PipelineTmaAsync<Cfg::kStages, 2>;  // parts: K, then V
  static constexpr int kPartK = 0, kPartV = 1;

  // Device-side params: TMA descriptors of Q, K and V as 4-d tensors (column,
  // row, head, batch), in boxes of 64 columns (one swizzle region) by a tile's rows.
  // e4m3: V's map is V^T's (v_hi: its 64-key boxes past the first 128 of a
  // 192-key tile); o_scale is what O is multiplied by before the epilogue
  // (V's descale; 1 for 16-bit elements).
  struct Params {
    CUtensorMap q, k, v, v_hi;
    float o_scale = 1.f;
  };

  // The descriptors of a tensor set: encoded on its first call and kept (a
  // few sets a thread), since three cuTensorMapEncodeTiled calls cost more
  // host time than the rest of a launch. A descriptor holds only the address,
  // sizes and strides, all in the key, so a hit is the same descriptor.
  static cudaError_t to_params(const FwdArgs& a, Params& p) {
    const sm90::MapKey key{{a.q, a.k, a.v},
                           {a.q_batch_stride, a.q_head_stride, a.q_row_stride, a.k_batch_stride, a.k_head_stride,
                            a.k_row_stride, a.v_batch_stride, a.v_head_stride, a.v_row_stride},
                           {a.q_rows, a.k_rows, a.heads, a.group, a.map_batch}};
    thread_local sm90::MapCache<Params> cache;
    if (const Params* hit = cache.find(key)) {
      p = *hit;
      return cudaSuccess;
    }
    const int kv_heads = a.heads / a.group;
    // e4m3's V^T: a.v_row_stride keys a row (the pre-pass's padded count, all
    // written), head_dim rows a head.
    for (const cudaError_t e : {
             sm90::make_map<Element>(p.q, a.q, Cfg::kHeadDim, a.q_rows, a.heads, a.map_batch, a.q_row_stride,
                                     a.q_head_stride, a.q_batch_stride, kBM),
             sm90::make_map<Element>(p.k, a.k, Cfg::kHeadDim, a.k_rows, kv_heads, a.map_batch, a.k_row_stride,
                                     a.k_head_stride, a.k_batch_stride, kBN),
             kFp8 ? sm90::make_map<Element>(p.v, a.v, static_cast<int>(a.v_row_stride), Cfg::kHeadDim, kv_heads,
                                            a.map_batch, a.v_row_stride, a.v_head_stride, a.v_batch_stride, kD)
                  : sm90::make_map<Element>(p.v, a.v, Cfg::kHeadDim, a.k_rows, kv_heads, a.map_batch, a.v_row_stride,
                                            a.v_head_stride, a.v_batch_stride, kBN),
             kVtHi ? sm90::make_map<Element>(p.v_hi, a.v, static_cast<int>(a.v_row_stride), Cfg::kHeadDim, kv_heads,
                                             a.map_batch, a.v_row_stride, a.v_head_stride, a.v_batch_stride, kD, 64)
                   : cudaSuccess,
         }) {
      if (e != cudaSuccess) return e;
    }
    cache.insert(key, p);
    return cudaSuccess;
  }

  // The shared buffers, from their 1024-byte aligned base.
  struct Smem {
    std::uint32_t base;
    __device__ __forceinline__ std::uint32_t q() const { return base; }
    __device__ __forceinline__ std::uint32_t k(int stage) const { return base + kQBytes + stage * 2 * kKVBytes; }
    __device__ __forceinline__ std::uint32_t v(int stage) const { return k(stage) + kKVBytes; }
    __device__ __forceinline__ std::uint32_t ones() const { return k(Cfg::kStages); }
  };

  // The tile of ones (Cfg::kTensorRowSums), written by threads 0..255 before
  // the kernel's first barrier and fenced for wgmma's reads.
  __device__ __forceinline__ static void fill_ones(const Smem& smem, int tid) {
    if constexpr (Cfg::kTensorRowSums) {
      constexpr std::uint32_t kOnes = kFp8 ? 0x38383838u : std::same_as<Element, Bf16> ? 0x3F803F80u : 0x3C003C00u;
      if (tid < kOnesBytes / 4) {
        asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(smem.ones() + 4 * tid), "r"(kOnes) : "memory");
        sm90::fence_view_async_shared();
      }
    }
  }

  // Producer (one thread): Q of the tile, then its key tiles [tiles.begin,
  // tiles.end) last first. a: the tile's sequence (FwdArgs::sequence), whose
  // rows start at q_row0 and k_row0 of the maps. A packed batch's tiles read
  // past their sequence's rows into the next one's (or TMA's zeros past the
  // tensor): the mask drops those keys, and those query rows are not stored.
  template <class Tile>
  __device__ __forceinline__ static void load(const Params& p, const FwdArgs& a, const Smem& smem, const Tile& cta,
                                              KeyTiles tiles, const QPipeline& q_pipe,
                                              const typename QPipeline::State& q_state, const KVPipeline& kv_pipe,
                                              typename KVPipeline::State& kv_state) {
    const int batch = a.map_batch_of(cta.batch);
    const std::uint32_t q_bar = q_pipe.producer_expect(q_state, 0, kQBytes);
    for (int r = 0; r < kRegions; ++r) {
      sm90::tma_load_4d(smem.q() + r * kBM * 128, &p.q, q_bar, kRegionCols * r, a.q_row0 + cta.m0, cta.head, batch);
    }
    for (int n_block = tiles.end - 1; n_block >= tiles.begin; --n_block) {
      const int n0 = a.k_row0 + n_block * kBN, stage = kv_state.index();
      kv_pipe.producer_acquire(kv_state, kPartK);  // both consumers are done with the stage's last K
      const std::uint32_t k_bar = kv_pipe.producer_expect(kv_state, kPartK, kKVBytes);
      for (int r = 0; r < kRegions; ++r) {
        sm90::tma_load_4d(smem.k(stage) + r * kBN * 128, &p.k, k_bar, kRegionCols * r, n0, cta.kv_head, batch);
      }
      kv_pipe.producer_acquire(kv_state, kPartV);
      const std::uint32_t v_bar = kv_pipe.producer_expect(kv_state, kPartV, kKVBytes);
      if constexpr (kFp8) {  // V^T: the tile's 128 keys (one region) of all kD rows
        sm90::tma_load_4d(smem.v(stage), &p.v, v_bar, n0, 0, cta.kv_head, batch);
        if constexpr (kVtHi) {
          sm90::tma_load_4d(smem.v(stage) + kD * 128, &p.v_hi, v_bar, n0 + 128, 0, cta.kv_head, batch);
        }
      } else {
        for (int r = 0; r < kRegions; ++r) {
          sm90::tma_load_4d(smem.v(stage) + r * kBN * 128, &p.v, v_bar, 64 * r, n0, cta.kv_head, batch);
        }
      }
      kv_state.advance();
    }
  }

  // S = Q K^T, issued (not waited for): this warpgroup's 64 rows of Q against
  // the key tile in `stage`, K-major, over the head dim's k-steps (not the padding).
  __device__ __forceinline__ static void issue_s(const Smem& smem, int stage, float (&s)[1][kNT][4], int wg) {
    zero(s);
    sm90::fence_operands(s[0]);
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < Cfg::kHeadDim / kKStep; ++kk) {
      const std::uint32_t q_at = smem.q() + (kk / 4) * kBM * 128 + wg * 64 * 128 + (kk % 4) * 32;
      const std::uint32_t k_at = smem.k(stage) + (kk / 4) * kBN * 128 + (kk % 4) * 32;
      if constexpr (kFp8) {
        sm90::wgmma_ss_e4m3<kNT>(s[0], sm90::smem_desc(q_at, 0), sm90::smem_desc(k_at, 0), kk > 0);
      } else {
        sm90::wgmma_ss<Element, kNT>(s[0], sm90::smem_desc(q_at, 0), sm90::smem_desc(k_at, 0), kk > 0);
      }
    }
    sm90::wgmma_commit();
  }

  // O += P V, issued (not waited for): P from registers (kKStep keys a
  // step), in O's column chunks; V of `stage` read MN-major, or e4m3's V^T
  // K-major (chunk rows 8 kFirst.. at 1024 bytes per 8 rows, the k-step 32
  // bytes along them).
  __device__ __forceinline__ static void issue_pv(const Smem& smem, int stage, float (&acc)[1][kAccT][4],
                                                  std::uint32_t (&p)[kPSteps][4]) {
    sm90::fence_operands(acc[0]);
    sm90::fence_operands(p);
    sm90::wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kPSteps; ++kk) {
      if constexpr (kFp8) {
#pragma unroll
        for (int chunk = 0; chunk < kDT / 16; ++chunk) {
          // Keys 0..127: the 128-byte region (1024 bytes per 8 rows); 128..191: the 64-byte one (512).
          const std::uint64_t v_desc =
              kk < 4 ? sm90::smem_desc(smem.v(stage) + chunk * 16 * 1024 + kk * 32, 0)
                     : sm90::smem_desc_sw64(smem.v(stage) + kD * 128 + chunk * 16 * 512 + (kk - 4) * 32);
          sm90::wgmma_rs_e4m3(reinterpret_cast<float(&)[16][4]>(acc[0][16 * chunk]), p[kk], v_desc, true);
        }
        if constexpr (Cfg::kTensorRowSums) {  // the row sums: P times ones
          sm90::wgmma_rs_e4m3(reinterpret_cast<float(&)[1][4]>(acc[0][kDT]), p[kk], sm90::smem_desc_plain(smem.ones()),
                              !kFoldSums || kk != 0);
        }
      } else {
        sm90::for_n_chunks<0, kDT>([&]<int kFirst, int kN>() {
          // Columns [8 kFirst, 8 (kFirst + kN)): from region kFirst / 8 on, regions kBN * 128 bytes apart.
          const std::uint32_t v_at = smem.v(stage) + (kFirst / 8) * kBN * 128 + kk * 16 * 128;
          sm90::wgmma_rs<Element, kN>(reinterpret_cast<float(&)[kN][4]>(acc[0][kFirst]), p[kk],
                                      sm90::smem_desc(v_at, kBN * 128), true);
        });
        if constexpr (Cfg::kTensorRowSums) {  // the row sums: P times ones
          sm90::wgmma_rs<Element, 1>(reinterpret_cast<float(&)[1][4]>(acc[0][kDT]), p[kk],
                                     sm90::smem_desc_plain(smem.ones()), true);
        }
      }
    }
    sm90::wgmma_commit();
  }

  // The soft cap (where the problem has one), then the mask on the key tile
  // at n_block, where the tile needs one.
  template <class Tile>
  __device__ __forceinline__ static void mask(const FwdArgs& a, const Tile& cta, int n_block, float (&s)[1][kNT][4],
                                              int warp_row0, int lane) {
    if (a.softcap_in != 0.f) softcap_scores(s[0], a.softcap_in);
    const int n0 = n_block * kBN;
    if (tile_needs_mask<kMask, kBM, kBN>(a, cta.m0, n0)) {
      apply_mask<kMask>(s, a, cta.m0 + warp_row0 + lane / 4, n0 + 2 * (lane % 4));
    }
  }

  // P as the RS form's A: 16-bit pairs (pack_p), or e4m3 quads (256 p) in
  // the accumulators' own order (n-tiles 4kk .. 4kk + 3), which V^T's key
  // permutation matches.
  __device__ __forceinline__ static void to_p(std::uint32_t (&p)[kPSteps][4], const float (&s)[1][kNT][4]) {
#pragma unroll
    for (int kk = 0; kk < kPSteps; ++kk) {
      if constexpr (kFp8) {
        const float(&t)[kNT][4] = s[0];
        p[kk][0] = pack4_e4m3(t[4 * kk][0], t[4 * kk][1], t[4 * kk + 1][0], t[4 * kk + 1][1]);
        p[kk][1] = pack4_e4m3(t[4 * kk][2], t[4 * kk][3], t[4 * kk + 1][2], t[4 * kk + 1][3]);
        p[kk][2] = pack4_e4m3(t[4 * kk + 2][0], t[4 * kk + 2][1], t[4 * kk + 3][0], t[4 * kk + 3][1]);
        p[kk][3] = pack4_e4m3(t[4 * kk + 2][2], t[4 * kk + 2][3], t[4 * kk + 3][2], t[4 * kk + 3][3]);
      } else {
        pack_p<Element>(p[kk], s[0], kk);
      }
    }
  }

  // S of the key tile in k_state's stage, waited for (in the warpgroup's turn
  // under pingpong); K's buffer is released once S is in.
  __device__ __forceinline__ static void s_waited(const KVPipeline& kv_pipe, const typename KVPipeline::State& k_state,
                                                  const Smem& smem, float (&s)[1][kNT][4], int wg) {
    kv_pipe.consumer_wait(k_state, kPartK);
    if constexpr (Cfg::kPingpong) sm90::take_turn(wg);
    issue_s(smem, k_state.index(), s, wg);
    if constexpr (Cfg::kPingpong) sm90::pass_turn(wg);
    sm90::wgmma_wait<0>();
    sm90::fence_operands(s[0]);
    kv_pipe.consumer_release(k_state, kPartK);
  }

  // Waits for every wgmma in flight (the last is P V) and releases V's
  // buffer; kFoldSums: the tile's row sums join the softmax's.
  __device__ __forceinline__ static void pv_retired(const KVPipeline& kv_pipe,
                                                    const typename KVPipeline::State& v_state,
                                                    float (&acc)[1][kAccT][4], std::uint32_t (&p)[kPSteps][4],
                                                    Softmax& softmax) {
    sm90::wgmma_wait<0>();
    sm90::fence_operands(acc[0]);
    sm90::fence_operands(p);
    kv_pipe.consumer_release(v_state, kPartV);
    if constexpr (kFoldSums) {  // a quarter each: see mma()
      softmax.row_sum[0][0] += 0.25f * acc[0][kDT][0];
      softmax.row_sum[0][1] += 0.25f * acc[0][kDT][2];
    }
  }

  // O (and kFoldSums: the row sums so far) times alpha, before the next P V.
  __device__ __forceinline__ static void rescale(float (&acc)[1][kAccT][4], const float (&alpha)[1][2],
                                                 Softmax& softmax) {
    Softmax::rescale(acc, alpha);
    if constexpr (kFoldSums) {
      softmax.row_sum[0][0] *= alpha[0][0];
      softmax.row_sum[0][1] *= alpha[0][1];
    }
  }

  // O += P V of the key tile in v_state's stage, waited for (in the turn).
  __device__ __forceinline__ static void pv_waited(const KVPipeline& kv_pipe, const typename KVPipeline::State& v_state,
                                                   const Smem& smem, float (&acc)[1][kAccT][4],
                                                   std::uint32_t (&p)[kPSteps][4], Softmax& softmax, int wg) {
    kv_pipe.consumer_wait(v_state, kPartV);
    if constexpr (Cfg::kPingpong) sm90::take_turn(wg);
    issue_pv(smem, v_state.index(), acc, p);
    if constexpr (Cfg::kPingpong) sm90::pass_turn(wg);
    pv_retired(kv_pipe, v_state, acc, p, softmax);
  }

  // Consumer warpgroup wg: its 64 rows of the tile against every key tile,
  // into acc (O, unnormalised) and softmax. warp_row0: this warp's first row.
  template <class Tile>
  __device__ __forceinline__ static void mma(const FwdArgs& a, const Smem& smem, const Tile& cta, KeyTiles tiles,
                                             const QPipeline& q_pipe, const typename QPipeline::State& q_state,
                                             const KVPipeline& kv_pipe, typename KVPipeline::State& kv_state,
                                             float (&acc)[1][kAccT][4], Softmax& softmax, int wg, int warp_row0,
                                             int lane) {
    q_pipe.consumer_wait(q_state);
    if constexpr (Cfg::kCapFixedBase) softmax.fix_base();
    if constexpr (Cfg::kIntraOverlap) {
      mma_overlapped(a, smem, cta, tiles, kv_pipe, kv_state, acc, softmax, wg, warp_row0, lane);
    } else {
      mma_in_turn(a, smem, cta, tiles, kv_pipe, kv_state, acc, softmax, wg, warp_row0, lane);
    }
    if constexpr (Cfg::kTensorRowSums && !kFoldSums) {
      // Every column of P times ones is the row's sum, as P V read P. A
      // quarter each, so that finish()'s sum over the quad gives it whole
      // (x/4 + x/4 + (x/4 + x/4): exact).
      softmax.row_sum[0][0] = 0.25f * acc[0][kDT][0];
      softmax.row_sum[0][1] = 0.25f * acc[0][kDT][2];
    }
  }

  // One key tile's softmax: the soft cap and the mask (mask()), then the
  // online softmax's exponentials, or (Cfg::kCapFixedBase) those against the
  // fixed base, each score's tanh beside its exponential where the tile
  // needs no mask. Returns whether some row's max grew (never with the fixed
  // base: O needs no rescale).
  template <class Tile>
  __device__ __forceinline__ static bool softmax_tile(const FwdArgs& a, const Tile& cta, int n_block,
                                                      float (&s)[1][kNT][4], int warp_row0, int lane, Softmax& softmax,
                                                      float (&alpha)[1][2]) {
    if constexpr (Cfg::kCapFixedBase) {
      if (tile_needs_mask<kMask, kBM, kBN>(a, cta.m0, n_block * kBN)) {
        mask(a, cta, n_block, s, warp_row0, lane);
        softmax.template scores_fixed_base<false>(s, a.softcap_in, a.scale_log2);
      } else {
        softmax.template scores_fixed_base<true>(s, a.softcap_in, a.scale_log2);
      }
      return false;
    } else {
      mask(a, cta, n_block, s, warp_row0, lane);
      return softmax.template scores<!Cfg::kTensorRowSums>(s, a.scale_log2, alpha);
    }
  }

  // Whether O takes the alpha of a tile whose maxima grew as `grew` says:
  // with kSkipRescale, alpha is exactly 1 for a warp none of whose rows grew.
  __device__ __forceinline__ static bool rescale_wanted(bool grew) {
    return !Cfg::kCapFixedBase && (!Cfg::kSkipRescale || __any_sync(0xffffffffu, grew));
  }

  // One key tile after another: S, its softmax, then its P V, each waited for.
  template <class Tile>
  __device__ __forceinline__ static void mma_in_turn(const FwdArgs& a, const Smem& smem, const Tile& cta,
                                                     KeyTiles tiles, const KVPipeline& kv_pipe,
                                                     typename KVPipeline::State& kv_state, float (&acc)[1][kAccT][4],
                                                     Softmax& softmax, int wg, int warp_row0, int lane) {
    for (int n_block = tiles.end - 1; n_block >= tiles.begin; --n_block) {
      float s[1][kNT][4];
      float alpha[1][2];
      s_waited(kv_pipe, kv_state, smem, s, wg);
      const bool grew = softmax_tile(a, cta, n_block, s, warp_row0, lane, softmax, alpha);
      if (rescale_wanted(grew)) rescale(acc, alpha, softmax);
      std::uint32_t p[kPSteps][4];
      to_p(p, s);
      pv_waited(kv_pipe, kv_state, smem, acc, p, softmax, wg);
      kv_state.advance();
    }
  }

  // FlashAttention-3's intra-warpgroup pipelining. Tile j+1's S and tile j's
  // P V are issued back to back; once S is in (wgmma groups retire in order),
  // its softmax runs while P V still works. Nothing outside a wgmma touches the
  // registers of one in flight (else ptxas serialises every wgmma, C7514):
  // O is rescaled to tile j's maxima before its P V is issued, with the alpha
  // tile j's softmax left; the next P is packed only after P V is done.
  // k_state leads v_state by one tile.
  template <class Tile>
  __device__ __forceinline__ static void mma_overlapped(const FwdArgs& a, const Smem& smem, const Tile& cta,
                                                        KeyTiles tiles, const KVPipeline& kv_pipe,
                                                        typename KVPipeline::State& kv_state, float (&acc)[1][kAccT][4],
                                                        Softmax& softmax, int wg, int warp_row0, int lane) {
    typename KVPipeline::State k_state = kv_state, v_state = kv_state;
    float s[1][kNT][4];
    std::uint32_t p[kPSteps][4];
    float alpha[1][2];
    int n_block = tiles.end - 1;
    s_waited(kv_pipe, k_state, smem, s, wg);
    k_state.advance();
    softmax_tile(a, cta, n_block, s, warp_row0, lane, softmax, alpha);  // O is still 0: its alpha is moot
    bool grew = false;
    to_p(p, s);
    for (--n_block; n_block >= tiles.begin; --n_block) {
      kv_pipe.consumer_wait(k_state, kPartK);
      if constexpr (Cfg::kPingpong) sm90::take_turn(wg);
      issue_s(smem, k_state.index(), s, wg);
      if (rescale_wanted(grew)) rescale(acc, alpha, softmax);
      kv_pipe.consumer_wait(v_state, kPartV);
      issue_pv(smem, v_state.index(), acc, p);
      if constexpr (Cfg::kPingpong) sm90::pass_turn(wg);
      sm90::wgmma_wait<1>();  // S is in; P V works on
      sm90::fence_operands(s[0]);
      kv_pipe.consumer_release(k_state, kPartK);
      k_state.advance();
      grew = softmax_tile(a, cta, n_block, s, warp_row0, lane, softmax, alpha);
      pv_retired(kv_pipe, v_state, acc, p, softmax);
      v_state.advance();
      to_p(p, s);
    }
    if (rescale_wanted(grew)) rescale(acc, alpha, softmax);
    pv_waited(kv_pipe, v_state, smem, acc, p, softmax, wg);
    v_state.advance();
    kv_state = v_state;
  }
};

}  // namespace attnprof::cuda::kernels
