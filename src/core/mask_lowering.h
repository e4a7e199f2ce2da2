// Lowering a boolean key-padding mask to per-sequence key rows.
//
// A padded batch's mask is usually a key-padding mask: [B, 1, 1, Skv] (or any
// broadcast of it), each sequence's row one run of Trues (right padding: Trues
// then Falses; left padding, as generate() pads: Falses then Trues; or both).
// Such a mask says no more than "sequence b's keys are rows begin .. end - 1",
// which a tiled kernel takes as bounds on the key blocks it visits (nothing
// read per element, blocks outside the rows never visited) instead of a
// tensor to read.
//
// Where it is used: the CPU flash forward (backends/cpu/flash.cpp) lowers a
// Boolean mask on every call and, when this returns rows, narrows each
// sequence's keys to them (Inputs::kv_rows, a paged call's per-sequence
// lengths, take the same path). The CUDA flash (fused_backend.h, through
// backends/cuda/sequence_lengths.h) lowers a host copy once a call and hands
// the rows to its kernels as FusedParams::kv_rows; any other Boolean mask it
// refuses by name.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "attnprof/tensor.h"
#include "core/mask_geometry.h"

namespace attnprof {

// One sequence's rows, begin .. end - 1: an entry of Inputs::kv_rows (two
// int32s, the layout of the tensor's last dimension and of the kernels' pairs).
using RowSpan = geometry::Span<std::int32_t>;

// Per-batch key rows when `mask`, a CPU Bool tensor [B, H, S, Skv] (any
// strides, broadcast dimensions stride 0), is a key-padding mask: for each b,
// every (h, i) row is the same single run of Trues, keys begin .. end - 1
// (0 <= begin <= end <= Skv; a row of only Falses is (0, 0)), and False
// elsewhere. nullopt otherwise (another mask, another dtype or device). Reads
// each distinct row once and stops at the first that breaks the pattern:
// B * Skv bytes for a [B, 1, 1, Skv] mask.
std::optional<std::vector<RowSpan>> key_padding_rows(const Tensor& mask);

}  // namespace attnprof
