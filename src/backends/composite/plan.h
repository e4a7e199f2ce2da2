// The plan: a shape-only implementation of the ops that computes nothing and
// allocates nothing, and records which ops a forward calls and what each
// issues on the device it plans for (OpSpec's per-device costs). Running a
// composite forward against it gives the backend's expectation, on any device
// and on a machine without one.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "attnprof/backend.h"
#include "backends/ops.h"

namespace attnprof::composite {

class PlanOps final : public Ops {
 public:
  explicit PlanOps(Device device);
  ~PlanOps() override;
  PlanOps(const PlanOps&) = delete;
  PlanOps& operator=(const PlanOps&) = delete;

  // Inputs and output of p's shapes (masks broadcast from [1, 1, S, Skv], as
  // make_inputs() makes them), and for a backward or training pass dO and the
  // gradients (the runner's, counted with the inputs), allocated by the plan.
  // They must die before it.
  struct Args {
    Inputs in;
    Tensor out;
    Tensor dout;
    Gradients grads;
  };
  Args args(const Problem& p);
  // A context whose allocator is the plan's.
  RunContext context();

  // Forgets what was recorded (after a warmup pass that filled the caches).
  void clear();
  // What was recorded since the last clear(): the ops in order, and on a GPU
  // the device activities and copies they issue; on the CPU copies only, and
  // device_activities stays -1 (there is no device).
  const Expectation& recorded() const { return recorded_; }
  // Peak bytes the ops allocated since the last clear(), beyond what was live then.
  std::size_t peak_bytes() const;
  // Bytes of the plan's tensors alive now.
  std::size_t live_bytes() const;

  Device device() const override { return device_; }
  std::string describe_gemm(DType operands) const override;
  std::size_t library_workspace_bytes() const override { return 0; }

  Tensor matmul_qk(const Tensor& q, const Tensor& k, RunContext& ctx) override;
  void matmul_pv(const Tensor& p, const Tensor& v, Tensor& out, RunContext& ctx) override;
  Tensor matmul_pv(const Tensor& p, const Tensor& v, RunContext& ctx) override;
  void matmul_tn(const Tensor& a, const Tensor& b, Tensor& out, RunContext& ctx) override;
  Tensor mul(const Tensor& x, float s, RunContext& ctx) override;
  Tensor masked_fill(const Tensor& x, const Tensor& keep, float value, RunContext& ctx) override;
  void masked_fill_(Tensor& x, const Tensor& keep, float value, RunContext& ctx) override;
  Tensor add(const Tensor& a, const Tensor& b, RunContext& ctx) override;
  void add_(Tensor& a, const Tensor& b, RunContext& ctx) override;
  Tensor softmax(const Tensor& x, RunContext& ctx) override;
  Tensor safe_softmax(const Tensor& x, RunContext& ctx) override;
  Tensor softmax_backward(const Tensor& grad, const Tensor& probs, RunContext& ctx) override;
  Tensor dequantize(const Tensor& x, float descale, RunContext& ctx) override;
  Tensor to(const Tensor& x, DType dtype, RunContext& ctx) override;
  void to_into(const Tensor& src, Tensor& dst, RunContext& ctx) override;
  Tensor ones(const Dims& sizes, RunContext& ctx) override;
  Tensor tril(const Tensor& x, std::int64_t diagonal, RunContext& ctx) override;
  Tensor triu(const Tensor& x, std::int64_t diagonal, RunContext& ctx) override;
  Tensor where(const Tensor& cond, float if_true, float if_false, RunContext& ctx) override;
  Tensor structural_mask(const Problem& p, RunContext& ctx) override;
  Tensor gather_pages(const Tensor& pages, const Tensor& block_table, std::int64_t kv_seq, RunContext& ctx) override;
  Tensor tanh(const Tensor& x, RunContext& ctx) override;
  Tensor tanh_backward(const Tensor& grad, const Tensor& t, RunContext& ctx) override;

 private:
  class ShapeAllocator;
  void record(const OpSpec& spec);

  Device device_;
  std::unique_ptr<ShapeAllocator> allocator_;
  Expectation recorded_;
};

}  // namespace attnprof::composite
