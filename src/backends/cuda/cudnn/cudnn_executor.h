// The graphs the cudnn backend (cudnn.cpp) runs: each problem's graph found
// or built once per key (shape, strides, dtype, mask, scale) and cached with
// its plans and cuDNN's refusal, the handle, one workspace shared by the
// graphs, the variant packs by address, and each graph kind's last call, so
// that a repeated call compares its key with the last call's and executes.
// Only cudnn.cpp includes it, in builds with the cuDNN frontend.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

#include "attnprof/backend.h"
#include "attnprof/problem.h"
#include "attnprof/tensor.h"
#include "backends/cuda/cudnn/cudnn_graph.h"
#include "backends/cuda/cudnn/cudnn_inputs.h"

namespace attnprof::cuda::cudnn_graph {

class GraphExecutor {
 public:
  GraphExecutor() = default;
  GraphExecutor(const GraphExecutor&) = delete;
  GraphExecutor& operator=(const GraphExecutor&) = delete;
  ~GraphExecutor();

  // A plan's state (attnprof/plan.h): the forward graph of the problem found
  // (and its plans built) once, at the layout make_inputs() and a contiguous
  // caller's tensors have, and the plan's own last call, so that a run of the
  // planned problem neither builds the graph's string key nor looks it up,
  // and plans of other problems between its runs do not make it miss.
  // Boolean masks (lowered per call), packed batches (offsets bound per call)
  // and FP8 (its own binding) keep the per-call path.
  struct Planned final : BackendState {
    Entry* entry = nullptr;  // in the cache, whose entries live as long as the executor
    Layout layout;           // the entry's
    LastCall last;
    std::uint64_t generation = 0;  // generation() when `last` was made
  };

  // Held by the callers of entry(), cached(), build_plans() and generation();
  // run() takes it itself.
  std::mutex& mutex() const { return mutex_; }

  // The cached graph for (p, layout), built up to check_support() on first
  // sight; a refusal is cached too, with cuDNN's own words for it.
  // `fp8_bf16_out`: an FP8 graph writes its O in bf16 (cudnn_fp8.h).
  Entry& entry(const Problem& p, const Layout& l, GraphKind kind, bool fp8_bf16_out) const;
  // The entry cached under `key` (key_of), or null: nothing is built.
  const Entry* cached(const std::string& key) const;
  // An entry's plans and workspace size, on its first run (or its plan's prepare).
  static void build_plans(Entry& e, MaskKind mask);
  // Bumped whenever cached packs or bound inputs go: a plan's last call made
  // before is stale (Planned::generation).
  std::uint64_t generation() const { return packs_generation_; }

  // One call of graph `kind` on the bound tensors, on ctx's stream (a plan's
  // state in ctx.state: its own last call).
  void run(GraphKind kind, const Problem& p, const Inputs& in, Bound t, RunContext& ctx, bool fp8_bf16_out);
  // The stream of the last call (the FP8 amaxes are read on it).
  void* stream() const { return stream_; }

 private:
  void set_stream(void* stream);
  bool prepare(GraphKind kind, const Problem& p, const Bound& t, RunContext& ctx, CallKey key, LastCall& last,
               const Planned* planned, bool fp8_bf16_out);
  static bool same_layout(const Layout& a, const Layout& b);

  mutable std::mutex mutex_;
  // A boolean mask's bias, a packed batch's offsets and lengths (cudnn_inputs.h).
  CallInputs inputs_;
  mutable std::unordered_map<std::string, Entry> cache_;
  mutable cudnnHandle_t handle_ = nullptr;
  void* stream_ = nullptr;
  bool stream_set_ = false;
  Tensor workspace_;
  static constexpr std::size_t kMaxPacks = 64;
  std::map<PackKey, cudnnBackendDescriptor_t> packs_;  // finalized; destroyed with the executor
  // Per graph kind, the last call the direct path ran; valid until a miss
  // starts over.
  std::array<LastCall, kGraphKinds> last_{};
  std::uint64_t packs_generation_ = 0;  // generation()
};

}  // namespace attnprof::cuda::cudnn_graph
