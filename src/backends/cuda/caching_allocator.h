// A caching device allocator in PyTorch's manner: freed blocks are kept and
// handed out again, so steady-state forwards call cudaMalloc/cudaFree never,
// and "reserved" (held from the driver) differs from "allocated" (in tensors).
//
// Sizes are rounded up to 512 B (requests up to 1 MiB) or to 2 MiB (larger
// ones), and a cached block is reused for a request when it is at most a
// quarter larger. Blocks are not split. Reuse is safe without events because
// every device tensor is used on the one stream of the CUDA runtime: a block
// freed on the host is only written again by work queued after its last use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>

#include "attnprof/tensor.h"

namespace attnprof::cuda {

class CachingAllocator final : public Allocator {
 public:
  explicit CachingAllocator(int device = 0);
  ~CachingAllocator() override;  // gives cached blocks back (live ones belong to tensors)
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  Device device() const override { return Device::Cuda; }
  // Throws Error(OutOfMemory) after releasing the cache and retrying once;
  // nothing stays allocated by a failed call.
  void* allocate(std::size_t bytes) override;
  void deallocate(void* ptr, std::size_t bytes) noexcept override;
  MemoryStats stats() const override;
  void reset_peak() override;
  void release_cached() override;

  // Bytes held in cached (free) blocks: reserved - allocated.
  std::int64_t cached_bytes() const;
  static std::size_t round_size(std::size_t bytes);

 private:
  void* take_cached(std::size_t size);  // under mutex_
  void release_cached_locked();

  int device_;
  mutable std::mutex mutex_;
  std::multimap<std::size_t, void*> free_;       // cached blocks by size
  std::unordered_map<void*, std::size_t> live_;  // block -> its (rounded) size
  MemoryStats stats_;
};

}  // namespace attnprof::cuda
