// What the composite backends share: the Ops object they run on, the cached
// structural mask, and the expectation derived by running the forward against
// the plan (plan.h) instead of being written by hand.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "attnprof/backend.h"
#include "backends/ops.h"

namespace attnprof::composite {

// The structural mask of the last problem, built once and kept, like the
// registered buffer of the reference module: building it is not per-call work.
class MaskCache {
 public:
  Tensor get(Ops& ops, const Problem& p, RunContext& ctx);

 private:
  std::mutex mutex_;
  std::string key_;
  const Allocator* allocator_ = nullptr;
  Tensor mask_;
};

class CompositeBackend : public Backend {
 public:
  explicit CompositeBackend(std::unique_ptr<Ops> ops) : ops_(std::move(ops)) {}

  Device device() const override { return ops_->device(); }

  // The ops a steady-state forward calls, in order, and what they issue on
  // this device: a warmup pass against the plan fills the caches, the second
  // pass is recorded (as the profiler's schedule warms up before it records).
  Expectation expectation(const Problem& p) const override;
  // Bytes the same planned forward allocates beyond its inputs and output (at
  // its peak, the cached mask and the library's workspace included): what
  // workspace_bytes() estimates, for the tests to hold it to.
  std::size_t planned_workspace_bytes(const Problem& p) const;

  void forward(const Problem& p, const Inputs& in, Tensor& out, RunContext& ctx) override {
    run(*ops_, p, in, out, ctx, mask_);
  }

 protected:
  // The forward, written once over the ops.
  virtual void run(Ops& ops, const Problem& p, const Inputs& in, Tensor& out, RunContext& ctx,
                   MaskCache& mask) const = 0;

  const Ops& ops() const { return *ops_; }
  // Why a problem for another device is not eligible here (empty when it is ours).
  std::string wrong_device(const Problem& p) const;

 private:
  struct Planned {
    Expectation expectation;
    std::size_t workspace_bytes = 0;
  };
  Planned plan(const Problem& p) const;

  std::unique_ptr<Ops> ops_;
  MaskCache mask_;
};

}  // namespace attnprof::composite
