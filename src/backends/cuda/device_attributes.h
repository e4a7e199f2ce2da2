// Device attributes that stay fixed while the process runs, read from the
// driver once per device: a forward asks for them on every call (the
// compute capability in the eligibility check, the multiprocessors in a
// persistent kernel's grid and the decode kernel's split count).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <cstddef>

namespace attnprof::cuda {

// cudaDeviceGetAttribute(&value, attr, device), answered from a per-device
// memo once a positive value has been read. Only the attributes of kFixed (and
// devices 0-63) are kept; any other is read each time. Lock-free: two threads
// that both miss read the same value.
inline cudaError_t fixed_device_attribute(int& value, cudaDeviceAttr attr, int device) {
  constexpr std::array<cudaDeviceAttr, 3> kFixed = {cudaDevAttrComputeCapabilityMajor, cudaDevAttrMultiProcessorCount,
                                                    cudaDevAttrMaxSharedMemoryPerMultiprocessor};
  constexpr int kDevices = 64;
  static std::array<std::array<std::atomic<int>, kFixed.size()>, kDevices> memo{};  // 0: not read yet
  std::size_t slot = 0;
  while (slot < kFixed.size() && kFixed[slot] != attr) ++slot;
  if (slot == kFixed.size() || device < 0 || device >= kDevices) return cudaDeviceGetAttribute(&value, attr, device);
  std::atomic<int>& known = memo[static_cast<std::size_t>(device)][slot];
  if (const int v = known.load(std::memory_order_relaxed); v > 0) {
    value = v;
    return cudaSuccess;
  }
  const cudaError_t e = cudaDeviceGetAttribute(&value, attr, device);
  if (e == cudaSuccess) known.store(value, std::memory_order_relaxed);
  return e;
}

}  // namespace attnprof::cuda
