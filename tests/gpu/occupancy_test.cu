// Our occupancy calculator (attnprof/occupancy.h, what the CUPTI collector
// and the trace reader report) against CUDA's own,
// cudaOccupancyMaxActiveBlocksPerMultiprocessor, on this device: small
// kernels made to be bound by each limit (warps, registers, static and
// dynamic shared memory) and our fused backward's and sm80 forward's real
// kernels, over block sizes and dynamic shared memory sizes. Registers and
// static shared memory are the compiler's, read back with
// cudaFuncGetAttributes as CUPTI's record gives them.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "attnprof/activity.h"
#include "attnprof/occupancy.h"
#include "backends/cuda/kernels/flash_bwd_sm80.cuh"
#include "backends/cuda/kernels/flash_fwd_sm80.cuh"
#include "gpu/gpu_test.h"
#include "profiler/cupti/cupti_collector.h"

namespace {

namespace kern = attnprof::cuda::kernels;

// Few registers, no shared memory: bound by warps or the block cap.
__global__ void light_kernel(float* out) { out[blockIdx.x * blockDim.x + threadIdx.x] = 1.f; }

// 40 KiB of static shared memory: bound by shared memory.
__global__ void static_shared_kernel(float* out) {
  __shared__ float buf[10 * 1024];
  buf[threadIdx.x] = static_cast<float>(threadIdx.x);
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = buf[(threadIdx.x + 1) % blockDim.x];
}

// Dynamic shared memory only, sized per launch.
__global__ void dynamic_shared_kernel(float* out) {
  extern __shared__ float dyn[];
  dyn[threadIdx.x] = static_cast<float>(threadIdx.x);
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = dyn[(threadIdx.x + 1) % blockDim.x];
}

// About a hundred live values a thread: bound by registers at larger blocks.
__global__ void many_registers_kernel(float* out, float x) {
  constexpr int kLive = 96;
  float v[kLive];
#pragma unroll
  for (int i = 0; i < kLive; ++i) v[i] = x * static_cast<float>(i + 1) + static_cast<float>(threadIdx.x);
#pragma unroll
  for (int r = 0; r < 8; ++r) {
#pragma unroll
    for (int i = 0; i < kLive; ++i) v[i] = v[i] * v[(i + 1) % kLive] + 1.f;
  }
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < kLive; ++i) s += v[i];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

struct Kernel {
  std::string name;
  const void* func;
};

std::vector<Kernel> kernels_under_test() {
  using Cfg = kern::BwdCfg<64>;
  using FwdCfg = kern::FlashDefaultCfg<128>;
  return {
      {"light", reinterpret_cast<const void*>(light_kernel)},
      {"static_shared", reinterpret_cast<const void*>(static_shared_kernel)},
      {"dynamic_shared", reinterpret_cast<const void*>(dynamic_shared_kernel)},
      {"many_registers", reinterpret_cast<const void*>(many_registers_kernel)},
      {"flash_bwd_preprocess", reinterpret_cast<const void*>(kern::flash_bwd_preprocess_kernel<kern::Bf16, 16>)},
      {"flash_bwd_dkdv hdim 64 causal",
       reinterpret_cast<const void*>(kern::flash_bwd_dkdv_kernel<Cfg, kern::MaskMode::Causal, kern::Bf16, false>)},
      {"flash_fwd_sm80 hdim 128 causal",
       reinterpret_cast<const void*>(kern::flash_fwd_sm80_kernel<FwdCfg, kern::MaskMode::Causal, kern::Bf16, false>)},
  };
}

TEST(OccupancyGpu, OursEqualsCudaOccupancyCalculatorOnRealKernelsAndLaunches) {
  REQUIRE_GPU();
  int device = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  const attnprof::DeviceProperties props = attnprof::cupti::query_device_properties(device);
  if (props.compute_major < 8) GTEST_SKIP() << "the fused kernels under test are built for sm80 and later";
  ASSERT_TRUE(attnprof::arch_limits(props.compute_major, props.compute_minor).has_value())
      << "sm" << props.compute_major << props.compute_minor << " is not in our calculator's table";

  std::set<attnprof::OccupancyLimit> limits_seen;
  int compared = 0;
  for (const Kernel& k : kernels_under_test()) {
    cudaFuncAttributes attr{};
    ASSERT_EQ(cudaFuncGetAttributes(&attr, k.func), cudaSuccess) << k.name;
    // Opt in to all the dynamic shared memory the device allows beside the
    // kernel's static memory, as our launches do for what they use.
    const int dynamic_max = static_cast<int>(props.shared_mem_per_block_optin) - static_cast<int>(attr.sharedSizeBytes);
    ASSERT_EQ(cudaFuncSetAttribute(k.func, cudaFuncAttributeMaxDynamicSharedMemorySize, dynamic_max), cudaSuccess)
        << k.name;
    for (const int block : {32, 64, 96, 128, 192, 256, 384, 512, 768, 1024}) {
      if (block > attr.maxThreadsPerBlock) continue;  // the kernel's launch bounds refuse it
      for (const int dynamic : {0, 1024, 20 * 1024, 48 * 1024, 100 * 1024, 200 * 1024}) {
        if (dynamic > dynamic_max) continue;
        int cuda_blocks = -1;
        ASSERT_EQ(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&cuda_blocks, k.func, block, dynamic), cudaSuccess)
            << k.name << " block " << block << " dynamic " << dynamic;

        attnprof::KernelInfo record;
        record.block = {block, 1, 1};
        record.registers_per_thread = attr.numRegs;
        record.static_shared_bytes = static_cast<int>(attr.sharedSizeBytes);
        record.dynamic_shared_bytes = dynamic;
        const auto ours = attnprof::theoretical_occupancy(record, props);
        ASSERT_TRUE(ours.has_value()) << k.name;
        const std::string what = k.name + " (" + std::to_string(attr.numRegs) + " registers, " +
                                 std::to_string(attr.sharedSizeBytes) + " B static shared), block " +
                                 std::to_string(block) + ", dynamic shared " + std::to_string(dynamic);
        EXPECT_EQ(ours->blocks_per_sm, cuda_blocks)
            << what << ", ours limited by " << attnprof::occupancy_limit_name(ours->limited_by);
        // The collector's record: the same calculator, the same figures.
        attnprof::cupti::fill_occupancy(record, props);
        ASSERT_TRUE(record.blocks_per_sm.has_value()) << what;
        EXPECT_EQ(*record.blocks_per_sm, cuda_blocks) << what;
        EXPECT_NEAR(*record.occupancy_pct, 100.0 * cuda_blocks * ((block + 31) / 32) / (props.max_threads_per_sm / 32),
                    1e-9)
            << what;
        if (cuda_blocks > 0) limits_seen.insert(ours->limited_by);
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 100);
  // The cases bind every limit at least once, so each branch of ours is compared.
  for (const auto limit : {attnprof::OccupancyLimit::Warps, attnprof::OccupancyLimit::Blocks,
                           attnprof::OccupancyLimit::Registers, attnprof::OccupancyLimit::SharedMemory}) {
    EXPECT_TRUE(limits_seen.contains(limit)) << "no case limited by " << attnprof::occupancy_limit_name(limit);
  }
}

}  // namespace
