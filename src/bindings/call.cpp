// One call on the caller's arrays: the problem they make, checked once, and
// the backend that runs it (the call cache over it: call_cache.cpp).
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "attnprof/check_inputs.h"
#include "attnprof/device_runtime.h"
#include "attnprof/error.h"
#include "attnprof/mask_tensor.h"
#include "attnprof/problem_spec.h"
#include "attnprof/reference.h"
#include "bindings/bindings.h"

namespace attnprof::python {
namespace {

// Which backend runs a problem: resolved and checked for eligibility once per
// (problem, requested name, use). The whole Problem is the key (its pass,
// deterministic and KV cache included), so nothing that decides the plan can
// be left out of it.
struct PlanKey {
  Problem problem;
  std::string backend;
  Use use;
  BatchLayout layout;  // the call's: a padded batch's rows, a paged cache's key counts
  auto operator<=>(const PlanKey&) const = default;
};

// The backends on `device` whose traits have `trait`, in display order: the
// refusals below name them from the traits, never from a list kept by hand.
std::string takers(Device device, bool Traits::*trait) {
  std::string names;
  for (const std::string_view n : backend_names()) {
    const Backend* b = find_backend(n, device);
    if (b && b->traits().*trait) names += (names.empty() ? "" : ", ") + std::string(n);
  }
  return names.empty() ? "none" : names;
}

std::string keeps_probabilities(std::string_view backend, Device device) {
  return std::string(backend) +
         " keeps the [S, Skv] probabilities, not their log-sum-exp: return_lse and autograd through attnprof take "
         "a backend that keeps only the log-sum-exp (on " +
         std::string(device_name(device)) + ": " + takers(device, &Traits::backward_recomputes) + ")";
}

}  // namespace

Backend& resolve(const Problem& p, const std::string& requested, Use use, const BatchLayout& layout) {
  static std::mutex mu;
  static std::map<PlanKey, Backend*> plans;
  PlanKey key{p, requested, use, layout};
  {
    std::lock_guard lock(mu);
    if (auto it = plans.find(key); it != plans.end()) return *it->second;
  }
  check_backend_name("backend", requested, /*auto_ok=*/true);
  // The runner's one answer for a problem in a layout (eligibility_of):
  // auto's rule among the backends that take it, a name refused with the
  // layout's reason and the backends that take it.
  const bool recompute = use == Use::Autograd;
  Backend* b = after_runtime_use([&] {
    return &resolve_backend(p, layout, requested == "auto" ? choose_auto(p, layout, recompute).backend : requested);
  });
  if (recompute && !b->traits().backward_recomputes) {
    fail(ErrorKind::Unsupported, keeps_probabilities(b->name(), p.device));
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

void Call::forward() {
  if (planned && planned->stream == ctx.stream) {
    // One run at a time uses the plan's state: a second thread's run of the
    // same call goes without it rather than share its scratch.
    std::unique_lock lock(planned->busy, std::try_to_lock);
    if (lock.owns_lock()) {
      planned->plan.run(in, out, ctx.stream);
      return;
    }
  }
  backend->forward(p, in, out, ctx);
}

namespace {

// Bumped by every setting of the CPU runtime's thread counts (runtime_for's
// own, and runtime_touched() for the library's other callers).
std::atomic<std::uint64_t> runtime_epoch{1};

// Off: every call prepared and its runtime set afresh, as before the cache
// (bench/python_overhead.py times both in one run).
std::atomic<bool> cache_on{true};

}  // namespace

void use_cache(bool on) { cache_on.store(on, std::memory_order_relaxed); }
bool cache_enabled() { return cache_on.load(std::memory_order_relaxed); }

DeviceRuntime& runtime_for(Device device, int threads) {
  if (device != Device::Cpu) return device_runtime(device, threads);  // no thread counts to set
  if (!cache_on.load(std::memory_order_relaxed)) {
    DeviceRuntime& rt = device_runtime(device, threads);
    runtime_touched();
    return rt;
  }
  // The thread counts this thread last set, at the epoch it set them in:
  // OpenMP's count is per thread, OpenBLAS's the process's, so any other
  // setting since (another thread's, compare's) makes this thread set them
  // again.
  thread_local std::uint64_t set_at = 0;
  thread_local int set_threads = -1;
  static std::atomic<DeviceRuntime*> cpu{nullptr};
  DeviceRuntime* rt = cpu.load(std::memory_order_acquire);
  if (rt && set_threads == threads && set_at == runtime_epoch.load(std::memory_order_acquire)) return *rt;
  rt = &device_runtime(device, threads);
  cpu.store(rt, std::memory_order_release);
  set_at = runtime_epoch.fetch_add(1, std::memory_order_acq_rel) + 1;
  set_threads = threads;
  return *rt;
}

void runtime_touched() { runtime_epoch.fetch_add(1, std::memory_order_acq_rel); }

Call finish_call(Problem p, Inputs in, Tensor out, const std::string& backend, std::uintptr_t stream, int threads) {
  Backend& b = resolve(p, backend, p.pass == Pass::Forward ? Use::Inference : Use::Autograd, layout_of(p, in));
  DeviceRuntime& rt = runtime_for(p.device, threads);
  return Call{std::move(p),
              std::move(in),
              std::move(out),
              &b,
              RunContext{rt.allocator(), reinterpret_cast<void*>(stream), threads},
              nullptr};
}

void set_descales(Call& c, const std::optional<Descale>& q, const std::optional<Descale>& k,
                  const std::optional<Descale>& v) {
  const std::pair<const char*, const std::optional<Descale>*> given[] = {
      {"q_descale", &q}, {"k_descale", &k}, {"v_descale", &v}};
  float* slots[] = {&c.in.q_descale, &c.in.k_descale, &c.in.v_descale};
  Tensor* tensors[] = {&c.in.q_descale_tensor, &c.in.k_descale_tensor, &c.in.v_descale_tensor};
  for (std::size_t i = 0; i < 3; ++i) {
    const auto& [name, d] = given[i];
    *slots[i] = 1.0f;
    *tensors[i] = Tensor();
    if (!*d) continue;
    if (!is_fp8(c.p.dtype)) {
      fail(ErrorKind::InvalidArgument, std::string(name) + " applies to fp8 (float8_e4m3fn) inputs only; q is " +
                                           std::string(dtype_name(c.p.dtype)));
    }
    double value = 0;
    if (const In* a = std::get_if<In>(&**d)) {
      Tensor t = descale_view(name, array_of(*a));
      if (t.device() != Device::Cpu && t.device() != c.p.device) {
        fail(ErrorKind::InvalidArgument, std::string(name) + " is on " + std::string(device_name(t.device())) +
                                             " but q is on " + std::string(device_name(c.p.device)) +
                                             ": pass it on q's device (or the CPU, or a number)");
      }
      if (t.device() == c.p.device && c.p.device != Device::Cpu) {
        // Read only by the kernels, in the caller's stream order; the checking
        // mode reads it first (in that order) to name a bad value.
        if (checking_inputs()) {
          const Tensor host = device_runtime(c.p.device).download(t, c.ctx.stream);
          check_fp8_descale(name, host.data_as<const float>()[0]);
        }
        *tensors[i] = t;
        continue;
      }
      value = t.data_as<const float>()[0];  // host memory: nothing to wait for
    } else {
      value = std::get<double>(**d);
    }
    check_fp8_descale(name, value);
    const float f = static_cast<float>(value);
    if (!(std::isfinite(f) && f > 0)) {
      fail(ErrorKind::InvalidArgument, std::string(name) + " is beyond float32's range (the kernels take a float)");
    }
    *slots[i] = f;
  }
}

Call prepare(const Array& q, const Array& k, const Array& v, const Array& out, const CallArgs& a, const Extras& x) {
  check_threads(a.threads);
  const Device device = device_of("q", q);
  const DType dtype = dtype_of("q", q);
  require_like_q("k", k, q, device, dtype);
  require_like_q("v", v, q, device, dtype);
  require_like_q("out", out, q, device, output_dtype(dtype));  // bf16 for fp8 inputs
  const bool paged = x.block_table || x.seq_lens;
  if (paged && x.attn_mask) {
    fail(ErrorKind::InvalidArgument,
         "attn_mask with a paged KV cache: seq_lens says each sequence's keys (and mask= their alignment)");
  }
  if (paged && a.pass != Pass::Forward) {
    fail(ErrorKind::Unsupported, "a paged KV cache is inference only: no gradients flow into the caches");
  }
  Inputs in;
  in.q = view_of("q", q, a.options.bshd, device, dtype);
  Tensor o = view_of("out", out, a.options.bshd, device, output_dtype(dtype));
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
    prepare_paged(p, in, k, v, x, dtype, a.stream);
  } else {
    in.k = view_of("k", k, a.options.bshd, device, dtype);
    in.v = view_of("v", v, a.options.bshd, device, dtype);
    require_same("batch", "q", in.q.size(0), "k", in.k.size(0));
    require_same("head_dim", "q", in.q.size(3), "k", in.k.size(3));
    for (int i = 0; i < 4; ++i) require_same("a dimension of k and v", "k", in.k.size(i), "v", in.v.size(i));
    p.kv_heads = in.k.size(1);
    p.kv_seq = in.k.size(2);
  }
  // Per-sequence rows: int32 [B, 2] (kv_rows also [B, 1], key ends) on q's
  // device; their values are read by the backend that takes them (on the
  // CPU, checked there on the host).
  const std::pair<const char*, const std::optional<Array>*> row_args[] = {{"q_rows", &x.q_rows},
                                                                          {"kv_rows", &x.kv_rows}};
  for (const auto& [name, arr] : row_args) {
    if (!*arr) continue;
    if (paged) fail(ErrorKind::InvalidArgument, std::string(name) + " with a paged KV cache: seq_lens says its keys");
    if (x.attn_mask) {
      fail(ErrorKind::InvalidArgument,
           std::string(name) +
               " with attn_mask: rows take a structural mask (mask=), a key-padding attn_mask is "
               "lowered to rows when passed with mask=");
    }
    const bool keys = std::string_view(name) == "kv_rows";
    (keys ? in.kv_rows : in.q_rows) = rows_view(name, **arr, p.batch, device, /*ends_ok=*/keys);
  }
  Tensor mask_tensor;
  if (x.attn_mask) {
    if (!a.options.mask.empty()) {
      fail(ErrorKind::InvalidArgument, "attn_mask and mask='" + a.options.mask +
                                           "' are exclusive: the tensor is the whole mask (leave mask unset, or "
                                           "fold the causal part into the tensor)");
    }
    mask_tensor = mask_view(*x.attn_mask, p.device);
    p.mask = mask_kind_of("attn_mask", mask_tensor.dtype());
  } else {
    set_mask(p, a.options.mask.empty() ? std::string("causal") : a.options.mask);
  }
  apply_problem_args(p, problem_args(a.options, a.pass));
  p.normalize().validate();
  if (mask_tensor.defined()) attach_mask(p, mask_tensor, in, "attn_mask");
  return finish_call(std::move(p), std::move(in), std::move(o), a.options.backend, a.stream, a.threads);
}

}  // namespace attnprof::python
