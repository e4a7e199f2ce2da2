// The vocabulary of the cudnn backend's graphs (cudnn.cpp): the tensors'
// uids and the three graph kinds, the descriptors cuDNN sees ([B, H, S, D]
// with strides; a paged cache's page containers and page table; a packed
// batch's ragged layout), a problem's layout and cache key, the frontend
// graph whose chosen plan may be run directly, a cached graph's entry, a
// call's key for the direct path, the tensors and checks every graph shares,
// and the 16-bit graphs' builder (build_sdpa()). Only cudnn.cpp and its
// halves (cudnn_graph.cpp, the 16-bit graphs; cudnn_fp8.cpp, the FP8 graph;
// cudnn_inputs.cpp, a call's mask and ragged inputs) include it, in builds
// with the cuDNN frontend.
#pragma once

#include <cudnn_frontend.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/problem.h"
#include "attnprof/tensor.h"
#include "core/mask_geometry.h"

namespace attnprof::cuda::cudnn_graph {

namespace fe = cudnn_frontend;

// Tensor uids in the graphs and the variant packs. A call binds its tensors
// by uid (Bound), so one path builds, keys and runs every graph. A paged
// forward binds the page containers as K and V, and adds the padding mask's
// lengths and the page tables. A packed batch (and a key-padding boolean
// mask) binds the padding mask's lengths, int32 [B, 1, 1, 1]; a packed batch
// also binds one ragged offset tensor per packed tensor, int32 [B + 1, 1, 1, 1]:
// where sequence b starts in it, in elements (kRagQ is Q's, and so on in the
// order of kQ ... kDV). An FP8 forward (cudnn_fp8.h) binds its scalars, FP32
// [1, 1, 1, 1] each: the descales and scales it reads and the amaxes it
// writes.
enum Uid : std::int64_t {
  kQ = 1,
  kK,
  kV,
  kO,
  kBias,
  kStats,
  kDO,
  kDQ,
  kDK,
  kDV,
  kSeqQ,
  kSeqKV,
  kPageK,
  kPageV,
  kRagQ,
  kRagK,
  kRagV,
  kRagO,
  kRagStats,
  kRagDO,
  kRagDQ,
  kRagDK,
  kRagDV,
  kDescaleQ,
  kDescaleK,
  kDescaleV,
  kDescaleS,
  kScaleS,
  kScaleO,
  kAmaxS,
  kAmaxO,
};
constexpr std::int64_t kLastUid = kAmaxO;
constexpr std::size_t kTensors = kLastUid - kQ + 1;
constexpr std::size_t slot(Uid uid) { return static_cast<std::size_t>(uid - kQ); }
// A call's tensors by slot(uid); null where its graph has none.
using Bound = std::array<const Tensor*, kTensors>;

// The packed tensors of a packed batch, each with its ragged offset's uid.
struct RaggedPair {
  Uid tensor, offset;
};
constexpr std::array<RaggedPair, 9> kRagged{{{kQ, kRagQ},
                                             {kK, kRagK},
                                             {kV, kRagV},
                                             {kO, kRagO},
                                             {kStats, kRagStats},
                                             {kDO, kRagDO},
                                             {kDQ, kRagDQ},
                                             {kDK, kRagDK},
                                             {kDV, kRagDV}}};
// Whether a packed tensor's rows are the queries' (Q, O, dO, dQ, the
// statistics) or the keys' (K, V, dK, dV).
constexpr bool query_rows(Uid uid) { return uid != kK && uid != kV && uid != kDK && uid != kDV; }

// The three graphs of a problem: the inference forward, the forward of a
// training step (which also writes the softmax statistics) and the backward.
enum class GraphKind : std::uint8_t { Forward, TrainForward, Backward };
constexpr std::size_t kGraphKinds = 3;

constexpr const char* kForwardOp = "_scaled_dot_product_cudnn_attention";
constexpr const char* kBackwardOp = "_scaled_dot_product_cudnn_attention_backward";

// Dims and strides cuDNN sees: [B, H, S, D] with arbitrary strides. A
// broadcast (stride-0) dim of the bias becomes a size-1 dim, which is how
// cuDNN spells broadcasting.
struct TensorDesc {
  std::vector<std::int64_t> dims, strides;
};

// Size-1 dims get the stride a packed tensor would have; cuDNN checks them.
inline TensorDesc packed_unit_strides(TensorDesc d) {
  for (int i = 3; i >= 0; --i) {
    if (d.dims[static_cast<std::size_t>(i)] == 1) {
      const auto u = static_cast<std::size_t>(i);
      d.strides[u] = u == 3 ? 1 : d.strides[u + 1] * d.dims[u + 1];
    }
  }
  return d;
}

inline TensorDesc desc_of(const Tensor& t, bool compact_broadcast = false) {
  TensorDesc d;
  for (int i = 0; i < 4; ++i) {
    const bool broadcast = compact_broadcast && t.stride(i) == 0;
    d.dims.push_back(broadcast ? 1 : t.size(i));
    d.strides.push_back(broadcast ? 0 : t.stride(i));
  }
  return packed_unit_strides(std::move(d));
}

// The block table [1, 1, B, pages_per_seq] as cuDNN's page table
// [B, 1, pages_per_seq, 1]: the same int32s, the sequences outermost.
inline TensorDesc page_table_desc(const Tensor& table) {
  return packed_unit_strides({{table.size(2), 1, table.size(3), 1}, {table.stride(2), 0, table.stride(3), 0}});
}

inline TensorDesc packed(std::int64_t b, std::int64_t h, std::int64_t s, std::int64_t d) {
  return TensorDesc{{b, h, s, d}, {h * s * d, s * d, d, 1}};
}

// A packed batch's tensor, held as [1, heads, total rows, d] with these
// strides, as cuDNN's ragged layout sees it: [B, heads, max rows, d] with the
// same head, row and element strides, each sequence's first row found through
// the ragged offsets (its first row times the row stride), so any layout of
// the packed rows serves: [total, H, D] (FlashAttention's, make_inputs') or
// [H, total, D] (a contiguous [1, H, total, D], as the runner allocates O and
// the gradients). The batch stride is never read through; it is the span of
// one sequence's extent so that no dimension overlaps another.
inline TensorDesc ragged_desc(const Dims& strides, std::int64_t heads, std::int64_t batch, std::int64_t max_rows,
                              std::int64_t d) {
  const std::int64_t span = std::max({heads * strides[1], max_rows * strides[2], d * strides[3]});
  return packed_unit_strides({{batch, heads, max_rows, d}, {span, strides[1], strides[2], strides[3]}});
}

// Each bound tensor's desc by slot(uid); empty where the graph has none.
struct Layout {
  std::array<TensorDesc, kTensors> t;
  const TensorDesc& operator[](Uid uid) const { return t[slot(uid)]; }
  bool has(Uid uid) const { return !t[slot(uid)].dims.empty(); }
  // A packed batch's graph (ragged offsets), and a graph with a padding
  // mask's per-sequence lengths bound by the call (a packed batch's, a
  // key-padding boolean mask's; a paged graph keeps its own, in Entry).
  bool ragged() const { return has(kRagQ); }
  bool padding() const { return has(kSeqQ); }
};

// What eligibility assumes before it sees tensors: packed [B, H, S, D], a
// bias broadcast over batch and heads, as make_inputs() lays them out, an
// FP8 forward's scalars (packed [1, 1, 1, 1]), and
// the statistics packed [B, H, S, 1] as forward_train() allocates them. A
// packed batch: Q, K and V [total, H, D] as make_inputs() lays them out, O,
// dO, the gradients and the statistics contiguous [1, H, total, D] (and
// [1, H, total_q, 1]) as the runner, make_dout() and forward_train()
// allocate them, each with its ragged offsets, and the padding mask's
// lengths.
inline Layout default_layout(const Problem& p, GraphKind kind) {
  Layout l;
  const TensorDesc qs = packed(p.batch, p.heads, p.seq, p.head_dim);
  const TensorDesc kvs = packed(p.batch, p.kv_heads, p.kv_seq, p.head_dim);
  l.t[slot(kQ)] = l.t[slot(kO)] = qs;
  l.t[slot(kK)] = l.t[slot(kV)] = kvs;
  if (p.kv_cache == KvCache::Paged) {
    // make_inputs' cache: B * pages_per_seq pages, a packed table.
    l.t[slot(kK)] = l.t[slot(kV)] = packed(p.batch * p.pages_per_seq(), p.kv_heads, p.page_size, p.head_dim);
    l.t[slot(kPageK)] = l.t[slot(kPageV)] = packed(p.batch, 1, p.pages_per_seq(), 1);
  }
  if (p.mask == MaskKind::Bias) l.t[slot(kBias)] = packed(1, 1, p.seq, p.kv_seq);
  if (is_fp8(p.dtype)) {
    for (Uid u : {kDescaleQ, kDescaleK, kDescaleV, kDescaleS, kScaleS, kScaleO, kAmaxS, kAmaxO}) {
      l.t[slot(u)] = packed(1, 1, 1, 1);
    }
  }
  if (kind != GraphKind::Forward) l.t[slot(kStats)] = packed(p.batch, p.heads, p.seq, 1);
  if (kind == GraphKind::Backward) {
    l.t[slot(kDO)] = l.t[slot(kDQ)] = qs;
    l.t[slot(kDK)] = l.t[slot(kDV)] = kvs;
  }
  if (!p.varlen()) return l;
  const std::int64_t d = p.head_dim, tq = p.total_q(), tk = p.total_kv();
  const auto rows_major = [&](std::int64_t h, std::int64_t max_rows) {  // [total, h, d]
    return ragged_desc({0, d, h * d, 1}, h, p.batch, max_rows, d);
  };
  const auto heads_major = [&](std::int64_t h, std::int64_t total, std::int64_t max_rows, std::int64_t dd) {
    return ragged_desc(contiguous_strides({1, h, total, dd}), h, p.batch, max_rows, dd);
  };
  l.t[slot(kQ)] = rows_major(p.heads, p.seq);
  l.t[slot(kK)] = l.t[slot(kV)] = rows_major(p.kv_heads, p.kv_seq);
  l.t[slot(kO)] = heads_major(p.heads, tq, p.seq, d);
  if (kind != GraphKind::Forward) l.t[slot(kStats)] = heads_major(p.heads, tq, p.seq, 1);
  if (kind == GraphKind::Backward) {
    l.t[slot(kDO)] = l.t[slot(kDQ)] = l.t[slot(kO)];
    l.t[slot(kDK)] = l.t[slot(kDV)] = heads_major(p.kv_heads, tk, p.kv_seq, d);
  }
  for (const RaggedPair& r : kRagged) {
    if (l.has(r.tensor)) l.t[slot(r.offset)] = packed(p.batch + 1, 1, 1, 1);
  }
  l.t[slot(kSeqQ)] = l.t[slot(kSeqKV)] = packed(p.batch, 1, 1, 1);
  return l;
}

// A paged graph's padding-mask lengths are the graph's own (Entry) unless the
// call binds its seq_lens (Inputs::kv_rows as key ends: then in the layout, as bound). A packed batch's
// tensors are described in the ragged layout.
inline Layout layout_of(const Problem& p, const Bound& bound) {
  Layout l;
  for (std::size_t i = 0; i < kTensors; ++i) {
    if (bound[i] == nullptr) continue;
    if (i == slot(kPageK) || i == slot(kPageV)) {
      l.t[i] = page_table_desc(*bound[i]);
    } else {
      l.t[i] = desc_of(*bound[i], /*compact_broadcast=*/i == slot(kBias));
    }
  }
  if (!p.varlen()) return l;
  for (const RaggedPair& r : kRagged) {
    const Tensor* t = bound[slot(r.tensor)];
    if (t == nullptr) continue;
    l.t[slot(r.tensor)] =
        ragged_desc(t->strides(), t->size(1), p.batch, query_rows(r.tensor) ? p.seq : p.kv_seq, t->size(3));
  }
  return l;
}

inline std::string key_of(const Problem& p, const Layout& l, GraphKind kind) {
  std::string k = std::to_string(static_cast<int>(kind)) + "|" + std::string(dtype_name(p.dtype)) + "|" +
                  std::string(mask_name(p.mask)) + "|" + std::to_string(p.window) + "|" +
                  std::to_string(std::bit_cast<std::uint32_t>(static_cast<float>(p.softmax_scale())));
  if (kind == GraphKind::Backward && p.deterministic) k += "|deterministic";
  if (p.softcap > 0) k += "|softcap " + std::to_string(std::bit_cast<std::uint64_t>(p.softcap));
  // A paged K's dims are its pages': the keys read are the problem's.
  if (p.kv_cache == KvCache::Paged) k += "|paged " + std::to_string(p.kv_seq);
  for (const TensorDesc& d : l.t) {
    k += "|";
    for (auto x : d.dims) k += std::to_string(x) + ",";
    k += ":";
    for (auto x : d.strides) k += std::to_string(x) + ",";
  }
  return k;
}

// A frontend graph whose chosen plan can be run directly. The frontend keeps its
// plans protected and offers only execute(), which per call creates and
// finalizes a new variant-pack descriptor, queries the stream's capture state
// and the thread's context; a derived class may read the plan.
class PlanGraph final : public fe::graph::Graph {
 public:
  // The plan build_plans() chose; null when it chose none or an engine the
  // frontend runs itself (candidate < -1).
  const fe::ExecutionPlan* chosen_plan() const {
    const std::int64_t i = plans.candidate;
    if (i < 0 || i >= static_cast<std::int64_t>(plans.execution_plans.size())) return nullptr;
    return plans.execution_plans[static_cast<std::size_t>(i)].get();
  }
  // Bytes of the workspace the frontend keeps in front of the engine's.
  std::int64_t frontend_workspace() const { return get_fe_workspace_size_subtree(); }
  // Whether every tensor the frontend places in its part of the workspace is
  // only pointed into (operation 2: a backward's dQ accumulator, which cuDNN
  // zeroes itself since 9.6, the full-head dK and dV of grouped-query heads,
  // softmax sums), so that a cached pack may point at them too. Values it
  // copies in (0) or memsets (1) on every execute() need execute().
  bool workspace_only_pointed_into() const {
    std::unordered_map<fe::graph::Tensor_attributes::uid_t, std::tuple<std::int64_t, std::int64_t, std::vector<float>>>
        modifications;
    std::int64_t offset = 0;
    if (collect_tensors_in_workspace_subtree(modifications, offset).is_bad()) return false;
    for (const auto& [uid, m] : modifications) {
      if (std::get<0>(m) != 2) return false;
    }
    return true;
  }
};

struct Entry {
  std::shared_ptr<PlanGraph> graph;
  std::string failure;  // why cuDNN refused; empty when supported
  bool plans_built = false;
  std::int64_t workspace = 0;
  std::int64_t frontend_workspace = 0;  // where the engine's workspace starts within it
  // The chosen plan's backend descriptor (owned by graph) when forward() may
  // run it with a cached variant pack; null when the frontend has work of its
  // own around the plan, and execute() must run it.
  cudnnBackendDescriptor_t plan = nullptr;
  std::unordered_map<std::int64_t, void*> pack;  // execute()'s map, when plan is null
  // A paged graph's padding-mask lengths, int32 [B, 1, 1, 1] on the device
  // (every query count S, every key count Skv), made on the graph's first run.
  Tensor seq_q, seq_kv;
};

// What makes two calls identical for the direct path: the problem's
// parameters, every tensor's shape and strides, and every address the variant
// pack holds. Plain ints and pointers, so that the per-call check is a compare
// with the last call's key, with no strings or allocations.
struct CallKey {
  std::array<Dims, 2 * kTensors> shape{};  // sizes, strides by slot (zeros when absent)
  std::array<void*, kTensors + 1> ptr{};   // addresses by slot, then the workspace
  std::int64_t window = 0;
  std::int64_t kv_seq = 0;  // a paged K's shape is its pages'
  std::uint32_t scale_bits = 0;
  std::uint64_t softcap_bits = 0;
  DType dtype = DType::BF16;
  MaskKind mask = MaskKind::None;
  bool deterministic = false;
  bool operator==(const CallKey&) const = default;
};

// A cached variant pack: the plan it runs with (an Entry's graph) and the
// addresses of the tensors by slot, then the workspace, as integers for a
// total order.
using PackKey = std::array<std::uintptr_t, kTensors + 2>;

// The last call of one graph kind that the direct path ran: a training step
// alternates the forward's and the backward's, and each keeps its own.
struct LastCall {
  CallKey key;
  cudnnBackendDescriptor_t plan = nullptr, pack = nullptr;
  bool valid = false;
};

// cuDNN's messages may run over several lines; a reason or an error is one.
inline std::string one_line(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

// A built graph's validation, operation graph, engine heuristics and support
// check, each step's refusal returned in cuDNN's words, on one line (the
// reason explain prints); empty when cuDNN takes the graph.
inline std::string check_graph(fe::graph::Graph& g, cudnnHandle_t handle) {
  if (auto s = g.validate(); s.is_bad()) return one_line("validate: " + s.get_message());
  if (auto s = g.build_operation_graph(handle); s.is_bad())
    return one_line("build_operation_graph: " + s.get_message());
  if (auto s = g.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}); s.is_bad()) {
    return one_line("no engine: " + s.get_message());
  }
  if (auto s = g.check_support(handle); s.is_bad()) return one_line("check_support: " + s.get_message());
  return {};
}

// cuDNN's SDPA backward takes no page table, and the cache is a decode-time one.
constexpr const char* kPagedForwardOnly =
    "the paged KV cache is forward only (cuDNN's SDPA backward reads no pages): use pass=forward";

// The frontend takes a score modifier (the soft cap) only without the
// padding mask, and a ragged layout needs one.
inline std::string no_softcap_on_ragged() {
  return "a soft cap on a packed batch is not built for cudnn: the cuDNN frontend " +
         std::to_string(CUDNN_FRONTEND_MAJOR_VERSION) + "." + std::to_string(CUDNN_FRONTEND_MINOR_VERSION) +
         " takes its score modifier (the soft cap) only without the padding mask a ragged layout needs (use "
         "device=cpu, or a dense batch)";
}

inline std::shared_ptr<fe::graph::Tensor_attributes> add_tensor(fe::graph::Graph& g, const char* name, Uid uid,
                                                                const TensorDesc& d, fe::DataType_t type) {
  return g.tensor(
      fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(d.dims).set_stride(d.strides).set_data_type(
          type));
}

// A banded mask (core/mask_geometry.h) in the frontend's terms, the one
// mapping the attributes and the soft cap's score modifier share: the
// diagonal it hangs from (top-left for causal, else bottom-right), the right
// bound 0 (the diagonal itself), and a window's left bound, its keys counted
// back from the diagonal, clamped to the keys (cuDNN takes an int; a longer
// window hides nothing more). None and the tensor masks have none.
struct DiagonalBand {
  fe::DiagonalAlignment_t alignment;
  std::optional<std::int64_t> left;  // keeps i + off - left < j
};
inline std::optional<DiagonalBand> diagonal_band(const Problem& p) {
  if (!geometry::banded(p.mask)) return std::nullopt;
  const auto band = geometry::band_of(p.mask, p.window, p.seq, p.kv_seq);
  return DiagonalBand{.alignment = geometry::top_left(p.mask) ? fe::DiagonalAlignment_t::TOP_LEFT
                                                              : fe::DiagonalAlignment_t::BOTTOM_RIGHT,
                      .left = band.has_lo ? std::optional<std::int64_t>(band.width) : std::nullopt};
}

// The 16-bit (fp16, bf16) SDPA graph of `kind` for p and layout l
// (cudnn_graph.cpp; dtype fp8's is cudnn_fp8.h's), built up to
// check_support(): empty when cuDNN takes it, else its refusal in its own
// words, on one line.
std::string build_sdpa(cudnnHandle_t handle, const Problem& p, const Layout& l, GraphKind kind,
                       std::shared_ptr<PlanGraph>& out);

// ---- cudnn_run.cpp: the run path ----

// The range's inputs: Q, K and V, or with a paged cache what cuDNN reads
// instead of K and V (the pages and the block table).
void describe(const Problem& p, const Inputs& in, std::string& dtypes, std::string& dims);
// A graph kind's name in a refusal ("cuDNN SDPA backward: ...").
std::string_view graph_name(GraphKind kind);
// The graphs a pass runs: the forward's, or a training step's two.
std::vector<GraphKind> kinds_of(Pass pass);
// The problem eligibility asks cuDNN about: a boolean mask as the bias it
// becomes in general.
Problem as_bias(const Problem& p);
// cuDNN before 9.25 writes NaN into the rows of a packed batch's sequence
// with no keys (NVIDIA/cudnn-frontend#943, whose tests skip zero-length
// sequences below 9.25); refused by name there, with what to change.
std::string zero_length_refusal(const Problem& p);
// `length` in each of `batch` int32s [batch, 1, 1, 1] on the device: a
// padding mask's per-sequence counts. Once per graph, so the copy waits for
// its host buffer rather than keep one.
Tensor lengths(std::int64_t batch, std::int64_t length, RunContext& ctx);

// A frontend call's status, refused as a device error in one line.
void require_ok(fe::error_t status, const char* step);
// The inputs and O by slot; the bias only for a bias mask. A paged cache
// binds its pages as K and V, and its block table as both page tables.
Bound bind(const Problem& p, const Inputs& in, const Tensor& out);
// The call's key for the direct path (`workspace` the backend's, or null).
// Cheap: copies ints and pointers, allocates nothing.
CallKey call_key(const Problem& p, const Bound& t, void* workspace);
// The chosen plan's descriptor when execute() would do nothing for this graph
// but build a variant pack from the user's pointers, the frontend's
// pass-by-value scalars and pointers into its part of the workspace, and run
// the plan: no workspace the frontend fills (alibi slopes, accumulators it
// zeroes), no pointers it derives from others (slices), no frontend-run
// engine. Otherwise null, and execute() runs it.
cudnnBackendDescriptor_t direct_plan(Entry& e, MaskKind mask);
// A finalized variant pack as the frontend's execute() builds it: its
// template's uids and pass-by-value pointers (scalars owned by the graph),
// with the user's slots and the frontend's workspace tensors filled, the
// engine's workspace after the frontend's, and the alignment it checks per
// call checked once here.
cudnnBackendDescriptor_t make_pack(const Entry& e, const std::array<void*, kTensors>& user, void* workspace);

}  // namespace attnprof::cuda::cudnn_graph
