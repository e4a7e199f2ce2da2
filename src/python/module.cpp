// attnprof._core: the Python bindings. Thin by design: arrays come in as
// DLPack views (nb::ndarray, never converted or copied) and become borrowed
// Tensors; problems, backends, eligibility, the pipeline and its tables are
// the library's own calls. attnprof/__init__.py shapes what comes back.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <vector>

#include "attnprof/error.h"
#include "attnprof/mask_tensor.h"
#include "attnprof/problem_spec.h"
#include "attnprof/reference.h"
#include "attnprof/report.h"
#include "attnprof/runner.h"

namespace nb = nanobind;

namespace attnprof::python {
namespace {

// q, k and v are read only (nanobind then takes the cheaper unversioned
// DLPack export); out is written.
using In = nb::ndarray<nb::ro>;
using Out = nb::ndarray<>;

struct Where {
  Device device;
  int id;
};

template <class Array>
std::string where_name(const Array& a) {
  switch (a.device_type()) {
    case nb::device::cpu::value:
      return "cpu";
    case nb::device::cuda::value:
      return "cuda:" + std::to_string(a.device_id());
    default:
      return "DLPack device type " + std::to_string(a.device_type());
  }
}

template <class Array>
Where where_of(const char* name, const Array& a) {
  if (a.device_type() == nb::device::cpu::value) return {Device::Cpu, 0};
  if (a.device_type() == nb::device::cuda::value) {
    // The CUDA runtime (its allocator, cuBLAS and cuDNN handles) is device 0's.
    if (a.device_id() != 0) {
      fail(ErrorKind::Unsupported,
           std::string(name) + " is on " + where_name(a) + ": attnprof runs on cuda:0 (set CUDA_VISIBLE_DEVICES)");
    }
    return {Device::Cuda, 0};
  }
  fail(ErrorKind::Unsupported, std::string(name) + " is on " + where_name(a) + ": attnprof takes CPU and CUDA arrays");
}

template <class Array>
DType dtype_of(const char* name, const Array& a) {
  const nb::dlpack::dtype t = a.dtype();
  if (t.lanes == 1 && t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float)) {
    if (t.bits == 32) return DType::F32;
    if (t.bits == 16) return DType::F16;
  }
  if (t.lanes == 1 && t.bits == 16 && t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat)) {
    return DType::BF16;
  }
  fail(ErrorKind::InvalidArgument, std::string(name) + " has a dtype attnprof does not take (DLPack code " +
                                       std::to_string(t.code) + ", " + std::to_string(t.bits) +
                                       " bits): use float32, float16 or bfloat16");
}

// A borrowed [B, H, S, D] view of a caller's 4-d array; `bshd` reads it as
// [B, S, H, D] (the view swaps the two middle dimensions; nothing moves).
template <class Array>
Tensor view_of(const char* name, const Array& a, bool bshd, Device device, DType dtype) {
  if (a.ndim() != 4) {
    std::string dims = "[";
    for (std::size_t i = 0; i < a.ndim(); ++i) dims += (i ? ", " : "") + std::to_string(a.shape(i));
    fail(ErrorKind::InvalidArgument, std::string(name) + " must be 4-d, " +
                                         (bshd ? "[batch, seq, heads, head_dim]" : "[batch, heads, seq, head_dim]") +
                                         "; got " + std::to_string(a.ndim()) + "-d " + dims + "]");
  }
  Dims sizes{}, strides{};
  // A DLPack producer can claim any shape: sizes past what an int64 offset
  // can address are refused before any arithmetic on them, and so is an
  // empty array (whose strides DLPack leaves meaningless).
  constexpr std::uint64_t kMax = std::uint64_t{1} << 48;
  std::uint64_t elements = 1;
  for (std::size_t i = 0; i < 4; ++i) {
    const std::uint64_t n = a.shape(i);
    const std::int64_t stride = a.stride(i);
    if (n == 0)
      fail(ErrorKind::InvalidArgument,
           std::string(name) + " is empty (dimension " + std::to_string(i) + " has size 0)");
    if (n > kMax || elements > kMax / n) {
      fail(ErrorKind::InvalidArgument,
           std::string(name) + " has more than 2^48 elements: more than attnprof addresses");
    }
    if (stride > static_cast<std::int64_t>(kMax) || stride < -static_cast<std::int64_t>(kMax)) {
      fail(ErrorKind::InvalidArgument,
           std::string(name) + " has a stride beyond 2^48 elements in dimension " + std::to_string(i));
    }
    elements *= n;
    sizes[i] = static_cast<std::int64_t>(n);
    strides[i] = stride;
  }
  // q, k and v are only read, though a Tensor's data is not const.
  Tensor t = Tensor::from_blob(const_cast<void*>(static_cast<const void*>(a.data())), sizes, strides, dtype, device);
  if (bshd) t = t.transpose(1, 2);
  if (!t.rows_contiguous()) {
    fail(ErrorKind::InvalidArgument, std::string(name) + " " + t.describe() +
                                         " has a strided head_dim: attnprof views any batch, head and sequence "
                                         "strides but reads each row of head_dim contiguously (call .contiguous())");
  }
  return t;
}

// The output is written by many threads or blocks at once: no two elements
// may share memory. Dimensions by increasing stride must each step past all
// the elements of the ones below (as_strided views that overlap do not).
void require_writable_layout(const char* name, const Tensor& out) {
  for (int i = 0; i < 4; ++i) {
    if (out.size(i) > 1 && out.stride(i) == 0) {
      fail(ErrorKind::InvalidArgument, std::string(name) + " " + out.describe() +
                                           " is a broadcast view (stride 0 in dimension " + std::to_string(i) +
                                           "): pass a tensor that owns one element per position");
    }
  }
  std::array<int, 4> order{0, 1, 2, 3};
  std::sort(order.begin(), order.end(), [&](int a, int b) { return out.stride(a) < out.stride(b); });
  std::int64_t span = 1;  // elements spanned by the dimensions below
  for (const int i : order) {
    if (out.size(i) <= 1) continue;
    if (out.stride(i) < span) {
      fail(ErrorKind::InvalidArgument, std::string(name) + " " + out.describe() + " overlaps itself (dimension " +
                                           std::to_string(i) +
                                           "'s stride is less than the elements below it span): pass a tensor that "
                                           "owns one element per position");
    }
    span = out.stride(i) * out.size(i);
  }
}

void require_same(const char* what, const char* a_name, std::int64_t a, const char* b_name, std::int64_t b) {
  if (a != b) {
    fail(ErrorKind::InvalidArgument, std::string(what) + " differs: " + a_name + " has " + std::to_string(a) + ", " +
                                         b_name + " has " + std::to_string(b));
  }
}

// What a call needs of its backend beyond the problem: autograd through
// attnprof keeps only what the fused backwards keep (the log-sum-exp), so a
// training step takes a backend that recomputes the probabilities.
enum class Use : std::uint8_t { Inference, Autograd };

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

// attention()'s mask names: the structural ones (a mask tensor comes as attn_mask).
void set_mask(Problem& p, const std::string& mask) {
  set_problem_field(p, "mask", mask);
  if (p.mask == MaskKind::Boolean || p.mask == MaskKind::Bias) {
    fail(ErrorKind::InvalidArgument,
         "mask '" + mask + "' names a mask tensor: pass the tensor as attn_mask=", {"mask"});
  }
}

// What a call may take beyond q, k, v and out: a mask tensor, or a paged KV
// cache's block table and per-sequence lengths (k and v are then the caches).
struct Extras {
  std::optional<In> attn_mask, block_table, seq_lens;
};

std::string dims_of(const In& a) {
  std::string dims = "[";
  for (std::size_t i = 0; i < a.ndim(); ++i) dims += (i ? ", " : "") + std::to_string(a.shape(i));
  return dims + "]";
}

// attn_mask as a borrowed view right-aligned to 4-d (missing leading
// dimensions are size 1), on q's device; broadcast_mask() checks it against
// the problem. Its dtype picks the mask kind: bool, or a float (Bias).
Tensor mask_view(const In& a, Device device) {
  if (a.ndim() < 1 || a.ndim() > 4) {
    fail(ErrorKind::InvalidArgument, "attn_mask " + dims_of(a) + " has " + std::to_string(a.ndim()) +
                                         " dimensions: a mask has 1 to 4, broadcastable to [B, H, S, Skv]");
  }
  if (where_of("attn_mask", a).device != device) {
    fail(ErrorKind::InvalidArgument,
         "attn_mask is on " + where_name(a) + " but q is on " + device_name(device) + ": move the mask to q's device");
  }
  const nb::dlpack::dtype t = a.dtype();
  DType dtype = DType::Bool;
  if (t.lanes == 1 && t.bits == 8 && t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bool)) {
    dtype = DType::Bool;
  } else if (t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float) ||
             t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat)) {
    try {
      dtype = dtype_of("attn_mask", a);
    } catch (const Error&) {
      fail(ErrorKind::InvalidArgument, "attn_mask is a " + std::to_string(t.bits) +
                                           "-bit float: a float mask takes q's dtype (float32, float16 or bfloat16)");
    }
  } else {
    fail(ErrorKind::InvalidArgument, "attn_mask has DLPack dtype code " + std::to_string(t.code) + ", " +
                                         std::to_string(t.bits) +
                                         " bits: a mask is bool (True attends) or an additive float in q's dtype");
  }
  Dims sizes{1, 1, 1, 1}, strides{0, 0, 0, 0};
  const std::size_t lead = 4 - a.ndim();
  for (std::size_t i = 0; i < a.ndim(); ++i) {
    if (a.shape(i) == 0) fail(ErrorKind::InvalidArgument, "attn_mask " + dims_of(a) + " is empty");
    if (a.shape(i) > (std::uint64_t{1} << 31)) {
      fail(ErrorKind::InvalidArgument, "attn_mask " + dims_of(a) + " has a dimension beyond 2^31");
    }
    sizes[lead + i] = static_cast<std::int64_t>(a.shape(i));
    strides[lead + i] = a.shape(i) == 1 ? 0 : a.stride(i);
  }
  return Tensor::from_blob(const_cast<void*>(static_cast<const void*>(a.data())), sizes, strides, dtype, device);
}

// An int32 array of `ndim` dimensions on q's device (block_table, seq_lens),
// as a borrowed [1, 1, .., ..] view.
Tensor index_view(const char* name, const In& a, std::size_t ndim, Device device) {
  const nb::dlpack::dtype t = a.dtype();
  if (t.lanes != 1 || t.bits != 32 || t.code != static_cast<std::uint8_t>(nb::dlpack::dtype_code::Int)) {
    fail(ErrorKind::InvalidArgument, std::string(name) + " must be int32 (DLPack code " + std::to_string(t.code) +
                                         ", " + std::to_string(t.bits) + " bits given)");
  }
  if (a.ndim() != ndim) {
    fail(ErrorKind::InvalidArgument, std::string(name) + " must be " + std::to_string(ndim) + "-d, " +
                                         (ndim == 2 ? "[batch, pages_per_seq]" : "[batch]") + "; got " + dims_of(a));
  }
  if (where_of(name, a).device != device) {
    fail(ErrorKind::InvalidArgument, std::string(name) + " is on " + where_name(a) + " but q is on " +
                                         device_name(device) + ": move it to q's device");
  }
  Dims sizes{1, 1, 1, 1}, strides{0, 0, 0, 0};
  for (std::size_t i = 0; i < ndim; ++i) {
    if (a.shape(i) == 0) fail(ErrorKind::InvalidArgument, std::string(name) + " " + dims_of(a) + " is empty");
    if (a.shape(i) > (std::uint64_t{1} << 31)) {
      fail(ErrorKind::InvalidArgument, std::string(name) + " " + dims_of(a) + " has a dimension beyond 2^31");
    }
    sizes[4 - ndim + i] = static_cast<std::int64_t>(a.shape(i));
    strides[4 - ndim + i] = a.stride(i);
  }
  return Tensor::from_blob(const_cast<void*>(static_cast<const void*>(a.data())), sizes, strides, DType::I32, device);
}

// A paged call: q [B, H, S, D] (bshd: [B, S, H, D]), k and v the caches
// [num_pages, Hkv, page_size, D] (vLLM's layout, whatever the layout of q),
// block_table int32 [B, pages_per_seq], seq_lens int32 [B] each sequence's
// keys. kv_seq is the longest; with unequal lengths in.kv_lens holds them.
// A CUDA table and lengths are read back to check them (a synchronisation).
void prepare_paged(Problem& p, Inputs& in, const In& k, const In& v, const Extras& x, DType dtype) {
  if (!x.block_table || !x.seq_lens) {
    fail(ErrorKind::InvalidArgument, "a paged KV cache takes block_table= and seq_lens= together");
  }
  in.k_pages = view_of("k_cache", k, false, p.device, dtype);
  in.v_pages = view_of("v_cache", v, false, p.device, dtype);
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
  DeviceRuntime* rt = p.device == Device::Cpu ? nullptr : &device_runtime(p.device);
  const Tensor host_lens = rt ? rt->download(lens) : lens;
  const Tensor host_table = rt ? rt->download(in.block_table) : in.block_table;
  const std::int64_t capacity = in.block_table.size(3) * p.page_size;
  std::int64_t longest = 0;
  bool equal = true;
  std::vector<std::int32_t> per_seq(static_cast<std::size_t>(p.batch));
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const std::int32_t n = host_lens.data_as<const std::int32_t>()[b * host_lens.stride(3)];
    if (n < 0 || n > capacity) {
      fail(ErrorKind::InvalidArgument, "seq_lens[" + std::to_string(b) + "] = " + std::to_string(n) +
                                           " is outside 0 .. " + std::to_string(capacity) + " (the block table's " +
                                           std::to_string(in.block_table.size(3)) + " pages of " +
                                           std::to_string(p.page_size) + " keys)");
    }
    per_seq[static_cast<std::size_t>(b)] = n;
    longest = std::max<std::int64_t>(longest, n);
    equal &= b == 0 || n == per_seq[0];
  }
  if (longest == 0) fail(ErrorKind::InvalidArgument, "seq_lens are all 0: no sequence has a key to attend");
  p.kv_seq = longest;
  p.validate_kv_cache();
  check_block_table_reads(p, host_table, in.k_pages.size(0), equal ? nullptr : per_seq.data());
  if (!equal) in.kv_lens = lens;
}

// One call on the caller's arrays: their borrowed views, the problem they
// make, the backend that runs it and the context on the caller's stream.
struct Call {
  Problem p;
  Inputs in;
  Tensor out;
  Backend* backend = nullptr;
  RunContext ctx;

  // A borrowed view of another array of the call (dO, the gradients): q's
  // device and dtype, the same layout, and `like`'s sizes.
  template <class Array>
  Tensor view_like(const char* name, const Array& a, const Tensor& like, bool bshd) const {
    const Tensor t = view_of(name, a, bshd, p.device, p.dtype);
    if (where_of(name, a).device != p.device || dtype_of(name, a) != p.dtype) {
      fail(ErrorKind::InvalidArgument, std::string(name) + " must be on q's device with q's dtype");
    }
    for (int i = 0; i < 4; ++i) require_same(name, name, t.size(i), "its counterpart", like.size(i));
    return t;
  }
};

// As the pipeline bounds them (check_before_work): thousands of threads
// would each be created, with an OpenBLAS buffer apiece.
void check_threads(int threads) {
  if (threads < 0 || threads > 4096) {
    fail(ErrorKind::InvalidArgument, "threads must be from 0 (every core) to 4096, got " + std::to_string(threads));
  }
}

// A soft cap from Python through the parser, as the CLI's text: 0 or less,
// NaN and inf are refused there. None leaves no cap.
void set_softcap(Problem& p, std::optional<double> softcap) {
  if (!softcap) return;
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, *softcap);
  set_problem_field(p, "softcap", std::string_view(buf, ec == std::errc() ? static_cast<std::size_t>(end - buf) : 0));
}

// The calls of a training step resolve `auto` as one problem, the training
// step's (pass train, its deterministic): the backward must run on the backend
// whose forward saved its tensors.
Call prepare(const In& q, const In& k, const In& v, const Out& out, const std::string& backend, const std::string& mask,
             std::optional<std::int64_t> window, std::optional<double> scale, std::uintptr_t stream, int threads,
             bool bshd, Pass pass, bool deterministic, std::optional<double> softcap, const Extras& x = {}) {
  check_threads(threads);
  const Where wq = where_of("q", q);
  const DType dtype = dtype_of("q", q);
  const auto same_place = [&](const char* name, const auto& a) {
    if (where_of(name, a).device != wq.device) {
      fail(ErrorKind::InvalidArgument, std::string("q and ") + name + " are on different devices: q on " +
                                           where_name(q) + ", " + name + " on " + where_name(a) +
                                           "; move them to one device");
    }
    if (const DType t = dtype_of(name, a); t != dtype) {
      fail(ErrorKind::InvalidArgument, std::string("q is ") + std::string(dtype_name(dtype)) + " but " + name + " is " +
                                           std::string(dtype_name(t)) + ": pass one dtype");
    }
  };
  same_place("k", k);
  same_place("v", v);
  same_place("out", out);
  const bool paged = x.block_table || x.seq_lens;
  if (paged && x.attn_mask) {
    fail(ErrorKind::InvalidArgument,
         "attn_mask with a paged KV cache: seq_lens says each sequence's keys (and mask= their alignment)");
  }
  if (paged && pass != Pass::Forward) {
    fail(ErrorKind::Unsupported, "a paged KV cache is inference only: no gradients flow into the caches");
  }
  Inputs in;
  in.q = view_of("q", q, bshd, wq.device, dtype);
  Tensor o = view_of("out", out, bshd, wq.device, dtype);
  require_writable_layout("out", o);
  for (int i = 0; i < 4; ++i) require_same("a dimension of q and out", "q", in.q.size(i), "out", o.size(i));

  Problem p;
  p.batch = in.q.size(0);
  p.heads = in.q.size(1);
  p.seq = in.q.size(2);
  p.head_dim = in.q.size(3);
  p.dtype = dtype;
  p.device = wq.device;
  if (paged) {
    prepare_paged(p, in, k, v, x, dtype);
  } else {
    in.k = view_of("k", k, bshd, wq.device, dtype);
    in.v = view_of("v", v, bshd, wq.device, dtype);
    require_same("batch", "q", in.q.size(0), "k", in.k.size(0));
    require_same("head_dim", "q", in.q.size(3), "k", in.k.size(3));
    for (int i = 0; i < 4; ++i) require_same("a dimension of k and v", "k", in.k.size(i), "v", in.v.size(i));
    p.kv_heads = in.k.size(1);
    p.kv_seq = in.k.size(2);
  }
  Tensor mask_tensor;
  if (x.attn_mask) {
    if (!mask.empty()) {
      fail(ErrorKind::InvalidArgument, "attn_mask and mask='" + mask +
                                           "' are exclusive: the tensor is the whole mask (leave mask unset, or "
                                           "fold the causal part into the tensor)");
    }
    mask_tensor = mask_view(*x.attn_mask, p.device);
    p.mask = mask_kind_of("attn_mask", mask_tensor.dtype());
  } else {
    set_mask(p, mask.empty() ? std::string("causal") : mask);
  }
  if (window) set_problem_field(p, "window", std::to_string(*window));
  p.scale = scale;
  p.pass = pass;
  p.deterministic = deterministic;
  set_softcap(p, softcap);
  p.normalize().validate();
  if (mask_tensor.defined()) attach_mask(p, mask_tensor, in, "attn_mask");

  Backend& b = resolve(p, backend, pass == Pass::Forward ? Use::Inference : Use::Autograd, in.kv_lens.defined());
  DeviceRuntime& rt = device_runtime(p.device, threads);
  return Call{p, std::move(in), std::move(o), &b, RunContext{rt.allocator(), reinterpret_cast<void*>(stream), threads}};
}

// Runs `work` with the GIL released on the CPU (milliseconds of work; other
// Python threads run meanwhile); on a GPU it is an asynchronous launch.
template <class Work>
void run(const Call& c, Work&& work) {
  if (c.p.device == Device::Cpu) {
    nb::gil_scoped_release unlocked;
    work();
  } else {
    work();
  }
}

// softmax(scale * Q K^T + mask) V of the caller's arrays into the caller's
// `out`, on the caller's stream (a cudaStream_t as an integer; 0 = legacy
// default). Returns the backend that ran.
std::string attention(const In& q, const In& k, const In& v, const Out& out, const std::string& backend,
                      const std::string& mask, std::optional<std::int64_t> window, std::optional<double> scale,
                      std::uintptr_t stream, int threads, bool bshd, std::optional<double> softcap,
                      const std::optional<In>& attn_mask, const std::optional<In>& block_table,
                      const std::optional<In>& seq_lens) {
  Call c = prepare(q, k, v, out, backend, mask, window, scale, stream, threads, bshd, Pass::Forward, false, softcap,
                   Extras{attn_mask, block_table, seq_lens});
  run(c, [&] { c.backend->forward(c.p, c.in, c.out, c.ctx); });
  return std::string(c.backend->name());
}

// The forward of a training step: `out` as attention() writes it, and the
// saved log-sum-exp (FP32 [B, H, S], held by the library's allocator until
// the returned array is dropped). Backends whose backward reads saved
// probabilities (the composites) are refused: autograd through attnprof keeps
// what the fused backwards keep.
using Lse = nb::ndarray<float, nb::ndim<3>>;
std::tuple<std::string, Lse> attention_train(const In& q, const In& k, const In& v, const Out& out,
                                             const std::string& backend, const std::string& mask,
                                             std::optional<std::int64_t> window, std::optional<double> scale,
                                             std::uintptr_t stream, int threads, bool bshd, bool deterministic,
                                             std::optional<double> softcap, const std::optional<In>& attn_mask) {
  Call c = prepare(q, k, v, out, backend, mask, window, scale, stream, threads, bshd, Pass::Train, deterministic,
                   softcap, Extras{attn_mask, {}, {}});
  Saved saved;
  run(c, [&] { c.backend->forward_train(c.p, c.in, c.out, saved, c.ctx); });
  auto* held = new Tensor(saved.lse);
  nb::capsule owner(held, [](void* t) noexcept { delete static_cast<Tensor*>(t); });
  const std::size_t shape[3] = {static_cast<std::size_t>(c.p.batch), static_cast<std::size_t>(c.p.heads),
                                static_cast<std::size_t>(c.p.seq)};
  const std::int64_t strides[3] = {held->stride(0), held->stride(1), held->stride(2)};
  const int device_type = c.p.device == Device::Cpu ? nb::device::cpu::value : nb::device::cuda::value;
  return {std::string(c.backend->name()),
          Lse(held->data(), 3, shape, owner, strides, nb::dtype<float>(), device_type, 0)};
}

// dQ, dK and dV for the upstream gradient dout into the caller's dq, dk, dv,
// from the forward's out and log-sum-exp (attention_train's), on `stream`.
std::string attention_backward(const In& dout, const In& q, const In& k, const In& v, const Out& out, const In& lse,
                               const Out& dq, const Out& dk, const Out& dv, const std::string& backend,
                               const std::string& mask, std::optional<std::int64_t> window, std::optional<double> scale,
                               std::uintptr_t stream, int threads, bool bshd, bool deterministic,
                               std::optional<double> softcap, const std::optional<In>& attn_mask) {
  Call c = prepare(q, k, v, out, backend, mask, window, scale, stream, threads, bshd, Pass::Train, deterministic,
                   softcap, Extras{attn_mask, {}, {}});
  c.p.pass = Pass::Backward;  // the call itself; planned as the training step it is part of
  const Tensor d_out = c.view_like("dout", dout, c.out, bshd);
  Gradients g{c.view_like("dq", dq, c.in.q, bshd), c.view_like("dk", dk, c.in.k, bshd),
              c.view_like("dv", dv, c.in.v, bshd)};
  require_writable_layout("dq", g.dq);
  require_writable_layout("dk", g.dk);
  require_writable_layout("dv", g.dv);
  if (lse.ndim() != 3 || lse.dtype() != nb::dtype<float>() || where_of("lse", lse).device != c.p.device) {
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

// ---- Packed (variable-length) batches, as flash_attn_varlen_func takes them ----

// A borrowed [1, H, total, D] view of a caller's packed [total, H, D] array.
template <class Array>
Tensor packed_view_of(const char* name, const Array& a, Device device, DType dtype) {
  if (a.ndim() != 3) {
    std::string dims = "[";
    for (std::size_t i = 0; i < a.ndim(); ++i) dims += (i ? ", " : "") + std::to_string(a.shape(i));
    fail(ErrorKind::InvalidArgument, std::string(name) +
                                         " must be 3-d with cu_seqlens, [total, heads, head_dim]; got " +
                                         std::to_string(a.ndim()) + "-d " + dims + "]");
  }
  constexpr std::uint64_t kMax = std::uint64_t{1} << 48;
  std::uint64_t elements = 1;
  for (std::size_t i = 0; i < 3; ++i) {
    const std::uint64_t n = a.shape(i);
    if (n == 0)
      fail(ErrorKind::InvalidArgument,
           std::string(name) + " is empty (dimension " + std::to_string(i) + " has size 0)");
    if (n > kMax || elements > kMax / n || a.stride(i) > static_cast<std::int64_t>(kMax) ||
        a.stride(i) < -static_cast<std::int64_t>(kMax)) {
      fail(ErrorKind::InvalidArgument, std::string(name) + " has sizes or strides beyond 2^48 elements");
    }
    elements *= n;
  }
  const auto total = static_cast<std::int64_t>(a.shape(0));
  const Dims sizes{1, static_cast<std::int64_t>(a.shape(1)), total, static_cast<std::int64_t>(a.shape(2))};
  const Dims strides{total * a.stride(0), a.stride(1), a.stride(0), a.stride(2)};
  Tensor t = Tensor::from_blob(const_cast<void*>(static_cast<const void*>(a.data())), sizes, strides, dtype, device);
  if (!t.rows_contiguous()) {
    fail(ErrorKind::InvalidArgument, std::string(name) + " " + t.describe() +
                                         " has a strided head_dim: rows of head_dim are read contiguously "
                                         "(call .contiguous())");
  }
  return t;
}

// Per-sequence lengths from a caller's cu_seqlens: int32, 1-d, contiguous, on
// q's device (read back to the host there), checked entry by entry.
std::vector<std::int64_t> lengths_of(const char* name, const In& cu, Device device, std::int64_t total) {
  const nb::dlpack::dtype t = cu.dtype();
  if (t.lanes != 1 || t.bits != 32 || t.code != static_cast<std::uint8_t>(nb::dlpack::dtype_code::Int)) {
    fail(ErrorKind::InvalidArgument, std::string(name) +
                                         " must be int32 (torch.int32), as flash_attn_varlen_func "
                                         "takes it; got DLPack code " +
                                         std::to_string(t.code) + ", " + std::to_string(t.bits) + " bits");
  }
  if (where_of(name, cu).device != device) {
    fail(ErrorKind::InvalidArgument, std::string(name) + " is on " + where_name(cu) + " but q is on " +
                                         device_name(device) + ": pass cu_seqlens on q's device");
  }
  if (cu.ndim() != 1 || (cu.shape(0) > 1 && cu.stride(0) != 1)) {
    fail(ErrorKind::InvalidArgument, std::string(name) + " must be a contiguous 1-d array of batch + 1 offsets");
  }
  const auto n = static_cast<std::int64_t>(cu.shape(0));
  if (n == 0) return lengths_from_cu_seqlens(nullptr, 0, total, name);
  Tensor view = Tensor::from_blob(const_cast<void*>(static_cast<const void*>(cu.data())), {1, 1, 1, n}, {n, n, n, 1},
                                  DType::I32, device);
  const Tensor host = device == Device::Cpu ? view : device_runtime(device).download(view);
  return lengths_from_cu_seqlens(host.data_as<const std::int32_t>(), static_cast<std::size_t>(n), total, name);
}

// One packed call: q [total_q, H, D], k and v [total_k, Hkv, D], out like q.
Call prepare_varlen(const In& q, const In& k, const In& v, const Out& out, const In& cu_q, const In& cu_k,
                    std::optional<std::int64_t> max_q, std::optional<std::int64_t> max_k, const std::string& backend,
                    const std::string& mask, std::optional<std::int64_t> window, std::optional<double> scale,
                    std::uintptr_t stream, int threads, Pass pass, bool deterministic, std::optional<double> softcap) {
  check_threads(threads);
  const Where wq = where_of("q", q);
  const DType dtype = dtype_of("q", q);
  const auto same_place = [&](const char* name, const auto& a) {
    if (where_of(name, a).device != wq.device || dtype_of(name, a) != dtype) {
      fail(ErrorKind::InvalidArgument, std::string(name) + " must be on q's device with q's dtype (q is " +
                                           std::string(dtype_name(dtype)) + " on " + where_name(q) + ")");
    }
  };
  same_place("k", k);
  same_place("v", v);
  same_place("out", out);
  Inputs in;
  in.q = packed_view_of("q", q, wq.device, dtype);
  in.k = packed_view_of("k", k, wq.device, dtype);
  in.v = packed_view_of("v", v, wq.device, dtype);
  Tensor o = packed_view_of("out", out, wq.device, dtype);
  require_writable_layout("out", o);
  require_same("head_dim", "q", in.q.size(3), "k", in.k.size(3));
  for (int i = 0; i < 4; ++i) require_same("a dimension of k and v", "k", in.k.size(i), "v", in.v.size(i));
  for (int i = 0; i < 4; ++i) require_same("a dimension of q and out", "q", in.q.size(i), "out", o.size(i));
  std::vector<std::int64_t> lens_q = lengths_of("cu_seqlens_q", cu_q, wq.device, in.q.size(2));
  std::vector<std::int64_t> lens_k = lengths_of("cu_seqlens_k", cu_k, wq.device, in.k.size(2));
  if (lens_q.size() != lens_k.size()) {
    fail(ErrorKind::InvalidArgument, "cu_seqlens_q has " + std::to_string(lens_q.size() + 1) +
                                         " entries but cu_seqlens_k has " + std::to_string(lens_k.size() + 1) +
                                         ": both are batch + 1");
  }
  Problem p;
  p.heads = in.q.size(1);
  p.head_dim = in.q.size(3);
  p.kv_heads = in.k.size(1);
  p.dtype = dtype;
  p.device = wq.device;
  p = varlen_problem(p, std::move(lens_q), std::move(lens_k));
  // max_seqlen_q and _k, as flash_attn_varlen_func takes them: at least every length.
  for (const auto& [given, lens, name, field] : {std::tuple{max_q, &p.seq_lens, "max_seqlen_q", &p.seq},
                                                 std::tuple{max_k, &p.kv_seq_lens, "max_seqlen_k", &p.kv_seq}}) {
    if (!given) continue;
    for (std::size_t b = 0; b < lens->size(); ++b) {
      if ((*lens)[b] > *given) {
        fail(ErrorKind::InvalidArgument, std::string(name) + " is " + std::to_string(*given) +
                                             ", smaller than sequence " + std::to_string(b) + "'s length " +
                                             std::to_string((*lens)[b]));
      }
    }
    if (*given > 0) *field = *given;
  }
  set_mask(p, mask);
  if (window) set_problem_field(p, "window", std::to_string(*window));
  p.scale = scale;
  p.pass = pass;
  p.deterministic = deterministic;
  set_softcap(p, softcap);
  p.normalize().validate();

  Backend& b = resolve(p, backend, pass == Pass::Forward ? Use::Inference : Use::Autograd, /*kv_lens=*/false);
  DeviceRuntime& rt = device_runtime(p.device, threads);
  return Call{p, std::move(in), std::move(o), &b, RunContext{rt.allocator(), reinterpret_cast<void*>(stream), threads}};
}

std::string attention_varlen(const In& q, const In& k, const In& v, const Out& out, const In& cu_q, const In& cu_k,
                             std::optional<std::int64_t> max_q, std::optional<std::int64_t> max_k,
                             const std::string& backend, const std::string& mask, std::optional<std::int64_t> window,
                             std::optional<double> scale, std::uintptr_t stream, int threads,
                             std::optional<double> softcap) {
  Call c = prepare_varlen(q, k, v, out, cu_q, cu_k, max_q, max_k, backend, mask, window, scale, stream, threads,
                          Pass::Forward, false, softcap);
  run(c, [&] { c.backend->forward(c.p, c.in, c.out, c.ctx); });
  return std::string(c.backend->name());
}

// The packed training forward: out, and the saved log-sum-exp as FP32
// [H, total_q] (flash_attn_varlen_func's softmax_lse layout).
using Lse2 = nb::ndarray<float, nb::ndim<2>>;
std::tuple<std::string, Lse2> attention_varlen_train(const In& q, const In& k, const In& v, const Out& out,
                                                     const In& cu_q, const In& cu_k, std::optional<std::int64_t> max_q,
                                                     std::optional<std::int64_t> max_k, const std::string& backend,
                                                     const std::string& mask, std::optional<std::int64_t> window,
                                                     std::optional<double> scale, std::uintptr_t stream, int threads,
                                                     bool deterministic, std::optional<double> softcap) {
  Call c = prepare_varlen(q, k, v, out, cu_q, cu_k, max_q, max_k, backend, mask, window, scale, stream, threads,
                          Pass::Train, deterministic, softcap);
  Saved saved;
  run(c, [&] { c.backend->forward_train(c.p, c.in, c.out, saved, c.ctx); });
  auto* held = new Tensor(saved.lse);
  nb::capsule owner(held, [](void* t) noexcept { delete static_cast<Tensor*>(t); });
  const std::size_t shape[2] = {static_cast<std::size_t>(c.p.heads), static_cast<std::size_t>(c.p.total_q())};
  const std::int64_t strides[2] = {held->stride(1), held->stride(2)};
  const int device_type = c.p.device == Device::Cpu ? nb::device::cpu::value : nb::device::cuda::value;
  return {std::string(c.backend->name()),
          Lse2(held->data(), 2, shape, owner, strides, nb::dtype<float>(), device_type, 0)};
}

std::string attention_varlen_backward(const In& dout, const In& q, const In& k, const In& v, const Out& out,
                                      const In& lse, const Out& dq, const Out& dk, const Out& dv, const In& cu_q,
                                      const In& cu_k, std::optional<std::int64_t> max_q,
                                      std::optional<std::int64_t> max_k, const std::string& backend,
                                      const std::string& mask, std::optional<std::int64_t> window,
                                      std::optional<double> scale, std::uintptr_t stream, int threads,
                                      bool deterministic, std::optional<double> softcap) {
  Call c = prepare_varlen(q, k, v, out, cu_q, cu_k, max_q, max_k, backend, mask, window, scale, stream, threads,
                          Pass::Train, deterministic, softcap);
  c.p.pass = Pass::Backward;
  const auto like = [&](const char* name, const auto& a, const Tensor& counterpart) {
    if (where_of(name, a).device != c.p.device || dtype_of(name, a) != c.p.dtype) {
      fail(ErrorKind::InvalidArgument, std::string(name) + " must be on q's device with q's dtype");
    }
    const Tensor t = packed_view_of(name, a, c.p.device, c.p.dtype);
    for (int i = 0; i < 4; ++i) require_same(name, name, t.size(i), "its counterpart", counterpart.size(i));
    return t;
  };
  const Tensor d_out = like("dout", dout, c.out);
  Gradients g{like("dq", dq, c.in.q), like("dk", dk, c.in.k), like("dv", dv, c.in.v)};
  require_writable_layout("dq", g.dq);
  require_writable_layout("dk", g.dk);
  require_writable_layout("dv", g.dv);
  if (lse.ndim() != 2 || lse.dtype() != nb::dtype<float>() || where_of("lse", lse).device != c.p.device ||
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

// A problem from Python's keywords, through the library's one parser: None
// leaves a field at its default (batch and heads: the device's).
Problem make_problem(std::optional<std::int64_t> batch, std::optional<std::int64_t> heads,
                     std::optional<std::int64_t> kv_heads, std::int64_t seq, std::optional<std::int64_t> kv_seq,
                     std::int64_t head_dim, const std::string& dtype, const std::string& device,
                     const std::string& mask, std::optional<std::int64_t> window, std::optional<double> scale,
                     const std::string& pass, bool deterministic, std::optional<double> softcap,
                     const std::optional<std::string>& seq_lens = std::nullopt,
                     const std::optional<std::string>& kv_seq_lens = std::nullopt) {
  Problem p;
  p.batch = 0;
  p.heads = 0;
  const auto set = [&p](std::string_view field, std::optional<std::int64_t> v) {
    if (v) set_problem_field(p, field, std::to_string(*v));
  };
  set("batch", batch);
  set("heads", heads);
  set("kv_heads", kv_heads);
  set("seq", seq);
  set("kv_seq", kv_seq);
  p.head_dim = head_dim;  // validate() names its range
  set_problem_field(p, "dtype", dtype);
  set_problem_field(p, "device", device);
  set_problem_field(p, "mask", mask);
  set("window", window);
  p.scale = scale;
  set_problem_field(p, "pass", pass);
  p.deterministic = deterministic;
  set_softcap(p, softcap);
  // A packed batch's lengths ("512,1024,7"), as --seq-lens: seq becomes their maximum.
  if (seq_lens) set_problem_field(p, "seq_lens", *seq_lens);
  if (kv_seq_lens) set_problem_field(p, "kv_seq_lens", *kv_seq_lens);
  fill_device_defaults(p).normalize().validate();
  return p;
}

// Ctrl-C during a long call: Python's handler only sets a flag while the
// library runs without the GIL, so each progress step takes the GIL and runs
// the handlers; a KeyboardInterrupt (or any exception they raise) unwinds
// the run as this exception, and is raised once the GIL is back (rethrow).
struct Interrupted {};

void check_signals(std::string_view) {
  nb::gil_scoped_acquire held;
  if (PyErr_CheckSignals() != 0) throw Interrupted{};
}

template <class Work>
auto interruptible(Work&& work) {
  try {
    nb::gil_scoped_release unlocked;
    return work();
  } catch (const Interrupted&) {
    throw nb::python_error();  // the error PyErr_CheckSignals set
  }
}

PipelineOptions make_options(const std::optional<std::string>& trace_dir, const std::optional<std::string>& json_path,
                             std::uint64_t seed, int threads, bool bshd, std::int64_t check_rows,
                             std::tuple<int, int, int, int> schedule, int unprofiled_calls,
                             const std::map<std::string, int>& expect, const std::string& sort_by, int row_limit) {
  PipelineOptions o;
  o.run.seed = seed;
  o.run.threads = threads;
  o.run.bshd_inputs = bshd;
  o.run.check_rows = check_rows;
  std::tie(o.run.schedule.wait, o.run.schedule.warmup, o.run.schedule.active, o.run.schedule.repeat) = schedule;
  o.run.unprofiled_calls = unprofiled_calls;
  o.run.progress = check_signals;
  for (const auto& [name, n] : expect) {
    check_backend_name("expect", name, /*auto_ok=*/false);
    o.guesses.emplace(name, n);
  }
  o.table = {.sort_by = sort_by, .row_limit = row_limit};
  if (trace_dir) o.trace_dir = *trace_dir;
  if (json_path) o.json_path = *json_path;
  return o;
}

}  // namespace
}  // namespace attnprof::python

namespace attnprof::python {
void bind_analyze(nb::module_& m);  // analyze_bindings.cpp
}  // namespace attnprof::python

NB_MODULE(_core, m) {
  using namespace attnprof;
  using namespace attnprof::python;
  m.doc() = "attnprof's C++ library: attention on DLPack arrays, and the compare/profile/explain pipeline";

  nb::exception<Error>(m, "Error", PyExc_ValueError);
  bind_analyze(m);

  m.def("attention", &attention, nb::arg("q").noconvert(), nb::arg("k").noconvert(), nb::arg("v").noconvert(),
        nb::arg("out").noconvert(), nb::arg("backend"), nb::arg("mask"), nb::arg("window").none(),
        nb::arg("scale").none(), nb::arg("stream"), nb::arg("threads"), nb::arg("bshd"),
        nb::arg("softcap").none() = nb::none(), nb::arg("attn_mask").noconvert().none() = nb::none(),
        nb::arg("block_table").noconvert().none() = nb::none(), nb::arg("seq_lens").noconvert().none() = nb::none(),
        "softmax(scale * q k^T + mask) v into `out`, no copies; returns the backend that ran");

  m.def("attention_train", &attention_train, nb::arg("q").noconvert(), nb::arg("k").noconvert(),
        nb::arg("v").noconvert(), nb::arg("out").noconvert(), nb::arg("backend"), nb::arg("mask"),
        nb::arg("window").none(), nb::arg("scale").none(), nb::arg("stream"), nb::arg("threads"), nb::arg("bshd"),
        nb::arg("deterministic"), nb::arg("softcap").none() = nb::none(),
        nb::arg("attn_mask").noconvert().none() = nb::none(),
        "the forward of a training step into `out`; returns (backend, the saved log-sum-exp)");
  m.def("attention_backward", &attention_backward, nb::arg("dout").noconvert(), nb::arg("q").noconvert(),
        nb::arg("k").noconvert(), nb::arg("v").noconvert(), nb::arg("out").noconvert(), nb::arg("lse").noconvert(),
        nb::arg("dq").noconvert(), nb::arg("dk").noconvert(), nb::arg("dv").noconvert(), nb::arg("backend"),
        nb::arg("mask"), nb::arg("window").none(), nb::arg("scale").none(), nb::arg("stream"), nb::arg("threads"),
        nb::arg("bshd"), nb::arg("deterministic"), nb::arg("softcap").none() = nb::none(),
        nb::arg("attn_mask").noconvert().none() = nb::none(),
        "dQ, dK, dV into dq, dk, dv; returns the backend that ran");

  // Packed batches: q [total_q, H, D], k and v [total_k, Hkv, D], int32
  // cumulative lengths (flash_attn_varlen_func's arguments).
  m.def("attention_varlen", &attention_varlen, nb::arg("q").noconvert(), nb::arg("k").noconvert(),
        nb::arg("v").noconvert(), nb::arg("out").noconvert(), nb::arg("cu_seqlens_q").noconvert(),
        nb::arg("cu_seqlens_k").noconvert(), nb::arg("max_seqlen_q").none(), nb::arg("max_seqlen_k").none(),
        nb::arg("backend"), nb::arg("mask"), nb::arg("window").none(), nb::arg("scale").none(), nb::arg("stream"),
        nb::arg("threads"), nb::arg("softcap").none() = nb::none(),
        "attention over a packed batch into `out`; returns the backend that ran");
  m.def("attention_varlen_train", &attention_varlen_train, nb::arg("q").noconvert(), nb::arg("k").noconvert(),
        nb::arg("v").noconvert(), nb::arg("out").noconvert(), nb::arg("cu_seqlens_q").noconvert(),
        nb::arg("cu_seqlens_k").noconvert(), nb::arg("max_seqlen_q").none(), nb::arg("max_seqlen_k").none(),
        nb::arg("backend"), nb::arg("mask"), nb::arg("window").none(), nb::arg("scale").none(), nb::arg("stream"),
        nb::arg("threads"), nb::arg("deterministic"), nb::arg("softcap").none() = nb::none(),
        "the packed training forward into `out`; returns (backend, the saved [H, total_q] log-sum-exp)");
  m.def("attention_varlen_backward", &attention_varlen_backward, nb::arg("dout").noconvert(), nb::arg("q").noconvert(),
        nb::arg("k").noconvert(), nb::arg("v").noconvert(), nb::arg("out").noconvert(), nb::arg("lse").noconvert(),
        nb::arg("dq").noconvert(), nb::arg("dk").noconvert(), nb::arg("dv").noconvert(),
        nb::arg("cu_seqlens_q").noconvert(), nb::arg("cu_seqlens_k").noconvert(), nb::arg("max_seqlen_q").none(),
        nb::arg("max_seqlen_k").none(), nb::arg("backend"), nb::arg("mask"), nb::arg("window").none(),
        nb::arg("scale").none(), nb::arg("stream"), nb::arg("threads"), nb::arg("deterministic"),
        nb::arg("softcap").none() = nb::none(), "dQ, dK, dV of a packed batch; returns the backend that ran");

  // The views attention() reads and writes, as (data pointer, sizes, strides)
  // for q, k, v and out: the tests compare them with the caller's own.
  m.def(
      "_views",
      [](const In& q, const In& k, const In& v, const Out& out, bool bshd) {
        const Where w = where_of("q", q);
        const DType t = dtype_of("q", q);
        std::vector<std::tuple<std::uintptr_t, Dims, Dims>> views;
        for (const Tensor& x : {view_of("q", q, bshd, w.device, t), view_of("k", k, bshd, w.device, t),
                                view_of("v", v, bshd, w.device, t), view_of("out", out, bshd, w.device, t)}) {
          views.emplace_back(reinterpret_cast<std::uintptr_t>(x.data()), x.sizes(), x.strides());
        }
        return views;
      },
      nb::arg("q").noconvert(), nb::arg("k").noconvert(), nb::arg("v").noconvert(), nb::arg("out").noconvert(),
      nb::arg("bshd"));

  nb::class_<Problem>(m, "Problem")
      .def(
          "__init__",
          [](Problem* self, std::optional<std::int64_t> batch, std::optional<std::int64_t> heads,
             std::optional<std::int64_t> kv_heads, std::int64_t seq, std::optional<std::int64_t> kv_seq,
             std::int64_t head_dim, const std::string& dtype, const std::string& device, const std::string& mask,
             std::optional<std::int64_t> window, std::optional<double> scale, const std::string& pass,
             bool deterministic, std::optional<double> softcap, const std::optional<std::string>& seq_lens,
             const std::optional<std::string>& kv_seq_lens) {
            new (self) Problem(make_problem(batch, heads, kv_heads, seq, kv_seq, head_dim, dtype, device, mask, window,
                                            scale, pass, deterministic, softcap, seq_lens, kv_seq_lens));
          },
          nb::arg("batch").none(), nb::arg("heads").none(), nb::arg("kv_heads").none(), nb::arg("seq"),
          nb::arg("kv_seq").none(), nb::arg("head_dim"), nb::arg("dtype"), nb::arg("device"), nb::arg("mask"),
          nb::arg("window").none(), nb::arg("scale").none(), nb::arg("pass_") = "forward",
          nb::arg("deterministic") = false, nb::arg("softcap").none() = nb::none(),
          nb::arg("seq_lens").none() = nb::none(), nb::arg("kv_seq_lens").none() = nb::none())
      .def("describe", &Problem::describe)
      .def_prop_ro("seq_lens", [](const Problem& p) { return p.seq_lens; })
      .def_prop_ro("kv_seq_lens", [](const Problem& p) { return p.kv_seq_lens; })
      .def_prop_ro("batch", [](const Problem& p) { return p.batch; })
      .def_prop_ro("seq", [](const Problem& p) { return p.seq; })
      .def("forward_flops", &Problem::forward_flops)
      .def("padded_forward_flops", [](const Problem& p) { return p.padded().forward_flops(); })
      .def("file_stem", &Problem::file_stem)
      .def("shape_key", &Problem::shape_key)
      .def("json", [](const Problem& p) { return problem_json(p); });

  nb::class_<PipelineReport>(m, "PipelineReport")
      .def_ro("device_description", &PipelineReport::device_description)
      .def_ro("tables", &PipelineReport::tables)
      .def_ro("collector_note", &PipelineReport::collector_note)
      .def_prop_ro("outputs",
                   [](const PipelineReport& r) {
                     std::vector<std::tuple<std::string, std::string, std::string>> out;
                     for (const auto& o : r.outputs) out.emplace_back(o.trace, o.table, o.summary);
                     return out;
                   })
      .def_prop_ro("problem_description", [](const PipelineReport& r) { return r.problem.describe(); })
      .def("accepted", &PipelineReport::accepted)
      .def("json", &PipelineReport::json)
      .def("compare_table", [](const PipelineReport& r) { return compare_table(r.results); });

  m.def(
      "compare",
      [](const Problem& p, const std::vector<std::string>& only, const std::optional<std::string>& trace_dir,
         const std::optional<std::string>& json_path, std::uint64_t seed, int threads, bool bshd,
         std::int64_t check_rows, std::tuple<int, int, int, int> schedule, int unprofiled_calls,
         const std::map<std::string, int>& expect, const std::string& sort_by, int row_limit) {
        for (const auto& b : only) check_backend_name("backends", b, /*auto_ok=*/false);
        const PipelineOptions o = make_options(trace_dir, json_path, seed, threads, bshd, check_rows, schedule,
                                               unprofiled_calls, expect, sort_by, row_limit);
        return interruptible([&] { return compare(p, o, only); });
      },
      nb::arg("problem"), nb::arg("backends"), nb::arg("trace_dir").none(), nb::arg("json_path").none(),
      nb::arg("seed"), nb::arg("threads"), nb::arg("bshd"), nb::arg("check_rows"), nb::arg("schedule"),
      nb::arg("unprofiled_calls"), nb::arg("expect"), nb::arg("sort_by"), nb::arg("row_limit"));

  m.def(
      "profile",
      [](const Problem& p, const std::string& backend, const std::optional<std::string>& trace_dir,
         const std::optional<std::string>& json_path, std::uint64_t seed, int threads, bool bshd,
         std::int64_t check_rows, std::tuple<int, int, int, int> schedule, int unprofiled_calls,
         const std::map<std::string, int>& expect, const std::string& sort_by, int row_limit) {
        check_backend_name("backend", backend, /*auto_ok=*/true);
        const PipelineOptions o = make_options(trace_dir, json_path, seed, threads, bshd, check_rows, schedule,
                                               unprofiled_calls, expect, sort_by, row_limit);
        return interruptible([&] { return profile(p, backend, o); });
      },
      nb::arg("problem"), nb::arg("backend"), nb::arg("trace_dir").none(), nb::arg("json_path").none(), nb::arg("seed"),
      nb::arg("threads"), nb::arg("bshd"), nb::arg("check_rows"), nb::arg("schedule"), nb::arg("unprofiled_calls"),
      nb::arg("expect"), nb::arg("sort_by"), nb::arg("row_limit"));

  // explain: (the --json document, the table, the device's description).
  m.def(
      "explain",
      [](const Problem& p, int threads) {
        check_threads(threads);
        nb::gil_scoped_release unlocked;
        const ExplainReport e = explain_report(p, threads);
        return std::make_tuple(e.json(), e.table(), e.device_description, e.auto_refusal);
      },
      nb::arg("problem"), nb::arg("threads"));

  m.def("backend_names", [] {
    std::vector<std::string> out;
    for (auto n : backend_names()) out.emplace_back(n);
    return out;
  });
  m.def("cuda_built", &cuda_built);
  // The library's spellings and defaults, so that Python keeps no copies.
  m.def(
      "is_bshd", [](const std::string& layout) { return layout_from_text(layout) == Layout::Bshd; }, nb::arg("layout"));
  m.def("defaults", [] {
    const Problem p;
    const RunOptions r;
    const TableOptions t;
    nb::dict d;
    d["seq"] = p.seq;
    d["head_dim"] = p.head_dim;
    d["dtype"] = std::string(dtype_name(p.dtype));
    d["mask"] = std::string(mask_name(p.mask));
    d["pass_"] = std::string(pass_name(p.pass));
    d["seed"] = r.seed;
    d["threads"] = r.threads;
    d["check_rows"] = r.check_rows;
    d["unprofiled_calls"] = r.unprofiled_calls;
    d["schedule"] = std::make_tuple(r.schedule.wait, r.schedule.warmup, r.schedule.active, r.schedule.repeat);
    d["sort_by"] = t.sort_by;
    d["row_limit"] = t.row_limit;
    return d;
  });
  // Bytes live in the library's own allocator on a device (the tests check
  // that a refused call leaves nothing behind).
  m.def(
      "allocated_bytes",
      [](const std::string& device) {
        Problem p;
        set_problem_field(p, "device", device);
        return device_runtime(p.device).allocator().stats().allocated;
      },
      nb::arg("device"));
}
