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

class CpuAllocator final : public Allocator {
 public:
  Device device() const override { return Device::Cpu; }

  void* allocate(std::size_t bytes) override {
    // A size near SIZE_MAX would round to 0 (no memory, no error).
    const std::size_t rounded = bytes > SIZE_MAX - 63 ? 0 : (bytes + 63) / 64 * 64;
    void* p = rounded ? std::aligned_alloc(64, rounded) : nullptr;
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
    std::free(ptr);  // after the event, which records the address
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
