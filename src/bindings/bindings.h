// The Python bindings' internal header: what the files of attnprof._core
// share. Arrays come in as DLPack views (nb::ndarray, never converted or
// copied) and become borrowed Tensors here; one call on them is a Call.
//   arrays.cpp             DLPack arrays -> borrowed Tensor views, and their checks
//   call_options.h/.cpp    a call's plain options: their one table; from the C entry, and as Python reads it
//   def_call.h             a binding's signature: its plain options as keywords, made from the table
//   call.cpp               a dense call: prepare(), the backend it resolves
//   call_cache.cpp         the call cache: a repeated call's plan, made once (attnprof/plan.h)
//   call_key.h/.cpp        the call cache's key, its equality and hash
//   attention_bindings.cpp attention, attention_train, attention_backward
//   varlen_bindings.cpp    packed (variable-length) batches; a paged cache's preparation
//   pipeline_bindings.cpp  Problem, compare, profile, explain, the library's defaults
//   plan_bindings.cpp      attnprof.plan: a call planned once (attnprof/plan.h), run many times
//   analyze_bindings.cpp   analyze and diff
//   module.cpp             the module, which adds them all
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/variant.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "attnprof/backend.h"
#include "attnprof/error.h"
#include "attnprof/plan.h"
#include "attnprof/problem.h"
#include "attnprof/runner.h"
#include "attnprof/tensor.h"
#include "attnprof/thread_counts.h"
#include "bindings/call_options.h"
#include "bindings/forward_entry.h"

namespace attnprof::python {

namespace nb = nanobind;

// q, k and v are read only (nanobind then takes the cheaper unversioned
// DLPack export); out is written.
using In = nb::ndarray<nb::ro>;
using Out = nb::ndarray<>;

// What the bindings read of a caller's DLPack array, whichever nb::ndarray
// type it came in as (so that the checks below are written once).
struct Array {
  const void* data;
  std::size_t ndim;
  const std::int64_t* shape;
  const std::int64_t* strides;  // in elements; nanobind fills them in for a compact array
  int device_type;
  int device_id;
  nb::dlpack::dtype dtype;

  std::uint64_t size(std::size_t i) const { return static_cast<std::uint64_t>(shape[i]); }
  std::int64_t stride(std::size_t i) const { return strides[i]; }
};

template <class A>
Array array_of(const A& a) {
  return {a.data(), a.ndim(), a.shape_ptr(), a.stride_ptr(), a.device_type(), a.device_id(), a.dtype()};
}

// ---- arrays.cpp: borrowed views of the caller's arrays, each check once ----

// "cpu", "cuda:1", ... as a message names an array's device.
std::string where_name(const Array& a);
// The array's device: CPU or cuda:0 (the CUDA runtime is device 0's), else refused.
Device device_of(const char* name, const Array& a);
DType dtype_of(const char* name, const Array& a);
std::string dims_of(const Array& a);  // "[2, 16, 64]"
// The array's dtype as torch and NumPy name it ("int64", "float64", "bool",
// "float8_e4m3fn"), other codes by number, for messages.
std::string dtype_text(const Array& a);
// `name` on `device` with `dtype`, else refused naming q's ("q is fp32 but v is fp16").
void require_like_q(const char* name, const Array& a, const Array& q, Device device, DType dtype);
// A borrowed [B, H, S, D] view of a caller's 4-d array; `bshd` reads it as
// [B, S, H, D] (the view swaps the two middle dimensions; nothing moves).
Tensor view_of(const char* name, const Array& a, bool bshd, Device device, DType dtype);
// A borrowed view of a paged KV cache, [num_pages, Hkv, page_size, D] (vLLM's
// layout, whatever q's), its rank refused in those terms.
Tensor cache_view_of(const char* name, const Array& a, Device device, DType dtype);
// A borrowed [1, H, total, D] view of a caller's packed [total, H, D] array.
Tensor packed_view_of(const char* name, const Array& a, Device device, DType dtype);
// attn_mask as a borrowed view right-aligned to 4-d, on q's device; its
// dtype picks the mask kind (bool, or a float: Bias).
Tensor mask_view(const Array& a, Device device);
// An int32 array of `ndim` dimensions on q's device (block_table, seq_lens),
// as a borrowed [1, 1, .., ..] view.
Tensor index_view(const char* name, const Array& a, std::size_t ndim, Device device);
// An FP8 descale array as a borrowed float32 [1, 1, 1, 1] view on its own
// device: refused by name unless float32 with one element. Nothing is read.
Tensor descale_view(const char* name, const Array& a);
// A dense call's per-sequence rows (q_rows, kv_rows) on q's device as the core
// reads them, a borrowed int32 [1, 1, B, 2] view of (begin, end) pairs: given
// as [B, 2] or in that very shape; with `ends_ok` (kv_rows) also [B, 1] or
// [1, 1, B, 1], key ends from 0. Refused in one line naming the shapes taken.
Tensor rows_view(const char* name, const Array& a, std::int64_t batch, Device device, bool ends_ok);
// The output is written by many threads or blocks at once: no two elements
// may share memory.
void require_writable_layout(const char* name, const Tensor& out);
void require_same(const char* what, const char* a_name, std::int64_t a, const char* b_name, std::int64_t b);
// As the pipeline bounds them (check_before_work).
void check_threads(int threads);
// attention()'s mask names: the structural ones (a mask tensor comes as attn_mask).
void set_mask(Problem& p, const std::string& mask);
// A float32 log-sum-exp the library allocated, as an array Python owns
// (the Tensor is held until the array is dropped): `dims` of lse's sizes.
nb::ndarray<float> owned_lse(const Tensor& lse, Device device, std::size_t ndim, const std::size_t* shape,
                             const std::int64_t* strides);

// ---- call.cpp: one call on the caller's arrays ----

// What a call needs of its backend beyond the problem: autograd through
// attnprof keeps only what the fused backwards keep (the log-sum-exp), so a
// training step takes a backend that recomputes the probabilities.
enum class Use : std::uint8_t { Inference, Autograd };

// The backend that runs p, resolved and checked for eligibility once per
// (problem, requested name, use, the call's batch layout: layout_of).
Backend& resolve(const Problem& p, const std::string& requested, Use use, const BatchLayout& layout);

// A cached forward's plan (call_cache.cpp), shared by the cache and the
// calls running it, so that an entry evicted mid-call lives until the call
// ends. Its state (a CPU flash's scratch, a GPU's workspace) serves one run
// at a time, on the stream the plan was made on: a run on another stream, or
// while another thread runs it, goes without the plan's state (Call::forward).
struct PlanSlot {
  Plan plan;
  void* stream = nullptr;  // the stream its workspace is ordered on
  std::mutex busy;         // held for a run with the plan's state
};

// One call on the caller's arrays: their borrowed views, the problem they
// make, the backend that runs it and the context on the caller's stream.
struct Call {
  Problem p;
  Inputs in;
  Tensor out;
  Backend* backend = nullptr;
  RunContext ctx;
  // A forward's plan from the call cache, or null (training passes, calls
  // the cache does not take): forward() then calls the backend directly.
  std::shared_ptr<PlanSlot> planned;

  // The forward of the call: through its plan (Plan::run: no resolution, no
  // eligibility, nothing sized or allocated by the plan's work) where it has
  // one free for this stream, else the backend's forward on the call's context.
  void forward();

  // A borrowed view of another array of the call (dO, the gradients): q's
  // device and dtype, the same layout (packed, or 4-d and `bshd`), and
  // `like`'s sizes.
  Tensor view_like(const char* name, const Array& a, const Tensor& like, bool bshd) const;
  // dq, dk and dv as view_like makes them, each writable.
  Gradients gradients(const Array& dq, const Array& dk, const Array& dv, bool bshd) const;
};

// An FP8 descale as Python passes it: a number, or a one-element float32
// array (a torch tensor's DLPack), which on a GPU only the kernels read.
using Descale = std::variant<double, In>;

// FP8 inputs' per-tensor descales (real = e4m3 x descale) onto a prepared
// call: each given number finite and positive, 1 where not given; refused for
// inputs of another dtype. An array on the CPU is host memory, read here as
// its number; one on q's GPU becomes Inputs::q_descale_tensor ..., never read
// on the host (issue 56 item 2) but in the checking mode, which reads it in
// the call's stream order and refuses a bad value by name.
void set_descales(Call& c, const std::optional<Descale>& q, const std::optional<Descale>& k,
                  const std::optional<Descale>& v);

// The last step of every prepare: the backend (for the pass's use) and the
// context on the caller's stream.
Call finish_call(Problem p, Inputs in, Tensor out, const std::string& backend, std::uintptr_t stream, int threads);

// What a call may take beyond q, k, v and out: a mask tensor, or a paged KV
// cache's block table and per-sequence lengths (k and v are then the caches);
// and a dense batch's per-sequence rows (Inputs::q_rows, kv_rows: int32
// [B, 2] (begin, end) on q's device).
struct Extras {
  std::optional<Array> attn_mask, block_table, seq_lens, q_rows, kv_rows;
};

// A dense call (q [B, H, S, D], or bshd), or a paged one (Extras). The calls
// of a training step resolve `auto` as one problem, the training step's
// (pass train, its deterministic): the backward must run on the backend
// whose forward saved its tensors. The plain options are the binding's
// (call_options.h), held by it for the call.
struct CallArgs {
  const CallOptions& options;
  std::uintptr_t stream;
  int threads;
  Pass pass;
};
Call prepare(const Array& q, const Array& k, const Array& v, const Array& out, const CallArgs& args,
             const Extras& x = {});

// prepare() through the call cache (call_key.h says what its key holds):
// a call whose every array layout and argument matches one prepared before
// takes that one's problem, backend and, for a forward, plan, and makes only
// its views. Bounded: least recently used entries go first, past
// kCacheEntries entries or kCacheWorkspaceBytes of plans' workspace.
Call prepare_cached(const Array& q, const Array& k, const Array& v, const Array& out, const CallArgs& args,
                    const Extras& x = {});
inline constexpr std::size_t kCacheEntries = 512;
inline constexpr std::size_t kCacheWorkspaceBytes = std::size_t{256} << 20;
// What the cache holds and did since the process started (or the last
// clear_cache()), for the tests and bench/python_overhead.py.
struct CacheStats {
  std::size_t entries = 0;          // calls held
  std::size_t plans = 0;            // of them, forwards with a plan
  std::size_t workspace_bytes = 0;  // the plans' workspace
  std::uint64_t hits = 0, misses = 0, evictions = 0;
};
CacheStats cache_stats();
std::size_t cache_entries();
void clear_cache();
// Off: prepare_cached() is prepare() and runtime_for() device_runtime(), as
// before the cache (for measuring what it saves).
void use_cache(bool on);
bool cache_enabled();

// device_runtime(device, threads), setting the CPU's thread counts only when
// they are not what this thread last set. The CPU runtime sets OpenMP's and
// OpenBLAS's counts and asks glibc for the CPU count on every call, and
// glibc opens /sys/devices/system/cpu/online for it: microseconds a call.
// Whatever else sets the counts (compare, profile, explain, replay,
// allocated_bytes, auto's measuring: the library's own calls of
// device_runtime) calls runtime_touched() after, so the next call sets them
// again. Only speed hangs on it: a CPU backend sizes its scratch by the
// count it runs with, whichever that is.
DeviceRuntime& runtime_for(Device device, int threads);
void runtime_touched();

// Held for the whole of every call into the library that may set the CPU's
// thread counts (runtime_for, device_runtime): they are read when it starts
// and put back when it ends, returning or throwing, where the call changed
// them, so that no call leaves the process's counts changed (torch reads
// OpenMP's as torch.get_num_threads()). runtime_for is then told
// (runtime_touched), so that the next call sets its own count again.
class ThreadCountsKept {
 public:
  ThreadCountsKept() : before_(cpu_thread_counts()) {}
  ~ThreadCountsKept() {
    if (cpu_thread_counts() == before_) return;
    set_cpu_thread_counts(before_);
    runtime_touched();
  }
  ThreadCountsKept(const ThreadCountsKept&) = delete;
  ThreadCountsKept& operator=(const ThreadCountsKept&) = delete;

 private:
  CpuThreadCounts before_;
};

// `work` (a call of the library that may set the CPU's thread counts), then
// runtime_touched(), whether it returns or throws.
template <class Work>
auto after_runtime_use(Work&& work) {
  struct Touched {
    ~Touched() { runtime_touched(); }
  } touched;
  return work();
}

// ---- varlen_bindings.cpp ----

// A paged call's k and v caches, block table and lengths into `in`, and the
// problem's kv_heads, kv_seq, page size and cache kind; `stream` is the
// caller's, which the checking mode reads the table and lengths in the order of.
void prepare_paged(Problem& p, Inputs& in, const Array& k, const Array& v, const Extras& x, DType dtype,
                   std::uintptr_t stream);

// What a packed call takes beyond its arrays (and the dense call's arguments).
struct Packed {
  const In& cu_q;
  const In& cu_k;
  std::optional<std::int64_t> max_q, max_k;
};

// One packed call: q [total_q, H, D], k and v [total_k, Hkv, D], out like q
// (attention_varlen's, and a packed plan's: plan_bindings.cpp).
Call prepare_varlen(const In& q, const In& k, const In& v, const Out& out, const Packed& packed, const CallArgs& a);
// prepare_varlen() through the call cache (call_cache.cpp): keyed by the
// arrays' layouts and, on the CPU, the lengths themselves.
Call prepare_varlen_cached(const In& q, const In& k, const In& v, const Out& out, const Packed& packed,
                           const CallArgs& a);

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

// ---- the C entries of bindings/forward_entry.h (attnprof._torch_call's way in) ----

// An array the torch extension read from a tensor, as the bindings read one.
Array entry_array(const AttnprofArray& a);
// Runs `work` for a C entry: 0 when it ran; 1 for attnprof's own refusal, 2
// for any other exception, with its message in `error` (NUL-terminated).
template <class Work>
int entry_call(char* error, std::size_t error_len, Work&& work) {
  const auto failed = [&](int code, const char* what) {
    if (error_len > 0) {
      std::strncpy(error, what, error_len - 1);
      error[error_len - 1] = '\0';
    }
    return code;
  };
  try {
    work();
    return 0;
  } catch (const Error& e) {
    return failed(1, e.what());
  } catch (const std::exception& e) {
    return failed(2, e.what());
  } catch (...) {
    return failed(2, "attnprof: an unknown C++ exception");
  }
}

// ---- call_options.cpp: a call's plain options from the torch extension ----
// (from Python's keywords: def_call.h)

// The options attention() takes from the torch extension's C entry
// (AttnprofForwardArgs, in AttnprofForwardEntry's order: forward_entry()).
CallOptions call_options(const AttnprofForwardArgs& args);
// The AttnprofForwardEntry _core hands the extension, around `forward`.
const AttnprofForwardEntry& forward_entry_of(AttnprofForward forward);

// The module's parts, each adding its functions (module.cpp calls them).
void bind_attention(nb::module_& m);     // attention_bindings.cpp
void bind_varlen(nb::module_& m);        // varlen_bindings.cpp
void bind_pipeline(nb::module_& m);      // pipeline_bindings.cpp
void bind_analyze(nb::module_& m);       // analyze_bindings.cpp
void bind_plan(nb::module_& m);          // plan_bindings.cpp
void bind_call_options(nb::module_& m);  // call_options.cpp: the table as Python reads it (_call_options)

}  // namespace attnprof::python
