// Host entry of the flash (FA2-class, sm80) fused forward; its kernels are
// instantiated in flash_fwd_sm80_hdim*.cu, one file per head dim. Also the
// eligibility check both fused kernels share.
#include <cmath>
#include <cstdint>
#include <string>

#include "backends/cuda/device_attributes.h"
#include "backends/cuda/kernels/fwd_dispatch.cuh"
#include "backends/cuda/kernels/fwd_launch.cuh"
#include "backends/cuda/launch/fused_kernels.h"

namespace attnprof::cuda {
namespace {

struct FlashRunner {
  template <int kHeadDim, kernels::MaskMode kMask, kernels::Half16 Element, bool kLse>
  static cudaError_t run(const kernels::FwdArgs& a, cudaStream_t stream) {
    return kernels::launch_flash_fwd_sm80<kHeadDim, kMask, Element, kLse>(a, stream);
  }
};

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace

FusedShape fused_shape_of(const FusedParams& p) {
  return {.batch = p.batch,
          .heads = p.heads,
          .kv_heads = p.kv_heads,
          .seq_q = p.seq_q,
          .seq_k = p.seq_k,
          .head_dim = p.head_dim,
          .scale = p.scale,
          .mask = p.mask,
          .window = p.window,
          .page_size = p.page_size,
          .pages_per_seq = p.pages_per_seq,
          .packed = p.cu_seqlens_q != nullptr,
          .total_q = p.total_q,
          .total_k = p.total_k,
          .rows = p.dense_rows(),
          .softcap = p.softcap,
          .fp8 = p.fp8,
          .lse = p.lse != nullptr};
}

// Both kernels take the same problems but one: a paged KV cache, which only
// flash's decode kernel reads (`flash`). Callers prefix the backend's name,
// so the reason does not repeat it.
const char* fused_shape_unsupported_reason(const FusedShape& p, [[maybe_unused]] bool flash) {
  thread_local std::string reason;
  auto say = [&](const std::string& text) {
    reason = text;
    return reason.c_str();
  };

  int device = 0, major = 0;
  if (const cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) {
    return say(std::string("no usable CUDA device (") + cudaGetErrorString(err) + ")");
  }
  if (const cudaError_t err = fixed_device_attribute(major, cudaDevAttrComputeCapabilityMajor, device);
      err != cudaSuccess) {
    return say(std::string("cannot read the device's compute capability (") + cudaGetErrorString(err) + ")");
  }
  if (major < 8)
    return say("needs an sm80 or newer GPU (Ampere, Hopper); this one is sm" + std::to_string(major) + "x");

  if (p.batch < 1 || p.heads < 1 || p.kv_heads < 1 || p.seq_q < 1 || p.seq_k < 1) {
    return say("batch, heads, kv_heads, seq and kv_seq must all be at least 1");
  }
  if (p.heads > 65535 || p.batch > 65535) return say("batch and heads must each be at most 65535 (grid limit)");
  if (p.heads % p.kv_heads != 0) {
    return say("heads " + std::to_string(p.heads) + " is not a multiple of kv_heads " + std::to_string(p.kv_heads));
  }
  const bool sm90_only = flash && flash_sm90_head_dim(p.head_dim) && !fused_head_dim_built(p.head_dim);
  if (!fused_head_dim_built(p.head_dim) && !(sm90_only && flash_sm90_runs_here())) {
    std::string built;
    for (const int d : kFusedHeadDims) built += (built.empty() ? "" : ", ") + std::to_string(d);
    return say("head_dim " + std::to_string(p.head_dim) + " is not built: use one of " + built +
               (flash ? " (and 192 with flash on an sm90 GPU)" : ""));
  }
  if (!(p.scale > 0.f) || !std::isfinite(p.scale)) return say("the softmax scale must be a positive finite number");
  if (p.mask == MaskKind::Boolean || p.mask == MaskKind::Bias) {
    return say("a mask given as a tensor (boolean, bias) is not read by the fused kernels");
  }
  if (p.mask == MaskKind::SlidingWindow && p.window < 1) return say("mask=sliding-window needs window=N (N >= 1 keys)");
  if (p.page_size > 0) {
    if (!flash) return say("the efficient kernel reads no paged KV cache");
    if (!flash_decode_head_dim(p.head_dim)) {
      std::string built;
      for (const int d : kFlashDecodeHeadDims) built += (built.empty() ? "" : ", ") + std::to_string(d);
      return say("a paged KV cache is read by the decode kernel, built for head_dim " + built + ", not " +
                 std::to_string(p.head_dim));
    }
    if ((p.page_size & (p.page_size - 1)) != 0) {
      return say("the page size must be a power of two, not " + std::to_string(p.page_size));
    }
    if (static_cast<std::int64_t>(p.pages_per_seq) * p.page_size < p.seq_k) {
      return say("the block table's " + std::to_string(p.pages_per_seq) + " pages of " + std::to_string(p.page_size) +
                 " keys do not hold kv_seq " + std::to_string(p.seq_k));
    }
    // The decode kernel's grid y is KV heads x row tiles of (queries x group).
    const std::int64_t rows = static_cast<std::int64_t>(p.seq_q) * (p.heads / p.kv_heads);
    const int tile = flash_decode_rows(rows);
    const std::int64_t row_tiles = (rows + tile - 1) / tile;
    if (row_tiles * p.kv_heads > 65535) {
      return say("a paged cache is read by the decode kernel, which takes at most 65535 KV heads x " +
                 std::to_string(tile) + "-row query tiles; this problem has " + std::to_string(row_tiles * p.kv_heads) +
                 ": use fewer queries or a contiguous cache");
    }
  }
  // Sequences of their own lengths: flash's kernels (sm90 and sm80); soft
  // caps: flash's sm90 kernels only.
  if (p.per_sequence() || p.softcap > 0.f) {
    const char* what = p.softcap > 0.f ? "soft-capping"
                       : p.packed      ? "a packed batch (seq_lens)"
                                       : "per-sequence rows (q_rows, kv_rows)";
    if (!flash) return say("the efficient kernel reads no " + std::string(what));
    if (p.softcap > 0.f && !(flash_sm90_head_dim(p.head_dim) && flash_sm90_runs_here())) {
      return say(std::string(what) +
                 " is read by flash's sm90 kernels only: an sm90 GPU with sm_90a code in this build, head_dim 64, "
                 "96, 128, 192 or 256");
    }
    if (p.page_size > 0 && (p.packed || p.softcap > 0.f)) {
      return say(std::string(what) + " does not combine with a paged KV cache on CUDA");
    }
    if (p.packed && (p.total_q < 1 || p.total_k < 1)) {
      return say("a packed batch needs both cumulative lengths and its packed rows");
    }
    if (p.packed && p.rows) {
      return say("per-sequence rows (q_rows, kv_rows) do not combine with a packed batch (seq_lens)");
    }
    if (p.softcap > 0.f && !std::isfinite(p.softcap)) return say("the soft cap must be a positive finite number");
  }
  if (p.fp8) {
    if (!flash) return say("the efficient kernel takes no fp8 (e4m3) inputs");
    if (!flash_sm90_runs_here()) {
      return say("fp8 (e4m3) needs flash's sm90a kernel: an sm90 GPU (FP8 tensor cores) and sm_90a code in this build");
    }
    if (p.head_dim != kFlashFp8HeadDim) {
      return say("fp8 (e4m3) is built for head_dim " + std::to_string(kFlashFp8HeadDim) + ", not " +
                 std::to_string(p.head_dim));
    }
    if (p.per_sequence() || p.softcap > 0.f || p.page_size > 0) {
      return say(
          "fp8 (e4m3) takes a dense batch with a contiguous cache, no soft cap (not packed batches, per-sequence "
          "rows (q_rows, kv_rows), soft caps or pages)");
    }
    if (p.lse) return say("fp8 (e4m3) runs the forward only (no log-sum-exp for a backward)");
  }
  return nullptr;
}

const char* fused_unsupported_reason(const FusedParams& p, bool flash) {
  if (const char* why = fused_shape_unsupported_reason(fused_shape_of(p), flash)) return why;
  thread_local std::string reason;
  auto say = [&](const std::string& text) {
    reason = text;
    return reason.c_str();
  };
  // What a launch adds to its shape: the tensors' addresses, strides and page
  // count, the lengths' and rows' pointers, the descales.
  if (!p.q || !p.k || !p.v || !p.o) return say("q, k, v and o must all be device pointers");
  if (!aligned16(p.q) || !aligned16(p.k) || !aligned16(p.v) || !aligned16(p.o)) {
    return say("q, k, v and o must be 16-byte aligned");
  }
  if (p.page_size > 0) {
    if (p.block_table == nullptr) return say("a paged KV cache needs its block table");
    if (p.num_pages < 1) return say("a paged KV cache needs its page count (num_pages, at least 1)");
    if (reinterpret_cast<std::uintptr_t>(p.block_table) % alignof(std::int32_t) != 0) {
      return say("the block table must be an int32-aligned device pointer");
    }
  }
  if (p.cu_seqlens_q != nullptr && p.cu_seqlens_k == nullptr) {
    return say("a packed batch needs both cumulative lengths and its packed rows");
  }
  const bool aligned_rows = reinterpret_cast<std::uintptr_t>(p.q_rows) % alignof(std::int32_t) == 0 &&
                            reinterpret_cast<std::uintptr_t>(p.kv_rows) % alignof(std::int32_t) == 0;
  if (!aligned_rows) return say("q_rows and kv_rows must be int32-aligned device pointers (or null)");
  if (p.fp8) {
    for (const float d : {p.q_descale, p.k_descale, p.v_descale}) {
      if (!(d > 0.f) || !std::isfinite(d)) return say("the fp8 descales must be positive finite numbers");
    }
    for (const float* d : {p.q_descale_device, p.k_descale_device, p.v_descale_device}) {
      if (reinterpret_cast<std::uintptr_t>(d) % alignof(float) != 0) {
        return say("the fp8 descale tensors must be float-aligned device pointers (or null)");
      }
    }
  }
  if (p.lse != nullptr && reinterpret_cast<std::uintptr_t>(p.lse) % alignof(float) != 0) {
    return say("lse must be a float-aligned device pointer (or null)");
  }
  // Tiles are loaded in 16-byte rows: 16 e4m3 elements, or 8 of a 16-bit dtype.
  const std::int64_t per_16_bytes = p.fp8 ? 16 : 8;
  for (const std::int64_t stride :
       {p.q_batch_stride, p.q_head_stride, p.q_row_stride, p.k_batch_stride, p.k_head_stride, p.k_row_stride,
        p.v_batch_stride, p.v_head_stride, p.v_row_stride, p.o_batch_stride, p.o_head_stride, p.o_row_stride}) {
    if (stride % per_16_bytes != 0) {
      return say("every batch, head and row stride must be a multiple of " + std::to_string(per_16_bytes) +
                 " elements (16-byte rows" + (p.fp8 ? " of e4m3" : "") + "); make the tensors contiguous");
    }
  }
  // Tile loads and stores index rows inside one tile with 32-bit offsets.
  for (const std::int64_t row_stride : {p.q_row_stride, p.k_row_stride, p.v_row_stride, p.o_row_stride}) {
    if (row_stride >= (std::int64_t{1} << 23)) return say("row strides must be below 2^23 elements");
  }
  return nullptr;
}

cudaError_t launch_flash_sm80(const FusedParams& p, cudaStream_t stream) {
  if (fused_unsupported_reason(p, /*flash=*/true) != nullptr || p.page_size > 0) return cudaErrorInvalidValue;
  return launch_flash_sm80_checked(p, stream);
}

cudaError_t launch_flash_sm80_checked(const FusedParams& p, cudaStream_t stream) {
  return kernels::dispatch_fwd<FlashRunner>(p, stream);
}

}  // namespace attnprof::cuda
