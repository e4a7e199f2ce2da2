// The Backend shell around one fused kernel (efficient, flash): eligibility
// from the kernel's own answer, FusedParams from the problem and the tensors,
// one RecordFunction and one launch per forward. The backward reads the
// log-sum-exp that forward_train saves: three kernels (efficient's, and
// flash's off sm90: kernels/flash_bwd_sm80.cuh; flash's on sm90:
// kernels/flash_bwd_sm90.cuh), workspace as fused_bwd_workspace says.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "attnprof/aliasing.h"
#include "attnprof/check_inputs.h"
#include "attnprof/error.h"
#include "attnprof/profiler.h"
#include "backends/cuda/arch_check.h"
#include "backends/cuda/fp8_descales.h"
#include "backends/cuda/fused_inputs.h"
#include "backends/cuda/launch/fused_kernels.h"
#include "backends/cuda/runtime.h"
#include "backends/cuda/sequence_lengths.h"
#include "core/cuda_check.h"
#include "core/mask_geometry.h"
#include "core/rows.h"

namespace attnprof::cuda {

// The refusal of a head dim the fused backward is not built for on its path
// (fused_bwd_path), or null: one message for eligibility and the launch's own
// check (fused_bwd_launch.cu).
const char* fused_bwd_head_dim_refusal(int head_dim, bool flash);

class FusedBackend : public Backend {
 public:
  // The kernel's launch for a `p` that fused_unsupported_reason already
  // accepted, given flash's decode plan (empty off the decode path):
  // launch_flash_checked; efficient's ignores the plan.
  using Launch = cudaError_t (*)(const FusedParams& p, const DecodePlan& plan, cudaStream_t stream);
  // What eligibility says will run for a problem of this shape.
  using Story = const char* (*)(const FusedParams& shape);

  // Which kernel the backend drives: its eligibility, backward path, plans
  // and traits follow from it.
  enum class Kernel : std::uint8_t { Efficient, Flash };
  struct Spec {
    std::string_view name;  // the backend's
    std::string_view op;    // the forward's RecordFunction (the backward's is derived from it)
    Kernel kernel;
    Launch launch;
    Story story;
  };

  explicit FusedBackend(const Spec& s)
      : name_(s.name),
        op_(s.op),
        bwd_op_(backward_op(s.op)),
        flash_(s.kernel == Kernel::Flash),
        launch_(s.launch),
        story_(s.story) {}

  std::string_view name() const override { return name_; }
  Device device() const override { return Device::Cuda; }

  Eligibility eligibility(const Problem& p) const override {
    if (p.dtype == DType::F32) return {false, "fp32 is not supported: the fused kernels take fp16 or bf16"};
    // dtype fp8 with a backward or training pass is Problem::validate()'s
    // refusal, the one every front end gives before asking a backend.
    // A paged cache on efficient: eligibility_of refuses it (Traits::paged).
    if (p.mask == MaskKind::Bias) {
      return {false, "bias masks are not supported by our fused kernels"};
    }
    // A mask tensor is never read back on the host (no copy, no
    // synchronisation): key padding comes as rows (Inputs::q_rows, kv_rows),
    // which the Python call lowers a key-padding attn_mask to on the device.
    if (p.mask == MaskKind::Boolean) {
      return {false, std::string(name_) +
                         " on CUDA reads no boolean mask tensor: give key padding as per-sequence rows (kv_rows, "
                         "q_rows; in Python attention(mask=..., attn_mask=key_padding) lowers it)"};
    }
    if (p.varlen() && std::max(p.total_q(), p.total_kv()) > std::int64_t{1} << 30) {
      return {false, std::string(name_) + " indexes a packed batch's rows in 32 bits: at most 2^30 rows"};
    }
    if (std::string why = arch_unsupported_reason(); !why.empty()) return {false, why};
    // The kernels' own question, asked of the problem and its layout (no
    // tensor, no pointer); the story reads the launch's values for the
    // problem (fused_params_for: sizes, scale, pages, packed rows; no addresses).
    if (const char* why = fused_shape_unsupported_reason(fused_shape_for(p, p.layout()), flash_)) return {false, why};
    const FusedParams shape = fused_params_for(p);
    if (p.pass == Pass::Forward) return {true, story_(shape)};
    if (const char* why = fused_bwd_head_dim_refusal(static_cast<int>(p.head_dim), flash_)) return {false, why};
    return {true, std::string(story_(shape)) + "; backward: " + backward_story(p)};
  }

  // The sm90 backward's group split, where it splits (flash_sm90_bwd_group_split).
  std::string group_split_story(const Problem& p) const {
    const int split = backward_shape(p).group_split;
    if (split <= 1) return {};
    return "; each key tile's " + std::to_string(p.group()) + " query heads split among " + std::to_string(split) +
           " CTAs (the fewest that fill the GPU 1.9 times over and keep a wave's query heads within 2.5 times its L2; "
           "one more where a masked grid's CTAs would be few and heavy), "
           "their FP32 dK and dV summed in order by a fourth kernel";
  }

  // What the backward runs for `p`, and why that kernel.
  std::string backward_story(const Problem& p) const {
    if (fused_bwd_path(static_cast<int>(p.head_dim), flash_) == BwdPath::Sm90) {
      return std::string("D = rowsum(dO O), then one warp-specialised kernel per ") +
             (p.head_dim > 128 ? "64-key tile" : "128-key tile") +
             " (FlashAttention-3 class on sm90: TMA loads of Q, dO, LSE and D from a producer warpgroup, wgmma in "
             "two consumer warpgroups, K and V resident), dQ summed in FP32 " +
             (p.deterministic ? "in key-tile order (deterministic: each key tile waits its turn)"
                              : "by vector reductions as key tiles finish") +
             ", then the dQ conversion" + group_split_story(p);
    }
    std::string why;
    if (flash_ && !flash_sm90_bwd_head_dim(static_cast<int>(p.head_dim))) {
      std::string dims;
      for (const int d : kFlashSm90BwdHeadDims) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
      why = " (the sm90 backward is built for head_dim " + dims + ")";
    } else if (flash_) {
      why = " (not an sm90 GPU with sm_90a code in this build)";
    }
    return (p.deterministic ? "D = rowsum(dO O), dK/dV per key tile, dQ per query tile (no atomics)"
                            : "D = rowsum(dO O), dK/dV per key tile with dQ by FP32 atomics, dQ conversion") +
           std::string(" (FlashAttention-2 class, mma.sync)") + why;
  }

  // Forward: FP8's V^T; flash's split-KV decode keeps its splits' partial results (freed
  // when the call returns). Backward: the saved LSE, D and (not deterministic)
  // the FP32 dQ accumulator. A training step peaks at the larger of its
  // forward (with the LSE it saves) and its backward.
  std::size_t workspace_bytes(const Problem& p) const override {
    const auto rows = static_cast<std::size_t>(p.batch * p.heads * p.seq);
    if (is_fp8(p.dtype)) return fp8_vt_bytes(fused_params_for(p));  // forward only: V^T
    const std::size_t decode =
        flash_ && p.pass != Pass::Backward ? flash_decode_plan(fused_params_for(p)).workspace_bytes : 0;
    if (p.pass == Pass::Forward) return decode;
    const std::size_t backward = rows * sizeof(float) +  // the saved LSE
                                 static_cast<std::size_t>(backward_workspace(p).total()) * sizeof(float);
    return std::max(backward, decode + rows * sizeof(float));
  }

  // The backward's shape, with the sm90 kernel's group split (flash_sm90_bwd_group_split).
  FusedBwdShape backward_shape(const Problem& p) const {
    FusedBwdShape s{.batch = p.batch,
                    .heads = p.heads,
                    .kv_heads = p.kv_heads,
                    .seq_q = p.seq,
                    .seq_k = p.kv_seq,
                    .head_dim = p.head_dim,
                    .deterministic = p.deterministic,
                    .sm90 = fused_bwd_path(static_cast<int>(p.head_dim), flash_) == BwdPath::Sm90,
                    .masked = p.mask != MaskKind::None};
    s.group_split = flash_sm90_bwd_group_split(s, p.varlen());
    return s;
  }
  FusedBwdWorkspace backward_workspace(const Problem& p) const { return fused_bwd_workspace(backward_shape(p)); }

  // Forward: one kernel, or flash's decode kernel and, when it splits the
  // keys, its combine kernel. Backward: preprocess (D, and the dQ accumulator
  // zeroed in the same kernel: no memset), dK/dV (with atomic dQ), then the
  // dQ conversion or, deterministic, the dQ kernel: 3; 4 where sm90's group
  // is split (the partial dK and dV summed). Train: forward + backward.
  Expectation expectation(const Problem& p) const override {
    Expectation e;
    // FP8: the V^T pre-pass and the kernel.
    const auto split_decode = [&] {
      const DecodePlan d = flash_decode_plan(fused_params_for(p));
      return d.splits > 1 && !d.fused_combine;  // a combine kernel after the split kernel
    };
    const int forward = is_fp8(p.dtype) || (flash_ && split_decode()) ? 2 : 1;
    const int backward = p.pass == Pass::Forward ? 0 : 3 + (backward_shape(p).group_split > 1 ? 1 : 0);
    switch (p.pass) {
      case Pass::Forward:
        e.cpu_ops = {std::string(op_)};
        e.device_activities = forward;
        break;
      case Pass::Backward:
        e.cpu_ops = {bwd_op_};
        e.device_activities = backward;
        break;
      case Pass::Train:
        e.cpu_ops = {std::string(op_), bwd_op_};
        e.device_activities = forward + backward;
        break;
    }
    return e;
  }

  bool has_backward() const override { return true; }
  // The backward recomputes P from the saved log-sum-exp; dQ is summed with
  // FP32 atomics unless the problem asks for deterministic. flash's decode
  // path splits the keys (fused_params.h's limits, for the split-kv rule).
  Traits traits() const override {
    return {.backward_recomputes = true,
            .backward_dq_unordered = true,
            .max_kv_splits = flash_ ? kFlashDecodeMaxSplits : 0,
            .kv_split_keys = flash_ ? kFlashDecodeKeys : 0,
            .softcap = flash_,
            .rows = flash_,
            .varlen = flash_,
            .device_lengths = flash_,
            .fp8 = flash_,
            .paged = flash_,  // the decode kernel reads pages
            .paged_lengths = flash_};
  }

  void forward(const Problem& p, const Inputs& in, Tensor& out, RunContext& ctx) override {
    run_forward(p, in, out, nullptr, ctx);
  }

  // A plan's state (attnprof/plan.h): flash's decode plan (the split count,
  // from the device's facts) and its splits' workspace, and FP8's V^T
  // buffer, sized and allocated once for the problem, so that a planned
  // forward sizes and allocates nothing (a CUDA graph captures it and
  // replays it with its buffers still live). The kernels' input-error word
  // is made here too (its first ask is a synchronous cudaMalloc, which a
  // capture may not make), and a packed batch's device lengths.
  std::unique_ptr<BackendState> prepare(const Problem& p, RunContext& ctx) override {
    auto s = std::make_unique<Prepared>();
    const FusedParams f = fused_params_for(p);
    if (flash_ && flash_decode_takes(f)) s->decode = flash_decode_plan(f);
    std::size_t bytes = s->decode.workspace_bytes;
    if (f.fp8) bytes = std::max(bytes, fp8_vt_bytes(f));  // the decode path takes no FP8: one or the other
    if (bytes > 0) s->workspace.emplace(ctx.allocator, bytes);
    if (s->workspace) {
      ATTNPROF_CUDA_CHECK(zero_decode_counters(s->decode, s->workspace->data(), static_cast<cudaStream_t>(ctx.stream)));
    }
    if (flash_) device_input_errors();
    // A packed batch's host lengths copied to the device now, not on the
    // first run (the runs look the copy up); lengths on the device are the
    // runs' own tensors.
    if (p.varlen() && !p.lengths_on_device) device_cu_seqlens(p, static_cast<cudaStream_t>(ctx.stream));
    return s;
  }

  void forward_train(const Problem& p, const Inputs& in, Tensor& out, Saved& saved, RunContext& ctx) override {
    saved.lse = Tensor::empty(fused_lse_dims(p), DType::F32, ctx.allocator);
    run_forward(p, in, out, saved.lse.data_as<float>(), ctx);
  }

  void backward(const Problem& p, const Inputs& in, const Tensor& out, const Tensor& dout, const Saved& saved,
                Gradients& grads, RunContext& ctx) override {
    RecordFunction rf(bwd_op_, dtype_name(p.dtype), shape_key_of(p));
    for (const Tensor* t :
         std::initializer_list<const Tensor*>{&in.q, &in.k, &in.v, &out, &dout, &grads.dq, &grads.dk, &grads.dv}) {
      if (t->stride(3) != 1) {
        fail(ErrorKind::Unsupported, std::string(name_) + " needs a contiguous head_dim; got " + t->describe());
      }
    }
    if (saved.lse.sizes() != fused_lse_dims(p) || saved.lse.dtype() != DType::F32) {
      fail(ErrorKind::InvalidArgument,
           std::string(name_) + "'s backward needs the FP32 log-sum-exp that its forward_train saves");
    }
    FusedBwdParams b;
    b.fwd = fused_params_for(p);
    bind_forward_tensors(b.fwd, name_, in, out, const_cast<float*>(saved.lse.data_as<float>()));
    bind_sequences(b.fwd, name_, p, in, ctx);
    b.dout = dout.data();
    set_strides(dout, b.do_batch_stride, b.do_head_stride, b.do_row_stride);
    b.dq = grads.dq.data();
    b.dk = grads.dk.data();
    b.dv = grads.dv.data();
    set_strides(grads.dq, b.dq_batch_stride, b.dq_head_stride, b.dq_row_stride);
    set_strides(grads.dk, b.dk_batch_stride, b.dk_head_stride, b.dk_row_stride);
    set_strides(grads.dv, b.dv_batch_stride, b.dv_head_stride, b.dv_row_stride);
    if (p.varlen()) b.do_batch_stride = b.dq_batch_stride = b.dk_batch_stride = b.dv_batch_stride = 0;
    b.deterministic = p.deterministic;
    // Workspace in one piece, released (to the stream-ordered cache) when
    // this call returns; each part starts 16-byte aligned (its element
    // count is a multiple of 4).
    const BwdPath path = fused_bwd_path(b.fwd.head_dim, flash_);
    const FusedBwdShape shape = backward_shape(p);
    const FusedBwdWorkspace w = fused_bwd_workspace(shape);
    Storage workspace(ctx.allocator, static_cast<std::size_t>(w.total()) * sizeof(float));
    float* at = static_cast<float*>(workspace.data());
    auto take = [&at](std::int64_t n) {
      float* part = n > 0 ? at : nullptr;
      at += n;
      return part;
    };
    b.dsum = take(w.dsum);
    b.lse_log2 = take(w.lse_log2);
    b.dq_accum = take(w.dq_accum);
    b.dq_semaphore = reinterpret_cast<int*>(take(w.dq_semaphore));
    b.dq_accum_cols = w.dq_accum_cols;
    b.group_split = shape.group_split;
    b.dkv_partial = take(w.dkv_partial);
    if (const char* why = fused_bwd_unsupported_reason(b, path))
      fail(ErrorKind::Unsupported, std::string(name_) + ": " + why);
    ATTNPROF_CUDA_CHECK(launch_fused_bwd(b, path, static_cast<cudaStream_t>(ctx.stream)));
  }

 private:
  // prepare()'s state: the decode plan and the workspace held for the plan's forwards.
  struct Prepared final : BackendState {
    DecodePlan decode;
    std::optional<Storage> workspace;
    std::size_t bytes() const override { return workspace ? workspace->bytes() : 0; }
  };

  // The backward's op name, made once (a call records it): "_flash_attention_forward" -> "..._backward".
  static std::string backward_op(std::string_view forward_op) {
    std::string op(forward_op);
    if (const auto at = op.rfind("forward"); at != std::string::npos) op.replace(at, 7, "backward");
    return op;
  }

  void run_forward(const Problem& p, const Inputs& in, Tensor& out, float* lse, RunContext& ctx) {
    require_output_apart(in, out, name());
    RecordFunction rf(op_, dtype_name(p.dtype), shape_key_of(p));
    FusedParams f = fused_params_for(p);
    bind_forward_tensors(f, name_, in, out, lse, p.kv_cache == KvCache::Paged);
    bind_sequences(f, name_, p, in, ctx);
    if (p.kv_cache == KvCache::Paged) {
      // The decode kernel reads row b of the table at b * pages_per_seq.
      if (in.block_table.stride(3) != 1 || in.block_table.stride(2) != p.pages_per_seq()) {
        fail(ErrorKind::Unsupported,
             std::string(name_) + " needs a contiguous block table; got " + in.block_table.describe());
      }
      f.block_table = in.block_table.data_as<std::int32_t>();
      if (in.k_pages.size(0) > INT32_MAX) {
        fail(ErrorKind::Unsupported, std::string(name_) + " indexes at most 2^31 - 1 pages; the cache has " +
                                         std::to_string(in.k_pages.size(0)));
      }
      f.num_pages = static_cast<int>(in.k_pages.size(0));
    }
    // Where the kernels report a per-sequence count or a page they had to
    // clamp (read by take_input_errors()); made once per device.
    if (f.kv_rows != nullptr || f.block_table != nullptr) f.input_errors = device_input_errors();
    // FP8: the descales, and V^T's buffer (released to the stream-ordered
    // cache when this call returns).
    // A plan's forward (ctx.state, prepare()'s for this problem) takes its
    // held workspace instead.
    const auto* planned = dynamic_cast<const Prepared*>(ctx.state);
    std::optional<Storage> v_t;
    if (f.fp8) {
      f.q_descale = in.q_descale;
      f.k_descale = in.k_descale;
      f.v_descale = in.v_descale;
      // Device descales: only the kernel reads them, on ctx.stream.
      f.q_descale_device = device_descale(in.q_descale_tensor, "q_descale", p.device);
      f.k_descale_device = device_descale(in.k_descale_tensor, "k_descale", p.device);
      f.v_descale_device = device_descale(in.v_descale_tensor, "v_descale", p.device);
      const std::size_t bytes = fp8_vt_bytes(f);
      if (planned && planned->bytes() >= bytes) {
        f.v_t = planned->workspace->data();
      } else {
        v_t.emplace(ctx.allocator, bytes);
        f.v_t = v_t->data();
      }
    }
    // Checked here for the message; the launch does not check again.
    if (const char* why = fused_unsupported_reason(f, flash_))
      fail(ErrorKind::Unsupported, std::string(name_) + ": " + why);
    // The decode kernel's plan, made once for the workspace and the launch;
    // its split results, released (to the stream-ordered cache) when this
    // call returns: a Storage in place, not a Tensor (no heap allocation).
    DecodePlan plan;
    std::optional<Storage> workspace;
    if (flash_ && flash_decode_takes(f)) {
      // The plan's decode plan is this one: both are made from the problem's
      // shape alone (fused_params_for), which the plan checked the tensors against.
      plan = planned && planned->decode.applies ? planned->decode : flash_decode_plan(f);
      if (plan.workspace_bytes > 0 && planned && planned->bytes() >= plan.workspace_bytes) {
        f.workspace = static_cast<float*>(planned->workspace->data());
      } else if (plan.workspace_bytes > 0) {
        workspace.emplace(ctx.allocator, plan.workspace_bytes);
        f.workspace = static_cast<float*>(workspace->data());
        ATTNPROF_CUDA_CHECK(zero_decode_counters(plan, f.workspace, static_cast<cudaStream_t>(ctx.stream)));
      }
    }
    ATTNPROF_CUDA_CHECK(launch_(f, plan, static_cast<cudaStream_t>(ctx.stream)));
  }

  std::string_view name_, op_;
  std::string bwd_op_;
  bool flash_;
  Launch launch_;
  Story story_;
};

}  // namespace attnprof::cuda
