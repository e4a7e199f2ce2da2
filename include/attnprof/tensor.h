// Tensors: 4-d strided views over owned, allocator-tracked buffers.
//
// Attention tensors are [batch, heads, seq, head_dim]; any strides are allowed,
// so a [batch, seq, heads, head_dim] buffer is the same storage viewed through
// transpose(1, 2), not a copy.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "attnprof/dtype.h"

namespace attnprof {

enum class Device : std::uint8_t { Cpu, Cuda };

constexpr const char* device_name(Device d) { return d == Device::Cpu ? "cpu" : "cuda"; }

struct MemoryStats {
  std::int64_t allocated = 0;       // bytes in live tensors
  std::int64_t reserved = 0;        // bytes held from the system (>= allocated for a caching allocator)
  std::int64_t peak_allocated = 0;  // since the last reset_peak()
  std::int64_t peak_reserved = 0;
};

// Told of every allocation and free of the allocators it observes (the
// profiler, while it records): `delta` > 0 allocates, < 0 frees, and `after`
// holds the totals once the change is made.
class AllocationObserver {
 public:
  virtual ~AllocationObserver() = default;
  virtual void on_allocation(Device device, const void* ptr, std::int64_t delta, const MemoryStats& after) = 0;
};

// Every tensor buffer comes from an allocator, which keeps totals and the peak
// and reports each allocation and free to its observer, if it has one.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Device device() const = 0;
  // Throws Error(OutOfMemory) with the size asked for; never returns null.
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void deallocate(void* ptr, std::size_t bytes) noexcept = 0;
  virtual MemoryStats stats() const = 0;
  virtual void reset_peak() = 0;
  // Gives cached blocks back to the system (no-op where nothing is cached).
  virtual void release_cached() {}

  // One observer at a time; clear_observer(o) clears it only if it is still o.
  void set_observer(AllocationObserver* o) { observer_.store(o, std::memory_order_release); }
  bool clear_observer(AllocationObserver* expected) { return observer_.compare_exchange_strong(expected, nullptr); }

 protected:
  // Implementations call this after each change, outside their own lock.
  void notify(const void* ptr, std::int64_t delta, const MemoryStats& after) const {
    if (AllocationObserver* o = observer_.load(std::memory_order_acquire))
      o->on_allocation(device(), ptr, delta, after);
  }

 private:
  std::atomic<AllocationObserver*> observer_{nullptr};
};

// The process-wide CPU allocator (64-byte aligned, tracked).
Allocator& cpu_allocator();

class Storage {
 public:
  // Allocates `bytes` from `allocator` and gives them back on destruction.
  Storage(Allocator& allocator, std::size_t bytes);
  // Borrows memory someone else owns (a PyTorch or NumPy buffer): never freed here.
  Storage(void* data, std::size_t bytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  // The allocator that owns the buffer; null for borrowed memory.
  Allocator* allocator() const { return allocator_; }

 private:
  Allocator* allocator_;
  void* data_;
  std::size_t bytes_;
  Device device_;
};

using Dims = std::array<std::int64_t, 4>;

// "[8, 16, 1024, 64]", as profiler ranges list input dims.
std::string dims_string(const Dims& d);

class Tensor {
 public:
  Tensor() = default;

  // A contiguous (row-major) tensor; contents uninitialised.
  static Tensor empty(const Dims& sizes, DType dtype, Allocator& allocator);
  // A view over memory the caller owns and keeps alive while the tensor is
  // used (nothing is allocated, copied or freed). `data` is element
  // [0,0,0,0]; strides are in elements and may not be negative.
  static Tensor from_blob(void* data, const Dims& sizes, const Dims& strides, DType dtype, Device device);

  bool defined() const { return storage_ != nullptr; }
  const Dims& sizes() const { return sizes_; }
  const Dims& strides() const { return strides_; }  // in elements
  std::int64_t size(int dim) const { return sizes_[static_cast<std::size_t>(dim)]; }
  std::int64_t stride(int dim) const { return strides_[static_cast<std::size_t>(dim)]; }
  std::int64_t numel() const { return sizes_[0] * sizes_[1] * sizes_[2] * sizes_[3]; }
  std::int64_t offset() const { return offset_; }
  DType dtype() const { return dtype_; }
  Device device() const;
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * element_size(dtype_); }
  bool is_contiguous() const;
  // True when the last dimension is unit-stride (rows can be read as vectors).
  bool rows_contiguous() const { return sizes_[3] == 1 || strides_[3] == 1; }

  // Base pointer of element [0,0,0,0].
  void* data() const;
  template <class T>
  T* data_as() const {
    return static_cast<T*>(data());
  }

  // Metadata-only views sharing this storage.
  Tensor transpose(int a, int b) const;
  Tensor as_strided(const Dims& sizes, const Dims& strides, std::int64_t offset) const;
  // Broadcasts size-1 dimensions to `sizes` with stride 0 (like expand()).
  Tensor expand(const Dims& sizes) const;

  std::int64_t index(std::int64_t i0, std::int64_t i1, std::int64_t i2, std::int64_t i3) const {
    return i0 * strides_[0] + i1 * strides_[1] + i2 * strides_[2] + i3 * strides_[3];
  }
  // Element access for CPU tensors, through float.
  float get(std::int64_t i0, std::int64_t i1, std::int64_t i2, std::int64_t i3) const {
    return load_as_float(data(), dtype_, index(i0, i1, i2, i3));
  }
  void set(std::int64_t i0, std::int64_t i1, std::int64_t i2, std::int64_t i3, float v) const {
    store_from_float(data(), dtype_, index(i0, i1, i2, i3), v);
  }

  std::string describe() const;     // "bf16[8, 16, 1024, 64] strides [...]"
  std::string dims_string() const;  // "[8, 16, 1024, 64]", as profiler ranges list input dims

 private:
  std::shared_ptr<Storage> storage_;
  Dims sizes_{};
  Dims strides_{};
  std::int64_t offset_ = 0;
  DType dtype_ = DType::F32;
};

Dims contiguous_strides(const Dims& sizes);

}  // namespace attnprof
