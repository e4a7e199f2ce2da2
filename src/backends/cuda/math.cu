// math: PyTorch's careful reference path (_scaled_dot_product_attention_math),
// op for op, and with it the costs the reference study found in its trace:
//  - Q, K, V upcast to FP32 and both products run as SGEMM on CUDA cores, not
//    on tensor cores (TF32 stays off, as PyTorch's default);
//  - the mask is rebuilt on every call (ones, tril, where) and added;
//  - the scale goes half on Q and half on K (sqrt(scale) each, two kernels);
//  - the NaN-safe softmax zeros fully masked rows at the price of three extra
//    passes over the scores;
//  - the FP32 result is cast back to the input dtype.
// Causal bf16 per forward: 3 to + mul + ones, tril, where + mul + SGEMM + add_ +
// 4 (_safe_softmax) + SGEMM + to = 16 device activities.
#include <cmath>
#include <memory>
#include <string>

#include "attnprof/error.h"
#include "backends/cuda/cuda_backends.h"
#include "backends/cuda/ops.h"

namespace attnprof::cuda {
namespace {

class Math final : public Backend {
 public:
  std::string_view name() const override { return "math"; }
  Device device() const override { return Device::Cuda; }

  Eligibility eligibility(const Problem& p) const override {
    if (p.device != Device::Cuda) return {false, "runs on a CUDA device only"};
    std::string why = is_16bit(p.dtype) ? "upcasts to FP32, " : "";
    why += "FP32 SGEMMs on CUDA cores (TF32 off)";
    if (p.mask != MaskKind::None && p.mask != MaskKind::Bias) why += ", mask rebuilt every call";
    return {true, why + ", NaN-safe softmax"};
  }

  std::size_t workspace_bytes(const Problem& p) const override {
    const auto n = [](std::int64_t x) { return static_cast<std::size_t>(x); };
    const std::size_t scores = n(p.batch * p.heads * p.seq * p.kv_seq) * 4;
    const std::size_t q = n(p.batch * p.heads * p.seq * p.head_dim) * 4;
    const std::size_t kv = n(p.batch * p.kv_heads * p.kv_seq * p.head_dim) * 4;
    const std::size_t mask = n(p.seq * p.kv_seq) * (4 + 2);  // the FP32 additive mask and its bool parents
    // At the safe softmax: the scores, the softmax, the where output (and
    // briefly a bool [B, H, S, Skv]); before it, Q and K each with a scaled copy.
    return 3 * scores + scores / 4 + 2 * q + 2 * kv + kv + q + mask + ops::blas_workspace_bytes();
  }

  Traits traits() const override { return {.reference_precision = true}; }

  Expectation expectation(const Problem& p) const override {
    Expectation e;
    const bool upcast = is_16bit(p.dtype);
    auto op = [&](const char* name, int activities) {
      e.cpu_ops.emplace_back(name);
      e.device_activities += activities;
    };
    e.device_activities = 0;
    if (upcast) op("to", 1), op("to", 1), op("to", 1);
    op("mul", 1);
    switch (p.mask) {
      case MaskKind::Causal:
      case MaskKind::CausalBottomRight:
        op("ones", 1), op("tril", 1), op("where", 1);
        break;
      case MaskKind::SlidingWindow:
        op("ones", 1), op("tril", 1), op("triu", 1), op("where", 1);
        break;
      case MaskKind::Boolean:
        op("where", 1);
        break;
      default:
        break;
    }
    op("mul", 1);
    op("matmul", 1);
    if (p.mask != MaskKind::None) op("add_", 1);
    op("_safe_softmax", 4);  // softmax, eq, all, where
    op("matmul", 1);
    if (upcast) op("to", 1);
    return e;
  }

  void forward(const Problem& p, const Inputs& in, Tensor& out, RunContext& ctx) override {
    const bool upcast = is_16bit(p.dtype);
    // Half the scale on each operand keeps q.k in range before the product.
    const float root = static_cast<float>(std::sqrt(p.softmax_scale()));
    Tensor q32 = upcast ? ops::to(in.q, DType::F32, ctx) : in.q;
    Tensor k32 = upcast ? ops::to(in.k, DType::F32, ctx) : in.k;
    Tensor v32 = upcast ? ops::to(in.v, DType::F32, ctx) : in.v;
    Tensor q = ops::mul(q32, root, ctx);
    q32 = Tensor();
    Tensor mask = additive_mask(p, in, ctx);
    Tensor attn;
    {
      const Tensor k = ops::mul(k32, root, ctx);
      k32 = Tensor();
      attn = ops::matmul_qk(blas_, q, k, ctx);
    }
    q = Tensor();
    if (mask.defined()) ops::add_(attn, mask, ctx);
    if (p.mask == MaskKind::Bias) ops::add_(attn, in.bias, ctx);
    mask = Tensor();
    attn = ops::safe_softmax(attn, ctx);
    if (upcast) {
      const Tensor o = ops::matmul_pv(blas_, attn, v32, ctx);
      attn = Tensor();
      ops::to_into(o, out, ctx);
    } else {
      ops::matmul_pv(blas_, attn, v32, out, ctx);
    }
  }

 private:
  // The FP32 additive mask, rebuilt every call as PyTorch's math path does
  // (undefined for None and Bias, whose bias is added as given).
  static Tensor additive_mask(const Problem& p, const Inputs& in, RunContext& ctx) {
    if (p.mask == MaskKind::Boolean) return ops::where(in.mask, 0.f, -INFINITY, ctx);
    if (p.mask == MaskKind::None || p.mask == MaskKind::Bias) return {};
    const std::int64_t off = p.mask == MaskKind::Causal ? 0 : p.diagonal_offset();
    Tensor keep = ops::tril(ops::ones({1, 1, p.seq, p.kv_seq}, ctx), off, ctx);
    if (p.mask == MaskKind::SlidingWindow) keep = ops::triu(keep, off - p.window + 1, ctx);
    return ops::where(keep, 0.f, -INFINITY, ctx);
  }

  ops::Blas blas_;
};

}  // namespace

std::unique_ptr<Backend> make_math() { return std::make_unique<Math>(); }

}  // namespace attnprof::cuda
