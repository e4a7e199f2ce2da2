// Ring attention over NCCL (context parallelism), driven by one process: one
// NCCL communicator per GPU (ncclCommInitAll), Q, K and V sharded zigzag along
// the sequence (sharding.h). Each rank computes its query shard against the
// key/value shards as they come around the ring (ncclSend to rank+1,
// ncclRecv from rank-1, on a communication stream that overlaps the compute
// stream; events order the two), with our flash forward on each visible
// (query chunk, key chunk) pair, merging the partial results by their
// log-sum-exp (merge.h) in FP32.
//
// Built only where CUDA and NCCL are (ATTNPROF_WITH_NCCL); the interface is
// plain C++ so that the layer's host code includes no CUDA header.
#pragma once

#include <memory>
#include <string>

#include "attnprof/backend.h"
#include "attnprof/problem.h"
#include "attnprof/tensor.h"

namespace attnprof::parallel {

// CUDA devices this process sees; 0 (and `why` set) when none can be used.
int cuda_device_count(std::string* why = nullptr);

class RingAttention {
 public:
  // Devices 0..world-1; uploads each rank's shard of `host` (q, k, v on the
  // CPU, [B, H, S, D], rows contiguous). Throws Error(Device) naming the
  // failing CUDA or NCCL call; NCCL failing to start names ncclGetErrorString.
  RingAttention(const Problem& p, int world, const Inputs& host);
  ~RingAttention();
  RingAttention(const RingAttention&) = delete;
  RingAttention& operator=(const RingAttention&) = delete;

  // Enqueues one forward on every rank (returns before the GPUs finish).
  void forward();
  // Waits for every rank's streams.
  void synchronize();
  // The output, gathered from the ranks into global row order on the CPU.
  Tensor gather_output();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace attnprof::parallel
