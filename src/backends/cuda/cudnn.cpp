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
// is cuDNN's score modifier there (soft_cap()). cudnn_executor.cpp caches the
// graphs and runs them (the steady state: a key compare and one execute);
// cudnn_run.cpp holds the run path's pieces: the tensors by slot, the call
// key, the direct plan and its variant packs, and the eligibility helpers.
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
#include "backends/cuda/cudnn/cudnn_executor.h"
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
      std::lock_guard<std::mutex> lock(exec_.mutex());
      const int sm = sm_version();
      if (sm < 80) return {false, "cuDNN SDPA needs sm80 or newer; this GPU is sm" + std::to_string(sm)};
      // A boolean mask is asked about in its general form, as the bias it
      // becomes; a key-padding one falls back to it if its padding-mask
      // graph is refused.
      const Problem g = as_bias(p);
      for (GraphKind kind : kinds_of(p.pass)) {
        const Entry& e = exec_.entry(g, default_layout(g, kind), kind, false);  // not fp8 (above)
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
    std::lock_guard<std::mutex> lock(exec_.mutex());
    std::size_t bytes = 0;
    for (GraphKind kind : kinds_of(p.pass)) {
      const Entry* e = exec_.cached(key_of(p, default_layout(p, kind), kind));
      if (e != nullptr) bytes = std::max(bytes, static_cast<std::size_t>(e->workspace));
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

  // A plan's state: the forward graph found and its plans built once
  // (GraphExecutor::Planned).
  std::unique_ptr<BackendState> prepare(const Problem& p, RunContext& ctx) override {
    (void)ctx;
    if (p.pass != Pass::Forward || p.mask == MaskKind::Boolean || p.varlen() || is_fp8(p.dtype)) return nullptr;
    std::lock_guard<std::mutex> lock(exec_.mutex());
    auto s = std::make_unique<GraphExecutor::Planned>();
    s->layout = default_layout(p, GraphKind::Forward);
    Entry& e = exec_.entry(p, s->layout, GraphKind::Forward, false);  // not fp8 (above)
    if (!e.failure.empty()) return nullptr;                           // the forward refuses, in cuDNN's words
    GraphExecutor::build_plans(e, p.mask);
    s->entry = &e;
    s->generation = exec_.generation();
    return s;
  }

  void forward(const Problem& p, const Inputs& in, Tensor& out, RunContext& ctx) override {
    require_output_apart(in, out, "cudnn");
    std::string dtypes, dims;
    if (Profiler* prof = Profiler::current(); prof != nullptr && prof->recording()) describe(p, in, dtypes, dims);
    RecordFunction range(kForwardOp, dtypes, dims);
    if (is_fp8(p.dtype)) return forward_fp8(p, in, out, ctx);
    exec_.run(GraphKind::Forward, p, in, bind(p, in, out), ctx, false);
  }

  // The amaxes cuDNN's FP8 graph wrote (cudnn_fp8.h), read on the stream of
  // the last call.
  std::optional<Fp8Amax> read_fp8_amax() override {
    std::lock_guard<std::mutex> lock(fp8_.mutex());
    return fp8_.read_amax(exec_.stream());
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
    exec_.run(GraphKind::TrainForward, p, in, t, ctx, false);
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
    exec_.run(GraphKind::Backward, p, in, t, ctx, false);
  }

 private:
  // dtype fp8: the refusals by name, then cuDNN's own word on the graph.
  Eligibility fp8_eligibility(const Problem& p) const {
    bool bf16_out = false;
    try {
      const int sm = sm_version();
      if (std::string why = cudnn_fp8::refusal(p, sm); !why.empty()) return {false, why};
      bf16_out = cudnn_fp8::writes_bf16_output(sm);
      std::lock_guard<std::mutex> lock(exec_.mutex());
      const Entry& e = exec_.entry(p, default_layout(p, GraphKind::Forward), GraphKind::Forward, bf16_out);
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
    exec_.run(GraphKind::Forward, p, in, t, ctx, bf16_out);
    fp8_.finish(in, out, bf16_out, ctx);
  }

  int sm_version() const {
    int dev = 0, major = 0, minor = 0;
    ATTNPROF_CUDA_CHECK(cudaGetDevice(&dev));
    ATTNPROF_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    ATTNPROF_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    return major * 10 + minor;
  }

  // The graphs, their cache, plans, variant packs and last calls (cudnn_executor.h).
  cudnn_graph::GraphExecutor exec_;
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
