// cudnn: cuDNN 9's fused SDPA forward and backward through the cuDNN
// frontend graph API.
//
// Building a graph (heuristics query, plan compilation of the generated kernel)
// is the slow part, milliseconds to seconds, so a graph is built once per
// problem key (shape, strides, dtype, mask, scale) and cached; a call then only
// runs the plan with a variant pack cached for its tensors (see forward()).
// That is the difference from PyTorch's
// path, which the reference study caught choosing plans per call (214 us of
// CPU per call). Per forward: one kernel, launched by cuDNN through
// cuLaunchKernelEx.
//
// The backward pass uses two more graphs per problem, built and run the same
// way: the forward of a training step, which also writes the softmax
// statistics (each row's log-sum-exp), and sdpa_backward, which reads Q, K,
// V, O, dO and those statistics and writes dQ, dK and dV.
//
// A paged KV cache (forward only) is cuDNN's paged SDPA: K and V are the
// page containers [num_pages, Hkv, page_size, D], read through the block
// table (one table for K, the same for V, seen as [B, 1, pages_per_seq, 1]).
// cuDNN takes pages only with its padding mask, so the graph also reads each
// sequence's query and key counts, int32 [B, 1, 1, 1] on the device, every
// one S and Skv here (no sequence is shorter): made once per graph, with it.
#include <bit>
#include <cstdint>
#include <memory>
#include <string>

#include "attnprof/error.h"
#include "attnprof/profiler.h"
#include "backends/cuda/cuda_backends.h"

#ifdef ATTNPROF_WITH_CUDNN

#include <cuda_runtime.h>
#include <cudnn_frontend.h>

#include <algorithm>
#include <array>
#include <map>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "backends/cuda/cudnn_check.h"
#include "backends/cuda/cudnn_graph.h"
#include "core/cuda_check.h"

namespace attnprof::cuda {
namespace {

// The graphs' uids, layouts, keys and cache entries: cudnn_graph.h.
using namespace cudnn_graph;  // NOLINT(google-build-using-namespace): this file's own vocabulary (and `fe`)

class Cudnn final : public Backend {
 public:
  ~Cudnn() override {
    // No throw from a destructor, so statuses are ignored here.
    for (auto& [key, pack] : packs_) cudnnBackendDestroyDescriptor(pack);
    if (handle_ != nullptr) cudnnDestroy(handle_);
  }

  std::string_view name() const override { return "cudnn"; }
  Device device() const override { return Device::Cuda; }

  Eligibility eligibility(const Problem& p) const override {
    if (p.device != Device::Cuda) return {false, "runs on a CUDA device only"};
    if (!is_16bit(p.dtype)) return {false, "fp32 not supported by cuDNN SDPA (use dtype=bf16 or dtype=fp16)"};
    const bool paged = p.kv_cache == KvCache::Paged;
    if (paged && p.pass != Pass::Forward) return {false, kPagedForwardOnly};
    if (p.mask == MaskKind::Boolean) {
      return {false,
              "boolean masks are not taken by cudnn here: pass the additive float form (0 where True, -inf where "
              "False, in q's dtype) as attn_mask, which cudnn reads as its bias"};
    }
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      const int sm = sm_version();
      if (sm < 80) return {false, "cuDNN SDPA needs sm80 or newer; this GPU is sm" + std::to_string(sm)};
      for (GraphKind kind : kinds_of(p.pass)) {
        const Entry& e = entry(p, default_layout(p, kind), kind);
        if (!e.failure.empty()) return {false, std::string(graph_name(kind)) + ": " + e.failure};
      }
    } catch (const Error& err) {
      return {false, one_line(err.what())};
    }
    if (paged) {
      return {true, "cuDNN paged SDPA graph: K and V read from " + std::to_string(p.page_size) +
                        "-key pages through the block table (padding mask, every sequence full), one generated "
                        "kernel, plan built once per problem and cached"};
    }
    if (p.pass == Pass::Forward) {
      return {true, "cuDNN SDPA graph: one generated kernel, plan built once per problem and cached"};
    }
    return {true, std::string("cuDNN SDPA forward (with softmax stats) and backward graphs") +
                      (p.deterministic ? ", deterministic dQ" : "") + ", plans built once per problem and cached"};
  }

  // The largest workspace of the pass's graphs (they share one), plus the
  // statistics a training forward keeps.
  std::size_t workspace_bytes(const Problem& p) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::size_t bytes = 0;
    for (GraphKind kind : kinds_of(p.pass)) {
      const auto it = cache_.find(key_of(p, default_layout(p, kind), kind));
      if (it != cache_.end()) bytes = std::max(bytes, static_cast<std::size_t>(it->second.workspace));
    }
    if (p.pass != Pass::Forward) bytes += static_cast<std::size_t>(p.batch * p.heads * p.seq) * sizeof(float);
    // A paged graph's padding-mask lengths.
    if (p.kv_cache == KvCache::Paged) bytes += 2 * static_cast<std::size_t>(p.batch) * sizeof(std::int32_t);
    return bytes;
  }

  Expectation expectation(const Problem& p) const override {
    switch (p.pass) {
      // How many kernels the backward launches depends on the engine cuDNN
      // picks (a preprocessing kernel for rowsum(dO * O), a dQ conversion),
      // so the count is left unknown.
      case Pass::Backward:
        return {{kBackwardOp}, /*device_activities=*/-1, /*copies=*/0};
      case Pass::Train:
        return {{kForwardOp, kBackwardOp}, /*device_activities=*/-1, /*copies=*/0};
      case Pass::Forward:
        break;
    }
    // One activity: the generated kernel. On Hopper, cuDNN itself (inside
    // cudnnBackendExecute, not the frontend) zeroes part of the workspace before
    // that kernel, which the trace shows as an extra Memset; the report names
    // it rather than counting it here.
    return {{kForwardOp}, /*device_activities=*/1, /*copies=*/0};
  }

  bool has_backward() const override { return true; }
  // cuDNN's SDPA backward recomputes P from the forward's stats; its dQ is
  // summed with atomics unless the deterministic algorithm is asked for.
  Traits traits() const override { return {.backward_recomputes = true, .backward_dq_unordered = true}; }

  void forward(const Problem& p, const Inputs& in, Tensor& out, RunContext& ctx) override {
    std::string dtypes, dims;
    if (Profiler* prof = Profiler::current(); prof != nullptr && prof->recording()) describe(p, in, dtypes, dims);
    RecordFunction range(kForwardOp, dtypes, dims);
    run(GraphKind::Forward, p, bind(p, in, out), ctx);
  }

  // cuDNN's softmax statistics ("Stats") are, per query row, max + ln(sum of
  // exp(score - max)) over the scaled (and biased) scores: the natural-log
  // log-sum-exp that Saved::lse holds, in FP32 [B, H, S, 1] (the frontend's
  // stats_use_log2, which would make it base 2, is left off). Only cuDNN's own
  // backward reads them; on a fully masked row cuDNN writes what its masking
  // value gives, not necessarily -inf.
  void forward_train(const Problem& p, const Inputs& in, Tensor& out, Saved& saved, RunContext& ctx) override {
    if (p.kv_cache == KvCache::Paged) fail(ErrorKind::Unsupported, std::string("cudnn: ") + kPagedForwardOnly);
    std::string dtypes, dims;
    if (Profiler* prof = Profiler::current(); prof != nullptr && prof->recording()) describe(p, in, dtypes, dims);
    RecordFunction range(kForwardOp, dtypes, dims);
    saved.probs = Tensor();
    saved.lse = Tensor::empty({p.batch, p.heads, p.seq, 1}, DType::F32, ctx.allocator);
    Bound t = bind(p, in, out);
    t[slot(kStats)] = &saved.lse;
    run(GraphKind::TrainForward, p, t, ctx);
  }

  void backward(const Problem& p, const Inputs& in, const Tensor& out, const Tensor& dout, const Saved& saved,
                Gradients& grads, RunContext& ctx) override {
    if (p.kv_cache == KvCache::Paged) fail(ErrorKind::Unsupported, std::string("cudnn: ") + kPagedForwardOnly);
    std::string dtypes, dims;
    if (Profiler* prof = Profiler::current(); prof != nullptr && prof->recording()) describe(p, in, dtypes, dims);
    RecordFunction range(kBackwardOp, dtypes, dims);
    if (!saved.lse.defined()) fail(ErrorKind::InvalidArgument, "cudnn backward: no saved statistics (forward_train)");
    Bound t = bind(p, in, out);
    t[slot(kStats)] = &saved.lse;
    t[slot(kDO)] = &dout;
    t[slot(kDQ)] = &grads.dq;
    t[slot(kDK)] = &grads.dk;
    t[slot(kDV)] = &grads.dv;
    run(GraphKind::Backward, p, t, ctx);
  }

 private:
  static void require(fe::error_t status, const char* step) {
    if (status.is_bad()) {
      fail(ErrorKind::Device, one_line(std::string("cuDNN frontend ") + step + ": " + status.get_message()));
    }
  }

  // The range's inputs: Q, K and V, or with a paged cache what cuDNN reads
  // instead of K and V (the pages and the block table).
  static void describe(const Problem& p, const Inputs& in, std::string& dtypes, std::string& dims) {
    const std::array<const Tensor*, 4> paged{&in.q, &in.k_pages, &in.v_pages, &in.block_table};
    const std::array<const Tensor*, 4> contiguous{&in.q, &in.k, &in.v, nullptr};
    for (const Tensor* t : p.kv_cache == KvCache::Paged ? paged : contiguous) {
      if (t == nullptr) continue;
      if (!dtypes.empty()) dtypes += ", ", dims += ", ";
      dtypes += dtype_name(t->dtype());
      dims += t->dims_string();
    }
  }

  static std::string_view graph_name(GraphKind kind) {
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

  static std::vector<GraphKind> kinds_of(Pass pass) {
    if (pass == Pass::Forward) return {GraphKind::Forward};
    return {GraphKind::TrainForward, GraphKind::Backward};
  }

  // The inputs and O by slot; the bias only for a bias mask. A paged cache
  // binds its pages as K and V, and its block table as both page tables.
  static Bound bind(const Problem& p, const Inputs& in, const Tensor& out) {
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
    }
    return t;
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
  void run(GraphKind kind, const Problem& p, const Bound& t, RunContext& ctx) {
    std::lock_guard<std::mutex> lock(mutex_);
    LastCall& last = last_[static_cast<std::size_t>(kind)];
    const CallKey key = call_key(p, t);
    if (!last.valid || !(key == last.key)) {
      if (!prepare(kind, p, t, ctx, key, last)) return;  // run by the frontend's execute()
    }
    set_stream(ctx.stream);
    ATTNPROF_CUDNN_CHECK(cudnnBackendExecute(handle_, last.plan, last.pack));
  }

  // Cheap: copies ints and pointers, allocates nothing.
  CallKey call_key(const Problem& p, const Bound& t) const {
    CallKey k;
    for (std::size_t i = 0; i < kTensors; ++i) {
      if (t[i] == nullptr) continue;
      k.shape[2 * i] = t[i]->sizes();
      k.shape[2 * i + 1] = t[i]->strides();
      k.ptr[i] = t[i]->data();
    }
    k.ptr[kTensors] = workspace_.defined() ? workspace_.data() : nullptr;
    k.window = p.window;
    k.kv_seq = p.kv_seq;
    k.scale_bits = std::bit_cast<std::uint32_t>(static_cast<float>(p.softmax_scale()));
    k.dtype = p.dtype;
    k.mask = p.mask;
    k.deterministic = p.deterministic;
    return k;
  }

  void set_stream(void* stream) {
    if (stream_set_ && stream == stream_) return;
    ATTNPROF_CUDNN_CHECK(cudnnSetStream(handle_, static_cast<cudaStream_t>(stream)));
    stream_ = stream;
    stream_set_ = true;
  }

  // The slow path of run(): finds (or builds) the graph and the workspace,
  // then either caches a variant pack for this call's addresses and makes it
  // the kind's last call (true), or, for a graph the direct path cannot run,
  // runs the call through the frontend's execute() (false).
  bool prepare(GraphKind kind, const Problem& p, const Bound& t, RunContext& ctx, CallKey key, LastCall& last) {
    last.valid = false;
    Entry& e = entry(p, layout_of(t), kind);
    if (!e.failure.empty()) fail(ErrorKind::Unsupported, "cuDNN: " + e.failure);
    if (!e.plans_built) {
      require(e.graph->build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), "build_plans");
      require(e.graph->get_workspace_size(e.workspace), "get_workspace_size");
      e.plan = direct_plan(e, p.mask);
      e.plans_built = true;
    }
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
      user[slot(kSeqKV)] = e.seq_kv.data();
    }
    if (e.plan == nullptr) {
      set_stream(ctx.stream);
      for (std::size_t i = 0; i < kTensors; ++i) {
        if (user[i] != nullptr) e.pack[kQ + static_cast<std::int64_t>(i)] = user[i];
      }
      require(e.graph->execute(handle_, e.pack, workspace), "execute");
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

  // The chosen plan's descriptor when execute() would do nothing for this graph
  // but build a variant pack from the user's pointers, the frontend's
  // pass-by-value scalars and pointers into its part of the workspace, and run
  // the plan: no workspace the frontend fills (alibi slopes, accumulators it
  // zeroes), no pointers it derives from others (slices), no frontend-run
  // engine. Otherwise null, and execute() runs it.
  static cudnnBackendDescriptor_t direct_plan(Entry& e, MaskKind mask) {
    PlanGraph& g = *e.graph;
    if (!g.varpack_prep_state->prepared.load(std::memory_order_acquire)) {
      require(g.prepare_variant_pack_template(), "prepare_variant_pack_template");
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

  // A finalized variant pack as the frontend's execute() builds it: its
  // template's uids and pass-by-value pointers (scalars owned by the graph),
  // with the user's slots and the frontend's workspace tensors filled, the
  // engine's workspace after the frontend's, and the alignment it checks per
  // call checked once here.
  static cudnnBackendDescriptor_t make_pack(const Entry& e, const std::array<void*, kTensors>& user, void* workspace) {
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

  // `length` in each of `batch` int32s [batch, 1, 1, 1] on the device: a
  // padding mask's per-sequence counts. Once per graph, so the copy waits for
  // its host buffer rather than keep one.
  static Tensor lengths(std::int64_t batch, std::int64_t length, RunContext& ctx) {
    Tensor t = Tensor::empty({batch, 1, 1, 1}, DType::I32, ctx.allocator);
    const std::vector<std::int32_t> host(static_cast<std::size_t>(batch), static_cast<std::int32_t>(length));
    const auto stream = static_cast<cudaStream_t>(ctx.stream);
    ATTNPROF_CUDA_CHECK(
        cudaMemcpyAsync(t.data(), host.data(), host.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice, stream));
    ATTNPROF_CUDA_CHECK(cudaStreamSynchronize(stream));
    return t;
  }

  int sm_version() const {
    int dev = 0, major = 0, minor = 0;
    ATTNPROF_CUDA_CHECK(cudaGetDevice(&dev));
    ATTNPROF_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    ATTNPROF_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    return major * 10 + minor;
  }

  // The cached graph for (p, layout), built up to check_support() on first
  // sight; a refusal is cached too, with cuDNN's own words for it.
  Entry& entry(const Problem& p, const Layout& l, GraphKind kind) const {
    const std::string key = key_of(p, l, kind);
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
    if (handle_ == nullptr) ATTNPROF_CUDNN_CHECK(cudnnCreate(&handle_));
    Entry e;
    e.failure = build(p, l, kind, e.graph);
    return cache_.emplace(key, std::move(e)).first->second;
  }

  // Sets a graph output's uid, dims, strides and type from the layout.
  static void output(fe::graph::Tensor_attributes& t, Uid uid, const Layout& l, fe::DataType_t type) {
    t.set_output(true).set_uid(uid).set_dim(l[uid].dims).set_stride(l[uid].strides).set_data_type(type);
  }

  std::string build(const Problem& p, const Layout& l, GraphKind kind, std::shared_ptr<PlanGraph>& out) const {
    const auto io = p.dtype == DType::BF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
    auto g = std::make_shared<PlanGraph>();
    g->set_io_data_type(io)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto q = add_tensor(*g, "Q", kQ, l[kQ], io);
    auto k = add_tensor(*g, "K", kK, l[kK], io);
    auto v = add_tensor(*g, "V", kV, l[kV], io);
    std::shared_ptr<fe::graph::Tensor_attributes> bias;
    if (p.mask == MaskKind::Bias) bias = add_tensor(*g, "Bias", kBias, l[kBias], io);
    const auto scale = static_cast<float>(p.softmax_scale());
    if (kind == GraphKind::Backward) {
      auto o = add_tensor(*g, "O", kO, l[kO], io);
      auto d_o = add_tensor(*g, "dO", kDO, l[kDO], io);
      auto stats = add_tensor(*g, "Stats", kStats, l[kStats], fe::DataType_t::FLOAT);
      // The frontend's deterministic algorithm sums dQ in a fixed order
      // instead of with atomics: what --deterministic asks for.
      auto options = fe::graph::SDPA_backward_attributes()
                         .set_name("sdpa_backward")
                         .set_attn_scale(scale)
                         .set_deterministic_algorithm(p.deterministic);
      set_mask(options, p, bias);
      auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, d_o, stats, options);
      output(*dq, kDQ, l, io);
      output(*dk, kDK, l, io);
      output(*dv, kDV, l, io);
    } else {
      const bool train = kind == GraphKind::TrainForward;
      auto options = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(train).set_attn_scale(scale);
      set_mask(options, p, bias);
      if (p.kv_cache == KvCache::Paged) paged(*g, options, p, l);
      auto [o, stats] = g->sdpa(q, k, v, options);
      output(*o, kO, l, io);
      if (train) output(*stats, kStats, l, fe::DataType_t::FLOAT);  // stats is null otherwise
    }
    out = g;
    // Each step's refusal is returned in cuDNN's words, on one line: that is
    // the reason explain prints.
    if (auto s = g->validate(); s.is_bad()) return one_line("validate: " + s.get_message());
    if (auto s = g->build_operation_graph(handle_); s.is_bad()) {
      return one_line("build_operation_graph: " + s.get_message());
    }
    if (auto s = g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}); s.is_bad()) {
      return one_line("no engine: " + s.get_message());
    }
    if (auto s = g->check_support(handle_); s.is_bad()) return one_line("check_support: " + s.get_message());
    return {};
  }

  // cuDNN's paged SDPA on a forward's attributes: the page tables (the block
  // table for K and for V), the keys each sequence holds (the problem's, not
  // the pages' padded count), and the padding mask paging requires, its
  // lengths int32 [B, 1, 1, 1].
  static void paged(fe::graph::Graph& g, fe::graph::SDPA_attributes& options, const Problem& p, const Layout& l) {
    const TensorDesc counts{{p.batch, 1, 1, 1}, {1, 1, 1, 1}};
    auto seq_q = add_tensor(g, "seq_len_q", kSeqQ, counts, fe::DataType_t::INT32);
    auto seq_kv = add_tensor(g, "seq_len_kv", kSeqKV, counts, fe::DataType_t::INT32);
    auto table_k = add_tensor(g, "page_table_k", kPageK, l[kPageK], fe::DataType_t::INT32);
    auto table_v = add_tensor(g, "page_table_v", kPageV, l[kPageV], fe::DataType_t::INT32);
    options.set_padding_mask(true)
        .set_seq_len_q(seq_q)
        .set_seq_len_kv(seq_kv)
        .set_paged_attention_k_table(table_k)
        .set_paged_attention_v_table(table_v)
        .set_paged_attention_max_seq_len_kv(static_cast<int>(p.kv_seq));
  }

  mutable std::mutex mutex_;
  mutable std::unordered_map<std::string, Entry> cache_;
  mutable cudnnHandle_t handle_ = nullptr;
  void* stream_ = nullptr;
  bool stream_set_ = false;
  Tensor workspace_;
  static constexpr std::size_t kMaxPacks = 64;
  std::map<PackKey, cudnnBackendDescriptor_t> packs_;  // finalized; destroyed with the backend
  // Per graph kind, the last call the direct path ran; valid until a miss
  // starts over.
  std::array<LastCall, kGraphKinds> last_{};
};

}  // namespace

std::unique_ptr<Backend> make_cudnn() { return std::make_unique<Cudnn>(); }

}  // namespace attnprof::cuda

#else  // !ATTNPROF_WITH_CUDNN

namespace attnprof::cuda {
namespace {

// Stands in for the cuDNN backend so that explain and compare list it with the
// reason instead of leaving it out silently.
class CudnnMissing final : public Backend {
 public:
  std::string_view name() const override { return "cudnn"; }
  Device device() const override { return Device::Cuda; }
  Eligibility eligibility(const Problem&) const override {
    return {false, "not built with cuDNN (run scripts/setup.sh)"};
  }
  std::size_t workspace_bytes(const Problem&) const override { return 0; }
  Expectation expectation(const Problem&) const override {
    return {{"_scaled_dot_product_cudnn_attention"}, /*device_activities=*/1, /*copies=*/0};
  }
  void forward(const Problem&, const Inputs&, Tensor&, RunContext&) override {
    fail(ErrorKind::Unsupported, "cudnn: not built with cuDNN (run scripts/setup.sh)");
  }
};

}  // namespace

std::unique_ptr<Backend> make_cudnn() { return std::make_unique<CudnnMissing>(); }

}  // namespace attnprof::cuda

#endif
