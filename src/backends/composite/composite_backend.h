// What the composite backends share: the Ops object they run on, the cached
// structural mask, and the expectation derived by running the forward against
// the plan (plan.h) instead of being written by hand.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "attnprof/aliasing.h"
#include "attnprof/backend.h"
#include "backends/ops.h"

namespace attnprof::composite {

// The structural mask of the last problem, built once and kept, like the
// registered buffer of the reference module: building it is not per-call work.
// A packed batch's sequences each have their own (seq, kv_seq): the masks of
// the last problem's shapes are all kept, up to kShapes of them.
class MaskCache {
 public:
  // The whole problem a call is for: another one frees the masks kept.
  void use_for(const Problem& whole);
  // The mask of p (one sequence of the problem, or all of a dense one).
  Tensor get(Ops& ops, const Problem& p, RunContext& ctx);

 private:
  static constexpr std::size_t kShapes = 64;
  std::mutex mutex_;
  std::string owner_;
  std::map<std::string, Tensor> masks_;
  const Allocator* allocator_ = nullptr;
};

// The backward, for every composite: what autograd runs on the forward's
// decomposition, op for op, from the probabilities the training forward keeps
// (the one saved tensor; Saved::probs, [B, H, S, Skv], in the dtype the
// backend computes in). For O = P V, P = softmax(S), S = scale Q K^T masked:
//   dP = dO V^T, dV = P^T dO        (matmul's backward; dV summed over a group)
//   dS = P * (dP - rowsum(dP * P))  (_softmax_backward_data)
//   the mask's backward             (masked_fill: zero where masked; add: none)
//   dS *= scale                     (mul's backward)
//   dQ = dS K, dK = dS^T Q          (matmul's backward; dK summed over a group)
// Each backend writes its own in run_backward(), with its own precision.
//
// A packed batch (Problem::seq_lens) runs as a loop over its sequences, each
// the dense batch-1 problem Problem::sequence(b) on views of its rows (as a
// PyTorch user would loop over documents): no [S, Skv] of padding is ever
// made, the ops repeat once per sequence, and a training forward saves each
// sequence's tensors in Saved::sequences. A sequence without queries is
// skipped (its keys' dK and dV are zeros: mul by 0, to); one without keys
// gets zero rows the same way (every key of its rows is masked).
class CompositeBackend : public Backend {
 public:
  explicit CompositeBackend(std::unique_ptr<Ops> ops) : ops_(std::move(ops)) {}

  Device device() const override { return ops_->device(); }

  // The ops a steady-state call of p's pass makes, in order, and what they
  // issue on this device: a warmup pass against the plan fills the caches
  // (and, for a backward, makes the forward's saved probabilities), the
  // second pass is recorded (as the profiler's schedule warms up before it
  // records). Forward: the forward; Backward: the backward; Train: both.
  Expectation expectation(const Problem& p) const override;
  // Bytes the same planned pass allocates beyond its inputs and outputs (at
  // its peak, the cached mask, the saved probabilities and the library's
  // workspace included): what workspace_bytes() estimates, for the tests to
  // hold it to.
  std::size_t planned_workspace_bytes(const Problem& p) const;

  void forward(const Problem& p, const Inputs& in, Tensor& out, RunContext& ctx) override {
    require_output_apart(in, out, name());
    run_forward(*ops_, p, in, out, ctx, mask_, nullptr);
  }

  bool has_backward() const override { return true; }
  void forward_train(const Problem& p, const Inputs& in, Tensor& out, Saved& saved, RunContext& ctx) override;
  void backward(const Problem& p, const Inputs& in, const Tensor& out, const Tensor& dout, const Saved& saved,
                Gradients& grads, RunContext& ctx) override;

 protected:
  // The forward, written once over the ops; a training forward also hands
  // back the probabilities (and with a soft cap tanh's output) in *saved.
  virtual void run(Ops& ops, const Problem& p, const Inputs& in, Tensor& out, RunContext& ctx, MaskCache& mask,
                   Saved* saved) const = 0;
  // The backward, written once over the ops, from what the forward saved
  // into the caller's gradients.
  virtual void run_backward(Ops& ops, const Problem& p, const Inputs& in, const Tensor& dout, const Saved& saved,
                            Gradients& grads, RunContext& ctx, MaskCache& mask) const = 0;

  // Soft-capping, as Gemma-2's modelling code writes it: attn / c (a mul by
  // 1 / c), tanh, * c; a training forward keeps tanh's output in *saved.
  // Nothing when p.softcap is 0.
  static void soft_cap(Ops& ops, const Problem& p, Tensor& attn, RunContext& ctx, Saved* saved);
  // Its backward on dS: dS * (1 - t^2) from the saved t (the muls' c and
  // 1 / c cancel). Nothing when p.softcap is 0.
  static void soft_cap_backward(Ops& ops, const Problem& p, Tensor& ds, const Saved& saved, RunContext& ctx);
  // What a soft cap adds to the eligibility's story (empty without one).
  static std::string softcap_story(const Problem& p);

  const Ops& ops() const { return *ops_; }
  // Why a paged KV cache is refused here: empty when it is contiguous, or
  // paged in a forward, which gathers it on either device.
  std::string paged_refusal(const Problem& p) const;
  // What a paged cache adds to the eligibility's story (empty when contiguous).
  static std::string paged_story(const Problem& p);
  // Why a problem for another device is not eligible here (empty when it is ours).
  std::string wrong_device(const Problem& p) const;
  // What a backward or training pass adds to the eligibility's story (empty
  // for a forward): the probabilities it saves, in `saved`.
  static std::string backward_story(const Problem& p, DType saved);
  // p's score tensor [B, H, S, Skv] in elements: the saved probabilities and
  // every temporary the backward makes of that shape.
  static std::size_t score_elements(const Problem& p);
  // A packed batch's workspace: its sequences' (each as its own problem)
  // summed, an upper bound (their saved tensors and masks stay while the
  // others run; their temporaries do not).
  std::size_t packed_workspace_bytes(const Problem& p) const;
  // What a packed batch adds to the eligibility's story (empty when dense).
  static std::string packed_story(const Problem& p);

  // ---- FP8 semantics (dtype fp8) ----
  // p in FP32: the problem an FP8 forward computes once its inputs are dequantized.
  static Problem fp32_twin(const Problem& p);
  // An FP8 problem's workspace: its FP32 twin's, the FP32 copies of Q, K and
  // V (of the pages, with a paged cache) and the FP32 output before its cast.
  std::size_t fp8_workspace_bytes(const Problem& p) const;
  // What FP8 inputs add to the eligibility's story (empty for other dtypes).
  static std::string fp8_story(const Problem& p);
  // The dtype the products run in: p's, FP32 for fp8 inputs.
  static DType compute_dtype(const Problem& p) { return is_fp8(p.dtype) ? DType::F32 : p.dtype; }

 private:
  struct Planned {
    Expectation expectation;
    std::size_t workspace_bytes = 0;
  };
  Planned plan(const Problem& p) const;
  // run(), after a paged cache's K and V are gathered into contiguous
  // [B, Hkv, Skv, D] tensors (gather_pages, one per tensor and call). FP8
  // inputs go through run_fp8() first.
  void run_forward(Ops& ops, const Problem& p, const Inputs& in, Tensor& out, RunContext& ctx, MaskCache& mask,
                   Saved* saved) const;
  // FP8 semantics, the composites' reference of what quantization costs: q,
  // k and v (a paged cache's pages in place of the logical K and V) each
  // dequantized to FP32 (dequantize: e4m3 x descale), the forward run exactly
  // as p's FP32 twin runs it, and O cast to bf16 into `out` (to).
  void run_fp8(Ops& ops, const Problem& p, const Inputs& in, Tensor& out, RunContext& ctx, MaskCache& mask,
               Saved* saved) const;
  // run_backward(), or its loop over a packed batch's sequences.
  void run_backward_packed(Ops& ops, const Problem& p, const Inputs& in, const Tensor& dout, const Saved& saved,
                           Gradients& grads, RunContext& ctx, MaskCache& mask) const;

  std::unique_ptr<Ops> ops_;
  MaskCache mask_;
};

}  // namespace attnprof::composite
