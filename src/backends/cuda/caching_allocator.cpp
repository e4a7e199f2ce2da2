#include "backends/cuda/caching_allocator.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "attnprof/error.h"
#include "core/cuda_check.h"

namespace attnprof::cuda {
namespace {

constexpr std::size_t kSmallRound = 512;
constexpr std::size_t kSmallLimit = 1u << 20;  // requests up to this are "small"
constexpr std::size_t kLargeRound = 2u << 20;

std::string mib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", bytes / (1024.0 * 1024.0));
  return buf;
}

// Restores the caller's device so the allocator can be used from code that
// switched devices.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cudaGetDevice(&previous_);
    if (previous_ != device) ATTNPROF_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace

CachingAllocator::CachingAllocator(int device) : device_(device) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard lock(mutex_);
  for (auto& [size, ptr] : free_) cudaFree(ptr);  // at exit the runtime may be gone: ignore errors
  free_.clear();
}

std::size_t CachingAllocator::round_size(std::size_t bytes) {
  if (bytes <= kSmallLimit) return std::max(kSmallRound, (bytes + kSmallRound - 1) / kSmallRound * kSmallRound);
  return (bytes + kLargeRound - 1) / kLargeRound * kLargeRound;
}

void* CachingAllocator::take_cached(std::size_t size) {
  auto it = free_.lower_bound(size);
  // Allow a quarter of slack so a slightly smaller request reuses a block
  // instead of growing the reservation; more would inflate "allocated".
  if (it == free_.end() || it->first > size + size / 4) return nullptr;
  void* ptr = it->second;
  live_.emplace(ptr, it->first);
  stats_.allocated += static_cast<std::int64_t>(it->first);
  free_.erase(it);
  return ptr;
}

void* CachingAllocator::allocate(std::size_t bytes) {
  const std::size_t size = round_size(bytes);
  void* ptr = nullptr;
  MemoryStats after;
  std::int64_t delta = 0;
  {
    std::lock_guard lock(mutex_);
    ptr = take_cached(size);
    if (!ptr) {
      DeviceGuard guard(device_);
      cudaError_t e = cudaMalloc(&ptr, size);
      if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();  // clear it, so later calls do not report it
        release_cached_locked();
        e = cudaMalloc(&ptr, size);
      }
      if (e == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        std::size_t free_bytes = 0, total_bytes = 0;
        cudaMemGetInfo(&free_bytes, &total_bytes);
        throw Error(ErrorKind::OutOfMemory, "CUDA out of memory allocating " + mib(static_cast<double>(bytes)) +
                                                " MiB (" + mib(static_cast<double>(free_bytes)) + " MiB free of " +
                                                mib(static_cast<double>(total_bytes)) +
                                                "): use a smaller batch or seq");
      }
      ATTNPROF_CUDA_CHECK(e);
      live_.emplace(ptr, size);
      stats_.allocated += static_cast<std::int64_t>(size);
      stats_.reserved += static_cast<std::int64_t>(size);
    }
    stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
    stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
    delta = static_cast<std::int64_t>(live_.at(ptr));
    after = stats_;
  }
  notify(ptr, delta, after);  // outside the lock: the profiler takes its own
  return ptr;
}

void CachingAllocator::deallocate(void* ptr, std::size_t) noexcept {
  if (!ptr) return;
  MemoryStats after;
  std::int64_t delta = 0;
  {
    std::lock_guard lock(mutex_);
    auto it = live_.find(ptr);
    if (it == live_.end()) return;  // not ours; nothing sensible to do in noexcept
    delta = -static_cast<std::int64_t>(it->second);
    free_.emplace(it->second, ptr);
    stats_.allocated += delta;
    live_.erase(it);
    after = stats_;
  }
  try {
    notify(ptr, delta, after);
  } catch (...) {  // a free must not throw; losing one trace event is the lesser harm
  }
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard lock(mutex_);
  stats_.peak_allocated = stats_.allocated;
  stats_.peak_reserved = stats_.reserved;
}

void CachingAllocator::release_cached() {
  std::lock_guard lock(mutex_);
  release_cached_locked();
}

void CachingAllocator::release_cached_locked() {
  if (free_.empty()) return;
  DeviceGuard guard(device_);
  for (auto& [size, ptr] : free_) {
    cudaFree(ptr);  // synchronizes the device, so no queued work still uses it
    stats_.reserved -= static_cast<std::int64_t>(size);
  }
  free_.clear();
}

std::int64_t CachingAllocator::cached_bytes() const {
  std::lock_guard lock(mutex_);
  return stats_.reserved - stats_.allocated;
}

}  // namespace attnprof::cuda
