#include "backends/composite/composite_backend.h"

#include "backends/composite/plan.h"

namespace attnprof::composite {

Tensor MaskCache::get(Ops& ops, const Problem& p, RunContext& ctx) {
  const std::string key = std::to_string(p.seq) + "/" + std::to_string(p.kv_seq) + "/" +
                          std::string(mask_name(p.mask)) + "/" + std::to_string(p.window);
  std::lock_guard lock(mutex_);
  if (!mask_.defined() || key != key_ || allocator_ != &ctx.allocator) {
    mask_ = Tensor();  // free the old one before building the next
    mask_ = ops.structural_mask(p, ctx);
    key_ = key;
    allocator_ = &ctx.allocator;
  }
  return mask_;
}

CompositeBackend::Planned CompositeBackend::plan(const Problem& p) const {
  PlanOps plan(device());
  // Declared after the plan, so they give their bytes back before it goes.
  MaskCache mask;
  PlanOps::Args args = plan.args(p);
  RunContext ctx = plan.context();
  const std::size_t args_bytes = plan.live_bytes();
  run(plan, p, args.in, args.out, ctx, mask);
  const std::size_t cached = plan.live_bytes() - args_bytes;  // what the warmup left behind: the mask
  plan.clear();
  run(plan, p, args.in, args.out, ctx, mask);
  return {plan.recorded(), cached + plan.peak_bytes() + ops_->library_workspace_bytes()};
}

Expectation CompositeBackend::expectation(const Problem& p) const { return plan(p).expectation; }

std::size_t CompositeBackend::planned_workspace_bytes(const Problem& p) const { return plan(p).workspace_bytes; }

std::string CompositeBackend::wrong_device(const Problem& p) const {
  if (p.device == device()) return {};
  return std::string("runs on ") + (device() == Device::Cpu ? "the CPU" : "a CUDA device") + " only";
}

}  // namespace attnprof::composite
