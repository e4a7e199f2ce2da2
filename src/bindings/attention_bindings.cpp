// attention(), attention_train() and attention_backward() on the caller's
// dense (or paged) arrays: python/attnprof/__init__.py and _torch.py call them.
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "attnprof/check_inputs.h"
#include "attnprof/error.h"
#include "bindings/bindings.h"
#include "bindings/def_call.h"
#include "bindings/forward_entry.h"

namespace attnprof::python {

// The extension's description of a tensor (bindings/forward_entry.h) is DLPack's.
Array entry_array(const AttnprofArray& a) {
  return {a.data,      static_cast<std::size_t>(a.ndim),    a.shape, a.strides, a.device_type,
          a.device_id, nb::dlpack::dtype{a.code, a.bits, 1}};
}

namespace {

std::optional<Array> optional_array(const std::optional<In>& a) {
  return a ? std::optional<Array>(array_of(*a)) : std::nullopt;
}

// softmax(scale * Q K^T + mask) V of the caller's arrays into the caller's
// `out`, on the caller's stream (a cudaStream_t as an integer; 0 = legacy
// default). Returns the backend that ran.
std::string attention(const CallOptions& o, const In& q, const In& k, const In& v, const Out& out,
                      std::uintptr_t stream, int threads, const std::optional<In>& attn_mask,
                      const std::optional<In>& block_table, const std::optional<In>& seq_lens,
                      const std::optional<Descale>& q_descale, const std::optional<Descale>& k_descale,
                      const std::optional<Descale>& v_descale, const std::optional<In>& q_rows,
                      const std::optional<In>& kv_rows) {
  const ThreadCountsKept kept;
  Call c = prepare_cached(array_of(q), array_of(k), array_of(v), array_of(out), {o, stream, threads, Pass::Forward},
                          Extras{optional_array(attn_mask), optional_array(block_table), optional_array(seq_lens),
                                 optional_array(q_rows), optional_array(kv_rows)});
  set_descales(c, q_descale, k_descale, v_descale);  // per call: not part of the cached preparation
  run(c, [&] { c.forward(); });
  return std::string(c.backend->name());
}

// attention() for the torch extension's fast path (bindings/forward_entry.h):
// the same preparation (through the call cache) and run, on arrays the
// extension read from the tensors themselves, its index arrays included.
int forward_entry(const AttnprofArray* q, const AttnprofArray* k, const AttnprofArray* v, const AttnprofArray* out,
                  const AttnprofArray* const* indices, const AttnprofForwardArgs* a, char* error,
                  std::size_t error_len) {
  return entry_call(error, error_len, [&] {
    const ThreadCountsKept kept;
    const CallOptions options = call_options(*a);
    const auto index = [&](int i) {
      return indices[i] != nullptr ? std::optional<Array>(entry_array(*indices[i])) : std::nullopt;
    };
    Call c = prepare_cached(entry_array(*q), entry_array(*k), entry_array(*v), entry_array(*out),
                            {options, a->stream, a->threads, Pass::Forward},
                            Extras{std::nullopt, index(0), index(1), index(2), index(3)});
    set_descales(c, std::nullopt, std::nullopt, std::nullopt);
    run(c, [&] { c.forward(); });
  });
}

// The forward of a training step: `out` as attention() writes it, and the
// saved log-sum-exp (FP32 [B, H, S], held by the library's allocator until
// the returned array is dropped). Backends whose backward reads saved
// probabilities (the composites) are refused: autograd through attnprof keeps
// what the fused backwards keep.
std::tuple<std::string, nb::ndarray<float>> attention_train(const CallOptions& o, const In& q, const In& k, const In& v,
                                                            const Out& out, std::uintptr_t stream, int threads,
                                                            const std::optional<In>& attn_mask,
                                                            const std::optional<In>& q_rows,
                                                            const std::optional<In>& kv_rows) {
  const ThreadCountsKept kept;
  Call c = prepare_cached(array_of(q), array_of(k), array_of(v), array_of(out), {o, stream, threads, Pass::Train},
                          Extras{optional_array(attn_mask), {}, {}, optional_array(q_rows), optional_array(kv_rows)});
  Saved saved;
  run(c, [&] { c.backend->forward_train(c.p, c.in, c.out, saved, c.ctx); });
  const std::size_t shape[3] = {static_cast<std::size_t>(c.p.batch), static_cast<std::size_t>(c.p.heads),
                                static_cast<std::size_t>(c.p.seq)};
  const std::int64_t strides[3] = {saved.lse.stride(0), saved.lse.stride(1), saved.lse.stride(2)};
  return {std::string(c.backend->name()), owned_lse(saved.lse, c.p.device, 3, shape, strides)};
}

// dQ, dK and dV for the upstream gradient dout into the caller's dq, dk, dv,
// from the forward's out and log-sum-exp (attention_train's), on `stream`.
std::string attention_backward(const CallOptions& o, const In& dout, const In& q, const In& k, const In& v,
                               const Out& out, const In& lse, const Out& dq, const Out& dk, const Out& dv,
                               std::uintptr_t stream, int threads, const std::optional<In>& attn_mask,
                               const std::optional<In>& q_rows, const std::optional<In>& kv_rows) {
  const ThreadCountsKept kept;
  Call c = prepare_cached(array_of(q), array_of(k), array_of(v), array_of(out), {o, stream, threads, Pass::Train},
                          Extras{optional_array(attn_mask), {}, {}, optional_array(q_rows), optional_array(kv_rows)});
  c.p.pass = Pass::Backward;  // the call itself; planned as the training step it is part of
  const Tensor d_out = c.view_like("dout", array_of(dout), c.out, o.bshd);
  Gradients g = c.gradients(array_of(dq), array_of(dk), array_of(dv), o.bshd);
  if (lse.ndim() != 3 || lse.dtype() != nb::dtype<float>() || device_of("lse", array_of(lse)) != c.p.device) {
    fail(ErrorKind::InvalidArgument, "lse must be attention_train's float32 [B, H, S] log-sum-exp on q's device");
  }
  Saved saved;
  for (int i = 0; i < 3; ++i)
    require_same("a dimension of lse and q", "lse", static_cast<std::int64_t>(lse.shape(i)), "q", c.out.size(i));
  saved.lse =
      Tensor::from_blob(const_cast<void*>(static_cast<const void*>(lse.data())), {c.p.batch, c.p.heads, c.p.seq, 1},
                        {lse.stride(0), lse.stride(1), lse.stride(2), 1}, DType::F32, c.p.device);
  run(c, [&] { c.backend->backward(c.p, c.in, c.out, d_out, saved, g, c.ctx); });
  return std::string(c.backend->name());
}

// ---- Host time by piece (bench/python_overhead.py) ----

// attention() stopped after a stage, with its very arguments (so the
// argument conversion costs what attention()'s does): 0 returns once the
// arguments are converted, 1 once the call is prepared (views, problem,
// plan), 2 runs it as attention() does.
std::string attention_until(const CallOptions& o, int stage, const In& q, const In& k, const In& v, const Out& out,
                            std::uintptr_t stream, int threads, const std::optional<In>& attn_mask,
                            const std::optional<In>& block_table, const std::optional<In>& seq_lens) {
  const ThreadCountsKept kept;
  if (stage <= 0) return {};
  Call c = prepare_cached(array_of(q), array_of(k), array_of(v), array_of(out), {o, stream, threads, Pass::Forward},
                          Extras{optional_array(attn_mask), optional_array(block_table), optional_array(seq_lens)});
  if (stage == 1) return {};
  run(c, [&] { c.forward(); });
  return std::string(c.backend->name());
}

// The C++ call of the same problem: `calls` back-to-back forwards of one
// prepared call, each timed alone (us), as the runner's --unprofiled-calls
// times them (a quarter as many untimed first; a device synchronisation
// before and after, none between).
std::vector<double> time_forward(const CallOptions& o, const In& q, const In& k, const In& v, const Out& out,
                                 std::uintptr_t stream, int threads, int calls) {
  const ThreadCountsKept kept;
  Call c = prepare_cached(array_of(q), array_of(k), array_of(v), array_of(out), {o, stream, threads, Pass::Forward});
  std::vector<double> us(static_cast<std::size_t>(std::max(calls, 0)));
  nb::gil_scoped_release unlocked;
  DeviceRuntime& rt = runtime_for(c.p.device, threads);
  rt.synchronize();
  for (int i = 0; i < std::max(2, calls / 4); ++i) c.forward();  // untimed, as the runner's
  for (double& t : us) {
    const auto t0 = std::chrono::steady_clock::now();
    c.forward();
    t = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }
  rt.synchronize();
  return us;
}

// The call's preparation alone (prepare_cached(), a hit after the first),
// `calls` times back to back, each timed alone (us).
std::vector<double> time_prepare(const CallOptions& o, const In& q, const In& k, const In& v, const Out& out,
                                 std::uintptr_t stream, int threads, int calls) {
  const ThreadCountsKept kept;
  const Array aq = array_of(q), ak = array_of(k), av = array_of(v), ao = array_of(out);
  const CallArgs args{o, stream, threads, Pass::Forward};
  std::vector<double> us(static_cast<std::size_t>(std::max(calls, 0)));
  prepare_cached(aq, ak, av, ao, args);
  for (double& t : us) {
    const auto t0 = std::chrono::steady_clock::now();
    { const Call c = prepare_cached(aq, ak, av, ao, args); }
    t = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }
  return us;
}

}  // namespace

void bind_attention(nb::module_& m) {
  // After the arrays every argument is a keyword (python/attnprof passes them by name); the plain options
  // (call_options.h: backend, mask "" for causal or with attn_mask the tensor alone, ...) follow, by def_call.h.
  def_call<kForwardTakes>(
      m, "attention", &attention, nb::arg("q").noconvert(), nb::arg("k").noconvert(), nb::arg("v").noconvert(),
      nb::arg("out").noconvert(), nb::kw_only(), nb::arg("stream") = 0, nb::arg("threads") = 0,
      nb::arg("attn_mask").noconvert().none() = nb::none(), nb::arg("block_table").noconvert().none() = nb::none(),
      nb::arg("seq_lens").noconvert().none() = nb::none(), nb::arg("q_descale").none() = nb::none(),
      nb::arg("k_descale").none() = nb::none(), nb::arg("v_descale").none() = nb::none(),
      nb::arg("q_rows").noconvert().none() = nb::none(), nb::arg("kv_rows").noconvert().none() = nb::none(),
      "softmax(scale * q k^T + mask) v into `out`, no copies (fp8 inputs: real = e4m3 x descale, out bf16); "
      "returns the backend that ran");
  def_call<kTrainTakes>(m, "attention_train", &attention_train, nb::arg("q").noconvert(), nb::arg("k").noconvert(),
                        nb::arg("v").noconvert(), nb::arg("out").noconvert(), nb::kw_only(), nb::arg("stream") = 0,
                        nb::arg("threads") = 0, nb::arg("attn_mask").noconvert().none() = nb::none(),
                        nb::arg("q_rows").noconvert().none() = nb::none(),
                        nb::arg("kv_rows").noconvert().none() = nb::none(),
                        "the forward of a training step into `out`; returns (backend, the saved log-sum-exp)");
  def_call<kTrainTakes>(
      m, "attention_backward", &attention_backward, nb::arg("dout").noconvert(), nb::arg("q").noconvert(),
      nb::arg("k").noconvert(), nb::arg("v").noconvert(), nb::arg("out").noconvert(), nb::arg("lse").noconvert(),
      nb::arg("dq").noconvert(), nb::arg("dk").noconvert(), nb::arg("dv").noconvert(), nb::kw_only(),
      nb::arg("stream") = 0, nb::arg("threads") = 0, nb::arg("attn_mask").noconvert().none() = nb::none(),
      nb::arg("q_rows").noconvert().none() = nb::none(), nb::arg("kv_rows").noconvert().none() = nb::none(),
      "dQ, dK, dV into dq, dk, dv; returns the backend that ran");

  def_call<kForwardTakes>(
      m, "_attention_until", &attention_until, nb::arg("stage"), nb::arg("q").noconvert(), nb::arg("k").noconvert(),
      nb::arg("v").noconvert(), nb::arg("out").noconvert(), nb::kw_only(), nb::arg("stream") = 0,
      nb::arg("threads") = 0, nb::arg("attn_mask").noconvert().none() = nb::none(),
      nb::arg("block_table").noconvert().none() = nb::none(), nb::arg("seq_lens").noconvert().none() = nb::none(),
      "attention() up to a stage: 0 the arguments converted, 1 the call prepared, 2 run "
      "(bench/python_overhead.py)");
  def_call<kForwardTakes>(m, "_time_forward", &time_forward, nb::arg("q").noconvert(), nb::arg("k").noconvert(),
                          nb::arg("v").noconvert(), nb::arg("out").noconvert(), nb::kw_only(), nb::arg("stream") = 0,
                          nb::arg("threads") = 0, nb::arg("calls"),
                          "the host time (us) of each of `calls` back-to-back C++ forwards of one prepared call");
  def_call<Takes::none().with("backend").with("mask")>(
      m, "_time_prepare", &time_prepare, nb::arg("q").noconvert(), nb::arg("k").noconvert(), nb::arg("v").noconvert(),
      nb::arg("out").noconvert(), nb::kw_only(), nb::arg("stream") = 0, nb::arg("threads") = 0, nb::arg("calls"),
      "the host time (us) of each of `calls` preparations of one call (a cache hit)");

  // attention(check_inputs=True) holds the checking mode (attnprof/check_inputs.h) around its call.
  m.def("_exchange_checking_inputs", &exchange_checking_inputs, nb::arg("setting"),
        "this thread's checking mode: 1 on, 0 off, -1 the environment's (ATTNPROF_CHECK_INPUTS); returns the previous");
  // Python's one reading of the mode (attnprof/_key_padding.py's checking_inputs): the core's, so that the
  // environment means what it means to C++ and attention(check_inputs=True) reaches Python's checks too.
  m.def("checking_inputs", &checking_inputs,
        "whether the checking mode is on for this thread: its setting, else ATTNPROF_CHECK_INPUTS not '' or '0'");

  // The torch extension's way in (bindings/forward_entry.h; attnprof._torch_call).
  m.def(
      "_forward_entry",
      [] {
        // The entry and the options it takes (call_options.h's table): the extension reads them in that order.
        const AttnprofForwardEntry& entry = forward_entry_of(&forward_entry);
        return nb::capsule(const_cast<AttnprofForwardEntry*>(&entry), kAttnprofForwardCapsule);
      },
      "a capsule holding the C entry of attention()'s forward and its options, for attnprof._torch_call");

  // The call cache (call.cpp), for the tests.
  m.def("_cache_entries", &cache_entries, "prepared calls the call cache holds");
  m.def(
      "_cache_stats",
      [] {
        const CacheStats s = cache_stats();
        nb::dict d;
        d["entries"] = s.entries;
        d["plans"] = s.plans;
        d["workspace_bytes"] = s.workspace_bytes;
        d["hits"] = s.hits;
        d["misses"] = s.misses;
        d["evictions"] = s.evictions;
        d["max_entries"] = kCacheEntries;
        d["max_workspace_bytes"] = kCacheWorkspaceBytes;
        return d;
      },
      "the call cache: entries, plans, their workspace, hits, misses and evictions since the last clear, its bounds");
  m.def("_clear_cache", &clear_cache, "empties the call cache");
  m.def("_use_cache", &use_cache, nb::arg("on"),
        "off: every call prepared afresh, as before the cache (bench/python_overhead.py compares)");

  // The views attention() reads and writes, as (data pointer, sizes, strides)
  // for q, k, v and out: the tests compare them with the caller's own.
  m.def(
      "_views",
      [](const In& q, const In& k, const In& v, const Out& out, bool bshd) {
        const Array aq = array_of(q);
        const Device device = device_of("q", aq);
        const DType t = dtype_of("q", aq);
        std::vector<std::tuple<std::uintptr_t, Dims, Dims>> views;
        for (const Tensor& x :
             {view_of("q", aq, bshd, device, t), view_of("k", array_of(k), bshd, device, t),
              view_of("v", array_of(v), bshd, device, t), view_of("out", array_of(out), bshd, device, t)}) {
          views.emplace_back(reinterpret_cast<std::uintptr_t>(x.data()), x.sizes(), x.strides());
        }
        return views;
      },
      nb::arg("q").noconvert(), nb::arg("k").noconvert(), nb::arg("v").noconvert(), nb::arg("out").noconvert(),
      nb::arg("bshd"));
}

}  // namespace attnprof::python
