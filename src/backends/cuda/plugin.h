// The CUDA plugin's interface: how the CPU side reaches the CUDA half.
//
// The CUDA half (this folder, the CUPTI collectors in profiler/cupti, ring
// attention in parallel/cuda) is one shared library, libattnprof_cuda.so,
// that dispatch loads with dlopen the first time a CUDA device is asked for
// or probed (registry.cpp), so a CPU run never maps the CUDA libraries. The
// plugin links none of the CPU layers: its references to them (tensors,
// errors, the profiler's state) resolve against the program that loads it,
// which exports them, so one profiler serves both halves. Plain C++: no CUDA
// header.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "attnprof/backend.h"
#include "attnprof/device_runtime.h"
#include "backends/ops.h"

namespace attnprof::cuda {

// Ring attention over NCCL (parallel/cuda/ring_attention.h) as the host drives it.
class Ring {
 public:
  virtual ~Ring() = default;
  virtual void forward() = 0;      // enqueues one forward on every rank
  virtual void synchronize() = 0;  // waits for every rank's streams
  virtual Tensor gather_output() = 0;
};

// What the plugin hands the CPU side: cuda_backends.h's factories and
// runtime, and the ring.
struct Plugin {
  int abi;           // kPluginAbi of the build that made it
  std::size_t size;  // sizeof(Plugin) there
  std::unique_ptr<Ops> (*make_ops)();
  std::unique_ptr<Backend> (*make_efficient)();
  std::unique_ptr<Backend> (*make_flash)();
  std::unique_ptr<Backend> (*make_cudnn)();  // gives null when built without cuDNN
  DeviceRuntime& (*runtime)();               // throws Error(Unsupported) when no GPU is usable
  // Both null in a plugin built without NCCL. device_count: the CUDA devices
  // this process sees, 0 (and `why` set) when none can be used.
  int (*device_count)(std::string* why);
  std::unique_ptr<Ring> (*make_ring)(const Problem& p, int world, const Inputs& host);
};
// Raised whenever Plugin, or a type it passes, changes layout (2: Backend's
// read_fp8_amax(); 3: Backend's prepare() and RunContext::state).
inline constexpr int kPluginAbi = 3;
inline constexpr const char* kPluginEntry = "attnprof_cuda_plugin";

// The CPU side's handle (registry.cpp): the plugin, loaded on the first call.
// Throws Error(Unsupported), one line, when the build has no CUDA or the
// plugin or a CUDA library it needs cannot be loaded (the loader's dlerror()
// text, or where it looked).
const Plugin& plugin();

}  // namespace attnprof::cuda

// The plugin's entry point (src/plugin/cuda_plugin.cpp), looked up by name (kPluginEntry).
extern "C" const attnprof::cuda::Plugin* attnprof_cuda_plugin();
