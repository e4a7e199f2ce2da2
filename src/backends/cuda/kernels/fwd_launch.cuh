// How the fused forwards are launched (launch_fwd), and the per-head-dim
// launchers that dispatch calls. A launcher's definition lives in its kernel's
// header; each is explicitly instantiated, for every mask and element type,
// in one translation unit per kernel and head dim
// (src/backends/cuda/instantiations/<kernel>_hdim<D>.cu, ATTNPROF_FWD_INSTANTIATE), so a
// dispatching file sees declarations only and the kernels compile in parallel.
// The launch helpers here (opt_in_shared_memory, launch_after_prior) serve the
// backwards' kernels too.
#pragma once

#include <cuda_runtime.h>

#include <mutex>
#include <set>
#include <utility>

#include "backends/cuda/device_attributes.h"
#include "backends/cuda/kernels/element.cuh"
#include "backends/cuda/kernels/fwd_args.cuh"

namespace attnprof::cuda::kernels {

// Dynamic shared memory a kernel may take without opting in.
inline constexpr int kSmemWithoutOptIn = 48 * 1024;

// Opts `kernel` in to `bytes` of dynamic shared memory on `device` (the
// current one), once: cudaFuncSetAttribute costs a driver call (about a
// microsecond) that a kernel launched on every forward should not pay each
// time. The attribute is per function and device, so is the memo.
template <class Kernel>
cudaError_t opt_in_shared_memory(Kernel* kernel, int bytes, int device) {
  if (bytes <= kSmemWithoutOptIn) return cudaSuccess;
  static std::mutex mutex;
  static std::set<std::pair<const void*, int>> done;  // (kernel, device)
  const std::pair<const void*, int> key{reinterpret_cast<const void*>(kernel), device};
  std::lock_guard lock(mutex);
  if (done.contains(key)) return cudaSuccess;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess) done.insert(key);
  return e;
}

// The same on the current device.
template <class Kernel>
cudaError_t opt_in_shared_memory(Kernel* kernel, int bytes) {
  if (bytes <= kSmemWithoutOptIn) return cudaSuccess;
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  return opt_in_shared_memory(kernel, bytes, device);
}

// Launches `kernel` on `stream` so that it may start while the kernel before
// it finishes (programmatic dependent launch; the kernel waits with
// wait_prior_grid, utils.cuh): its blocks' start, shared-memory setup and
// the loads that need nothing of the kernel before overlap that kernel's
// last blocks. Args are converted to the kernel's parameter types.
template <class... Params, class... Args>
cudaError_t launch_after_prior(void (*kernel)(Params...), dim3 grid, int threads, int smem_bytes, cudaStream_t stream,
                               Args&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = dim3(static_cast<unsigned>(threads));
  config.dynamicSmemBytes = static_cast<std::size_t>(smem_bytes);
  config.stream = stream;
  config.attrs = &attr;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// The grid comes from the kernel's tile scheduler; `extra` are the kernel's
// arguments after FwdArgs (the sm90 kernel's TMA descriptors). Kernels of more
// than 48 KiB of dynamic shared memory opt in first (once). One cudaGetDevice
// serves both the opt-in and a persistent grid's multiprocessor count (read
// once per device).
template <class Scheduler, class... Extra>
cudaError_t launch_fwd(void (*kernel)(FwdArgs, Extra...), int threads, int smem_bytes, const FwdArgs& a,
                       cudaStream_t stream, const Extra&... extra) {
  int device = 0, sms = 0;
  if (Scheduler::kPersistent || smem_bytes > kSmemWithoutOptIn) {
    if (const cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  }
  if (const cudaError_t err = opt_in_shared_memory(kernel, smem_bytes, device); err != cudaSuccess) return err;
  if constexpr (Scheduler::kPersistent) {
    if (const cudaError_t err = fixed_device_attribute(sms, cudaDevAttrMultiProcessorCount, device);
        err != cudaSuccess) {
      return err;
    }
  }
  kernel<<<Scheduler::grid(a, sms), threads, smem_bytes, stream>>>(a, extra...);
  return cudaGetLastError();
}

// kLse: FwdArgs::lse is not null and the log-sum-exp is written (epilogue_fwd.cuh).
template <int kHeadDim, MaskMode kMask, Half16 Element, bool kLse>
cudaError_t launch_flash_fwd_sm90(const FwdArgs& a, cudaStream_t stream);
template <int kHeadDim, MaskMode kMask, Half16 Element, bool kLse>
cudaError_t launch_flash_fwd_sm80(const FwdArgs& a, cudaStream_t stream);
template <int kHeadDim, MaskMode kMask, Half16 Element, bool kLse>
cudaError_t launch_efficient_fwd(const FwdArgs& a, cudaStream_t stream);
// e4m3 inputs (flash_fwd_sm90_fp8.cuh): a.v is V^T, o_scale V's descale.
template <int kHeadDim, MaskMode kMask>
cudaError_t launch_flash_fwd_sm90_fp8(const FwdArgs& a, float o_scale, cudaStream_t stream);

// Explicit instantiations of `launcher` at one head dim: every mask and
// element type, with and without the LSE.
#define ATTNPROF_FWD_INSTANTIATE_ONE(launcher, ...) \
  template cudaError_t launcher<__VA_ARGS__>(const FwdArgs&, cudaStream_t);
#define ATTNPROF_FWD_INSTANTIATE(launcher, head_dim)                              \
  ATTNPROF_FWD_INSTANTIATE_ONE(launcher, head_dim, MaskMode::None, Bf16, false)   \
  ATTNPROF_FWD_INSTANTIATE_ONE(launcher, head_dim, MaskMode::Causal, Bf16, false) \
  ATTNPROF_FWD_INSTANTIATE_ONE(launcher, head_dim, MaskMode::Window, Bf16, false) \
  ATTNPROF_FWD_INSTANTIATE_ONE(launcher, head_dim, MaskMode::None, Fp16, false)   \
  ATTNPROF_FWD_INSTANTIATE_ONE(launcher, head_dim, MaskMode::Causal, Fp16, false) \
  ATTNPROF_FWD_INSTANTIATE_ONE(launcher, head_dim, MaskMode::Window, Fp16, false) \
  ATTNPROF_FWD_INSTANTIATE_ONE(launcher, head_dim, MaskMode::None, Bf16, true)    \
  ATTNPROF_FWD_INSTANTIATE_ONE(launcher, head_dim, MaskMode::Causal, Bf16, true)  \
  ATTNPROF_FWD_INSTANTIATE_ONE(launcher, head_dim, MaskMode::Window, Bf16, true)  \
  ATTNPROF_FWD_INSTANTIATE_ONE(launcher, head_dim, MaskMode::None, Fp16, true)    \
  ATTNPROF_FWD_INSTANTIATE_ONE(launcher, head_dim, MaskMode::Causal, Fp16, true)  \
  ATTNPROF_FWD_INSTANTIATE_ONE(launcher, head_dim, MaskMode::Window, Fp16, true)

}  // namespace attnprof::cuda::kernels
