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
#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "backends/composite/composite.h"
#include "backends/composite/composite_backend.h"

namespace attnprof::composite {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

bool structural(MaskKind m) {
  return m == MaskKind::Causal || m == MaskKind::CausalBottomRight || m == MaskKind::SlidingWindow;
}

class Math final : public CompositeBackend {
 public:
  using CompositeBackend::CompositeBackend;

  std::string_view name() const override { return "math"; }

  Eligibility eligibility(const Problem& p) const override {
    if (std::string why = wrong_device(p); !why.empty()) return {false, why};
    std::string what = is_16bit(p.dtype) ? "upcasts to FP32, " : "";
    what += "FP32 products (" + ops().describe_gemm(DType::F32) + ")";
    if (structural(p.mask)) what += ", mask rebuilt every call";
    return {true, what + ", NaN-safe softmax"};
  }

  std::size_t workspace_bytes(const Problem& p) const override {
    const auto n = [](std::int64_t x) { return static_cast<std::size_t>(x); };
    const std::size_t scores = n(p.batch * p.heads * p.seq * p.kv_seq) * 4;
    const std::size_t q = n(p.batch * p.heads * p.seq * p.head_dim) * 4;
    const std::size_t kv = n(p.batch * p.kv_heads * p.kv_seq * p.head_dim) * 4;
    const std::size_t mask = n(p.seq * p.kv_seq) * (4 + 2);  // the FP32 additive mask and its bool parents
    // At the safe softmax: the scores, the softmax, the result (and briefly a
    // bool [B, H, S, Skv]); before it, Q and K each with a scaled copy.
    return 3 * scores + scores / 4 + 2 * q + 2 * kv + kv + q + mask + ops().library_workspace_bytes();
  }

  Traits traits() const override { return {.reference_precision = true}; }

 protected:
  void run(Ops& ops, const Problem& p, const Inputs& in, Tensor& out, RunContext& ctx, MaskCache&) const override {
    const bool upcast = is_16bit(p.dtype);
    Tensor mask;  // additive: 0 or -inf, or the bias
    if (p.mask == MaskKind::Boolean) mask = ops.where(in.mask, 0.f, kNegInf, ctx);
    Tensor q32 = upcast ? ops.to(in.q, DType::F32, ctx) : in.q;
    Tensor k32 = upcast ? ops.to(in.k, DType::F32, ctx) : in.k;
    const Tensor v32 = upcast ? ops.to(in.v, DType::F32, ctx) : in.v;
    // Half the scale on each operand keeps q.k in range before the product.
    const float root = static_cast<float>(std::sqrt(p.softmax_scale()));
    Tensor q = ops.mul(q32, root, ctx);
    q32 = Tensor();
    if (structural(p.mask)) mask = rebuilt_mask(ops, p, ctx);
    if (p.mask == MaskKind::Bias) mask = in.bias;
    Tensor attn;
    {
      const Tensor k = ops.mul(k32, root, ctx);
      k32 = Tensor();
      attn = ops.matmul_qk(q, k, ctx);
    }
    q = Tensor();
    if (mask.defined()) ops.add_(attn, mask, ctx);
    mask = Tensor();
    attn = ops.safe_softmax(attn, ctx);
    if (upcast) {
      const Tensor o = ops.matmul_pv(attn, v32, ctx);
      attn = Tensor();
      ops.to_into(o, out, ctx);  // the downcast lands in the caller's (possibly strided) output
    } else {
      ops.matmul_pv(attn, v32, out, ctx);
    }
  }

 private:
  // The FP32 additive form of a structural mask, rebuilt every call as the
  // math path builds is_causal's: ones, tril (at the bottom-right diagonal for
  // the aligned kinds), triu for a window's lower edge, where.
  static Tensor rebuilt_mask(Ops& ops, const Problem& p, RunContext& ctx) {
    const std::int64_t off = p.mask == MaskKind::Causal ? 0 : p.diagonal_offset();
    Tensor keep = ops.tril(ops.ones({1, 1, p.seq, p.kv_seq}, ctx), off, ctx);
    if (p.mask == MaskKind::SlidingWindow) keep = ops.triu(keep, off - p.window + 1, ctx);
    return ops.where(keep, 0.f, kNegInf, ctx);
  }
};

}  // namespace

std::unique_ptr<Backend> make_math(std::unique_ptr<Ops> ops) { return std::make_unique<Math>(std::move(ops)); }

}  // namespace attnprof::composite
