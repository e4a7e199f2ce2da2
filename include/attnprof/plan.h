// A plan: one problem and batch layout, its backend resolved and checked
// once, and whatever that backend can do ahead of the calls done once too
// (Backend::prepare: flash's split-KV sizing and workspace on CUDA), so that
// each run() only checks the tensors against the plan and launches. A
// serving engine calls the same layout once per layer per step; a CUDA graph
// captures run() and replays it with new block tables and lengths written in
// place (docs/library.md, "Plans").
//
//   Plan plan = attnprof::plan(problem, layout, "auto");   // resolves, checks, prepares
//   for (...) plan.run(inputs, out, stream);                // checks shapes, launches
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "attnprof/backend.h"
#include "attnprof/batch_layout.h"
#include "attnprof/problem.h"
#include "attnprof/tensor.h"

namespace attnprof {

class Plan {
 public:
  Plan();  // an empty plan: run() refuses it
  ~Plan();
  Plan(Plan&&) noexcept;
  Plan& operator=(Plan&&) noexcept;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;

  // What the plan was made for, and the backend that runs it (`auto`'s pick,
  // kept for every run).
  const Problem& problem() const;
  const BatchLayout& layout() const;
  Backend& backend() const;
  // "flash: <its eligibility's story>; picked by auto: fastest measured (...)",
  // the layout and the workspace the plan holds.
  std::string explain() const;
  // Bytes the plan holds on the device for its runs (0: none).
  std::size_t workspace_bytes() const;
  // The plan holds its backend's state (false after release() or a move).
  bool valid() const { return state_ != nullptr; }

  // softmax(scale Q K^T + mask) V of `in` into `out` on `stream` (a
  // cudaStream_t; null on the CPU). Checks each tensor against the plan
  // (shape, dtype, device: one-line Error(InvalidArgument) naming the tensor
  // and both shapes), then calls the backend's forward with the plan's
  // state: no backend resolution, no eligibility, nothing sized or
  // allocated by the plan's own work, nothing read on the host on a GPU
  // (index tensors are read by the kernels, in stream order). Runs from
  // several threads take turns: the plan's state serves one at a time.
  void run(const Inputs& in, Tensor& out, void* stream = nullptr);

  // Gives the plan's state and workspace back now (the device memory to its
  // runtime's cache); run() then refuses in one line. A CUDA graph that
  // captured run() must not be replayed after.
  void release();

 private:
  struct State;
  const State& live() const;  // the state, or the one-line refusal of an empty plan
  std::unique_ptr<State> state_;
  friend Plan plan(const Problem& p, const BatchLayout& layout, std::string_view backend, int threads);
  friend Plan plan(const Problem& p, const BatchLayout& layout, Backend& backend, int threads, void* stream);
};

// A plan of `p` (normalized and validated here) in `layout` on `backend`
// ("auto" picks one as resolve_backend does; a layout with rows takes the
// first eligible backend that reads them). Refusals, one line each: an
// unknown backend, one that cannot take the problem or the layout (its
// reason), a layout the problem contradicts, a backward or training pass
// (plans run forwards). `threads`: the CPU's, as RunContext's (0: all cores).
Plan plan(const Problem& p, const BatchLayout& layout, std::string_view backend, int threads = 0);
// The same on a backend the caller holds (checked for eligibility here).
// `stream`: where the backend's prepare orders what it does on the device (a
// packed batch's host lengths copied there), as a first forward on that
// stream would (the call cache plans a call on its caller's stream).
Plan plan(const Problem& p, const BatchLayout& layout, Backend& backend, int threads = 0, void* stream = nullptr);

}  // namespace attnprof
