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
//
// A packed (variable-length) batch is cuDNN's ragged layout: the graph sees
// [B, H, max_seq, D] with the packed tensor's head, row and element strides,
// each packed tensor (Q, K, V, O, the statistics, dO, dQ, dK, dV) with a
// ragged offset tensor, int32 [B + 1, 1, 1, 1], where sequence b's rows start
// in elements (cu_seqlens times the row stride), and the padding mask with
// each sequence's query and key counts, int32 [B, 1, 1, 1]. The graph is
// built for the batch, the maxima and the strides; the offsets and lengths
// are data. Where the call left the caller's cu_seqlens on the device
// (Problem::lengths_on_device: the default on a GPU, issue 56) one small
// kernel makes them there, in the caller's stream order, clamped as flash
// clamps them, into a buffer kept per stream; where the lengths are host
// vectors they are copied the first time a length set is seen and kept,
// keyed by their contents. Either way a repeated call finds the same
// buffers and its cached variant pack (cudnn_inputs.h). Causal (top-left
// and bottom-right) and the window apply per sequence, through the lengths.
//
// A boolean mask is turned on the device into the additive bias cuDNN reads
// (0 where true, -inf where false, in q's dtype: mask_to_bias.cu) and runs
// as a bias mask (cudnn_inputs.h); it is never read on the host.
//
// The 16-bit graphs are built in cudnn_graph.cpp (build_sdpa()); a soft cap
// is cuDNN's score modifier there (soft_cap()). cudnn_run.cpp holds the run
// path's pieces this class calls: the tensors by slot, the call key, the
// direct plan and its variant packs, and the eligibility helpers.
//
// dtype fp8 is cuDNN's FP8 SDPA graph (cudnn_fp8.h: which problems it
// takes, its scalars, its e4m3 O and amaxes), forward only, built, cached
// and run by the same path as the 16-bit graphs; this file only dispatches
// to it.
#include <cstdint>
#include <memory>
#include <string>

#include "attnprof/aliasing.h"
#include "attnprof/error.h"
#include "attnprof/profiler.h"
#include "backends/cuda/cuda_backends.h"

#ifdef ATTNPROF_WITH_CUDNN

#include <cuda_runtime.h>
#include <cudnn_frontend.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "backends/cuda/cudnn/cudnn_check.h"
#include "backends/cuda/cudnn/cudnn_fp8.h"
#include "backends/cuda/cudnn/cudnn_graph.h"
#include "backends/cuda/cudnn/cudnn_inputs.h"
#include "backends/cuda/sequence_lengths.h"
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
    if (is_fp8(p.dtype)) return fp8_eligibility(p);
    if (!is_16bit(p.dtype)) {
      return {false, "fp32 not supported by cuDNN SDPA (use dtype=bf16, dtype=fp16 or dtype=fp8)"};
    }
    const bool paged = p.kv_cache == KvCache::Paged;
    if (paged && p.pass != Pass::Forward) return {false, kPagedForwardOnly};
    if (p.varlen()) {
      if (p.softcap > 0) return {false, no_softcap_on_ragged()};
      if (const std::string why = zero_length_refusal(p); !why.empty()) return {false, why};
    }
    try {
      std::lock_guard<std::mutex> lock(mutex_);
      const int sm = sm_version();
      if (sm < 80) return {false, "cuDNN SDPA needs sm80 or newer; this GPU is sm" + std::to_string(sm)};
      // A boolean mask is asked about in its general form, as the bias it
      // becomes; a key-padding one falls back to it if its padding-mask
      // graph is refused.
      const Problem g = as_bias(p);
      for (GraphKind kind : kinds_of(p.pass)) {
        const Entry& e = entry(g, default_layout(g, kind), kind);
        if (!e.failure.empty()) return {false, std::string(graph_name(kind)) + ": " + e.failure};
      }
    } catch (const Error& err) {
      return {false, one_line(err.what())};
    }
    std::string how;
    if (p.varlen()) {
      how = "on the ragged layout (" + std::to_string(p.batch) +
            " packed sequences: per-sequence ragged offsets into Q, K, V and O, padding mask with each "
            "sequence's lengths" +
            (p.lengths_on_device ? ", made on the device from the caller's cu_seqlens by one small kernel" : "") + ")";
    }
    if (p.mask == MaskKind::Boolean) {
      how =
          "with the boolean mask as the additive bias made on the device (0 / -inf in q's dtype, one conversion "
          "kernel; the mask is never read on the host)";
    }
    if (p.softcap > 0) how += std::string(how.empty() ? "" : ", ") + "soft cap as cuDNN's score modifier (tanh)";
    if (!how.empty()) how += ", ";
    if (paged) {
      return {true, "cuDNN paged SDPA graph: K and V read from " + std::to_string(p.page_size) +
                        "-key pages through the block table (padding mask, every sequence full), " + how +
                        "one generated kernel, plan built once per problem and cached"};
    }
    if (p.pass == Pass::Forward) {
      return {true, "cuDNN SDPA graph " + how + "one generated kernel, plan built once per problem and cached"};
    }
    return {true, "cuDNN SDPA forward (with softmax stats) and backward graphs " + how +
                      (p.deterministic ? "deterministic dQ, " : "") + "plans built once per problem and cached"};
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
    if (p.pass != Pass::Forward) bytes += p.lse_bytes();
    if (is_fp8(p.dtype)) return bytes + cudnn_fp8::extra_bytes(p, fp8_bf16_output());
    // A packed batch's offsets and lengths; a boolean mask's bias, counted
    // at the [S, Skv] of a mask broadcast over batch and heads (a mask of
    // its own per batch or head is that many times larger).
    if (p.varlen()) bytes += (kRagged.size() + 2) * static_cast<std::size_t>(p.batch + 1) * sizeof(std::int32_t);
    if (p.mask == MaskKind::Boolean) bytes += static_cast<std::size_t>(p.seq * p.kv_seq) * element_size(p.dtype);
    // A paged graph's padding-mask lengths.
    if (p.kv_cache == KvCache::Paged) bytes += 2 * static_cast<std::size_t>(p.batch) * sizeof(std::int32_t);
    return bytes;
  }

  Expectation expectation(const Problem& p) const override {
    if (is_fp8(p.dtype)) return cudnn_fp8::expectation(p, fp8_bf16_output());
    // A boolean mask: the conversion kernel, then the graph's (a forward's
    // one SDPA kernel; the backward's count is the engine's, below); no copy.
    if (p.mask == MaskKind::Boolean) {
      std::vector<std::string> ops{kForwardOp};
      if (p.pass == Pass::Backward) ops = {kBackwardOp};
      if (p.pass == Pass::Train) ops.emplace_back(kBackwardOp);
      return {ops, /*device_activities=*/p.pass == Pass::Forward ? 2 : -1, /*copies=*/0};
    }
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
    // Lengths on the device: the kernel that makes the ragged offsets first.
    return {{kForwardOp}, /*device_activities=*/p.lengths_on_device ? 2 : 1, /*copies=*/0};
  }

  bool has_backward() const override { return true; }
  // cuDNN's SDPA backward recomputes P from the forward's stats; its dQ is
  // summed with atomics unless the deterministic algorithm is asked for.
  // Soft caps, packed batches and FP8: eligibility() says which of them
  // cuDNN builds (no soft cap on a packed batch; FP8 forward only, dense).
  Traits traits() const override {
    return {.backward_recomputes = true,
            .backward_dq_unordered = true,
            .softcap = true,
            .varlen = true,
            .device_lengths = true,  // its ragged offsets and lengths made on the device (cudnn_inputs.h)
            .fp8 = true,
            .paged = true,
            .paged_lengths = true};  // padded rows: none (a key-padding mask runs as a bias)
  }

  // A plan's state (attnprof/plan.h): the forward graph of the problem found
  // (and its plans built) once, at the layout make_inputs() and a contiguous
  // caller's tensors have, and the plan's own last call, so that a run of the
  // planned problem neither builds the graph's string key nor looks it up,
  // and plans of other problems between its runs do not make it miss.
  // Boolean masks (lowered per call), packed batches (offsets bound per call)
  // and FP8 (its own binding) keep the per-call path.
  struct Planned final : BackendState {
    Entry* entry = nullptr;  // in cache_, whose entries live as long as the backend
    Layout layout;           // the entry's
    LastCall last;
    std::uint64_t generation = 0;  // packs_generation_ when `last` was made
  };

  std::unique_ptr<BackendState> prepare(const Problem& p, RunContext& ctx) override {
    (void)ctx;
    if (p.pass != Pass::Forward || p.mask == MaskKind::Boolean || p.varlen() || is_fp8(p.dtype)) return nullptr;
    std::lock_guard<std::mutex> lock(mutex_);
    auto s = std::make_unique<Planned>();
    s->layout = default_layout(p, GraphKind::Forward);
    Entry& e = entry(p, s->layout, GraphKind::Forward);
    if (!e.failure.empty()) return nullptr;  // the forward refuses, in cuDNN's words
    build_plans(e, p.mask);
    s->entry = &e;
    s->generation = packs_generation_;
    return s;
  }

  void forward(const Problem& p, const Inputs& in, Tensor& out, RunContext& ctx) override {
    require_output_apart(in, out, "cudnn");
    std::string dtypes, dims;
    if (Profiler* prof = Profiler::current(); prof != nullptr && prof->recording()) describe(p, in, dtypes, dims);
    RecordFunction range(kForwardOp, dtypes, dims);
    if (is_fp8(p.dtype)) return forward_fp8(p, in, out, ctx);
    run(GraphKind::Forward, p, in, bind(p, in, out), ctx);
  }

  // The amaxes cuDNN's FP8 graph wrote (cudnn_fp8.h), read on the stream of
  // the last call.
  std::optional<Fp8Amax> read_fp8_amax() override {
    std::lock_guard<std::mutex> lock(fp8_.mutex());
    return fp8_.read_amax(stream_);
  }

  // cuDNN's softmax statistics ("Stats") are, per query row, max + ln(sum of
  // exp(score - max)) over the scaled (and biased) scores: the natural-log
  // log-sum-exp that Saved::lse holds, in FP32 [B, H, S, 1] (the frontend's
  // stats_use_log2, which would make it base 2, is left off). Only cuDNN's own
  // backward reads them; on a fully masked row cuDNN writes what its masking
  // value gives, not necessarily -inf. A packed batch's are the packed
  // [1, H, total_q, 1] of the fused backends, which cuDNN reads and writes
  // as ragged statistics ([B, H, max_seq, 1] through the query offsets);
  // cuDNN takes those on sm90 and newer, and refuses them for the backward on
  // sm8x and sm12x ("Packed/ragged LSE is not supported"), which
  // eligibility() then says.
  void forward_train(const Problem& p, const Inputs& in, Tensor& out, Saved& saved, RunContext& ctx) override {
    if (p.kv_cache == KvCache::Paged) fail(ErrorKind::Unsupported, std::string("cudnn: ") + kPagedForwardOnly);
    if (is_fp8(p.dtype)) fail(ErrorKind::Unsupported, std::string("cudnn: ") + cudnn_fp8::kForwardOnly);
    require_output_apart(in, out, "cudnn");
    std::string dtypes, dims;
    if (Profiler* prof = Profiler::current(); prof != nullptr && prof->recording()) describe(p, in, dtypes, dims);
    RecordFunction range(kForwardOp, dtypes, dims);
    saved.probs = Tensor();
    const Dims lse = p.varlen() ? Dims{1, p.heads, p.total_q(), 1} : Dims{p.batch, p.heads, p.seq, 1};
    saved.lse = Tensor::empty(lse, DType::F32, ctx.allocator);
    Bound t = bind(p, in, out);
    t[slot(kStats)] = &saved.lse;
    run(GraphKind::TrainForward, p, in, t, ctx);
  }

  void backward(const Problem& p, const Inputs& in, const Tensor& out, const Tensor& dout, const Saved& saved,
                Gradients& grads, RunContext& ctx) override {
    if (p.kv_cache == KvCache::Paged) fail(ErrorKind::Unsupported, std::string("cudnn: ") + kPagedForwardOnly);
    if (is_fp8(p.dtype)) fail(ErrorKind::Unsupported, std::string("cudnn: ") + cudnn_fp8::kForwardOnly);
    require_output_apart(in, out, "cudnn");
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
    run(GraphKind::Backward, p, in, t, ctx);
  }

 private:
  // dtype fp8: the refusals by name, then cuDNN's own word on the graph.
  Eligibility fp8_eligibility(const Problem& p) const {
    bool bf16_out = false;
    try {
      const int sm = sm_version();
      if (std::string why = cudnn_fp8::refusal(p, sm); !why.empty()) return {false, why};
      bf16_out = cudnn_fp8::writes_bf16_output(sm);
      std::lock_guard<std::mutex> lock(mutex_);
      const Entry& e = entry(p, default_layout(p, GraphKind::Forward), GraphKind::Forward);
      if (!e.failure.empty()) return {false, "cuDNN FP8 SDPA: " + e.failure};
    } catch (const Error& err) {
      return {false, one_line(err.what())};
    }
    return {true, cudnn_fp8::how(p, bf16_out)};
  }

  // Whether the FP8 graph writes its bf16 O itself (cudnn_fp8.h), from the
  // device's compute capability, read once; e4m3 (Hopper's) without a GPU.
  bool fp8_bf16_output() const {
    int known = fp8_bf16_out_.load(std::memory_order_relaxed);
    if (known == 0) {
      try {
        known = cudnn_fp8::writes_bf16_output(sm_version()) ? 2 : 1;
      } catch (const Error&) {
        return false;
      }
      fp8_bf16_out_.store(known, std::memory_order_relaxed);
    }
    return known == 2;
  }

  // The FP8 graph through run(), its tensors and scalars bound by fp8_, and
  // the e4m3 O converted into `out` after it where the graph writes one.
  void forward_fp8(const Problem& p, const Inputs& in, Tensor& out, RunContext& ctx) {
    const bool bf16_out = fp8_bf16_output();
    std::lock_guard<std::mutex> lock(fp8_.mutex());
    Bound t{};
    fp8_.bind(p, in, out, bf16_out, t, ctx);
    run(GraphKind::Forward, p, in, t, ctx);
    fp8_.finish(in, out, bf16_out, ctx);
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
  void run(GraphKind kind, const Problem& p, const Inputs& in, Bound t, RunContext& ctx) {
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
      if (!prepare(kind, g, t, ctx, key, last, planned)) return;  // run by the frontend's execute()
    }
    set_stream(ctx.stream);
    ATTNPROF_CUDNN_CHECK(cudnnBackendExecute(handle_, last.plan, last.pack));
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
  // `planned`: a plan's state, whose entry is this call's where its layout
  // is the one the plan found it for (no lookup then).
  bool prepare(GraphKind kind, const Problem& p, const Bound& t, RunContext& ctx, CallKey key, LastCall& last,
               const Planned* planned) {
    last.valid = false;
    const Layout layout = layout_of(p, t);
    Entry& e = planned && same_layout(planned->layout, layout) ? *planned->entry : entry(p, layout, kind);
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
  static void build_plans(Entry& e, MaskKind mask) {
    if (e.plans_built) return;
    require_ok(e.graph->build_plans(fe::BuildPlanPolicy_t::HEURISTICS_CHOICE), "build_plans");
    require_ok(e.graph->get_workspace_size(e.workspace), "get_workspace_size");
    e.plan = direct_plan(e, mask);
    e.plans_built = true;
  }

  static bool same_layout(const Layout& a, const Layout& b) {
    for (std::size_t i = 0; i < kTensors; ++i) {
      if (a.t[i].dims != b.t[i].dims || a.t[i].strides != b.t[i].strides) return false;
    }
    return true;
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
    e.failure = is_fp8(p.dtype) ? cudnn_fp8::build(handle_, p, l, fp8_bf16_output(), e.graph)
                                : build_sdpa(handle_, p, l, kind, e.graph);
    return cache_.emplace(key, std::move(e)).first->second;
  }

  mutable std::mutex mutex_;
  // A boolean mask's bias, a packed batch's offsets and lengths (cudnn_inputs.h).
  CallInputs inputs_;
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
  // Bumped whenever cached packs or bound inputs go: a plan's last call made
  // before is stale (Planned::generation).
  std::uint64_t packs_generation_ = 0;
  // dtype fp8's scalars, e4m3 O and amaxes (cudnn_fp8.h), and whether its
  // graph writes O in bf16 (0: not known yet, 1: e4m3, 2: bf16).
  cudnn_fp8::Fp8State fp8_;
  mutable std::atomic<int> fp8_bf16_out_{0};
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
