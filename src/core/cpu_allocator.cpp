// The CPU allocator: 64-byte aligned buffers, tracked totals and peak, and
// every allocate and free reported to the observer (a recording profiler).
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>

#include "attnprof/error.h"
#include "attnprof/tensor.h"

namespace attnprof {
namespace {

// 64-byte aligned buffers from plain malloc, the block's start kept in the 8
// bytes before the aligned address. Not aligned_alloc: glibc's memalign asks
// for the size plus the alignment's slack, so the block a freed buffer
// leaves is too small for the next request of the same size, and with a
// live record allocated above it, every profiled step of a run grew the
// heap by its workspace (231 KB a step for flash at 1x2x128x64: 20 GB over
// --active 1000 --repeat 100). A plain malloc of the same size reuses the
// block it freed.
constexpr std::size_t kAlign = 64;

void* aligned_block(std::size_t bytes) {
  void* const block = std::malloc(bytes + kAlign);
  if (!block) return nullptr;
  // malloc's 16-byte alignment leaves at least 16 bytes before the aligned address.
  const std::uintptr_t at = (reinterpret_cast<std::uintptr_t>(block) + kAlign) & ~(std::uintptr_t{kAlign} - 1);
  reinterpret_cast<void**>(at)[-1] = block;
  return reinterpret_cast<void*>(at);
}

void free_aligned_block(void* p) { std::free(static_cast<void**>(p)[-1]); }

class CpuAllocator final : public Allocator {
 public:
  Device device() const override { return Device::Cpu; }

  void* allocate(std::size_t bytes) override {
    // A size near SIZE_MAX would round to 0 (no memory, no error).
    const std::size_t rounded = bytes > SIZE_MAX - 2 * kAlign ? 0 : (bytes + kAlign - 1) / kAlign * kAlign;
    void* p = rounded ? aligned_block(rounded) : nullptr;
    if (bytes && !p) {
      fail(ErrorKind::OutOfMemory,
           "out of host memory allocating " + std::to_string(bytes >> 20) + " MiB: use a smaller batch, heads or seq",
           {"batch", "heads", "seq"});
    }
    MemoryStats after;
    {
      std::lock_guard lock(mutex_);
      stats_.allocated += static_cast<std::int64_t>(rounded);
      stats_.reserved = stats_.allocated;
      stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
      stats_.peak_reserved = stats_.peak_allocated;
      after = stats_;
    }
    notify(p, static_cast<std::int64_t>(rounded), after);
    return p;
  }

  void deallocate(void* ptr, std::size_t bytes) noexcept override {
    if (!ptr) return;
    const std::size_t rounded = (bytes + 63) / 64 * 64;
    MemoryStats after;
    {
      std::lock_guard lock(mutex_);
      stats_.allocated -= static_cast<std::int64_t>(rounded);
      stats_.reserved = stats_.allocated;
      after = stats_;
    }
    notify(ptr, -static_cast<std::int64_t>(rounded), after);
    free_aligned_block(ptr);  // after the event, which records the address
  }

  MemoryStats stats() const override {
    std::lock_guard lock(mutex_);
    return stats_;
  }

  void reset_peak() override {
    std::lock_guard lock(mutex_);
    stats_.peak_allocated = stats_.allocated;
    stats_.peak_reserved = stats_.reserved;
  }

 private:
  mutable std::mutex mutex_;
  MemoryStats stats_;
};

}  // namespace

Allocator& cpu_allocator() {
  static CpuAllocator instance;
  return instance;
}

}  // namespace attnprof
