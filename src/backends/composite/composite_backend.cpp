#include "backends/composite/composite_backend.h"

#include <cstdio>
#include <utility>

#include "attnprof/aliasing.h"
#include "attnprof/error.h"
#include "attnprof/varlen.h"
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

void MaskCache::use_for(const Problem& whole) {
  std::string key = std::to_string(whole.seq) + "/" + std::to_string(whole.kv_seq) + "/" +
                    std::string(mask_name(whole.mask)) + "/" + std::to_string(whole.window);
  for (const auto* lens : {&whole.seq_lens, &whole.kv_seq_lens}) {
    key += '|';
    for (const std::int64_t n : *lens) key += std::to_string(n) + ",";
  }
  std::lock_guard lock(mutex_);
  if (key == owner_) return;
  masks_.clear();  // free the old ones before building the next
  owner_ = std::move(key);
}

Tensor MaskCache::get(Ops& ops, const Problem& p, RunContext& ctx) {
  const std::string key = std::to_string(p.seq) + "/" + std::to_string(p.kv_seq);
  std::lock_guard lock(mutex_);
  if (allocator_ != &ctx.allocator || masks_.size() >= kShapes) masks_.clear();
  allocator_ = &ctx.allocator;
  Tensor& m = masks_[key];
  if (!m.defined()) m = ops.structural_mask(p, ctx);
  return m;
}

namespace {

// x's rows as zeros, into `dst`: mul by 0 (x is finite) and to, on either device.
void zero_rows(Ops& ops, const Tensor& like, Tensor& dst, RunContext& ctx) {
  ops.to_into(ops.mul(like, 0.f, ctx), dst, ctx);
}

}  // namespace

void CompositeBackend::run_fp8(Ops& ops, const Problem& p, const Inputs& in, Tensor& out, RunContext& ctx,
                               MaskCache& mask, Saved* saved) const {
  // Problem::validate() refuses it first; this guards callers that skip it.
  if (saved != nullptr) fail(ErrorKind::Unsupported, std::string(name()) + ": dtype fp8 is forward only");
  // Its dequantization takes each descale as a number; a device tensor would
  // have to be read on the host first, out of the caller's stream order.
  if (in.device_descales()) {
    fail(ErrorKind::Unsupported, std::string(name()) +
                                     " takes fp8 descales as numbers, not device tensors: pass floats, or "
                                     "backend=\"flash\" or \"cudnn\" (whose kernels read descale tensors)");
  }
  const Problem p32 = fp32_twin(p);
  Inputs in32 = in;
  in32.q = ops.dequantize(in.q, in.q_descale, ctx);
  if (p.kv_cache == KvCache::Paged) {
    in32.k_pages = ops.dequantize(in.k_pages, in.k_descale, ctx);
    in32.v_pages = ops.dequantize(in.v_pages, in.v_descale, ctx);
  } else {
    in32.k = ops.dequantize(in.k, in.k_descale, ctx);
    in32.v = ops.dequantize(in.v, in.v_descale, ctx);
  }
  in32.q_descale = in32.k_descale = in32.v_descale = 1.0f;
  Tensor out32 = Tensor::empty(out.sizes(), DType::F32, ctx.allocator);
  run_forward(ops, p32, in32, out32, ctx, mask, nullptr);
  ops.to_into(out32, out, ctx);
}

void CompositeBackend::run_forward(Ops& ops, const Problem& p, const Inputs& in, Tensor& out, RunContext& ctx,
                                   MaskCache& mask, Saved* saved) const {
  if (is_fp8(p.dtype)) {
    run_fp8(ops, p, in, out, ctx, mask, saved);
    return;
  }
  mask.use_for(p);
  if (p.varlen()) {
    if (saved != nullptr) saved->sequences.reserve(static_cast<std::size_t>(p.batch));
    for (std::int64_t b = 0; b < p.batch; ++b) {
      Saved* mine = saved != nullptr ? &saved->sequences.emplace_back() : nullptr;
      const Problem one = p.sequence(b);
      if (one.seq == 0) continue;
      const Inputs rows = sequence_inputs(p, in, b);
      Tensor o = sequence_q_rows(p, out, b);
      if (one.kv_seq == 0) {
        zero_rows(ops, rows.q, o, ctx);
        continue;
      }
      run(ops, one, rows, o, ctx, mask, mine);
    }
    return;
  }
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
  require_output_apart(in, out, name());
  saved = {};
  run_forward(*ops_, p, in, out, ctx, mask_, &saved);
}

void CompositeBackend::backward(const Problem& p, const Inputs& in, const Tensor&, const Tensor& dout,
                                const Saved& saved, Gradients& grads, RunContext& ctx) {
  const bool packed = p.varlen() && saved.sequences.size() == static_cast<std::size_t>(p.batch);
  if (!saved.probs.defined() && !packed) {
    fail(ErrorKind::Internal, std::string(name()) + ": backward without the probabilities forward_train saves");
  }
  run_backward_packed(*ops_, p, in, dout, saved, grads, ctx, mask_);
}

void CompositeBackend::run_backward_packed(Ops& ops, const Problem& p, const Inputs& in, const Tensor& dout,
                                           const Saved& saved, Gradients& grads, RunContext& ctx,
                                           MaskCache& mask) const {
  mask.use_for(p);
  if (!p.varlen()) {
    run_backward(ops, p, in, dout, saved, grads, ctx, mask);
    return;
  }
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const Problem one = p.sequence(b);
    const Inputs rows = sequence_inputs(p, in, b);
    Gradients g{sequence_q_rows(p, grads.dq, b), sequence_kv_rows(p, grads.dk, b), sequence_kv_rows(p, grads.dv, b)};
    if (one.seq == 0 || one.kv_seq == 0) {
      // No query sees these keys, or these queries see no key: zero gradients.
      if (one.kv_seq > 0) {
        zero_rows(ops, rows.k, g.dk, ctx);
        zero_rows(ops, rows.v, g.dv, ctx);
      }
      if (one.seq > 0) zero_rows(ops, rows.q, g.dq, ctx);
      continue;
    }
    run_backward(ops, one, rows, sequence_q_rows(p, dout, b), saved.sequences[static_cast<std::size_t>(b)], g, ctx,
                 mask);
  }
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
    run_backward_packed(plan, p, args.in, args.dout, saved, args.grads, ctx, mask);
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

std::size_t CompositeBackend::packed_workspace_bytes(const Problem& p) const {
  std::size_t n = 0;
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const Problem one = p.sequence(b);
    if (one.seq > 0 && one.kv_seq > 0) n += workspace_bytes(one);
  }
  // Zeroing a sequence without keys (or queries): its rows' mul by 0.
  return n + p.q_bytes() + 2 * p.kv_bytes();
}

std::string CompositeBackend::packed_story(const Problem& p) {
  if (!p.varlen()) return {};
  return ", " + std::to_string(p.batch) + " packed sequences run one by one (the ops once per sequence)";
}

Problem CompositeBackend::fp32_twin(const Problem& p) {
  Problem t = p;
  t.dtype = DType::F32;
  return t;
}

std::size_t CompositeBackend::fp8_workspace_bytes(const Problem& p) const {
  const Problem t = fp32_twin(p);
  const std::size_t kv = p.kv_cache == KvCache::Paged ? 2 * t.kv_page_bytes() : 2 * t.kv_bytes();
  return workspace_bytes(t) + t.q_bytes() + kv + t.o_bytes();
}

std::string CompositeBackend::fp8_story(const Problem& p) {
  if (!is_fp8(p.dtype)) return {};
  return ", FP8 semantics: q, k and v dequantized to FP32 (e4m3 x descale), computed as fp32, O cast to " +
         std::string(dtype_name(output_dtype(p.dtype)));
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
