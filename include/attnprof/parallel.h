// Context parallelism: one forward of flash sharded along the sequence over N
// GPUs of this machine, ring attention over NCCL (src/parallel/), profiled
// and checked as run_backend's runs are.
#pragma once

#include "attnprof/runner.h"

namespace attnprof {

// The backends --gpus takes.
inline constexpr const char* kRingBackend = "flash";

// Refuses, with one line, what --gpus cannot run before any work: a backend
// other than flash, an unsupported problem (masks other than none/causal,
// kv_seq != seq, grouped-query heads, a sequence that does not cut into 2N
// zigzag chunks), a build without NCCL, and more GPUs than the machine has.
void check_ring(const Problem& p, int gpus, std::string_view backend = kRingBackend);

// flash over `gpus` GPUs (1 runs the same path through NCCL on one GPU):
// fresh inputs, the schedule's steps under the profiler (every device's
// kernels, NCCL's included), the gathered output against float64. A failure
// while running lands in RunResult::failure.
RunResult run_ring(const Problem& p, int gpus, const RunOptions& options);

}  // namespace attnprof
