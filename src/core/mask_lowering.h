// Lowering a boolean key-padding mask to per-sequence key lengths.
//
// A padded batch's mask is usually a key-padding mask: [B, 1, 1, Skv] (or any
// broadcast of it), each sequence's row a run of Trues then only Falses.
// Such a mask says no more than "sequence b has kv_len[b] keys", which a
// tiled kernel takes as a bound on the key blocks it visits (nothing read per
// element, blocks past the length never visited) instead of a tensor to read.
//
// Where it is used: the CPU flash forward (backends/cpu/flash.cpp) lowers a
// Boolean mask on every call and, when this returns lengths, clamps each
// sequence's key range to them (Inputs::kv_lens, a paged call's per-sequence
// lengths, take the same path).
//
// The hook for the CUDA fused kernels (the lead's, not wired yet): FusedParams
// (backends/cuda/fused_params.h) would gain
//     const std::int32_t* kv_lens;  // device int32 [B] or null: keys of sequence b are 0 .. kv_lens[b] - 1
// and each kernel would clamp its n_block_max (and mask the last block's
// columns) per batch index with it, as it now does with kv_seq. The CUDA
// flash backend (fused_backend.h) then lowers on the host (the mask is read
// back once per call, B * Skv bytes for a [B, 1, 1, Skv] mask) and passes the
// lengths; until then it refuses Boolean masks, key-padding ones by name.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "attnprof/tensor.h"

namespace attnprof {

// Per-batch key lengths when `mask`, a CPU Bool tensor [B, H, S, Skv] (any
// strides, broadcast dimensions stride 0), is a key-padding mask: for each b,
// every (h, i) row is the same prefix of Trues of length kv_len[b] (0 to Skv)
// and False after it. nullopt otherwise (another mask, another dtype or
// device). Reads each distinct row once and stops at the first that breaks the
// pattern: B * Skv bytes for a [B, 1, 1, Skv] mask.
std::optional<std::vector<std::int32_t>> key_padding_lengths(const Tensor& mask);

}  // namespace attnprof
