// efficient: our memory-efficient fused kernel (xformers/CUTLASS lineage).
#include <memory>

#include "backends/cuda/cuda_backends.h"
#include "backends/cuda/fused_backend.h"

namespace attnprof::cuda {

std::unique_ptr<Backend> make_efficient() {
  return std::make_unique<FusedBackend>(FusedBackend::Spec{
      .name = "efficient",
      .op = "_efficient_attention_forward",
      .kernel = FusedBackend::Kernel::Efficient,
      .launch = [](const FusedParams& p, const DecodePlan&,
                   cudaStream_t stream) { return launch_efficient_checked(p, stream); },
      .story = [](const FusedParams&) { return "one fused kernel (64x64 register-resident tiles, mma.sync)"; }});
}

}  // namespace attnprof::cuda
