// naive_inplace: the naive backend with attn.masked_fill_(~mask, -inf).
//
// Filling in place drops the clone, so the device-to-device copy and the extra
// score buffer disappear from the trace. Per forward: 2 GEMMs, the scale, the
// fill and the softmax = 5 device activities.
#include <cmath>
#include <memory>

#include "backends/cuda/cuda_backends.h"
#include "backends/cuda/naive_common.h"

namespace attnprof::cuda {
namespace {

class NaiveInplace final : public NaiveBase {
 public:
  std::string_view name() const override { return "naive_inplace"; }

 protected:
  Tensor fill(Tensor attn, const Tensor& keep, RunContext& ctx) override {
    ops::masked_fill_(attn, keep, -INFINITY, ctx);
    return attn;
  }
  Tensor add_bias(Tensor attn, const Tensor& bias, RunContext& ctx) override {
    ops::add_(attn, bias, ctx);
    return attn;
  }
  const char* fill_op() const override { return "masked_fill_"; }
  const char* bias_op() const override { return "add_"; }
  int fill_activities() const override { return 1; }
  // The product and its scaled copy, or the scaled scores and the softmax.
  std::size_t peak_score_buffers() const override { return 2; }
  std::string mask_story() const override { return "in-place masked fill (no copy)"; }
};

}  // namespace

std::unique_ptr<Backend> make_naive_inplace() { return std::make_unique<NaiveInplace>(); }

}  // namespace attnprof::cuda
