// naive: attention op by op with an out-of-place masked fill.
//
// attn.masked_fill(~mask, -inf) returns a new tensor: PyTorch clones the scores
// (a device-to-device cudaMemcpyAsync of a whole [B, H, S, Skv] buffer) and then
// fills the clone. Nothing in the source says "copy"; the trace does. Per
// forward: 2 GEMMs, the scale, the memcpy, the fill and the softmax = 6 device
// activities.
#include <cmath>
#include <memory>

#include "backends/cuda/cuda_backends.h"
#include "backends/cuda/naive_common.h"

namespace attnprof::cuda {
namespace {

class Naive final : public NaiveBase {
 public:
  std::string_view name() const override { return "naive"; }

 protected:
  Tensor fill(Tensor attn, const Tensor& keep, RunContext& ctx) override {
    // The input stays alive until the copy is filled: two score buffers at once.
    return ops::masked_fill(attn, keep, -INFINITY, ctx);
  }
  Tensor add_bias(Tensor attn, const Tensor& bias, RunContext& ctx) override { return ops::add(attn, bias, ctx); }
  const char* fill_op() const override { return "masked_fill"; }
  const char* bias_op() const override { return "add"; }
  int fill_activities() const override { return 2; }
  // Two score buffers are live at a time (each op reads one, writes one), and
  // this one allocates a third over the forward; budgeting three keeps the
  // refuse-before-allocating check on the safe side of allocator rounding.
  std::size_t peak_score_buffers() const override { return 3; }
  std::string mask_story() const override { return "out-of-place masked fill (a hidden device-to-device copy)"; }
};

}  // namespace

std::unique_ptr<Backend> make_naive() { return std::make_unique<Naive>(); }

}  // namespace attnprof::cuda
