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
// lengths, take the same path). The CUDA flash (fused_backend.h, through
// backends/cuda/sequence_lengths.h) lowers a host copy once a call and hands
// the lengths to its sm90 kernels as FusedParams::kv_lens; any other Boolean
// mask it refuses by name.
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
