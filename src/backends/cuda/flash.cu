// flash: for few queries or a paged KV cache our split-KV decode kernel; else
// our FlashAttention-3 class kernel on sm90a (head_dim 64, 96, 128, 192, 256)
// and our FlashAttention-2 class kernel elsewhere (sm80 path; runs on sm90
// too). flash_path (fused_kernels.h) says which.
#include <cstdio>
#include <memory>
#include <string>

#include "backends/cuda/cuda_backends.h"
#include "backends/cuda/fused_backend.h"
#include "backends/cuda/kernels/flash_fwd_sm90_cfg.cuh"

namespace attnprof::cuda {
namespace {

// What eligibility (and so explain) says will run for a problem of this shape.
const char* flash_story(const FusedParams& shape) {
  thread_local std::string story;
  // A packed batch: a launch's cumulative lengths, or eligibility's
  // fused_params_for (its packed rows, no pointers).
  const bool packed = shape.cu_seqlens_q != nullptr || shape.total_q > 0;
  const FlashPath path = flash_path(shape);
  if (path == FlashPath::Decode) {
    const DecodePlan plan = flash_decode_plan(shape);
    const int group = shape.heads / shape.kv_heads;
    story = "the split-KV decode kernel (FlashDecoding class: the " + std::to_string(group) +
            " query heads of a KV head and their queries packed into " + std::to_string(plan.row_blocks) + " " +
            std::to_string(plan.rows) + "-row tile" + (plan.row_blocks == 1 ? "" : "s") + " a KV head, " +
            (plan.row_blocks == 1 ? "so K and V are read once" : "each reading K and V") + "; cp.async " +
            (shape.page_size > 0 ? "rows found through the block table" : "stages") + ", mma.sync)";
    story += plan.splits > 1 ? "; the " + std::to_string(shape.seq_k) + " keys split " + std::to_string(plan.splits) +
                                   " ways to fill the GPU, then a combine kernel merges the splits by their "
                                   "log-sum-exp (2 kernels)"
                             : "; one key range a CTA (the batch fills the GPU): 1 kernel";
    if (shape.page_size > 0 && shape.seq_q > kFlashDecodeMaxQueries) {
      story += "; a paged cache is read by this kernel only, so these " + std::to_string(shape.seq_q) +
               " queries run as decode tiles (it is built for at most " + std::to_string(kFlashDecodeMaxQueries) + ")";
    }
    return story.c_str();
  }
  if (shape.fp8) {
    story =
        "V^T in e4m3 by a pre-pass (e4m3 wgmma reads V K-major), then one fused kernel (FlashAttention-3 class "
        "on sm90: TMA loads, e4m3 wgmma for Q K^T and P V with P as 256 p in e4m3, FP32 softmax and "
        "accumulation, bf16 O; Q's and K's descales in the softmax scale, V's in the epilogue): 2 kernels";
    return story.c_str();
  }
  story = path == FlashPath::Sm90 ? "one fused kernel (FlashAttention-3 class on sm90: TMA loads from a "
                                    "producer warp, or at head dims 192 and 256 a producer warpgroup that gives "
                                    "its registers to the consumers; wgmma, two consumer warpgroups)"
                                  : "one fused kernel (FlashAttention-2 class: cp.async "
                                    "double-buffered K/V, mma.sync, online softmax)";
  if (packed) {
    story += "; a packed batch of " + std::to_string(shape.batch) +
             " sequences, each against its own keys (tiles past a sequence's end return at once)";
  }
  // A dense batch's rows are the call's (Inputs), not the problem's: said
  // whole when the shape has them, and as what a call may give otherwise.
  if (shape.dense_rows()) {
    story +=
        "; each sequence of its own rows (q_rows, kv_rows: read on the device in stream order, clamped there into "
        "the tensors): its query and key tiles only, from its first rows, the mask's band in its own coordinates; "
        "padded tiles are never computed, and the tiles that hold rows outside a sequence write their zeros (O, "
        "LSE +inf; dQ, dK and dV in the backward) in the same kernels, no memset";
  } else if (!packed && !shape.fp8) {
    story +=
        "; a call's per-sequence rows (q_rows, kv_rows: padding) are read on the device, and only each "
        "sequence's tiles computed (zeros outside its rows)";
  }
  if (shape.softcap > 0.f) {
    story += "; scores soft-capped (tanh before the mask, its derivative in the backward)";
    if (path == FlashPath::Sm90) {
      // Which softmax the capped forward takes (launch_flash_fwd_sm90).
      const kernels::FwdArgs a = kernels::FwdArgs::from(shape);
      char base[48];
      std::snprintf(base, sizeof base, "%.1f", a.scale_log2);
      story += shape.bf16 && kernels::softcap_on_fixed_base(a)
                   ? std::string("; the forward's exponentials against the fixed base c log2 e = ") + base +
                         " (a capped score stays below it: no row max, no rescale of O, the row sums from the "
                         "tensor cores)"
                   : std::string("; the forward's exponentials against the running max, as without a cap (") +
                         (shape.bf16 ? std::string("c log2 e = ") + base + " is past the fixed base's bound of " +
                                           std::to_string(static_cast<int>(kernels::kCapFixedBaseMaxLog2))
                                     : std::string("fp16's P cannot hold the fixed base's range")) +
                         ")";
    }
  }
  if (!shape.per_sequence() && !packed && shape.softcap == 0.f && shape.seq_q <= 8 * kFlashDecodeMaxQueries &&
      flash_decode_head_dim(shape.head_dim)) {
    story += "; the decode kernel takes at most " + std::to_string(kFlashDecodeMaxQueries) + " queries, this has " +
             std::to_string(shape.seq_q) + ", so it runs as a prefill";
  }
  return story.c_str();
}

}  // namespace

std::unique_ptr<Backend> make_flash() {
  return std::make_unique<FusedBackend>(FusedBackend::Spec{.name = "flash",
                                                           .op = "_flash_attention_forward",
                                                           .kernel = FusedBackend::Kernel::Flash,
                                                           .launch = &launch_flash_checked,
                                                           .story = &flash_story});
}

}  // namespace attnprof::cuda
