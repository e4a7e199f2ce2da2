// flash: our FlashAttention-3 class kernel on sm90a (head_dim 64, 128), our
// FlashAttention-2 class kernel elsewhere (sm80 path; runs on sm90 too).
#include <memory>

#include "backends/cuda/cuda_backends.h"
#include "backends/cuda/fused_backend.h"

namespace attnprof::cuda {

std::unique_ptr<Backend> make_flash() {
  return std::make_unique<FusedBackend>(
      "flash", "_flash_attention_forward", true, &launch_flash, [](const FusedParams& shape) {
        return flash_sm90_applies(shape) ? "one fused kernel (FlashAttention-3 class on sm90: TMA loads "
                                           "from a producer warp, wgmma, two consumer warpgroups)"
                                         : "one fused kernel (FlashAttention-2 class: cp.async "
                                           "double-buffered K/V, mma.sync, online softmax)";
      });
}

}  // namespace attnprof::cuda
