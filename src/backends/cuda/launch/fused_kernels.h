// Our fused attention forward kernels (sm80 and later; sm90 runs them too):
//   flash     — on sm90a at head_dim 64, 96, 128, 192 and 256, FlashAttention-3 class: TMA
//               loads from a producer warp (a warpgroup with setmaxnreg at 192
//               and 256) through mbarrier stages, wgmma,
//               two consumer warpgroups (kernels/flash_fwd_sm90.cuh and the
//               role headers it names). Elsewhere
//               FlashAttention-2 class: Q in registers, K/V double-buffered
//               through cp.async, mma.sync, online softmax, causal early exit.
//   efficient — memory-efficient (xformers / CUTLASS fMHA lineage): 64x64
//               register-resident tiles, a simpler single-buffer pipeline.
// Both: fp16 and bf16 in and out, the head dims of kFusedHeadDims (32, 64,
// 96, 128, 256; fused_params.h), optionally each row's log-sum-exp, masks none,
// causal top-left, causal bottom-right and sliding window, seq_k != seq_q,
// grouped-query attention, any strides with a contiguous head_dim. A fully
// masked query row is written as zeros.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "backends/cuda/fused_params.h"

namespace attnprof::cuda {

// What the fused forward kernels take, as a problem's shape and layout: no
// tensor, no pointer. Eligibility asks it of a Problem and its BatchLayout
// (fused_shape_for, fused_inputs.h); a launch of its FusedParams (fused_shape_of).
struct FusedShape {
  int batch = 0, heads = 0, kv_heads = 0, seq_q = 0, seq_k = 0, head_dim = 0;
  float scale = 0.f;
  MaskKind mask = MaskKind::None;
  int window = 0;
  int page_size = 0, pages_per_seq = 0;  // a paged cache (page_size > 0)
  bool packed = false;                   // cumulative lengths: total_q and total_k rows
  int total_q = 0, total_k = 0;
  bool rows = false;  // a dense batch's per-sequence rows (q_rows, kv_rows)
  float softcap = 0.f;
  bool fp8 = false;
  bool lse = false;  // writes each row's log-sum-exp (a training forward)
  bool per_sequence() const { return packed || rows; }
};
FusedShape fused_shape_of(const FusedParams& p);

// nullptr when a problem of shape `s` can run on the current device, else a
// one-line reason that says what to change. The text stays valid until this
// thread's next call.
const char* fused_shape_unsupported_reason(const FusedShape& s, bool flash);
// The same for a launch's `p`: its shape (fused_shape_unsupported_reason),
// then its pointers, strides, page count and descales.
const char* fused_unsupported_reason(const FusedParams& p, bool flash);

// Enqueue one forward on `stream`. cudaErrorInvalidValue when
// fused_unsupported_reason(p, ...) is not null; otherwise the first error of
// setting the kernel's shared-memory limit or of the launch.
cudaError_t launch_flash(const FusedParams& p, cudaStream_t stream);  // along flash_path(p)
cudaError_t launch_flash_sm80(const FusedParams& p, cudaStream_t stream);
cudaError_t launch_efficient(const FusedParams& p, cudaStream_t stream);

// Which kernel launch_flash runs for `p` on the current device: the decode
// kernel where flash_decode_takes(p); else the sm90a kernel at a head_dim of
// kFlashSm90HeadDims on an sm90 GPU with a binary built for sm_90a; else the
// sm80 kernel. (The eligibility's story and the launch both read this.)
enum class FlashPath { Decode, Sm90, Sm80 };
FlashPath flash_path(const FusedParams& p);
// flash_path(p) is Sm90 and `p` is supported. Where it is not,
// launch_flash_sm90 returns cudaErrorNotSupported.
bool flash_sm90_applies(const FusedParams& p);
// Whether this binary has the sm90a kernels as machine code for the current device.
bool flash_sm90_runs_here();
cudaError_t launch_flash_sm90(const FusedParams& p, cudaStream_t stream);
// FP8 (p.fp8): V^T into p.v_t, then the e4m3 kernel (flash_fp8_launch.cu);
// flash_path gives Sm90 for every FP8 problem that fused_unsupported_reason accepts.
cudaError_t launch_flash_sm90_fp8(const FusedParams& p, cudaStream_t stream);

// Flash's split-KV decode (kernels/flash_decode.cuh): whether it takes `p`
// (a paged cache, or at most kFlashDecodeMaxQueries queries, at a head dim of
// kFlashDecodeHeadDims), how many key ranges it splits into (filling the
// GPU's CTA slots; 1 needs no combine kernel) and the FP32 workspace that
// the splits need (FusedParams::workspace). Device facts are read once.
struct DecodePlan {
  bool applies = false;
  int splits = 1;
  int rows = kFlashDecodeRows;  // packed query rows (queries x heads of a group) a CTA: 16 or 64
  int row_blocks = 0;           // CTAs of `rows` a KV head
  std::size_t workspace_bytes = 0;
  // Splits > 1 and ATTNPROF_DECODE_FUSED_COMBINE=1 (compiled, not yet run on a GPU: off by default): the last split
  // of each (sequence, KV head, row block) to finish merges the splits itself, and no combine kernel runs. Its
  // counters (uint32, one a tile) follow the partials in the workspace at `counters_offset`; they are zeroed when
  // the workspace is made (zero_decode_counters) and each run leaves them zero.
  bool fused_combine = false;
  std::size_t counters_offset = 0, counters_bytes = 0;
};
DecodePlan flash_decode_plan(const FusedParams& p);
// A fused-combine plan's counters zeroed in `workspace` on `stream` (nothing for another plan).
cudaError_t zero_decode_counters(const DecodePlan& plan, void* workspace, cudaStream_t stream);
// The plan's `applies` alone, without device facts (cheap; on every call).
bool flash_decode_takes(const FusedParams& p);
// The packed query rows (queries x group) a decode CTA takes for a KV head
// of `rows`: kFlashDecodeRows or kFlashDecodeWideRows.
int flash_decode_rows(std::int64_t rows);

// The fused backward's two kernels: the FlashAttention-2 class sm80 one
// (kernels/flash_bwd_sm80.cuh; efficient's, and flash's off sm90) and flash's
// FlashAttention-3 class sm90a one (kernels/flash_bwd_sm90.cuh) at a head dim
// of kFlashSm90BwdHeadDims on an sm90 GPU with a binary built for sm_90a.
enum class BwdPath { Sm80, Sm90 };
BwdPath fused_bwd_path(int head_dim, bool flash);
// flash's sm90 backward's group split (bwd_sm90_group_split, fused_params.h,
// says how it is picked) on this GPU: its multiprocessors and L2.
// ATTNPROF_BWD_GROUP_SPLIT (a divisor of the group) overrides it, for measuring.
int flash_sm90_bwd_group_split(const FusedBwdShape& s, bool packed);
// nullptr when `p` can run on `path` (the forward's checks, a head_dim of
// kFusedBwdHeadDims, the saved LSE, dO, the gradients and the workspace that
// fused_bwd_workspace names for the path), else a one-line reason.
const char* fused_bwd_unsupported_reason(const FusedBwdParams& p, BwdPath path);
// Enqueues its three kernels on `stream` (preprocess, the main kernel, then
// the dQ conversion or, deterministic on sm80, the dQ kernel); the sm80 ones
// when the sm90 kernel cannot launch (its register split). cudaErrorInvalidValue when
// fused_bwd_unsupported_reason(p, path) is not null.
cudaError_t launch_fused_bwd(const FusedBwdParams& p, BwdPath path, cudaStream_t stream);

// The launches above for a `p` that fused_unsupported_reason(p, flash)
// already accepted (FusedBackend checks first, for its message): no second
// check. launch_flash_checked's `plan` is flash_decode_plan(p) where
// flash_decode_takes(p) (read on the decode path only), so that the plan made
// for the workspace is not made again. launch_flash_decode_planned enqueues
// the split kernel and, with more than one split, the combine kernel
// (without p.workspace, one split); cudaErrorInvalidValue when the plan does
// not apply.
cudaError_t launch_flash_checked(const FusedParams& p, const DecodePlan& plan, cudaStream_t stream);
cudaError_t launch_flash_decode_planned(const FusedParams& p, const DecodePlan& plan, cudaStream_t stream);
cudaError_t launch_flash_sm80_checked(const FusedParams& p, cudaStream_t stream);
cudaError_t launch_efficient_checked(const FusedParams& p, cudaStream_t stream);

}  // namespace attnprof::cuda
