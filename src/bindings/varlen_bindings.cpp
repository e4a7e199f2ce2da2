// The calls whose shape lives in index arrays: a packed (variable-length)
// batch, as flash_attn_varlen_func takes one (its bindings here), and a paged
// KV cache's preparation (prepare() calls it for attention(block_table=)).
// A packed batch's cumulative lengths stay on a GPU for flash, whose kernels
// read them in the caller's stream order, and are read on the host (in that
// order) for the others (prepare_varlen); a paged cache's table and lengths
// only on the CPU and in the checking mode (prepare_paged).
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "attnprof/check_inputs.h"
#include "attnprof/device_runtime.h"
#include "attnprof/error.h"
#include "attnprof/limits.h"
#include "attnprof/problem_spec.h"
#include "attnprof/reference.h"
#include "attnprof/runner.h"
#include "bindings/bindings.h"
#include "bindings/def_call.h"

namespace attnprof::python {

// q [B, H, S, D] (bshd: [B, S, H, D]), k and v the caches [num_pages, Hkv,
// page_size, D] (vLLM's layout, whatever the layout of q), block_table int32
// [B, pages_per_seq], seq_lens int32 [B] each sequence's keys.
//
// On the CPU the table and lengths are host memory, checked entry by entry on
// every call: kv_seq is the longest length, and unequal lengths go to
// in.kv_rows as (0, seq_lens[b]) pairs. On a GPU nothing is read on the host
// (attnprof/check_inputs.h): the values may not be written yet when the call
// is made, in the caller's stream order. kv_seq is then the table's capacity
// (pages_per_seq x page_size, so the problem follows from the shapes alone)
// and in.kv_rows is always the caller's seq_lens as key ends ([1, 1, B, 1]),
// which the kernel reads on the device and clamps into range. The checking mode reads both in the caller's stream
// order first and refuses a bad entry as the CPU does.
void prepare_paged(Problem& p, Inputs& in, const Array& k, const Array& v, const Extras& x, DType dtype,
                   std::uintptr_t stream) {
  if (!x.block_table || !x.seq_lens) {
    fail(ErrorKind::InvalidArgument, "a paged KV cache takes block_table= and seq_lens= together");
  }
  in.k_pages = cache_view_of("k_cache", k, p.device, dtype);
  in.v_pages = cache_view_of("v_cache", v, p.device, dtype);
  for (int i = 0; i < 4; ++i)
    require_same("a dimension of k_cache and v_cache", "k_cache", in.k_pages.size(i), "v_cache", in.v_pages.size(i));
  in.block_table = index_view("block_table", *x.block_table, 2, p.device);
  const Tensor lens = index_view("seq_lens", *x.seq_lens, 1, p.device);
  require_same("batch", "q", p.batch, "block_table", in.block_table.size(2));
  require_same("batch", "q", p.batch, "seq_lens", lens.size(3));
  p.kv_heads = in.k_pages.size(1);
  p.page_size = in.k_pages.size(2);
  p.kv_cache = KvCache::Paged;
  require_same("head_dim", "q", p.head_dim, "k_cache", in.k_pages.size(3));
  const std::int64_t capacity = in.block_table.size(3) * p.page_size;
  const bool on_host = p.device == Device::Cpu;
  if (!on_host && lens.size(3) > 1 && lens.stride(3) != 1) {
    fail(ErrorKind::InvalidArgument, "seq_lens must be contiguous on " + std::string(device_name(p.device)) +
                                         " (the kernel reads entry b at b), not of stride " +
                                         std::to_string(lens.stride(3)));
  }
  if (on_host || checking_inputs()) {
    DeviceRuntime* rt = on_host ? nullptr : &device_runtime(p.device);
    void* const s = reinterpret_cast<void*>(stream);
    const Tensor host_lens = rt ? rt->download(lens, s) : lens;
    const Tensor host_table = rt ? rt->download(in.block_table, s) : in.block_table;
    std::int64_t longest = 0;
    bool equal = true;
    // Sequence b's keys are rows 0 .. seq_lens[b] - 1 of its pages: (0, n) pairs, as kv_rows holds them.
    std::vector<std::int32_t> pairs(2 * static_cast<std::size_t>(p.batch));
    for (std::int64_t b = 0; b < p.batch; ++b) {
      const std::int32_t n = host_lens.data_as<const std::int32_t>()[b * host_lens.stride(3)];
      if (n < 0 || n > capacity) {
        fail(ErrorKind::InvalidArgument, "seq_lens[" + std::to_string(b) + "] = " + std::to_string(n) +
                                             " is outside 0 .. " + std::to_string(capacity) + " (the block table's " +
                                             std::to_string(in.block_table.size(3)) + " pages of " +
                                             std::to_string(p.page_size) + " keys)");
      }
      pairs[2 * static_cast<std::size_t>(b) + 1] = n;
      longest = std::max<std::int64_t>(longest, n);
      equal &= n == pairs[1];
    }
    if (longest == 0) fail(ErrorKind::InvalidArgument, "seq_lens are all 0: no sequence has a key to attend");
    Problem checked = p;
    checked.kv_seq = longest;
    checked.validate_kv_cache();
    check_block_table_reads(checked, host_table, in.k_pages.size(0), pairs.data());
    if (on_host) {
      p.kv_seq = longest;
      if (!equal) {
        Tensor rows = Tensor::empty({1, 1, p.batch, 2}, DType::I32, cpu_allocator());
        std::copy(pairs.begin(), pairs.end(), rows.data_as<std::int32_t>());
        in.kv_rows = rows;
      }
    }
  }
  if (!on_host) {
    p.kv_seq = capacity;
    in.kv_rows = lens.as_strided({1, 1, p.batch, 1}, {p.batch, p.batch, lens.stride(3), 1}, lens.offset());
  }
  p.validate_kv_cache();
}

namespace {

// A caller's cumulative lengths as the view [1, 1, 1, batch + 1]: int32,
// 1-d, contiguous, on q's device, at least 2 entries. Nothing is read.
Tensor cu_seqlens_view(const char* name, const Array& cu, Device device) {
  const nb::dlpack::dtype t = cu.dtype;
  if (t.lanes != 1 || t.bits != 32 || t.code != static_cast<std::uint8_t>(nb::dlpack::dtype_code::Int)) {
    fail(ErrorKind::InvalidArgument,
         std::string(name) + " must be int32 (torch.int32), as flash_attn_varlen_func takes it, not " + dtype_text(cu));
  }
  if (device_of(name, cu) != device) {
    fail(ErrorKind::InvalidArgument, std::string(name) + " is on " + where_name(cu) + " but q is on " +
                                         device_name(device) + ": pass cu_seqlens on q's device");
  }
  if (cu.ndim != 1 || (cu.size(0) > 1 && cu.stride(0) != 1)) {
    fail(ErrorKind::InvalidArgument, std::string(name) + " must be a contiguous 1-d array of batch + 1 offsets");
  }
  const auto n = static_cast<std::int64_t>(cu.size(0));
  if (n < 2) (void)lengths_from_cu_seqlens(nullptr, static_cast<std::size_t>(n), 0, name);  // its one-line refusal
  return Tensor::from_blob(const_cast<void*>(cu.data), {1, 1, 1, n}, {n, n, n, 1}, DType::I32, device);
}

// The per-sequence lengths, read on the host and checked entry by entry:
// directly on the CPU, else in the caller's stream order (a wait).
std::vector<std::int64_t> host_lengths(const char* name, const Tensor& cu, std::int64_t total, std::uintptr_t stream) {
  const Tensor host =
      cu.device() == Device::Cpu ? cu : device_runtime(cu.device()).download(cu, reinterpret_cast<void*>(stream));
  return lengths_from_cu_seqlens(host.data_as<const std::int32_t>(), static_cast<std::size_t>(cu.numel()), total, name);
}

// max_seqlen_q or _k as given (None or 0: not given), within the sequence
// limit; flash_attn_varlen_func's caller knows it without a read.
std::optional<std::int64_t> given_max(const char* name, std::optional<std::int64_t> given) {
  if (!given || *given == 0) return std::nullopt;
  if (*given < 0 || *given > limits::kMaxSeq) {
    fail(ErrorKind::InvalidArgument, std::string(name) + " is " + std::to_string(*given) + ": out of range, at most " +
                                         std::to_string(limits::kMaxSeq) +
                                         " (the longest sequence attnprof takes; None or 0: the longest given)");
  }
  return given;
}

// max_seqlen_q and _k, as flash_attn_varlen_func takes them: at least every length.
void check_maxima(const std::vector<std::int64_t>& lens_q, const std::vector<std::int64_t>& lens_k,
                  std::optional<std::int64_t> max_q, std::optional<std::int64_t> max_k) {
  for (const auto& [given, lens, name] :
       {std::tuple{max_q, &lens_q, "max_seqlen_q"}, std::tuple{max_k, &lens_k, "max_seqlen_k"}}) {
    if (!given) continue;
    for (std::size_t b = 0; b < lens->size(); ++b) {
      if ((*lens)[b] > *given) {
        fail(ErrorKind::InvalidArgument, std::string(name) + " is " + std::to_string(*given) +
                                             ", smaller than sequence " + std::to_string(b) + "'s length " +
                                             std::to_string((*lens)[b]));
      }
    }
  }
}

// Where a packed call's lengths are read. On a GPU they stay there for a
// backend whose kernels read them (Traits::device_lengths: flash, and cudnn,
// whose ragged offsets a kernel makes from them), asked for by name or picked
// by auto's rule (runner.h auto_order) where it is eligible; it sizes its
// grid (or graph) by max_seqlen_q and _k (else the packed rows) and clamps
// each sequence's rows on the device: no copy, no wait. Every other backend,
// one named that refuses the lengths unread (cuDNN before 9.25, which cannot
// rule out empty sequences), and the CPU read them on the host, in the
// caller's stream order; so does the checking mode
// (attnprof/check_inputs.h), which refuses a bad entry by name first.
// Returns that backend's name, or nothing: read them on the host.
std::optional<std::string> device_lengths_backend(const Problem& on_device, const std::string& backend) {
  if (on_device.device == Device::Cpu) return std::nullopt;
  const auto reads = [&](std::string_view name) {
    const Backend* b = find_backend(name, on_device.device);
    return b != nullptr && b->traits().device_lengths;
  };
  if (backend != "auto") {
    if (!reads(backend)) return std::nullopt;
    return eligibility_of(*find_backend(backend, on_device.device), on_device).eligible
               ? std::optional<std::string>(backend)
               : std::nullopt;
  }
  for (const std::string_view name : auto_order(on_device.device)) {
    if (reads(name) && eligibility_of(*find_backend(name, on_device.device), on_device).eligible) {
      return std::string(name);
    }
  }
  return std::nullopt;
}

}  // namespace

Call prepare_varlen(const In& q_in, const In& k_in, const In& v_in, const Out& out_in, const Packed& packed,
                    const CallArgs& a) {
  check_threads(a.threads);
  const Array q = array_of(q_in), k = array_of(k_in), v = array_of(v_in), out = array_of(out_in);
  const Device device = device_of("q", q);
  const DType dtype = dtype_of("q", q);
  require_like_q("k", k, q, device, dtype);
  require_like_q("v", v, q, device, dtype);
  require_like_q("out", out, q, device, output_dtype(dtype));  // bf16 for fp8 inputs
  Inputs in;
  in.q = packed_view_of("q", q, device, dtype);
  in.k = packed_view_of("k", k, device, dtype);
  in.v = packed_view_of("v", v, device, dtype);
  Tensor o = packed_view_of("out", out, device, output_dtype(dtype));
  require_writable_layout("out", o);
  require_same("head_dim", "q", in.q.size(3), "k", in.k.size(3));
  for (int i = 0; i < 4; ++i) require_same("a dimension of k and v", "k", in.k.size(i), "v", in.v.size(i));
  for (int i = 0; i < 4; ++i) require_same("a dimension of q and out", "q", in.q.size(i), "out", o.size(i));
  const Tensor cu_q = cu_seqlens_view("cu_seqlens_q", array_of(packed.cu_q), device);
  const Tensor cu_k = cu_seqlens_view("cu_seqlens_k", array_of(packed.cu_k), device);
  const std::int64_t total_q = in.q.size(2), total_k = in.k.size(2);
  // The lengths read on the host, q's entries first (an argument list has no order).
  const auto read_lengths = [&] {
    std::vector<std::int64_t> lens_q = host_lengths("cu_seqlens_q", cu_q, total_q, a.stream);
    return std::pair{std::move(lens_q), host_lengths("cu_seqlens_k", cu_k, total_k, a.stream)};
  };
  // Host memory is checked entry by entry first (it costs no wait).
  std::vector<std::int64_t> lens_q, lens_k;
  if (device == Device::Cpu) std::tie(lens_q, lens_k) = read_lengths();
  if (cu_q.numel() != cu_k.numel()) {
    fail(ErrorKind::InvalidArgument, "cu_seqlens_q has " + std::to_string(cu_q.numel()) +
                                         " entries but cu_seqlens_k has " + std::to_string(cu_k.numel()) +
                                         ": both are batch + 1");
  }
  const std::optional<std::int64_t> max_q = given_max("max_seqlen_q", packed.max_q);
  const std::optional<std::int64_t> max_k = given_max("max_seqlen_k", packed.max_k);
  Problem p;
  p.heads = in.q.size(1);
  p.head_dim = in.q.size(3);
  p.kv_heads = in.k.size(1);
  p.dtype = dtype;
  p.device = device;
  // A packed call names its mask (Python passes "causal" for None): "" is refused, as attention() refuses it.
  set_mask(p, a.options.mask);
  apply_problem_args(p, problem_args(a.options, a.pass));

  Problem on_device = p;
  on_device.lengths_on_device = true;
  on_device.batch = cu_q.numel() - 1;
  on_device.packed_total_q = total_q;
  on_device.packed_total_kv = total_k;
  // A sequence has at most the packed rows: a larger maximum sizes no grid past them.
  on_device.seq = std::min(max_q.value_or(total_q), total_q);
  on_device.kv_seq = std::min(max_k.value_or(total_k), total_k);
  if (const std::optional<std::string> reader = device_lengths_backend(on_device, a.options.backend)) {
    if (checking_inputs()) {
      const auto [checked_q, checked_k] = read_lengths();
      check_maxima(checked_q, checked_k, max_q, max_k);
    }
    in.cu_seqlens_q = cu_q;
    in.cu_seqlens_k = cu_k;
    on_device.normalize().validate();
    return finish_call(std::move(on_device), std::move(in), std::move(o), *reader, a.stream, a.threads);
  }

  if (device != Device::Cpu) std::tie(lens_q, lens_k) = read_lengths();
  p = varlen_problem(p, std::move(lens_q), std::move(lens_k));
  check_maxima(p.seq_lens, p.kv_seq_lens, max_q, max_k);
  if (max_q) p.seq = *max_q;
  if (max_k) p.kv_seq = *max_k;
  p.normalize().validate();
  return finish_call(std::move(p), std::move(in), std::move(o), a.options.backend, a.stream, a.threads);
}

namespace {

std::string attention_varlen(const CallOptions& o, const In& q, const In& k, const In& v, const Out& out,
                             const In& cu_q, const In& cu_k, std::optional<std::int64_t> max_q,
                             std::optional<std::int64_t> max_k, std::uintptr_t stream, int threads,
                             const std::optional<Descale>& q_descale, const std::optional<Descale>& k_descale,
                             const std::optional<Descale>& v_descale) {
  const ThreadCountsKept kept;
  Call c = prepare_varlen_cached(q, k, v, out, {cu_q, cu_k, max_q, max_k}, {o, stream, threads, Pass::Forward});
  set_descales(c, q_descale, k_descale, v_descale);
  run(c, [&] { c.forward(); });
  return std::string(c.backend->name());
}

// The packed training forward: out, and the saved log-sum-exp as FP32
// [H, total_q] (flash_attn_varlen_func's softmax_lse layout).
std::tuple<std::string, nb::ndarray<float>> attention_varlen_train(const CallOptions& o, const In& q, const In& k,
                                                                   const In& v, const Out& out, const In& cu_q,
                                                                   const In& cu_k, std::optional<std::int64_t> max_q,
                                                                   std::optional<std::int64_t> max_k,
                                                                   std::uintptr_t stream, int threads) {
  const ThreadCountsKept kept;
  Call c = prepare_varlen_cached(q, k, v, out, {cu_q, cu_k, max_q, max_k}, {o, stream, threads, Pass::Train});
  Saved saved;
  run(c, [&] { c.backend->forward_train(c.p, c.in, c.out, saved, c.ctx); });
  const std::size_t shape[2] = {static_cast<std::size_t>(c.p.heads), static_cast<std::size_t>(c.p.total_q())};
  const std::int64_t strides[2] = {saved.lse.stride(1), saved.lse.stride(2)};
  return {std::string(c.backend->name()), owned_lse(saved.lse, c.p.device, 2, shape, strides)};
}

std::string attention_varlen_backward(const CallOptions& o, const In& dout, const In& q, const In& k, const In& v,
                                      const Out& out, const In& lse, const Out& dq, const Out& dk, const Out& dv,
                                      const In& cu_q, const In& cu_k, std::optional<std::int64_t> max_q,
                                      std::optional<std::int64_t> max_k, std::uintptr_t stream, int threads) {
  const ThreadCountsKept kept;
  Call c = prepare_varlen_cached(q, k, v, out, {cu_q, cu_k, max_q, max_k}, {o, stream, threads, Pass::Train});
  c.p.pass = Pass::Backward;
  const Tensor d_out = c.view_like("dout", array_of(dout), c.out, false);
  Gradients g = c.gradients(array_of(dq), array_of(dk), array_of(dv), false);
  if (lse.ndim() != 2 || lse.dtype() != nb::dtype<float>() || device_of("lse", array_of(lse)) != c.p.device ||
      static_cast<std::int64_t>(lse.shape(0)) != c.p.heads ||
      static_cast<std::int64_t>(lse.shape(1)) != c.p.total_q()) {
    fail(ErrorKind::InvalidArgument,
         "lse must be attention_varlen_train's float32 [H, total_q] log-sum-exp on q's device");
  }
  Saved saved;
  saved.lse =
      Tensor::from_blob(const_cast<void*>(static_cast<const void*>(lse.data())), {1, c.p.heads, c.p.total_q(), 1},
                        {c.p.heads * c.p.total_q(), lse.stride(0), lse.stride(1), 1}, DType::F32, c.p.device);
  run(c, [&] { c.backend->backward(c.p, c.in, c.out, d_out, saved, g, c.ctx); });
  return std::string(c.backend->name());
}

}  // namespace

// Packed batches: q [total_q, H, D], k and v [total_k, Hkv, D], int32
// cumulative lengths (flash_attn_varlen_func's arguments).
void bind_varlen(nb::module_& m) {
  // After the arrays every argument is a keyword (python/attnprof passes them by name); the plain options
  // (call_options.h; mask named by the caller) follow, by def_call.h.
  def_call<kPackedForwardTakes>(
      m, "attention_varlen", &attention_varlen, nb::arg("q").noconvert(), nb::arg("k").noconvert(),
      nb::arg("v").noconvert(), nb::arg("out").noconvert(), nb::arg("cu_seqlens_q").noconvert(),
      nb::arg("cu_seqlens_k").noconvert(), nb::kw_only(), nb::arg("max_seqlen_q").none() = nb::none(),
      nb::arg("max_seqlen_k").none() = nb::none(), nb::arg("stream") = 0, nb::arg("threads") = 0,
      nb::arg("q_descale").none() = nb::none(), nb::arg("k_descale").none() = nb::none(),
      nb::arg("v_descale").none() = nb::none(),
      "attention over a packed batch into `out` (fp8: q, k and v's descales, out bf16); returns the backend that "
      "ran");
  def_call<kPackedTrainTakes>(
      m, "attention_varlen_train", &attention_varlen_train, nb::arg("q").noconvert(), nb::arg("k").noconvert(),
      nb::arg("v").noconvert(), nb::arg("out").noconvert(), nb::arg("cu_seqlens_q").noconvert(),
      nb::arg("cu_seqlens_k").noconvert(), nb::kw_only(), nb::arg("max_seqlen_q").none() = nb::none(),
      nb::arg("max_seqlen_k").none() = nb::none(), nb::arg("stream") = 0, nb::arg("threads") = 0,
      "the packed training forward into `out`; returns (backend, the saved [H, total_q] log-sum-exp)");
  def_call<kPackedTrainTakes>(
      m, "attention_varlen_backward", &attention_varlen_backward, nb::arg("dout").noconvert(), nb::arg("q").noconvert(),
      nb::arg("k").noconvert(), nb::arg("v").noconvert(), nb::arg("out").noconvert(), nb::arg("lse").noconvert(),
      nb::arg("dq").noconvert(), nb::arg("dk").noconvert(), nb::arg("dv").noconvert(),
      nb::arg("cu_seqlens_q").noconvert(), nb::arg("cu_seqlens_k").noconvert(), nb::kw_only(),
      nb::arg("max_seqlen_q").none() = nb::none(), nb::arg("max_seqlen_k").none() = nb::none(), nb::arg("stream") = 0,
      nb::arg("threads") = 0, "dQ, dK, dV of a packed batch; returns the backend that ran");
}

}  // namespace attnprof::python
