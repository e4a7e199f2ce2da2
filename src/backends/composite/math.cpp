// math: PyTorch's careful reference path (_scaled_dot_product_attention_math),
// op for op, and with it the costs the reference study found in its trace:
//  - Q, K, V upcast to FP32 and both products run in FP32 (on a GPU as SGEMM
//    on CUDA cores, not on tensor cores: TF32 stays off, as PyTorch's default);
//  - the scale goes half on Q and half on K (sqrt(scale) each, two passes);
//  - a causal mask is rebuilt on every call (ones, tril, where) and added in
//    place; a Boolean mask is made additive (where) before the path runs, as
//    scaled_dot_product_attention's convert_boolean_attn_mask does; a bias is
//    added as given;
//  - the NaN-safe softmax zeros fully masked rows at the price of three extra
//    passes over the scores on a GPU;
//  - the FP32 result is cast back to the input dtype.
// Causal bf16: to, to, to, mul, ones, tril, where, mul, matmul, add_,
// _safe_softmax, matmul, to; on a GPU 16 device activities (_safe_softmax is 4).
// FP8 inputs (CompositeBackend::run_fp8): dequantize q, k and v, the FP32
// path as above without its upcasts, then to (the bf16 output).
//
// The backward runs in FP32 from the saved FP32 probabilities (what the math
// path's autograd keeps of its _safe_softmax), as autograd would:
//   to (dO upcast), to (V), matmul (dP = dO V^T), matmul (dV = P^T dO), to (dV
//   cast back), _safe_softmax's backward (_softmax_backward_data), to (K),
//   matmul (dQ = dS K), mul, to (dQ), to (Q), matmul (dK = dS^T Q), mul, to (dK).
// bf16 on a GPU: 14 device activities (FP32 inputs skip the four upcasts and
// dV's downcast: 9).
// The mask has no backward here: add_'s gradient passes through, and the
// saved probabilities are already zero wherever it masks. A fully masked row's
// probabilities are all zeros, so its dS, its dQ and its share of dK and dV
// are zeros, never NaN. Autograd would also save the scaled FP32 Q and K;
// keeping only the probabilities, the backward upcasts Q and K again and
// applies the two sqrt(scale) factors as one scale on each product
// (d(q * r) = r dq_s, with dq_s = dS (r k)).
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "backends/composite/composite.h"
#include "backends/composite/composite_backend.h"
#include "core/mask_geometry.h"

namespace attnprof::composite {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

class Math final : public CompositeBackend {
 public:
  using CompositeBackend::CompositeBackend;

  std::string_view name() const override { return "math"; }

  Eligibility eligibility(const Problem& p) const override {
    if (std::string why = wrong_device(p); !why.empty()) return {false, why};
    if (std::string why = paged_refusal(p); !why.empty()) return {false, why};
    std::string what = is_16bit(p.dtype) ? "upcasts to FP32, " : "";
    what += "FP32 products (" + ops().describe_gemm(DType::F32) + ")";
    if (geometry::banded(p.mask)) what += ", mask rebuilt every call";
    return {true, what + ", NaN-safe softmax" + fp8_story(p) + softcap_story(p) + paged_story(p) + packed_story(p) +
                      backward_story(p, DType::F32)};
  }

  std::size_t workspace_bytes(const Problem& p) const override {
    if (is_fp8(p.dtype)) return fp8_workspace_bytes(p);
    if (p.varlen()) return packed_workspace_bytes(p);
    const auto n = [](std::int64_t x) { return static_cast<std::size_t>(x); };
    const std::size_t scores = score_elements(p) * 4;
    const std::size_t q = n(p.batch * p.heads * p.seq * p.head_dim) * 4;
    const std::size_t kv = n(p.batch * p.kv_heads * p.kv_seq * p.head_dim) * 4;
    const std::size_t mask = n(p.seq * p.kv_seq) * (4 + 2);  // the FP32 additive mask and its bool parents
    // At the safe softmax: the scores, the softmax, the result (and briefly a
    // bool [B, H, S, Skv]); before it, Q and K each with a scaled copy.
    const std::size_t forward = 3 * scores + scores / 4 + 2 * q + 2 * kv + kv + q + mask;
    // At the softmax's backward: the saved probabilities, dP and dS; around
    // the products, two of those and FP32 copies of dO or Q, of K or V, and
    // of the product and its scaled copy.
    const std::size_t backward = 3 * scores + 2 * q + 2 * kv;
    // A soft cap: its score buffers two at a time forward, the saved tanh and
    // tanh_backward's output backward.
    const std::size_t cap = p.softcap > 0 ? 2 * scores : 0;
    const std::size_t pass = (p.pass == Pass::Forward ? forward : std::max(forward, backward)) + cap;
    // A paged cache's K and V gathered into contiguous copies.
    const std::size_t gathered = p.kv_cache == KvCache::Paged ? 2 * p.kv_bytes() : 0;
    return pass + gathered + ops().library_workspace_bytes();
  }

  Traits traits() const override {
    // Soft caps, packed batches, and FP8 (dequantize, then the FP32 path: the
    // FP8 tolerance's yardstick) on every device.
    return {.reference_precision = true, .softcap = true, .varlen = true, .fp8 = true, .paged = true};
  }

 protected:
  void run(Ops& ops, const Problem& p, const Inputs& in, Tensor& out, RunContext& ctx, MaskCache&,
           Saved* saved) const override {
    const bool upcast = is_16bit(p.dtype);
    Tensor mask;  // additive: 0 or -inf, or the bias
    if (p.mask == MaskKind::Boolean) mask = ops.where(in.mask, 0.f, kNegInf, ctx);
    Tensor q32 = upcast ? ops.to(in.q, DType::F32, ctx) : in.q;
    Tensor k32 = upcast ? ops.to(in.k, DType::F32, ctx) : in.k;
    const Tensor v32 = upcast ? ops.to(in.v, DType::F32, ctx) : in.v;
    // Half the scale on each operand keeps q.k in range before the product;
    // a negative scale's sign goes on q (the root of its magnitude on both),
    // where PyTorch's sqrt of the scale itself would make every score NaN.
    const double scale = p.softmax_scale();
    const float root = static_cast<float>(std::sqrt(std::abs(scale)));
    Tensor q = ops.mul(q32, std::signbit(scale) ? -root : root, ctx);
    q32 = Tensor();
    if (geometry::banded(p.mask)) mask = rebuilt_mask(ops, p, ctx);
    if (p.mask == MaskKind::Bias) mask = in.bias;
    Tensor attn;
    {
      const Tensor k = ops.mul(k32, root, ctx);
      k32 = Tensor();
      attn = ops.matmul_qk(q, k, ctx);
    }
    q = Tensor();
    soft_cap(ops, p, attn, ctx, saved);
    if (mask.defined()) ops.add_(attn, mask, ctx);
    mask = Tensor();
    attn = ops.safe_softmax(attn, ctx);
    if (saved != nullptr) saved->probs = attn;
    if (upcast) {
      const Tensor o = ops.matmul_pv(attn, v32, ctx);
      attn = Tensor();
      ops.to_into(o, out, ctx);  // the downcast lands in the caller's (possibly strided) output
    } else {
      ops.matmul_pv(attn, v32, out, ctx);
    }
  }

  void run_backward(Ops& ops, const Problem& p, const Inputs& in, const Tensor& dout, const Saved& saved,
                    Gradients& grads, RunContext& ctx, MaskCache&) const override {
    const Tensor& probs = saved.probs;
    const bool upcast = is_16bit(p.dtype);
    const auto fp32 = [&](const Tensor& x) { return upcast ? ops.to(x, DType::F32, ctx) : x; };
    const auto scale = static_cast<float>(p.softmax_scale());
    Tensor ds;
    {
      const Tensor dout32 = fp32(dout), v32 = fp32(in.v);
      const Tensor dp = ops.matmul_qk(dout32, v32, ctx);  // dO V^T
      if (upcast) {
        Tensor dv = Tensor::empty(grads.dv.sizes(), DType::F32, ctx.allocator);
        ops.matmul_tn(probs, dout32, dv, ctx);
        ops.to_into(dv, grads.dv, ctx);
      } else {
        ops.matmul_tn(probs, dout32, grads.dv, ctx);
      }
      ds = ops.softmax_backward(dp, probs, ctx);
    }
    soft_cap_backward(ops, p, ds, saved, ctx);
    {
      const Tensor k32 = fp32(in.k);
      ops.to_into(ops.mul(ops.matmul_pv(ds, k32, ctx), scale, ctx), grads.dq, ctx);
    }
    const Tensor q32 = fp32(in.q);
    Tensor dk = Tensor::empty(grads.dk.sizes(), DType::F32, ctx.allocator);
    ops.matmul_tn(ds, q32, dk, ctx);
    ops.to_into(ops.mul(dk, scale, ctx), grads.dk, ctx);
  }

 private:
  // The FP32 additive form of a banded mask, rebuilt every call as the math
  // path builds is_causal's: ones, tril at the band's upper bound (the
  // top-left or bottom-right diagonal), triu at a window's lower bound, where.
  static Tensor rebuilt_mask(Ops& ops, const Problem& p, RunContext& ctx) {
    const auto band = geometry::band_of(p.mask, p.window, p.seq, p.kv_seq);
    Tensor keep = ops.tril(ops.ones({1, 1, p.seq, p.kv_seq}, ctx), band.hi, ctx);
    if (band.has_lo) keep = ops.triu(keep, band.lo(), ctx);
    return ops.where(keep, 0.f, kNegInf, ctx);
  }
};

}  // namespace

std::unique_ptr<Backend> make_math(std::unique_ptr<Ops> ops) { return std::make_unique<Math>(std::move(ops)); }

}  // namespace attnprof::composite
