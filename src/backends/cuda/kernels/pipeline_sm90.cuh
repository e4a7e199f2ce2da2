// The producer/consumer pipeline of the sm90 kernels, over mbarriers in shared
// memory (our own, shaped like CUTLASS's PipelineTmaAsync and the pipelines of
// FlashAttention-3's hopper/).
//
// A ring of kStages buffers, each of kParts parts (K and V). The producer (one
// thread) acquires a part of a stage once its consumers have released it,
// announces the bytes TMA will bring into it and issues the copies; the part's
// "full" barrier completes when it has landed, so consumers may start on the
// first part (K) before the second (V) arrives. Every consumer thread arrives
// on the part's "empty" barrier when done with it, so K's buffer may refill
// while V's is still read (FlashAttention-3's separate K and V pipelines). Who is where in the ring is a
// PipelineState that each side advances after a stage: the phase parities
// are kept there, never worked out from a loop counter by the kernel.
#pragma once

#include <cstdint>

namespace attnprof::cuda::kernels::sm90 {

// mbarriers in shared memory (addresses from smem_u32).
__device__ __forceinline__ void mbar_init(std::uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes this thread's mbarrier.init visible to the asynchronous proxy (the
// TMA unit completes transactions on the barriers), as CUTLASS's
// PipelineTmaAsync does after its inits; a CTA barrier must follow.
__device__ __forceinline__ void mbar_fence_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(std::uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Arrives and announces `bytes` of asynchronous copies that will complete on bar.
__device__ __forceinline__ void mbar_expect_tx(std::uint32_t bar, std::uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Waits until the phase of the given parity has completed (a fresh barrier
// counts its phase "1" as completed).
__device__ __forceinline__ void mbar_wait(std::uint32_t bar, int parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// A position in a ring of kStages: how many stages this side has been
// through, from which the stage and the parity of the phase its barriers are
// in on this lap follow. Both sides start at 0; the producer's first wait on
// each "empty" barrier asks for the phase before (parity 1), which a fresh
// barrier counts as completed. (Kept as one counter: with kStages a power of
// two index and phase are its bits, and ptxas gave the sm90 kernel 1-2 more
// registers with a separate index and phase bit, D = 64 causal 141 vs 139.)
template <int kStages>
struct PipelineState {
  int count = 0;

  __device__ __forceinline__ int index() const { return count % kStages; }
  __device__ __forceinline__ std::uint32_t phase() const { return (count / kStages) & 1; }
  __device__ __forceinline__ void advance() { ++count; }
};

template <int kStages_, int kParts_ = 1>
class PipelineTmaAsync {
 public:
  static constexpr int kStages = kStages_;
  static constexpr int kParts = kParts_;
  static constexpr int kBarriers = 2 * kStages * kParts;  // a full and an empty barrier per part of a stage
  static constexpr int kBarrierBytes = 8 * kBarriers;
  using State = PipelineState<kStages>;

  // bars: kBarrierBytes of 8-byte aligned shared memory.
  __device__ __forceinline__ explicit PipelineTmaAsync(std::uint32_t bars) : bars_(bars) {}

  // By one thread; then mbar_fence_init and a CTA barrier before first use.
  __device__ __forceinline__ void init(int consumer_threads) const {
    for (int st = 0; st < kStages; ++st) {
      for (int part = 0; part < kParts; ++part) {
        mbar_init(full(st, part), 1);
        mbar_init(empty(st, part), consumer_threads);
      }
    }
  }

  // Producer: waits until every consumer has released the part's last lap.
  __device__ __forceinline__ void producer_acquire(const State& s, int part = 0) const {
    mbar_wait(empty(s.index(), part), static_cast<int>(s.phase() ^ 1));
  }
  // Producer: announces `bytes` of TMA copies for one part of the stage and
  // returns the barrier they are to complete on.
  __device__ __forceinline__ std::uint32_t producer_expect(const State& s, int part, std::uint32_t bytes) const {
    const std::uint32_t bar = full(s.index(), part);
    mbar_expect_tx(bar, bytes);
    return bar;
  }

  // Consumer: waits until one part of the stage has landed.
  __device__ __forceinline__ void consumer_wait(const State& s, int part = 0) const {
    mbar_wait(full(s.index(), part), static_cast<int>(s.phase()));
  }
  // Consumer (every thread): done with one part of the stage.
  __device__ __forceinline__ void consumer_release(const State& s, int part = 0) const {
    mbar_arrive(empty(s.index(), part));
  }

 private:
  __device__ __forceinline__ std::uint32_t full(int stage, int part) const {
    return bars_ + 8 * (part * kStages + stage);
  }
  __device__ __forceinline__ std::uint32_t empty(int stage, int part) const {
    return bars_ + 8 * ((kParts + part) * kStages + stage);
  }

  std::uint32_t bars_;
};

}  // namespace attnprof::cuda::kernels::sm90
