// The call cache: attention() as a thin front over a cached plan.
//
// A repeated call (a model's every layer, every step) comes with arrays of
// the same layouts and the same arguments. Everything prepare() checks and
// builds from them but the data pointers (the devices, dtypes, shapes and
// strides, the problem, its validation, the backend) is then the same, so the
// cache keys a prepared call by exactly that, and a hit makes only the views
// of the new pointers. A forward's entry also holds its plan (attnprof/plan.h:
// the backend's prepared state, its scratch or workspace), made once on the
// miss, so that a hit resolves nothing, checks no eligibility and allocates
// nothing the plan holds. A key that differs in anything goes through
// prepare(), every check of it included; a refused call is never cached.
//
// Which calls it takes: dense calls (with or without an attn_mask), padded
// ones (q_rows, kv_rows: their values are read by the backend on every run),
// and on a GPU paged ones (the problem follows from the shapes: kv_seq is the
// table's capacity, seq_lens are read by the kernels). Not cached: a paged
// call on the CPU (its problem is read from the table and lengths), a paged
// call in the checking mode (prepare reads and checks them every call), and
// packed calls (their own path, prepare_varlen).
//
// Bounded and thread-safe: one mutex over an LRU list; an entry is shared
// (shared_ptr) with the calls running it, so evicting it never frees a plan
// mid-run.
#include <array>
#include <atomic>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "attnprof/check_inputs.h"
#include "attnprof/error.h"
#include "bindings/bindings.h"
#include "bindings/call_key.h"

namespace attnprof::python {
namespace {

// One tensor of the prepared call as a view of one of the caller's arrays:
// put on that array's new data pointer by a hit.
struct View {
  Tensor Inputs::*slot = nullptr;  // null: the output
  Source source = kQ;
  std::ptrdiff_t byte_offset = 0;  // of the view's first element from the array's data
  Dims sizes{};
  Dims strides{};
  DType dtype = DType::F32;
};

// The tensors of Inputs a prepared call may hold, and the array each is a
// view of (prepare() and prepare_paged() make them so). kv_rows is a paged
// call's seq_lens, else the caller's kv_rows.
struct SlotOf {
  Tensor Inputs::*slot;
  Source source;
};
constexpr SlotOf kSlots[] = {{&Inputs::q, kQ},
                             {&Inputs::k, kK},
                             {&Inputs::v, kV},
                             {&Inputs::mask, kMask},
                             {&Inputs::bias, kMask},
                             {&Inputs::k_pages, kK},
                             {&Inputs::v_pages, kV},
                             {&Inputs::block_table, kTable},
                             {&Inputs::q_rows, kQRows},
                             {&Inputs::kv_rows, kKvRows},
                             {&Inputs::cu_seqlens_q, kCuQ},
                             {&Inputs::cu_seqlens_k, kCuK}};

View view_of_source(Tensor Inputs::*slot, Source source, const Tensor& t, const Array& a) {
  return {slot,      source,      static_cast<const char*>(t.data()) - static_cast<const char*>(a.data),
          t.sizes(), t.strides(), t.dtype()};
}

// What a hit reuses of the call prepare() made.
struct Prepared {
  Problem p;
  Backend* backend = nullptr;
  std::vector<View> views;            // every tensor of the call, the output included
  std::shared_ptr<PlanSlot> planned;  // forwards only
  std::size_t workspace = 0;          // the plan's
};

// The views of a prepared call, or nothing where a tensor is no view of the
// array its slot names (then the call is not cached: no hit could remake it).
std::optional<std::vector<View>> views_of(const Call& c, const Sources& arrays) {
  std::vector<View> views;
  for (const SlotOf& s : kSlots) {
    const Tensor& t = c.in.*s.slot;
    if (!t.defined()) continue;
    const Source source = s.slot == &Inputs::kv_rows && arrays[kLens] != nullptr ? kLens : s.source;
    // Made by prepare itself, not a view of the caller's array: no hit could remake it.
    if (arrays[source] == nullptr || element_size(t.dtype()) * 8 != arrays[source]->dtype.bits) return std::nullopt;
    views.push_back(view_of_source(s.slot, source, t, *arrays[source]));
  }
  views.push_back(view_of_source(nullptr, kOut, c.out, *arrays[kOut]));
  return views;
}

Tensor view_on(const Array& a, const View& v, Device device) {
  // from_blob still refuses a null pointer: a check of the data, not of the layout.
  return Tensor::from_blob(const_cast<char*>(static_cast<const char*>(a.data)) + v.byte_offset, v.sizes, v.strides,
                           v.dtype, device);
}

// The LRU list, most recent first, and its index.
struct Node {
  CallKey key;
  std::shared_ptr<const Prepared> prepared;
};

struct Cache {
  std::mutex mu;
  std::list<Node> lru;
  std::unordered_map<CallKey, std::list<Node>::iterator, CallKeyHash> index;
  std::size_t workspace = 0;
  std::size_t plans = 0;
  std::uint64_t hits = 0, misses = 0, evictions = 0;

  // Under mu: drops the least recently used entries past either bound,
  // keeping the newest whatever its workspace.
  void trim() {
    while (lru.size() > 1 && (lru.size() > kCacheEntries || workspace > kCacheWorkspaceBytes)) {
      const Node& last = lru.back();
      workspace -= last.prepared->workspace;
      plans -= last.prepared->planned ? 1 : 0;
      index.erase(last.key);
      lru.pop_back();
      ++evictions;
    }
  }
};

// Never destroyed: its plans hold memory of allocators (the CPU's, a GPU
// runtime's) that are statics of their own, which an exit may destroy first;
// the process's end gives everything back.
Cache& cache() {
  static Cache* const c = new Cache;
  return *c;
}

// Whether prepare() makes this call's problem from its arrays' layouts alone.
bool cacheable(const Array& q, const Extras& x) {
  const bool paged = x.block_table || x.seq_lens;
  if (!paged) return true;
  // A paged call on the CPU reads its table and lengths for the problem (the
  // longest length, unequal lengths as rows); the checking mode reads them
  // in prepare on every call, which a hit would skip.
  return device_of("q", q) != Device::Cpu && !checking_inputs();
}

}  // namespace

namespace {

// A call through the cache under `key`: a hit's views of `arrays` on its
// entry, or on a miss make() (every check of the call) and, where keep(c)
// says its problem follows from the key, an entry of it.
template <class Make, class Keep>
Call through_cache(const Sources& arrays, const CallArgs& a, const CallKey& key, Make&& make, Keep&& keep) {
  Cache& cc = cache();
  std::shared_ptr<const Prepared> hit;
  {
    std::lock_guard lock(cc.mu);
    if (auto it = cc.index.find(key); it != cc.index.end()) {
      cc.lru.splice(cc.lru.begin(), cc.lru, it->second);
      hit = it->second->prepared;
      ++cc.hits;
    }
  }
  if (!hit) {
    Call c = make();
    if (!keep(c)) return c;
    std::optional<std::vector<View>> views = views_of(c, arrays);
    if (!views) return c;
    auto entry = std::make_shared<Prepared>();
    entry->p = c.p;
    entry->backend = c.backend;
    entry->views = std::move(*views);
    if (a.pass == Pass::Forward) {
      // The plan of this very problem on the backend make() resolved (its
      // refusals already made there, in the call's words).
      auto slot = std::make_shared<PlanSlot>();
      slot->plan = attnprof::plan(c.p, attnprof::layout_of(c.p, c.in), *c.backend, a.threads, c.ctx.stream);
      slot->stream = c.ctx.stream;
      entry->workspace = slot->plan.workspace_bytes();
      entry->planned = std::move(slot);
      c.planned = entry->planned;
    }
    std::lock_guard lock(cc.mu);
    ++cc.misses;
    if (cc.index.find(key) == cc.index.end()) {  // another thread may have made it meanwhile
      cc.lru.push_front(Node{key, std::move(entry)});
      cc.index.emplace(key, cc.lru.begin());
      cc.workspace += cc.lru.front().prepared->workspace;
      cc.plans += cc.lru.front().prepared->planned ? 1 : 0;
      cc.trim();
    }
    return c;
  }
  const Prepared& e = *hit;
  const Device device = e.p.device;
  Inputs in;
  Tensor o;
  for (const View& view : e.views) {
    Tensor t = view_on(*arrays[view.source], view, device);
    (view.slot ? in.*view.slot : o) = std::move(t);
  }
  DeviceRuntime& rt = runtime_for(device, a.threads);
  return Call{e.p,
              std::move(in),
              std::move(o),
              e.backend,
              RunContext{rt.allocator(), reinterpret_cast<void*>(a.stream), a.threads},
              e.planned};
}

// A CPU array of cumulative lengths as prepare_varlen takes it (int32, 1-d,
// contiguous), appended to `lengths`; false for anything else (prepare_varlen
// then refuses it, uncached).
bool host_lengths_of(const Array& cu, std::vector<std::int32_t>& lengths) {
  const nb::dlpack::dtype t = cu.dtype;
  if (t.lanes != 1 || t.bits != 32 || t.code != static_cast<std::uint8_t>(nb::dlpack::dtype_code::Int) ||
      cu.ndim != 1 || (cu.size(0) > 1 && cu.stride(0) != 1) || cu.device_type != nb::device::cpu::value) {
    return false;
  }
  const auto* data = static_cast<const std::int32_t*>(cu.data);
  lengths.insert(lengths.end(), data, data + cu.size(0));
  lengths.push_back(-1);  // where q's end, whatever their counts
  return true;
}

}  // namespace

Call prepare_cached(const Array& q, const Array& k, const Array& v, const Array& out, const CallArgs& a,
                    const Extras& x) {
  CallKey key;
  const Sources arrays = sources_of(q, k, v, out, x);
  if (!cache_enabled() || !cacheable(q, x) || !key_of(arrays, a, key)) return prepare(q, k, v, out, a, x);
  return through_cache(
      arrays, a, key, [&] { return prepare(q, k, v, out, a, x); }, [](const Call&) { return true; });
}

Call prepare_varlen_cached(const In& q, const In& k, const In& v, const Out& out, const Packed& packed,
                           const CallArgs& a) {
  const auto make = [&] { return prepare_varlen(q, k, v, out, packed, a); };
  // The checking mode reads and checks the lengths in prepare_varlen on every call.
  if (!cache_enabled() || checking_inputs()) return make();
  const Array aq = array_of(q), ak = array_of(k), av = array_of(v), ao = array_of(out);
  const Array cu_q = array_of(packed.cu_q), cu_k = array_of(packed.cu_k);
  Sources arrays{&aq, &ak, &av, &ao, nullptr, nullptr, nullptr, nullptr, nullptr, &cu_q, &cu_k};
  CallKey key;
  if (!key_of(arrays, a, key)) return make();
  key.max_q = packed.max_q;
  key.max_k = packed.max_k;
  // On the CPU the problem is made from the lengths (host memory, read as
  // prepare_varlen reads them); on a GPU only a call whose kernels read them
  // (lengths_on_device) is kept, its problem made from the shapes alone: a
  // backend that reads them on the host waits for the device every call.
  const bool on_host = aq.device_type == nb::device::cpu::value;
  if (on_host && !(host_lengths_of(cu_q, key.lengths) && host_lengths_of(cu_k, key.lengths))) return make();
  return through_cache(arrays, a, key, make, [&](const Call& c) { return on_host || c.p.lengths_on_device; });
}

CacheStats cache_stats() {
  Cache& cc = cache();
  std::lock_guard lock(cc.mu);
  return {cc.lru.size(), cc.plans, cc.workspace, cc.hits, cc.misses, cc.evictions};
}

std::size_t cache_entries() { return cache_stats().entries; }

void clear_cache() {
  Cache& cc = cache();
  std::lock_guard lock(cc.mu);
  cc.index.clear();
  cc.lru.clear();
  cc.workspace = 0;
  cc.plans = 0;
  cc.hits = cc.misses = cc.evictions = 0;
}

}  // namespace attnprof::python
