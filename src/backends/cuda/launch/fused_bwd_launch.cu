// Host entry of the fused backwards (kernels/flash_bwd_sm80.cuh, shared by
// efficient and flash; kernels/flash_bwd_sm90.cuh, flash's on sm90): which
// one runs, their eligibility check and the dispatch of the runtime choices
// (element type, head_dim, mask) to the instances in flash_bwd_sm80_hdim*.cu and
// flash_bwd_sm90_hdim*.cu (kernels/bwd_launch.cuh).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "backends/cuda/device_attributes.h"
#include "backends/cuda/kernels/bwd_launch.cuh"
#include "backends/cuda/kernels/static_switch.cuh"
#include "backends/cuda/launch/fused_kernels.h"

namespace attnprof::cuda {
namespace {

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace

const char* fused_bwd_head_dim_refusal(int head_dim, bool flash) {
  if (fused_bwd_head_dim_built(head_dim) || fused_bwd_path(head_dim, flash) == BwdPath::Sm90) return nullptr;
  thread_local std::string reason;
  std::string built;
  for (const int d : kFusedBwdHeadDims) built += (built.empty() ? "" : ", ") + std::to_string(d);
  reason = "the fused backward is built for head_dim " + built + ", not " + std::to_string(head_dim) +
           " (dK and dV of 16 keys a warp outgrow the registers)" +
           (flash && flash_sm90_bwd_head_dim(head_dim) ? "; flash's sm90 backward takes it on an sm90 GPU" : "");
  return reason.c_str();
}

BwdPath fused_bwd_path(int head_dim, bool flash) {
  return flash && flash_sm90_bwd_head_dim(head_dim) && flash_sm90_runs_here() ? BwdPath::Sm90 : BwdPath::Sm80;
}

int flash_sm90_bwd_group_split(const FusedBwdShape& s, bool packed) {
  const std::int64_t group = s.kv_heads > 0 ? s.heads / s.kv_heads : 1;
  if (!s.sm90 || packed || group <= 1) return 1;
  static const int forced = [] {
    const char* v = std::getenv("ATTNPROF_BWD_GROUP_SPLIT");
    return v != nullptr ? std::atoi(v) : 0;
  }();
  if (forced > 0) return group % forced == 0 ? forced : 1;
  struct Facts {
    int multiprocessors = 132;
    int l2_bytes = 50 << 20;
  };
  static const Facts facts = [] {
    Facts f;
    int device = 0, n = 0, l2 = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return f;
    if (fixed_device_attribute(n, cudaDevAttrMultiProcessorCount, device) == cudaSuccess) f.multiprocessors = n;
    if (fixed_device_attribute(l2, cudaDevAttrL2CacheSize, device) == cudaSuccess) f.l2_bytes = l2;
    return f;
  }();
  return bwd_sm90_group_split(s, packed, facts.multiprocessors, facts.l2_bytes);
}

const char* fused_bwd_unsupported_reason(const FusedBwdParams& p, BwdPath path) {
  if (const char* why = fused_unsupported_reason(p.fwd, /*flash=*/true)) return why;
  thread_local std::string reason;
  auto say = [&](const std::string& text) {
    reason = text;
    return reason.c_str();
  };
  if (const char* why = fused_bwd_head_dim_refusal(p.fwd.head_dim, path == BwdPath::Sm90)) return why;
  if (p.fwd.softcap > 0.f && path != BwdPath::Sm90) return say("soft caps are read by flash's sm90 backward only");
  if (p.fwd.lse == nullptr) return say("the backward needs the forward's saved log-sum-exp");
  if (!p.dout || !p.dq || !p.dk || !p.dv || !p.dsum) return say("dout, dq, dk, dv and the workspace must be set");
  const bool sm90 = path == BwdPath::Sm90;
  const int group = p.fwd.kv_heads > 0 ? p.fwd.heads / p.fwd.kv_heads : 0;
  if (p.group_split < 1 || (p.group_split > 1 && (!sm90 || group % p.group_split != 0 || p.fwd.cu_seqlens_q))) {
    return say("group_split must divide the grouped-query group, and split only sm90's dense backward");
  }
  const FusedBwdWorkspace need = fused_bwd_workspace({.batch = p.fwd.batch,
                                                      .heads = p.fwd.heads,
                                                      .kv_heads = p.fwd.kv_heads,
                                                      .seq_q = p.fwd.seq_q,
                                                      .seq_k = p.fwd.seq_k,
                                                      .head_dim = p.fwd.head_dim,
                                                      .deterministic = p.deterministic,
                                                      .sm90 = sm90,
                                                      .group_split = p.group_split});
  if ((need.dq_accum > 0 && !p.dq_accum) || (need.lse_log2 > 0 && !p.lse_log2) ||
      (need.dq_semaphore > 0 && !p.dq_semaphore) || (need.dkv_partial > 0 && !p.dkv_partial) ||
      (need.dq_accum > 0 && p.dq_accum_cols != need.dq_accum_cols)) {
    return say("the workspace this path needs (fused_bwd_workspace) must be set");
  }
  if (!aligned16(p.dout) || !aligned16(p.dq) || !aligned16(p.dk) || !aligned16(p.dv)) {
    return say("dout, dq, dk and dv must be 16-byte aligned");
  }
  for (const std::int64_t stride :
       {p.do_batch_stride, p.do_head_stride, p.do_row_stride, p.dq_batch_stride, p.dq_head_stride, p.dq_row_stride,
        p.dk_batch_stride, p.dk_head_stride, p.dk_row_stride, p.dv_batch_stride, p.dv_head_stride, p.dv_row_stride}) {
    if (stride % 8 != 0) {
      return say("every batch, head and row stride of dO and the gradients must be a multiple of 8 elements");
    }
  }
  if (p.do_row_stride >= (std::int64_t{1} << 23)) return say("row strides must be below 2^23 elements");
  return nullptr;
}

cudaError_t launch_fused_bwd(const FusedBwdParams& p, BwdPath path, cudaStream_t stream) {
  if (fused_bwd_unsupported_reason(p, path) != nullptr) return cudaErrorInvalidValue;
  const kernels::BwdArgs a = kernels::BwdArgs::from(p);
  return kernels::with_element(p.fwd.bf16, [&]<kernels::Half16 Element>() {
    return kernels::with_mask_mode(p.fwd.mask, cudaErrorInvalidValue, [&]<kernels::MaskMode kMask>() {
      if (path == BwdPath::Sm90) {
        const cudaError_t e = kernels::with_head_dim<kFlashSm90BwdHeadDims>(
            p.fwd.head_dim, cudaErrorInvalidValue,
            [&]<int kHeadDim>() { return kernels::launch_flash_bwd_sm90<kHeadDim, kMask, Element>(a, stream); });
        // Not launched (the register split, run_flash_bwd_sm90): sm80's kernels
        // take the same workspace (the sm90 one is a superset) where they are
        // built for the head dim.
        // (Not for what the sm80 kernels do not read: soft caps.)
        if (e != cudaErrorNotSupported || !fused_bwd_head_dim_built(p.fwd.head_dim) || p.fwd.softcap > 0.f) {
          return e;
        }
      }
      return kernels::with_head_dim<kFusedBwdHeadDims>(p.fwd.head_dim, cudaErrorInvalidValue, [&]<int kHeadDim>() {
        return kernels::launch_flash_bwd_sm80<kHeadDim, kMask, Element>(a, stream);
      });
    });
  });
}

}  // namespace attnprof::cuda
