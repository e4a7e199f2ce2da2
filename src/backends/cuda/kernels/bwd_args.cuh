// Device-side arguments of the fused backward (flash_bwd_sm80.cuh), made from
// the host-side FusedBwdParams in one place (BwdArgs::from): the forward's
// FwdArgs (its tensors, shape and mask geometry; O and the saved log-sum-exp
// read) and the backward's own tensors and workspace.
#pragma once

#include <cstdint>

#include "backends/cuda/fused_params.h"
#include "backends/cuda/kernels/fwd_args.cuh"

namespace attnprof::cuda::kernels {

struct BwdArgs {
  FwdArgs f;  // q, k, v, o (O of the forward), their strides, sizes, mask, lse (read)
  const std::uint16_t* dout;
  std::int64_t do_batch_stride, do_head_stride, do_row_stride;
  std::uint16_t* dq;
  std::uint16_t* dk;
  std::uint16_t* dv;
  std::int64_t dq_batch_stride, dq_head_stride, dq_row_stride;
  std::int64_t dk_batch_stride, dk_head_stride, dk_row_stride;
  std::int64_t dv_batch_stride, dv_head_stride, dv_row_stride;
  float* dsum;      // [B, H, Sq]
  float* dq_accum;  // [B, H, Sq, D], or null when deterministic
  float scale;      // softmax scale (dQ = scale dS K, dK = scale dS^T Q)
  int head_dim;

  static BwdArgs from(const FusedBwdParams& p) {
    return BwdArgs{
        .f = FwdArgs::from(p.fwd),
        .dout = static_cast<const std::uint16_t*>(p.dout),
        .do_batch_stride = p.do_batch_stride,
        .do_head_stride = p.do_head_stride,
        .do_row_stride = p.do_row_stride,
        .dq = static_cast<std::uint16_t*>(p.dq),
        .dk = static_cast<std::uint16_t*>(p.dk),
        .dv = static_cast<std::uint16_t*>(p.dv),
        .dq_batch_stride = p.dq_batch_stride,
        .dq_head_stride = p.dq_head_stride,
        .dq_row_stride = p.dq_row_stride,
        .dk_batch_stride = p.dk_batch_stride,
        .dk_head_stride = p.dk_head_stride,
        .dk_row_stride = p.dk_row_stride,
        .dv_batch_stride = p.dv_batch_stride,
        .dv_head_stride = p.dv_head_stride,
        .dv_row_stride = p.dv_row_stride,
        .dsum = p.dsum,
        .dq_accum = p.deterministic ? nullptr : p.dq_accum,
        .scale = p.fwd.scale,
        .head_dim = p.fwd.head_dim,
    };
  }
};

}  // namespace attnprof::cuda::kernels
