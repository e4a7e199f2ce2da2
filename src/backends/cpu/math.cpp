// math on the CPU: PyTorch's careful reference path. Upcasts 16-bit inputs to
// FP32, rebuilds the mask on every call (ones, tril, where), scales q and k by
// sqrt(scale) each, FP32 matrix products (OpenBLAS), a NaN-safe softmax (a
// fully masked row gives zeros), then downcasts.
#include <cmath>

#include "backends/cpu/cpu_backends.h"
#include "backends/cpu/ops.h"

namespace attnprof::cpu {
namespace {

class MathBackend final : public Backend {
 public:
  std::string_view name() const override { return "math"; }
  Device device() const override { return Device::Cpu; }

  Eligibility eligibility(const Problem& p) const override {
    std::string what = is_16bit(p.dtype) ? "upcasts to FP32, " : "";
    if (p.mask != MaskKind::None) what += "rebuilds the mask every call, ";
    return {true, what + "FP32 sgemm, NaN-safe softmax"};
  }

  std::size_t workspace_bytes(const Problem& p) const override {
    const std::size_t scores = static_cast<std::size_t>(p.batch * p.heads * p.seq * p.kv_seq) * 4;
    const std::size_t upcast = is_16bit(p.dtype) ? (p.q_bytes() + 2 * p.kv_bytes()) * 2 * 2 : 0;
    return 2 * scores + upcast + static_cast<std::size_t>(p.seq * p.kv_seq) * 5;
  }

  Traits traits() const override { return {.reference_precision = true}; }

  Expectation expectation(const Problem& p) const override {
    Expectation e;
    if (is_16bit(p.dtype)) e.cpu_ops = {"to", "to", "to"};
    if (p.mask == MaskKind::Boolean) {
      e.cpu_ops.push_back("where");
    } else if (p.mask == MaskKind::Bias) {
      if (is_16bit(p.dtype)) e.cpu_ops.push_back("to");
    } else if (p.mask != MaskKind::None) {
      e.cpu_ops.insert(e.cpu_ops.end(), {"ones", "tril", "where"});
    }
    e.cpu_ops.insert(e.cpu_ops.end(), {"mul", "mul", "matmul"});
    if (p.mask != MaskKind::None) e.cpu_ops.push_back("add");
    e.cpu_ops.insert(e.cpu_ops.end(), {"_safe_softmax", "matmul"});
    if (is_16bit(p.dtype)) e.cpu_ops.push_back("to");
    return e;
  }

  void forward(const Problem& p, const Inputs& in, Tensor& out, RunContext& ctx) override {
    Allocator& a = ctx.allocator;
    const bool upcast = is_16bit(p.dtype);
    Tensor q = upcast ? to(in.q, DType::F32, a) : in.q;
    Tensor k = upcast ? to(in.k, DType::F32, a) : in.k;
    Tensor v = upcast ? to(in.v, DType::F32, a) : in.v;
    const Dims full{p.batch, p.heads, p.seq, p.kv_seq};
    Tensor additive;  // FP32, 0 or -inf (or the bias), rebuilt on every call
    if (p.mask == MaskKind::Boolean) {
      additive = where_additive(in.mask, a);
    } else if (p.mask == MaskKind::Bias) {
      additive = upcast ? to(in.bias, DType::F32, a) : in.bias;
    } else if (p.mask != MaskKind::None) {
      Tensor keep = ones_bool(p.seq, p.kv_seq, a);
      tril_(keep, p);
      additive = where_additive(keep, a).expand(full);
    }
    const float root = static_cast<float>(std::sqrt(p.softmax_scale()));
    q = mul(q, root, a);
    k = mul(k, root, a);
    Tensor scores = matmul_qk(q, k, DType::F32, a);
    if (additive.defined()) scores = add(scores, additive, a);
    const Tensor probs = safe_softmax(scores, a);
    scores = Tensor();
    if (!upcast) {
      matmul_pv(probs, v, out);
      return;
    }
    Tensor o32 = Tensor::empty(out.sizes(), DType::F32, a);
    matmul_pv(probs, v, o32);
    to_into(o32, out);  // the downcast lands in the caller's (possibly strided) output
  }
};

}  // namespace

std::unique_ptr<Backend> make_math() { return std::make_unique<MathBackend>(); }

}  // namespace attnprof::cpu
