// cudnn_graph.h's run path, what cudnn.cpp's backend calls around its graph
// cache: the graphs a pass runs and their names, the problem eligibility asks
// about, the call's tensors by slot and its profiler range, and the direct
// path (whether a graph's plan may run with attnprof's own cached variant
// pack instead of the frontend's execute(), the pack, and the call key that
// says when one is reused). Built only with the cuDNN frontend.
#ifdef ATTNPROF_WITH_CUDNN

#include <bit>
#include <cstdint>
#include <string>
#include <vector>

#include "attnprof/error.h"
#include "backends/cuda/cudnn/cudnn_check.h"
#include "backends/cuda/cudnn/cudnn_graph.h"
#include "backends/cuda/sequence_lengths.h"

namespace attnprof::cuda::cudnn_graph {

void require_ok(fe::error_t status, const char* step) {
  if (status.is_bad()) {
    fail(ErrorKind::Device, one_line(std::string("cuDNN frontend ") + step + ": " + status.get_message()));
  }
}

Bound bind(const Problem& p, const Inputs& in, const Tensor& out) {
  Bound t{};
  t[slot(kQ)] = &in.q;
  t[slot(kK)] = &in.k;
  t[slot(kV)] = &in.v;
  t[slot(kO)] = &out;
  if (p.mask == MaskKind::Bias) t[slot(kBias)] = &in.bias;
  if (p.kv_cache == KvCache::Paged) {
    if (!in.k_pages.defined() || !in.v_pages.defined() || !in.block_table.defined()) {
      fail(ErrorKind::InvalidArgument, "cudnn: kv_cache=paged without the pages and block table");
    }
    t[slot(kK)] = &in.k_pages;
    t[slot(kV)] = &in.v_pages;
    t[slot(kPageK)] = t[slot(kPageV)] = &in.block_table;
    // A caller's per-sequence key ends (seq_lens, kv_rows [1, 1, B, 1]),
    // read by the graph on the device in stream order; without them the
    // graph's own (every kv_seq).
    if (in.kv_rows.defined()) {
      if (in.kv_rows.size(3) != 1) {
        fail(ErrorKind::Unsupported, "cudnn reads a paged cache's key ends (seq_lens) only, not (begin, end) rows");
      }
      t[slot(kSeqKV)] = &in.kv_rows;
    }
  } else if (in.kv_rows.defined()) {
    fail(ErrorKind::Unsupported, "cudnn reads per-sequence keys (kv_rows) only as a paged KV cache's seq_lens");
  }
  return t;
}

CallKey call_key(const Problem& p, const Bound& t, void* workspace) {
  CallKey k;
  for (std::size_t i = 0; i < kTensors; ++i) {
    if (t[i] == nullptr) continue;
    k.shape[2 * i] = t[i]->sizes();
    k.shape[2 * i + 1] = t[i]->strides();
    k.ptr[i] = t[i]->data();
  }
  k.ptr[kTensors] = workspace;
  k.window = p.window;
  k.kv_seq = p.kv_seq;
  k.scale_bits = std::bit_cast<std::uint32_t>(static_cast<float>(p.softmax_scale()));
  k.softcap_bits = std::bit_cast<std::uint64_t>(p.softcap);
  k.dtype = p.dtype;
  k.mask = p.mask;
  k.deterministic = p.deterministic;
  return k;
}

cudnnBackendDescriptor_t direct_plan(Entry& e, MaskKind mask) {
  PlanGraph& g = *e.graph;
  if (!g.varpack_prep_state->prepared.load(std::memory_order_acquire)) {
    require_ok(g.prepare_variant_pack_template(), "prepare_variant_pack_template");
  }
  const auto& t = g.varpack_template;
  const fe::ExecutionPlan* plan = g.chosen_plan();
  if (plan == nullptr) return nullptr;
  e.frontend_workspace = g.frontend_workspace();
  if (e.frontend_workspace + plan->getWorkspaceSize() > e.workspace) return nullptr;
  if (e.frontend_workspace > 0 && !g.workspace_only_pointed_into()) return nullptr;
  if (!t.replacement_slots.empty() || !t.backend_slots.empty()) return nullptr;
  for (int slot : t.user_slots) {
    const std::int64_t uid = t.all_uids[static_cast<std::size_t>(slot)];
    if (uid < kQ || uid > kLastUid || (uid == kBias && mask != MaskKind::Bias)) return nullptr;
  }
  return plan->get_raw_desc();
}

cudnnBackendDescriptor_t make_pack(const Entry& e, const std::array<void*, kTensors>& user, void* workspace) {
  const auto& t = e.graph->varpack_template;
  std::vector<void*> ptrs = t.template_ptrs;
  for (int slot : t.user_slots) {
    const auto s = static_cast<std::size_t>(slot);
    ptrs[s] = user[static_cast<std::size_t>(t.all_uids[s] - kQ)];
  }
  char* base = static_cast<char*>(workspace);
  for (const auto& [slot, offset] : t.workspace_slots) ptrs[static_cast<std::size_t>(slot)] = base + offset;
  void* engine_workspace = base == nullptr ? nullptr : base + e.frontend_workspace;
  for (const auto& [slot, alignment] : t.aligned_slots) {
    const auto s = static_cast<std::size_t>(slot);
    if (reinterpret_cast<std::uintptr_t>(ptrs[s]) % static_cast<std::uintptr_t>(alignment) != 0) {
      fail(ErrorKind::Device, "cuDNN: tensor uid " + std::to_string(t.all_uids[s]) + " is not aligned to " +
                                  std::to_string(alignment) + " bytes");
    }
  }
  cudnnBackendDescriptor_t pack = nullptr;
  ATTNPROF_CUDNN_CHECK(cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack));
  try {
    const auto n = static_cast<std::int64_t>(ptrs.size());
    ATTNPROF_CUDNN_CHECK(
        cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &engine_workspace));
    ATTNPROF_CUDNN_CHECK(
        cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs.data()));
    ATTNPROF_CUDNN_CHECK(
        cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, t.all_uids.data()));
    ATTNPROF_CUDNN_CHECK(cudnnBackendFinalize(pack));
  } catch (...) {
    cudnnBackendDestroyDescriptor(pack);  // already failing; its status adds nothing
    throw;
  }
  return pack;
}

void describe(const Problem& p, const Inputs& in, std::string& dtypes, std::string& dims) {
  const std::array<const Tensor*, 4> paged{&in.q, &in.k_pages, &in.v_pages, &in.block_table};
  const std::array<const Tensor*, 4> contiguous{&in.q, &in.k, &in.v, nullptr};
  for (const Tensor* t : p.kv_cache == KvCache::Paged ? paged : contiguous) {
    if (t == nullptr) continue;
    if (!dtypes.empty()) dtypes += ", ", dims += ", ";
    dtypes += dtype_name(t->dtype());
    dims += t->dims_string();
  }
}

std::string_view graph_name(GraphKind kind) {
  switch (kind) {
    case GraphKind::TrainForward:
      return "cuDNN SDPA forward with stats";
    case GraphKind::Backward:
      return "cuDNN SDPA backward";
    case GraphKind::Forward:
      break;
  }
  return "cuDNN";
}

std::vector<GraphKind> kinds_of(Pass pass) {
  if (pass == Pass::Forward) return {GraphKind::Forward};
  return {GraphKind::TrainForward, GraphKind::Backward};
}

Problem as_bias(const Problem& p) {
  Problem g = p;
  if (g.mask == MaskKind::Boolean) g.mask = MaskKind::Bias;
  return g;
}

std::string zero_length_refusal(const Problem& p) {
  const auto version = static_cast<long>(cudnnGetVersion());
  if (version >= 92500) return {};
  if (p.lengths_on_device) {
    // Unread, they cannot be ruled out: the call then reads them on the host.
    return "cuDNN " + std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) +
           " gives NaN for a packed batch's zero-length sequences, which lengths left on the device cannot rule out "
           "(cuDNN 9.25 and newer take them)";
  }
  for (std::int64_t b = 0; b < p.batch; ++b) {
    if (p.seq_len(b) > 0 && p.kv_seq_len(b) > 0) continue;
    return "cuDNN " + std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) +
           " gives NaN for a packed batch's zero-length sequences (sequence " + std::to_string(b) + " has " +
           std::to_string(p.seq_len(b)) + " queries and " + std::to_string(p.kv_seq_len(b)) +
           " keys; cuDNN 9.25 and newer take them): leave empty sequences out of seq_lens, or use device=cpu";
  }
  return {};
}

Tensor lengths(std::int64_t batch, std::int64_t length, RunContext& ctx) {
  return device_ints(std::vector<std::int32_t>(static_cast<std::size_t>(batch), static_cast<std::int32_t>(length)),
                     ctx.allocator, static_cast<cudaStream_t>(ctx.stream));
}

}  // namespace attnprof::cuda::cudnn_graph

#endif  // ATTNPROF_WITH_CUDNN
