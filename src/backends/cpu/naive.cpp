// naive and naive_inplace on the CPU: the textbook decomposition, one separate
// pass per op over a materialised [S, Skv] score tensor (OpenBLAS for the two
// matrix products). They differ only in the masked fill: naive's is out of
// place (a new tensor and a full copy, the "hidden copy"), naive_inplace's is not.
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>

#include "backends/cpu/cpu_backends.h"
#include "backends/cpu/ops.h"

namespace attnprof::cpu {
namespace {

class NaiveBackend final : public Backend {
 public:
  explicit NaiveBackend(bool inplace) : inplace_(inplace) {}

  std::string_view name() const override { return inplace_ ? "naive_inplace" : "naive"; }
  Device device() const override { return Device::Cpu; }

  Eligibility eligibility(const Problem& p) const override {
    std::string what = "matmul, mul, ";
    if (p.mask == MaskKind::Bias) {
      what += inplace_ ? "add_ (in place), " : "add, ";
    } else if (p.mask != MaskKind::None) {
      what += inplace_ ? "masked_fill_ (in place), " : "masked_fill (out of place: allocates and copies), ";
    }
    return {true, what + "softmax, matmul over materialised [S, Skv] scores (OpenBLAS sgemm)"};
  }

  std::size_t workspace_bytes(const Problem& p) const override {
    const std::size_t scores = static_cast<std::size_t>(p.batch * p.heads * p.seq * p.kv_seq) * element_size(p.dtype);
    return 2 * scores + static_cast<std::size_t>(p.seq * p.kv_seq);
  }

  Traits traits() const override { return {.nan_on_fully_masked = true, .memory_baseline = !inplace_}; }

  Expectation expectation(const Problem& p) const override {
    Expectation e;
    e.cpu_ops = {"matmul", "mul"};
    if (p.mask == MaskKind::Bias) {
      e.cpu_ops.push_back(inplace_ ? "add_" : "add");
    } else if (p.mask == MaskKind::Boolean) {
      e.cpu_ops.push_back("logical_not");
      e.cpu_ops.push_back(inplace_ ? "masked_fill_" : "masked_fill");
    } else if (p.mask != MaskKind::None) {
      e.cpu_ops.push_back(inplace_ ? "masked_fill_" : "masked_fill");
    }
    e.cpu_ops.push_back("softmax");
    e.cpu_ops.push_back("matmul");
    e.copies = (!inplace_ && p.mask != MaskKind::None && p.mask != MaskKind::Bias) ? 1 : 0;
    return e;
  }

  void forward(const Problem& p, const Inputs& in, Tensor& out, RunContext& ctx) override {
    Allocator& a = ctx.allocator;
    Tensor scores = matmul_qk(in.q, in.k, p.dtype, a);
    scores = mul(scores, static_cast<float>(p.softmax_scale()), a);
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    if (p.mask == MaskKind::Bias) {
      if (inplace_) {
        add_(scores, in.bias);
      } else {
        scores = add(scores, in.bias, a);
      }
    } else if (p.mask != MaskKind::None) {
      const Tensor masked = p.mask == MaskKind::Boolean ? logical_not(in.mask, a) : cached_mask(p, a);
      const Tensor m = masked.size(0) == scores.size(0) ? masked : masked.expand(scores.sizes());
      if (inplace_) {
        masked_fill_(scores, m, kNegInf);
      } else {
        scores = masked_fill(scores, m, kNegInf, a);
      }
    }
    const Tensor probs = softmax(scores, a);
    scores = Tensor();  // freed here, as the reference's reassignments free it
    matmul_pv(probs, in.v, out);
  }

 private:
  // The structural mask is built once per problem, like a registered buffer.
  Tensor cached_mask(const Problem& p, Allocator& a) {
    const auto key = std::make_tuple(p.batch, p.heads, p.seq, p.kv_seq, static_cast<int>(p.mask), p.window);
    std::lock_guard lock(mutex_);
    auto it = masks_.find(key);
    if (it == masks_.end()) it = masks_.emplace(key, structural_masked(p, a)).first;
    return it->second;
  }

  bool inplace_;
  std::mutex mutex_;
  std::map<std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t, int, std::int64_t>, Tensor> masks_;
};

}  // namespace

std::unique_ptr<Backend> make_naive() { return std::make_unique<NaiveBackend>(false); }
std::unique_ptr<Backend> make_naive_inplace() { return std::make_unique<NaiveBackend>(true); }

}  // namespace attnprof::cpu
