// The device-side sequence lengths that flash's sm90 kernels read
// (FusedParams::cu_seqlens_q/k and kv_lens): a packed batch's cumulative
// lengths, and a dense batch's per-sequence key counts, from a caller's
// kv_lens or from a key-padding mask lowered on the host.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "attnprof/problem.h"
#include "attnprof/tensor.h"

namespace attnprof::cuda {

struct PackedLengths {
  const std::int32_t* cu_q = nullptr;  // [batch + 1], from 0
  const std::int32_t* cu_k = nullptr;
};

// Device copies of a packed problem's cumulative lengths on the current
// device: made on the first call with these lengths (one synchronous copy)
// and kept, so that a training loop over the same batch shapes copies
// nothing per call. At most kKeptLengthSets sets are kept; past that the
// device is synchronised and the cache starts again.
inline constexpr int kKeptLengthSets = 256;
PackedLengths device_cu_seqlens(const Problem& p);

// A CUDA Boolean mask lowered to per-sequence key counts
// (core/mask_lowering.h's key_padding_lengths on a host copy, read on
// `stream` and waited for: B * Skv bytes for a [B, 1, 1, Skv] mask);
// nullopt when it is not a key-padding mask.
std::optional<std::vector<std::int32_t>> lowered_key_padding(const Tensor& mask, cudaStream_t stream);

// `lens` (one count a sequence) in `device_buffer` (batch int32 on the
// device, the caller's), copied on `stream`.
void copy_key_counts(const std::vector<std::int32_t>& lens, void* device_buffer, cudaStream_t stream);

}  // namespace attnprof::cuda
