// naive and naive_inplace: the textbook attention written op by op,
//   attn = (q @ k^T) * scale; <soft cap it>; attn = <mask it>; attn = softmax(attn); out = attn @ v
// over a materialised [S, Skv] score tensor, with the products in the input
// dtype. The two differ only in how they mask, which is the whole point of
// having both:
//  - naive: attn.masked_fill(~mask, -inf) returns a new tensor, so PyTorch
//    clones the scores (a device-to-device cudaMemcpyAsync of a whole
//    [B, H, S, Skv] buffer on a GPU) and fills the clone. Nothing in the source
//    says "copy"; the trace does. Causal on a GPU: 2 GEMMs, the scale, the
//    memcpy, the fill and the softmax = 6 device activities.
//  - naive_inplace: attn.masked_fill_(~mask, -inf) drops the clone, and with it
//    the copy and one score buffer: 5 device activities.
// A bias is added with add (naive) or add_ (naive_inplace). The structural
// mask is built once per problem, like a registered buffer. FP8 inputs are
// dequantized to FP32 first and the products run in FP32, O cast to bf16 at
// the end (CompositeBackend::run_fp8).
//
// The backward is autograd's on the same ops, in the input dtype, from the
// saved probabilities (the softmax's output, the one tensor kept):
//   matmul (dP = dO V^T), matmul (dV = P^T dO), _softmax_backward_data,
//   the fill's backward (dS.masked_fill(~mask, 0): naive out of place with its
//   hidden copy, as autograd's MaskedFillBackward is; naive_inplace in place),
//   mul (the scale), matmul (dQ = dS K), matmul (dK = dS^T Q).
// Causal on a GPU: 4 GEMMs, the softmax's backward, the memcpy, the fill and
// the scale = 8 device activities (naive_inplace 7).
// A bias's add has nothing to do backward. A fully masked row's NaN
// probabilities make its dS NaN until the fill's backward zeroes it (every key
// of the row is masked), so its dQ and its share of dK are zero; but dV =
// P^T dO sums the NaN row into every key's gradient, as autograd does on the
// textbook decomposition.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "backends/composite/composite.h"
#include "backends/composite/composite_backend.h"

namespace attnprof::composite {
namespace {

class Naive final : public CompositeBackend {
 public:
  Naive(std::unique_ptr<Ops> ops, bool inplace) : CompositeBackend(std::move(ops)), inplace_(inplace) {}

  std::string_view name() const override { return inplace_ ? "naive_inplace" : "naive"; }

  Eligibility eligibility(const Problem& p) const override {
    if (std::string why = wrong_device(p); !why.empty()) return {false, why};
    if (std::string why = paged_refusal(p); !why.empty()) return {false, why};
    return {true, ops().describe_gemm(compute_dtype(p)) + ", " + mask_story(p.mask) +
                      ", over materialised [S, Skv] scores" + fp8_story(p) + softcap_story(p) + paged_story(p) +
                      packed_story(p) + backward_story(p, p.dtype)};
  }

  std::size_t workspace_bytes(const Problem& p) const override {
    if (is_fp8(p.dtype)) return fp8_workspace_bytes(p);
    if (p.varlen()) return packed_workspace_bytes(p);
    const std::size_t scores = score_elements(p) * element_size(p.dtype);
    const auto mask = static_cast<std::size_t>(p.seq * p.kv_seq);  // the cached bool mask
    // Two score buffers are live at a time (each op reads one, writes one);
    // naive's out-of-place fill allocates a third over the forward, and
    // budgeting it keeps the refuse-before-allocating check on the safe side
    // of allocator rounding. The backward holds the saved probabilities and
    // two score-sized gradients at a time (dP and dS, dS and its masked or
    // scaled copy); a training step's forward peaks lower.
    // A soft cap adds its three score buffers' two at a time, and the saved
    // tanh with tanh_backward's output to the backward.
    const std::size_t cap = p.softcap > 0 ? 2 * scores : 0;
    const std::size_t forward = (inplace_ ? 2 : 3) * scores + cap, backward = 3 * scores + cap;
    const std::size_t pass = p.pass == Pass::Forward ? forward : std::max(forward, backward);
    // A paged cache's K and V gathered into contiguous copies.
    const std::size_t gathered = p.kv_cache == KvCache::Paged ? 2 * p.kv_bytes() : 0;
    return pass + mask + gathered + ops().library_workspace_bytes();
  }

  Traits traits() const override {
    // Soft caps (the ops' tanh) and packed batches (a loop over the
    // sequences, CompositeBackend::run_forward) on every device.
    return {.nan_on_fully_masked = true,
            .memory_baseline = !inplace_,
            .softcap = true,
            .varlen = true,
            .fp8 = true,
            .paged = true};
  }

 protected:
  void run(Ops& ops, const Problem& p, const Inputs& in, Tensor& out, RunContext& ctx, MaskCache& mask,
           Saved* saved) const override {
    Tensor attn;
    {
      // The product is a temporary PyTorch frees once the scaled copy exists.
      const Tensor scores = ops.matmul_qk(in.q, in.k, ctx);
      attn = ops.mul(scores, static_cast<float>(p.softmax_scale()), ctx);
    }
    soft_cap(ops, p, attn, ctx, saved);
    switch (p.mask) {
      case MaskKind::None:
        break;
      case MaskKind::Bias:
        if (inplace_) {
          ops.add_(attn, in.bias, ctx);
        } else {
          attn = ops.add(attn, in.bias, ctx);
        }
        break;
      default:
        fill(ops, attn, keep(ops, p, in, ctx, mask), kNegInf, ctx);
        break;
    }
    const Tensor probs = ops.softmax(attn, ctx);
    attn = Tensor();  // freed here, as the reference's reassignment frees it
    ops.matmul_pv(probs, in.v, out, ctx);
    if (saved != nullptr) saved->probs = probs;
  }

  void run_backward(Ops& ops, const Problem& p, const Inputs& in, const Tensor& dout, const Saved& saved,
                    Gradients& grads, RunContext& ctx, MaskCache& mask) const override {
    const Tensor& probs = saved.probs;
    Tensor ds;
    {
      const Tensor dp = ops.matmul_qk(dout, in.v, ctx);  // dO V^T
      ops.matmul_tn(probs, dout, grads.dv, ctx);
      ds = ops.softmax_backward(dp, probs, ctx);
    }
    if (p.mask != MaskKind::None && p.mask != MaskKind::Bias) fill(ops, ds, keep(ops, p, in, ctx, mask), 0.f, ctx);
    soft_cap_backward(ops, p, ds, saved, ctx);
    ds = ops.mul(ds, static_cast<float>(p.softmax_scale()), ctx);
    ops.matmul_pv(ds, in.k, grads.dq, ctx);
    ops.matmul_tn(ds, in.q, grads.dk, ctx);
  }

 private:
  static constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  // The keep mask of a Boolean or structural problem: the input's, or the
  // cached structural one.
  static Tensor keep(Ops& ops, const Problem& p, const Inputs& in, RunContext& ctx, MaskCache& mask) {
    return p.mask == MaskKind::Boolean ? in.mask : mask.get(ops, p, ctx);
  }

  // x.masked_fill(~keep, value) (-inf forward, 0 backward): the out-of-place
  // fill keeps its input alive until the copy is filled, two score buffers at once.
  void fill(Ops& ops, Tensor& x, const Tensor& keep, float value, RunContext& ctx) const {
    if (inplace_) {
      ops.masked_fill_(x, keep, value, ctx);
    } else {
      x = ops.masked_fill(x, keep, value, ctx);
    }
  }

  std::string mask_story(MaskKind m) const {
    if (m == MaskKind::None) return "no mask";
    if (m == MaskKind::Bias) return inplace_ ? "bias added in place (add_)" : "bias added out of place (add)";
    return inplace_ ? "in-place masked fill (no copy)" : "out-of-place masked fill (a hidden copy of the scores)";
  }

  bool inplace_;
};

}  // namespace

std::unique_ptr<Backend> make_naive(std::unique_ptr<Ops> ops) { return std::make_unique<Naive>(std::move(ops), false); }

std::unique_ptr<Backend> make_naive_inplace(std::unique_ptr<Ops> ops) {
  return std::make_unique<Naive>(std::move(ops), true);
}

}  // namespace attnprof::composite
