// flash: our FlashAttention-2 class fused kernel (sm80 path; runs on sm90).
#include <memory>

#include "backends/cuda/cuda_backends.h"
#include "backends/cuda/fused_backend.h"

namespace attnprof::cuda {

std::unique_ptr<Backend> make_flash() {
  return std::make_unique<FusedBackend>(
      "flash", "_flash_attention_forward", true, &launch_flash_sm80,
      "one fused kernel (FlashAttention-2 class: cp.async double-buffered K/V, mma.sync, online softmax)");
}

}  // namespace attnprof::cuda
