// The CUDA plugin's entry point: the one table of what libattnprof_cuda.so
// gives the CPU side (plugin.h).
#include "backends/cuda/cuda_backends.h"
#include "backends/cuda/plugin.h"
#ifdef ATTNPROF_WITH_NCCL
#include "parallel/cuda/ring_attention.h"
#endif

namespace attnprof::cuda {
namespace {

#ifdef ATTNPROF_WITH_NCCL
class NcclRing final : public Ring {
 public:
  NcclRing(const Problem& p, int world, const Inputs& host) : ring_(p, world, host) {}
  void forward() override { ring_.forward(); }
  void synchronize() override { ring_.synchronize(); }
  Tensor gather_output() override { return ring_.gather_output(); }

 private:
  parallel::RingAttention ring_;
};

std::unique_ptr<Ring> make_ring(const Problem& p, int world, const Inputs& host) {
  return std::make_unique<NcclRing>(p, world, host);
}
#endif

constexpr Plugin kPlugin{
    .abi = kPluginAbi,
    .size = sizeof(Plugin),
    .make_ops = &make_ops,
    .make_efficient = &make_efficient,
    .make_flash = &make_flash,
    .make_cudnn = &make_cudnn,
    .runtime = &runtime,
#ifdef ATTNPROF_WITH_NCCL
    .device_count = [](std::string* why) { return parallel::cuda_device_count(why); },
    .make_ring = &make_ring,
#else
    .device_count = nullptr,
    .make_ring = nullptr,
#endif
};

}  // namespace
}  // namespace attnprof::cuda

extern "C" const attnprof::cuda::Plugin* attnprof_cuda_plugin() { return &attnprof::cuda::kPlugin; }
