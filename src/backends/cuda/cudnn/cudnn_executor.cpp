// The graphs the cudnn backend runs (cudnn_executor.h): found or built once
// per problem key and cached with their plans, then run by comparing a
// call's key with the last call's and executing the plan with its cached
// variant pack.
#include "backends/cuda/cudnn/cudnn_executor.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>

#include "backends/cuda/cudnn/cudnn_check.h"
#include "backends/cuda/cudnn/cudnn_fp8.h"
#include "core/cuda_check.h"

namespace attnprof::cuda::cudnn_graph {

GraphExecutor::~GraphExecutor() {
  // No throw from a destructor, so statuses are ignored here.
  for (auto& [key, pack] : packs_) cudnnBackendDestroyDescriptor(pack);
  if (handle_ != nullptr) cudnnDestroy(handle_);
}

const Entry* GraphExecutor::cached(const std::string& key) const {
  const auto it = cache_.find(key);
  return it == cache_.end() ? nullptr : &it->second;
}

// The runner calls a pass repeatedly with the same tensors, so the steady
// state is: compare this call's key with the last call's of the same graph
// kind, set the stream if it changed, cudnnBackendExecute. Everything else
// (the graph lookup by string key, build_plans, the workspace, the
// variant-pack descriptor) runs on a miss only. Unlike execute(), this does
// not hand a CUDA graph being captured on the stream a reference to the plan
// (that costs a capture query per call): attnprof never captures a pass, and
// a caller that did would have to keep this backend alive as long as the
// captured graph.
//
// Before that, a boolean mask is lowered and a packed batch binds its
// offsets and lengths (cudnn_inputs.h); the graph then runs the problem as
// lowered.
void GraphExecutor::run(GraphKind kind, const Problem& p, const Inputs& in, Bound t, RunContext& ctx,
                        bool fp8_bf16_out) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (inputs_.trim()) {
    for (LastCall& l : last_) l.valid = false;  // their offsets and lengths went
    ++packs_generation_;                        // and the plans' last calls
  }
  std::optional<Problem> lowered;
  if (p.mask == MaskKind::Boolean) lowered = inputs_.lower_mask(p, in, t, ctx);
  const Problem& g = lowered ? *lowered : p;
  if (g.varlen()) inputs_.bind_ragged(g, in, t, ctx);
  // A planned forward keeps its own last call (prepare() above).
  Planned* planned = kind == GraphKind::Forward && !lowered ? dynamic_cast<Planned*>(ctx.state) : nullptr;
  if (planned && planned->generation != packs_generation_) {
    planned->last.valid = false;
    planned->generation = packs_generation_;
  }
  LastCall& last = planned ? planned->last : last_[static_cast<std::size_t>(kind)];
  const CallKey key = call_key(g, t, workspace_.defined() ? workspace_.data() : nullptr);
  if (!last.valid || !(key == last.key)) {
    if (!prepare(kind, g, t, ctx, key, last, planned, fp8_bf16_out)) return;  // run by the frontend's execute()
  }
  set_stream(ctx.stream);
  ATTNPROF_CUDNN_CHECK(cudnnBackendExecute(handle_, last.plan, last.pack));
}

void GraphExecutor::set_stream(void* stream) {
  if (stream_set_ && stream == stream_) return;
  ATTNPROF_CUDNN_CHECK(cudnnSetStream(handle_, static_cast<cudaStream_t>(stream)));
  stream_ = stream;
  stream_set_ = true;
}

// The slow path of run(): finds (or builds) the graph and the workspace,
// then either caches a variant pack for this call's addresses and makes it
// the kind's last call (true), or, for a graph the direct path cannot run,
// runs the call through the frontend's execute() (false).
// `planned`: a plan's state, whose entry is this call's where its layout
// is the one the plan found it for (no lookup then).
bool GraphExecutor::prepare(GraphKind kind, const Problem& p, const Bound& t, RunContext& ctx, CallKey key,
                            LastCall& last, const Planned* planned, bool fp8_bf16_out) {
  last.valid = false;
  const Layout layout = layout_of(p, t);
  Entry& e = planned && same_layout(planned->layout, layout) ? *planned->entry : entry(p, layout, kind, fp8_bf16_out);
  if (!e.failure.empty()) fail(ErrorKind::Unsupported, "cuDNN: " + e.failure);
  build_plans(e, p.mask);
  if (p.kv_cache == KvCache::Paged && !e.seq_q.defined()) {
    e.seq_q = lengths(p.batch, p.seq, ctx);
    e.seq_kv = lengths(p.batch, p.kv_seq, ctx);
  }
  if (e.workspace > 0 && (!workspace_.defined() || workspace_.nbytes() < static_cast<std::size_t>(e.workspace))) {
    workspace_ = Tensor();
    workspace_ = Tensor::empty({1, 1, 1, e.workspace}, DType::Bool, ctx.allocator);
  }
  void* workspace = e.workspace > 0 ? workspace_.data() : nullptr;
  std::array<void*, kTensors> user{};
  for (std::size_t i = 0; i < kTensors; ++i) user[i] = t[i] != nullptr ? t[i]->data() : nullptr;
  if (e.seq_q.defined()) {
    user[slot(kSeqQ)] = e.seq_q.data();
    if (user[slot(kSeqKV)] == nullptr) user[slot(kSeqKV)] = e.seq_kv.data();  // no caller's counts
  }
  if (e.plan == nullptr) {
    set_stream(ctx.stream);
    for (std::size_t i = 0; i < kTensors; ++i) {
      if (user[i] != nullptr) e.pack[kQ + static_cast<std::int64_t>(i)] = user[i];
    }
    require_ok(e.graph->execute(handle_, e.pack, workspace), "execute");
    return false;
  }
  // What execute() does once per call for a thread with no CUDA context
  // (the plan launches through the driver API); once per new pack here.
  if (!fe::detail::has_current_context()) fe::detail::ensure_current_context(static_cast<cudaStream_t>(ctx.stream));
  const auto addr = [](const void* x) { return reinterpret_cast<std::uintptr_t>(x); };
  PackKey pk{};
  pk[0] = addr(&e);
  for (std::size_t i = 0; i < kTensors; ++i) pk[1 + i] = addr(user[i]);
  pk[kTensors + 1] = addr(workspace);
  auto it = packs_.find(pk);
  if (it == packs_.end()) {
    // Callers that allocate fresh tensors per call would grow this without
    // bound; start over instead, and forget every kind's last call, whose
    // pack goes too.
    if (packs_.size() >= kMaxPacks) {
      for (LastCall& l : last_) l.valid = false;
      ++packs_generation_;  // the plans' last calls' packs go too
      // Out of the map first: a failed destroy must not leave the
      // destructor a descriptor to destroy twice.
      const auto old = std::move(packs_);
      packs_.clear();
      for (const auto& [k, pack] : old) ATTNPROF_CUDNN_CHECK(cudnnBackendDestroyDescriptor(pack));
    }
    const cudnnBackendDescriptor_t pack = make_pack(e, user, workspace);
    it = packs_.emplace(pk, pack).first;
  }
  key.ptr[kTensors] = workspace_.defined() ? workspace_.data() : nullptr;  // as the next call_key() will see it
  last.key = key;
  last.plan = e.plan;
  last.pack = it->second;
  last.valid = true;
  return true;
}

// An entry's plans and workspace size, on its first run (or its plan's prepare).
void GraphExecutor::build_plans(Entry& e, MaskKind mask) {
  if (e.plans_built) return;
  require_ok(e.graph->build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), "build_plans");
  require_ok(e.graph->get_workspace_size(e.workspace), "get_workspace_size");
  e.plan = direct_plan(e, mask);
  e.plans_built = true;
}

bool GraphExecutor::same_layout(const Layout& a, const Layout& b) {
  for (std::size_t i = 0; i < kTensors; ++i) {
    if (a.t[i].dims != b.t[i].dims || a.t[i].strides != b.t[i].strides) return false;
  }
  return true;
}

// The cached graph for (p, layout), built up to check_support() on first
// sight; a refusal is cached too, with cuDNN's own words for it.
Entry& GraphExecutor::entry(const Problem& p, const Layout& l, GraphKind kind, bool fp8_bf16_out) const {
  const std::string key = key_of(p, l, kind);
  if (auto it = cache_.find(key); it != cache_.end()) return it->second;
  if (handle_ == nullptr) ATTNPROF_CUDNN_CHECK(cudnnCreate(&handle_));
  Entry e;
  e.failure = is_fp8(p.dtype) ? cudnn_fp8::build(handle_, p, l, fp8_bf16_out, e.graph)
                              : build_sdpa(handle_, p, l, kind, e.graph);
  return cache_.emplace(key, std::move(e)).first->second;
}

}  // namespace attnprof::cuda::cudnn_graph
