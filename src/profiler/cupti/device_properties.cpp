// The device's facts the profiler reads (cupti_collector.h): its properties
// from the CUDA runtime, with the peak DRAM bandwidth, and each kernel's
// theoretical occupancy on it.
#include <cuda_runtime.h>

#include <optional>
#include <string>

#include "attnprof/error.h"
#include "attnprof/occupancy.h"
#include "profiler/cupti/cupti_collector.h"

namespace attnprof::cupti {

DeviceProperties query_device_properties(int device) {
  cudaDeviceProp p{};
  if (const cudaError_t e = cudaGetDeviceProperties(&p, device); e != cudaSuccess) {
    throw Error(ErrorKind::Device, std::string("cudaGetDeviceProperties failed: ") + cudaGetErrorString(e));
  }
  DeviceProperties d;
  d.id = device;
  d.name = p.name;
  d.total_global_mem = static_cast<std::int64_t>(p.totalGlobalMem);
  d.compute_major = p.major;
  d.compute_minor = p.minor;
  d.num_sms = p.multiProcessorCount;
  d.max_threads_per_sm = p.maxThreadsPerMultiProcessor;
  d.max_threads_per_block = p.maxThreadsPerBlock;
  d.max_blocks_per_sm = p.maxBlocksPerMultiProcessor;
  d.regs_per_sm = p.regsPerMultiprocessor;
  d.regs_per_block = p.regsPerBlock;
  d.warp_size = p.warpSize;
  d.shared_mem_per_sm = static_cast<std::int64_t>(p.sharedMemPerMultiprocessor);
  d.shared_mem_per_block = static_cast<std::int64_t>(p.sharedMemPerBlock);
  d.shared_mem_per_block_optin = static_cast<std::int64_t>(p.sharedMemPerBlockOptin);
  d.l2_cache_bytes = p.l2CacheSize;
  // Peak DRAM bandwidth: two transfers per memory clock over the bus. Read
  // as attributes: cudaDeviceProp's memoryClockRate is gone in CUDA 13.
  int clock_khz = 0;
  int bus_bits = 0;
  if (cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, device) == cudaSuccess &&
      cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, device) == cudaSuccess) {
    d.memory_bandwidth_gbs = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / 1e9;
  }
  return d;
}

void fill_occupancy(KernelInfo& kernel, const DeviceProperties& device) {
  const std::optional<Occupancy> o = theoretical_occupancy(kernel, device);
  if (!o) return;
  kernel.blocks_per_sm = o->blocks_per_sm;
  kernel.warps_per_sm = o->warps_per_sm;
  kernel.occupancy_pct = o->pct;
}

}  // namespace attnprof::cupti
