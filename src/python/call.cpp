// One call on the caller's arrays: the problem they make, checked once, and
// the backend that runs it.
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "attnprof/error.h"
#include "attnprof/mask_tensor.h"
#include "attnprof/problem_spec.h"
#include "python/bindings.h"

namespace attnprof::python {
namespace {

// Which backend runs a problem: resolved and checked for eligibility once per
// (problem, requested name, use), as `auto` measures once per problem. The
// whole Problem is the key (its pass, deterministic and KV cache included), so
// nothing that decides the plan can be left out of it.
struct PlanKey {
  Problem problem;
  std::string backend;
  Use use;
  bool kv_lens;  // per-sequence key lengths (a paged call's unequal seq_lens)
  auto operator<=>(const PlanKey&) const = default;
};

std::string keeps_probabilities(std::string_view backend) {
  return std::string(backend) +
         " keeps the [S, Skv] probabilities for its backward; autograd through attnprof takes a backend that keeps "
         "only the log-sum-exp (flash, efficient, cudnn)";
}

// `auto` under autograd: its measured pick where that recomputes, else the
// first eligible backend that does (explain()'s order).
std::string auto_for(const Problem& p, Use use, bool kv_lens) {
  const auto takes = [&](const std::string& name) {
    const Backend* b = find_backend(name, p.device);
    return b && (!kv_lens || b->traits().kv_lens);
  };
  if (kv_lens) {  // the measured pick may not read them: the first eligible one that does
    for (const auto& e : explain(p)) {
      if (e.eligible && takes(e.backend)) return e.backend;
    }
    fail(ErrorKind::Unsupported, "auto: no eligible backend takes per-sequence kv lengths (unequal seq_lens) for " +
                                     p.describe() + "; flash on the CPU does");
  }
  const std::string picked = choose_auto(p).backend;
  if (use == Use::Inference) return picked;
  const auto recomputes = [&](const std::string& name) {
    const Backend* b = find_backend(name, p.device);
    return b && b->traits().backward_recomputes;
  };
  if (recomputes(picked)) return picked;
  for (const auto& e : explain(p)) {
    if (e.eligible && recomputes(e.backend)) return e.backend;
  }
  fail(ErrorKind::Unsupported, "auto: no eligible backend keeps only the log-sum-exp for autograd (" + p.describe() +
                                   "); attnprof explain says why each is refused");
}

}  // namespace

Backend& resolve(const Problem& p, const std::string& requested, Use use, bool kv_lens) {
  static std::mutex mu;
  static std::map<PlanKey, Backend*> plans;
  PlanKey key{p, requested, use, kv_lens};
  {
    std::lock_guard lock(mu);
    if (auto it = plans.find(key); it != plans.end()) return *it->second;
  }
  check_backend_name("backend", requested, /*auto_ok=*/true);
  Backend* b = &resolve_backend(p, requested == "auto" ? auto_for(p, use, kv_lens) : requested);
  if (use == Use::Autograd && !b->traits().backward_recomputes) {
    fail(ErrorKind::Unsupported, keeps_probabilities(std::string(b->name())));
  }
  if (kv_lens && !b->traits().kv_lens) {
    fail(ErrorKind::Unsupported, std::string(b->name()) + " on " + device_name(p.device) +
                                     " takes one kv length for every sequence, and seq_lens differ: flash on the "
                                     "CPU takes per-sequence lengths (or pad the shorter sequences' pages)");
  }
  std::lock_guard lock(mu);
  plans.emplace(std::move(key), b);
  return *b;
}

Tensor Call::view_like(const char* name, const Array& a, const Tensor& like, bool bshd) const {
  if (device_of(name, a) != p.device || dtype_of(name, a) != p.dtype) {
    fail(ErrorKind::InvalidArgument, std::string(name) + " must be on q's device with q's dtype");
  }
  const Tensor t = p.varlen() ? packed_view_of(name, a, p.device, p.dtype) : view_of(name, a, bshd, p.device, p.dtype);
  for (int i = 0; i < 4; ++i) require_same(name, name, t.size(i), "its counterpart", like.size(i));
  return t;
}

Gradients Call::gradients(const Array& dq, const Array& dk, const Array& dv, bool bshd) const {
  Gradients g{view_like("dq", dq, in.q, bshd), view_like("dk", dk, in.k, bshd), view_like("dv", dv, in.v, bshd)};
  require_writable_layout("dq", g.dq);
  require_writable_layout("dk", g.dk);
  require_writable_layout("dv", g.dv);
  return g;
}

Call finish_call(Problem p, Inputs in, Tensor out, const std::string& backend, std::uintptr_t stream, int threads) {
  Backend& b = resolve(p, backend, p.pass == Pass::Forward ? Use::Inference : Use::Autograd, in.kv_lens.defined());
  DeviceRuntime& rt = device_runtime(p.device, threads);
  return Call{std::move(p), std::move(in), std::move(out), &b,
              RunContext{rt.allocator(), reinterpret_cast<void*>(stream), threads}};
}

Call prepare(const Array& q, const Array& k, const Array& v, const Array& out, const CallArgs& a, const Extras& x) {
  check_threads(a.threads);
  const Device device = device_of("q", q);
  const DType dtype = dtype_of("q", q);
  require_like_q("k", k, q, device, dtype);
  require_like_q("v", v, q, device, dtype);
  require_like_q("out", out, q, device, dtype);
  const bool paged = x.block_table || x.seq_lens;
  if (paged && x.attn_mask) {
    fail(ErrorKind::InvalidArgument,
         "attn_mask with a paged KV cache: seq_lens says each sequence's keys (and mask= their alignment)");
  }
  if (paged && a.pass != Pass::Forward) {
    fail(ErrorKind::Unsupported, "a paged KV cache is inference only: no gradients flow into the caches");
  }
  Inputs in;
  in.q = view_of("q", q, a.bshd, device, dtype);
  Tensor o = view_of("out", out, a.bshd, device, dtype);
  require_writable_layout("out", o);
  for (int i = 0; i < 4; ++i) require_same("a dimension of q and out", "q", in.q.size(i), "out", o.size(i));

  Problem p;
  p.batch = in.q.size(0);
  p.heads = in.q.size(1);
  p.seq = in.q.size(2);
  p.head_dim = in.q.size(3);
  p.dtype = dtype;
  p.device = device;
  if (paged) {
    prepare_paged(p, in, k, v, x, dtype);
  } else {
    in.k = view_of("k", k, a.bshd, device, dtype);
    in.v = view_of("v", v, a.bshd, device, dtype);
    require_same("batch", "q", in.q.size(0), "k", in.k.size(0));
    require_same("head_dim", "q", in.q.size(3), "k", in.k.size(3));
    for (int i = 0; i < 4; ++i) require_same("a dimension of k and v", "k", in.k.size(i), "v", in.v.size(i));
    p.kv_heads = in.k.size(1);
    p.kv_seq = in.k.size(2);
  }
  Tensor mask_tensor;
  if (x.attn_mask) {
    if (!a.mask.empty()) {
      fail(ErrorKind::InvalidArgument, "attn_mask and mask='" + a.mask +
                                           "' are exclusive: the tensor is the whole mask (leave mask unset, or "
                                           "fold the causal part into the tensor)");
    }
    mask_tensor = mask_view(*x.attn_mask, p.device);
    p.mask = mask_kind_of("attn_mask", mask_tensor.dtype());
  } else {
    set_mask(p, a.mask.empty() ? std::string("causal") : a.mask);
  }
  if (a.window) set_problem_field(p, "window", std::to_string(*a.window));
  p.scale = a.scale;
  p.pass = a.pass;
  p.deterministic = a.deterministic;
  set_softcap(p, a.softcap);
  p.normalize().validate();
  if (mask_tensor.defined()) attach_mask(p, mask_tensor, in, "attn_mask");
  return finish_call(std::move(p), std::move(in), std::move(o), a.backend, a.stream, a.threads);
}

}  // namespace attnprof::python
