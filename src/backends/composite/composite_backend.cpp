#include "backends/composite/composite_backend.h"

#include <cstdio>
#include <utility>

#include "attnprof/error.h"
#include "backends/composite/plan.h"

namespace attnprof {

Tensor Ops::gather_pages(const Tensor&, const Tensor&, std::int64_t, RunContext&) {
  fail(ErrorKind::Unsupported, std::string("these ") + device_name(device()) + " ops cannot read a paged KV cache");
}

Tensor Ops::tanh(const Tensor&, RunContext&) {
  fail(ErrorKind::Unsupported, std::string("these ") + device_name(device()) + " ops have no tanh (soft-capping)");
}

Tensor Ops::tanh_backward(const Tensor&, const Tensor&, RunContext&) {
  fail(ErrorKind::Unsupported,
       std::string("these ") + device_name(device()) + " ops have no tanh_backward (soft-capping)");
}

}  // namespace attnprof

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

void CompositeBackend::run_forward(Ops& ops, const Problem& p, const Inputs& in, Tensor& out, RunContext& ctx,
                                   MaskCache& mask, Saved* saved) const {
  if (p.kv_cache != KvCache::Paged) {
    run(ops, p, in, out, ctx, mask, saved);
    return;
  }
  Inputs gathered = in;
  gathered.k = ops.gather_pages(in.k_pages, in.block_table, p.kv_seq, ctx);
  gathered.v = ops.gather_pages(in.v_pages, in.block_table, p.kv_seq, ctx);
  run(ops, p, gathered, out, ctx, mask, saved);
}

void CompositeBackend::soft_cap(Ops& ops, const Problem& p, Tensor& attn, RunContext& ctx, Saved* saved) {
  if (p.softcap <= 0) return;
  Tensor t = ops.tanh(ops.mul(attn, static_cast<float>(1.0 / p.softcap), ctx), ctx);
  attn = ops.mul(t, static_cast<float>(p.softcap), ctx);
  if (saved != nullptr) saved->tanh = std::move(t);
}

void CompositeBackend::soft_cap_backward(Ops& ops, const Problem& p, Tensor& ds, const Saved& saved, RunContext& ctx) {
  if (p.softcap <= 0) return;
  if (!saved.tanh.defined()) fail(ErrorKind::Internal, "soft-capped backward without the tanh forward_train saves");
  ds = ops.tanh_backward(ds, saved.tanh, ctx);
}

std::string CompositeBackend::softcap_story(const Problem& p) {
  if (p.softcap <= 0) return {};
  char buf[96];
  std::snprintf(buf, sizeof buf, ", soft cap %g (mul, tanh, mul)", p.softcap);
  return buf;
}

void CompositeBackend::forward_train(const Problem& p, const Inputs& in, Tensor& out, Saved& saved, RunContext& ctx) {
  saved = {};
  run_forward(*ops_, p, in, out, ctx, mask_, &saved);
}

void CompositeBackend::backward(const Problem& p, const Inputs& in, const Tensor&, const Tensor& dout,
                                const Saved& saved, Gradients& grads, RunContext& ctx) {
  if (!saved.probs.defined()) {
    fail(ErrorKind::Internal, std::string(name()) + ": backward without the probabilities forward_train saves");
  }
  run_backward(*ops_, p, in, dout, saved, grads, ctx, mask_);
}

CompositeBackend::Planned CompositeBackend::plan(const Problem& p) const {
  PlanOps plan(device());
  // Declared after the plan, so they give their bytes back before it goes.
  MaskCache mask;
  Saved saved;
  PlanOps::Args args = plan.args(p);
  RunContext ctx = plan.context();
  const std::size_t args_bytes = plan.live_bytes();
  // One call of the pass, as the runner makes it (runner.cpp: call()).
  const auto call = [&] {
    if (p.pass == Pass::Forward) {
      run_forward(plan, p, args.in, args.out, ctx, mask, nullptr);
      return;
    }
    if (p.pass == Pass::Train) {
      saved = {};
      run_forward(plan, p, args.in, args.out, ctx, mask, &saved);
    }
    run_backward(plan, p, args.in, args.dout, saved, args.grads, ctx, mask);
  };
  // The runner makes a backward's saved tensors once, before the steps.
  if (p.pass == Pass::Backward) run_forward(plan, p, args.in, args.out, ctx, mask, &saved);
  call();
  // What the warmup left behind: the mask, and the saved probabilities.
  const std::size_t cached = plan.live_bytes() - args_bytes;
  plan.clear();
  call();
  return {plan.recorded(), cached + plan.peak_bytes() + ops_->library_workspace_bytes()};
}

Expectation CompositeBackend::expectation(const Problem& p) const { return plan(p).expectation; }

std::size_t CompositeBackend::planned_workspace_bytes(const Problem& p) const { return plan(p).workspace_bytes; }

std::size_t CompositeBackend::score_elements(const Problem& p) {
  return static_cast<std::size_t>(p.batch * p.heads * p.seq * p.kv_seq);
}

std::string CompositeBackend::backward_story(const Problem& p, DType saved) {
  if (p.pass == Pass::Forward) return {};
  // No atomics anywhere: deterministic changes nothing here.
  return ", backward from the saved [S, Skv] probabilities (" + std::string(dtype_name(saved)) + "), deterministic";
}

// Both devices' ops gather pages (CPU: one pass each; CUDA: one kernel each).
// What is left to refuse is a backward through the cache, as
// Problem::validate() does, for callers that skip validate().
std::string CompositeBackend::paged_refusal(const Problem& p) const {
  if (p.kv_cache != KvCache::Paged || p.pass == Pass::Forward) return {};
  return "the paged KV cache is forward only (a decode-time cache): use pass=forward, or kv_cache=contiguous";
}

std::string CompositeBackend::paged_story(const Problem& p) {
  if (p.kv_cache != KvCache::Paged) return {};
  return ", K and V gathered from " + std::to_string(p.page_size) + "-key pages through the block table (index_select" +
         (p.device == Device::Cuda ? ", one kernel each)" : ")");
}

std::string CompositeBackend::wrong_device(const Problem& p) const {
  if (p.device == device()) return {};
  return std::string("runs on ") + (device() == Device::Cpu ? "the CPU" : "a CUDA device") + " only";
}

}  // namespace attnprof::composite
