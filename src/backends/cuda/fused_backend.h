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
    // problem (params_for: sizes, scale, pages, packed rows; no addresses).
    if (const char* why = fused_shape_unsupported_reason(shape_of(p, p.layout()), flash_)) return {false, why};
    const FusedParams shape = params_for(p);
    if (p.pass == Pass::Forward) return {true, story_(shape)};
    if (const char* why = fused_bwd_head_dim_refusal(static_cast<int>(p.head_dim), flash_)) return {false, why};
    return {true, std::string(story_(shape)) + "; backward: " + backward_story(p)};
  }

  // The sm90 backward's group split, where it splits (flash_sm90_bwd_group_split).
  std::string group_split_story(const Problem& p) const {
    const int split = backward_shape(p).group_split;
    if (split <= 1) return {};
    return "; each key tile's " + std::to_string(p.group()) + " query heads split among " + std::to_string(split) +
           " CTAs (too few key tiles and kv heads to fill the GPU twice), their FP32 dK and dV summed in order by a "
           "fourth kernel";
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
    if (is_fp8(p.dtype)) return fp8_vt_bytes(params_for(p));  // forward only: V^T
    const std::size_t decode =
        flash_ && p.pass != Pass::Backward ? flash_decode_plan(params_for(p)).workspace_bytes : 0;
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
                    .sm90 = fused_bwd_path(static_cast<int>(p.head_dim), flash_) == BwdPath::Sm90};
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
    const int forward = is_fp8(p.dtype) || (flash_ && flash_decode_plan(params_for(p)).splits > 1) ? 2 : 1;
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

  // The kernels' arguments for a problem's shape (no tensors): what the
  // plans (decode splits, workspace, expectations) are made from.
  // What the kernels are asked for `p` in layout `l` (fused_kernels.h's
  // FusedShape): the problem's sizes and options, and which index tensors
  // its runs give.
  static FusedShape shape_of(const Problem& p, const BatchLayout& l) {
    const bool packed = l.form == BatchLayout::Form::Packed;
    return {.batch = static_cast<int>(p.batch),
            .heads = static_cast<int>(p.heads),
            .kv_heads = static_cast<int>(p.kv_heads),
            .seq_q = static_cast<int>(p.seq),
            .seq_k = static_cast<int>(p.kv_seq),
            .head_dim = static_cast<int>(p.head_dim),
            .scale = static_cast<float>(p.softmax_scale()),
            .mask = p.mask,
            .window = geometry::clamp_window(p.window, static_cast<int>(p.kv_seq)),
            .page_size = l.form == BatchLayout::Form::Paged ? static_cast<int>(p.page_size) : 0,
            .pages_per_seq = l.form == BatchLayout::Form::Paged ? static_cast<int>(p.pages_per_seq()) : 0,
            .packed = packed,
            .total_q = packed ? static_cast<int>(p.total_q()) : 0,
            .total_k = packed ? static_cast<int>(p.total_kv()) : 0,
            .rows = l.form == BatchLayout::Form::Padded && l.reads_rows(),
            .softcap = static_cast<float>(p.softcap),
            .fp8 = is_fp8(p.dtype),
            .lse = p.pass != Pass::Forward};
  }

  static FusedParams params_for(const Problem& p) {
    FusedParams f;
    f.batch = static_cast<int>(p.batch);
    f.heads = static_cast<int>(p.heads);
    f.kv_heads = static_cast<int>(p.kv_heads);
    f.seq_q = static_cast<int>(p.seq);
    f.seq_k = static_cast<int>(p.kv_seq);
    f.head_dim = static_cast<int>(p.head_dim);
    f.scale = static_cast<float>(p.softmax_scale());
    f.bf16 = p.dtype == DType::BF16;
    f.fp8 = is_fp8(p.dtype);
    // At most the longest sequence's keys: the same band for every window in
    // 1..INT64_MAX, and int32 arithmetic in the kernels (mask_geometry.h).
    f.window = geometry::clamp_window(p.window, f.seq_k);
    if (p.kv_cache == KvCache::Paged) {
      f.page_size = static_cast<int>(p.page_size);
      f.pages_per_seq = static_cast<int>(p.pages_per_seq());
      f.num_pages = static_cast<int>(std::min<std::int64_t>(p.batch * p.pages_per_seq(), INT32_MAX));  // make_inputs'
    }
    f.mask = p.mask;
    f.softcap = static_cast<float>(p.softcap);
    if (p.varlen()) {
      f.total_q = static_cast<int>(p.total_q());
      f.total_k = static_cast<int>(p.total_kv());
    }
    return f;
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
    const FusedParams f = params_for(p);
    if (flash_ && flash_decode_takes(f)) s->decode = flash_decode_plan(f);
    std::size_t bytes = s->decode.workspace_bytes;
    if (f.fp8) bytes = std::max(bytes, fp8_vt_bytes(f));  // the decode path takes no FP8: one or the other
    if (bytes > 0) s->workspace.emplace(ctx.allocator, bytes);
    if (flash_) device_input_errors();
    // A packed batch's host lengths copied to the device now, not on the
    // first run (the runs look the copy up); lengths on the device are the
    // runs' own tensors.
    if (p.varlen() && !p.lengths_on_device) device_cu_seqlens(p, static_cast<cudaStream_t>(ctx.stream));
    return s;
  }

  void forward_train(const Problem& p, const Inputs& in, Tensor& out, Saved& saved, RunContext& ctx) override {
    saved.lse = Tensor::empty(lse_dims(p), DType::F32, ctx.allocator);
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
    if (saved.lse.sizes() != lse_dims(p) || saved.lse.dtype() != DType::F32) {
      fail(ErrorKind::InvalidArgument,
           std::string(name_) + "'s backward needs the FP32 log-sum-exp that its forward_train saves");
    }
    FusedBwdParams b;
    b.fwd = params_for(p);
    fill_forward(b.fwd, in, out, const_cast<float*>(saved.lse.data_as<float>()));
    use_sequences(b.fwd, p, in, ctx);
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
    FusedParams f = params_for(p);
    fill_forward(f, in, out, lse, p.kv_cache == KvCache::Paged);
    use_sequences(f, p, in, ctx);
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
      // shape alone (params_for), which the plan checked the tensors against.
      plan = planned && planned->decode.applies ? planned->decode : flash_decode_plan(f);
      if (plan.workspace_bytes > 0 && planned && planned->bytes() >= plan.workspace_bytes) {
        f.workspace = static_cast<float*>(planned->workspace->data());
      } else if (plan.workspace_bytes > 0) {
        workspace.emplace(ctx.allocator, plan.workspace_bytes);
        f.workspace = static_cast<float*>(workspace->data());
      }
    }
    ATTNPROF_CUDA_CHECK(launch_(f, plan, static_cast<cudaStream_t>(ctx.stream)));
  }

  // The saved log-sum-exp's shape: [B, H, S, 1], or a packed batch's [1, H, total_q, 1].
  static Dims lse_dims(const Problem& p) {
    return p.varlen() ? Dims{1, p.heads, p.total_q(), 1} : Dims{p.batch, p.heads, p.seq, 1};
  }

  // Sequences of their own lengths into f (flash; fused_unsupported_reason
  // refuses them elsewhere): a packed batch's cumulative lengths (the
  // caller's own device tensors when Problem::lengths_on_device, read by the
  // kernels only, which clamp them and flag what they clamp in the input-error
  // word; else kept on the device per set of host lengths) with its tensors'
  // batch strides 0; a dense
  // batch's rows (Inputs::q_rows, kv_rows) as the caller's own device
  // tensors, read by the kernels only, in stream order (which clamp them
  // into the tensors): here their dtype, device and shape are checked, never
  // their values.
  void use_sequences(FusedParams& f, const Problem& p, const Inputs& in, RunContext& ctx) const {
    if (p.lengths_on_device) {
      f.cu_seqlens_q = device_cu_seqlens_of(in.cu_seqlens_q, "cu_seqlens_q", p);
      f.cu_seqlens_k = device_cu_seqlens_of(in.cu_seqlens_k, "cu_seqlens_k", p);
      f.input_errors = device_input_errors();
      f.q_batch_stride = f.k_batch_stride = f.v_batch_stride = f.o_batch_stride = 0;
    } else if (p.varlen()) {
      const PackedLengths cu = device_cu_seqlens(p, static_cast<cudaStream_t>(ctx.stream));
      f.cu_seqlens_q = cu.cu_q;
      f.cu_seqlens_k = cu.cu_k;
      f.q_batch_stride = f.k_batch_stride = f.v_batch_stride = f.o_batch_stride = 0;
    }
    f.q_rows = device_rows(in.q_rows, "q_rows", p, /*ends_only=*/false);
    f.kv_rows = device_rows(in.kv_rows, "kv_rows", p, /*ends_only=*/true);
    if (f.kv_rows != nullptr) f.kv_rows_width = static_cast<int>(in.kv_rows.size(3));
    // The checking mode (attnprof/check_inputs.h): the (begin, end) pairs
    // read in the caller's stream order (a wait) and checked as the CPU
    // checks them (core/rows.h), a bad entry refused in one line naming it.
    // (A paged call's key ends are checked by its binding.)
    const bool pairs = f.q_rows != nullptr || (f.kv_rows != nullptr && f.kv_rows_width == 2);
    if (pairs && checking_inputs()) {
      const auto stream = static_cast<cudaStream_t>(ctx.stream);
      Inputs host;
      if (f.q_rows != nullptr) host.q_rows = download_on(in.q_rows, stream);
      if (f.kv_rows != nullptr && f.kv_rows_width == 2) host.kv_rows = download_on(in.kv_rows, stream);
      sequence_rows(p, host);
    }
  }

  // A caller's cumulative lengths (Inputs::cu_seqlens_q or _k) as the kernels
  // read them: contiguous int32 [1, 1, 1, batch + 1] on the GPU.
  const std::int32_t* device_cu_seqlens_of(const Tensor& cu, const char* what, const Problem& p) const {
    if (!cu.defined() || cu.dtype() != DType::I32 || cu.device() != Device::Cuda || cu.numel() != p.batch + 1 ||
        (p.batch > 0 && cu.stride(3) != 1)) {
      fail(ErrorKind::InvalidArgument, std::string(name_) + ": " + what + " must be contiguous int32 [" +
                                           std::to_string(p.batch + 1) + "] on the GPU; got " +
                                           (cu.defined() ? cu.describe() : std::string("none")));
    }
    return cu.data_as<std::int32_t>();
  }

  // A dense batch's rows (Inputs::q_rows or kv_rows) as the kernels read
  // them, int32 (begin, end) pairs, or for kv_rows also key ends alone
  // ([1, 1, B, 1], a paged call's seq_lens: begin 0); null when not given.
  const std::int32_t* device_rows(const Tensor& rows, const char* what, const Problem& p, bool ends_only) const {
    if (!rows.defined()) return nullptr;
    const std::int64_t width = rows.size(3);
    if (rows.dtype() != DType::I32 || rows.device() != Device::Cuda || rows.size(0) != 1 || rows.size(1) != 1 ||
        rows.size(2) != p.batch || !(width == 2 || (ends_only && width == 1)) || (width > 1 && rows.stride(3) != 1) ||
        (p.batch > 1 && rows.stride(2) != width)) {
      fail(ErrorKind::InvalidArgument, std::string(name_) + ": " + what + " must be contiguous int32 [1, 1, " +
                                           std::to_string(p.batch) + (ends_only ? ", 2 or 1]" : ", 2]") +
                                           " on the GPU; got " + rows.describe());
    }
    return rows.data_as<std::int32_t>();
  }

  // The tensors of a forward into f (checking their head_dim is contiguous):
  // K and V from their pages with a paged cache (the logical K and V, which a
  // caller's cache does not have, are not read).
  void fill_forward(FusedParams& f, const Inputs& in, const Tensor& out, float* lse, bool paged = false) const {
    const Tensor& k = paged ? in.k_pages : in.k;
    const Tensor& v = paged ? in.v_pages : in.v;
    for (const Tensor* t : std::initializer_list<const Tensor*>{&in.q, &k, &v, &out}) {
      if (t->stride(3) != 1) {
        fail(ErrorKind::Unsupported, std::string(name_) + " needs a contiguous head_dim; got " + t->describe());
      }
    }
    f.q = in.q.data();
    f.k = k.data();
    f.v = v.data();
    f.o = out.data();
    set_strides(in.q, f.q_batch_stride, f.q_head_stride, f.q_row_stride);
    set_strides(k, f.k_batch_stride, f.k_head_stride, f.k_row_stride);
    set_strides(v, f.v_batch_stride, f.v_head_stride, f.v_row_stride);
    set_strides(out, f.o_batch_stride, f.o_head_stride, f.o_row_stride);
    f.lse = lse;
  }

  // p.shape_key() for a call's RecordFunction, built again only when the
  // shape changes: four numbers formatted and joined (past 15 characters, a
  // heap allocation) on every call otherwise. Keyed by the fields shape_key
  // reads; per thread, and read by RecordFunction before this thread's next call.
  static const std::string& shape_key_of(const Problem& p) {
    struct Last {
      std::int64_t batch = -1, heads = -1, seq = -1, head_dim = -1;
      std::string key;
    };
    thread_local Last last;
    if (p.batch != last.batch || p.heads != last.heads || p.seq != last.seq || p.head_dim != last.head_dim) {
      last.key = p.shape_key();
      last.batch = p.batch;
      last.heads = p.heads;
      last.seq = p.seq;
      last.head_dim = p.head_dim;
    }
    return last.key;
  }

  static void set_strides(const Tensor& t, std::int64_t& b, std::int64_t& h, std::int64_t& r) {
    b = t.stride(0);
    h = t.stride(1);
    r = t.stride(2);
  }

  static void set_contiguous(std::int64_t& b, std::int64_t& h, std::int64_t& r, std::int64_t heads, std::int64_t rows,
                             std::int64_t dim) {
    r = dim;
    h = rows * dim;
    b = heads * rows * dim;
  }

  std::string_view name_, op_;
  std::string bwd_op_;
  bool flash_;
  Launch launch_;
  Story story_;
};

}  // namespace attnprof::cuda
