// Host entry of flash's split-KV decode (kernels/flash_decode.cuh): when it
// applies, how many key ranges it splits into, and the dispatch to the
// instantiations of flash_decode_hdim*.cu.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "backends/cuda/device_attributes.h"
#include "backends/cuda/kernels/flash_decode.cuh"
#include "backends/cuda/kernels/static_switch.cuh"
#include "backends/cuda/launch/fused_kernels.h"
#include "core/mask_geometry.h"

namespace attnprof::cuda {
namespace kernels {
// One line per head dim of kFlashDecodeHeadDims (flash_decode_hdim<D>.cu).
ATTNPROF_DECODE_INSTANTIATE(extern template, 64)
ATTNPROF_DECODE_INSTANTIATE(extern template, 128)
ATTNPROF_DECODE_INSTANTIATE(extern template, 256)
}  // namespace kernels

namespace {

// What the split count depends on: multiprocessors and the shared memory
// each has (which caps the decode CTAs it holds). Read once per device.
struct DeviceFacts {
  int sms = 0, smem_per_sm = 0, major = 0;
};

DeviceFacts device_facts() {
  DeviceFacts f;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      fixed_device_attribute(f.sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      fixed_device_attribute(f.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) != cudaSuccess ||
      fixed_device_attribute(f.major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    return {};
  }
  return f;
}

int decode_smem_bytes(int head_dim, int rows) {
  return kernels::with_head_dim<kFlashDecodeHeadDims>(head_dim, 0, [&]<int kD>() {
    return rows == kFlashDecodeWideRows ? kernels::DecodeCfg<kD, 4>::kSmemBytes : kernels::DecodeCfg<kD, 1>::kSmemBytes;
  });
}

}  // namespace

// The wide tile once a KV head has more rows than one 16-row tile holds. It reads K and V once for 64 rows, where
// 16-row tiles read them once each from L2, which then bounds them (H100, 64 x 32/8 x 4096 x 128, docs/perf/decode.md:
// 16 queries 850 -> 373 us, 12 queries 660 -> 367, 8 queries, half the wide tile padding, 472 -> 365).
// ATTNPROF_DECODE_ROWS=16 or 64 forces one (measuring).
int flash_decode_rows(std::int64_t rows) {
  static const int forced = [] {
    const char* v = std::getenv("ATTNPROF_DECODE_ROWS");
    const int n = v != nullptr ? std::atoi(v) : 0;
    return n == kFlashDecodeRows || n == kFlashDecodeWideRows ? n : 0;
  }();
  if (forced != 0) return forced;
  return rows > kFlashDecodeRows ? kFlashDecodeWideRows : kFlashDecodeRows;
}

bool flash_decode_takes(const FusedParams& p) {
  // Packed batches, soft caps and a dense batch's query rows run on the sm90
  // prefill kernels; per-sequence key rows (kv_rows) are read here, on the
  // device.
  if (p.cu_seqlens_q != nullptr || p.total_q > 0 || p.mask == MaskKind::Boolean || p.softcap > 0.f ||
      p.q_rows != nullptr) {
    return false;
  }
  return flash_decode_head_dim(p.head_dim) && (p.page_size > 0 || p.seq_q <= kFlashDecodeMaxQueries);
}

DecodePlan flash_decode_plan(const FusedParams& p) {
  DecodePlan plan;
  if (!flash_decode_takes(p) || p.kv_heads < 1 || p.heads % p.kv_heads != 0) return plan;
  plan.applies = true;
  const std::int64_t rows = static_cast<std::int64_t>(p.seq_q) * (p.heads / p.kv_heads);
  plan.rows = flash_decode_rows(rows);
  plan.row_blocks = static_cast<int>((rows + plan.rows - 1) / plan.rows);
  const DeviceFacts f = device_facts();
  // CTAs an SM holds, from shared memory (the kernels' registers, 80-250 a
  // thread of 128, allow at least as many as their shared memory does).
  const int per_sm =
      f.smem_per_sm > 0 ? std::clamp(f.smem_per_sm / (decode_smem_bytes(p.head_dim, plan.rows) + 1024), 1, 8) : 1;
  const std::int64_t ctas = static_cast<std::int64_t>(p.batch) * p.kv_heads * plan.row_blocks;
  // The keys some query sees (a causal or windowed row sees fewer than seq_k):
  // splitting past them would only add empty ranges for the combine to read.
  // With per-sequence counts, seq_k is the longest a sequence may have (the
  // host does not read the counts): the splits are sized for it, and each
  // sequence cuts its own keys into as many (flash_decode.cuh).
  const geometry::Span<int> keys =
      geometry::keys_of_rows(geometry::band_of(p.mask, p.window, p.seq_q, p.seq_k), 0, p.seq_q, p.seq_k);
  const int key_tiles = (keys.size() + kFlashDecodeKeys - 1) / kFlashDecodeKeys;
  plan.splits = decode_splits(ctas, f.sms, per_sm, key_tiles);
  // ATTNPROF_DECODE_SPLITS=n forces n splits (measuring), at most one a key tile.
  static const int forced_splits = [] {
    const char* v = std::getenv("ATTNPROF_DECODE_SPLITS");
    return v != nullptr ? std::clamp(std::atoi(v), 0, kFlashDecodeMaxSplits) : 0;
  }();
  if (forced_splits > 0) plan.splits = std::clamp(forced_splits, 1, std::max(1, key_tiles));
  if (plan.splits > 1) {
    const std::size_t rows_all = static_cast<std::size_t>(p.batch) * p.heads * p.seq_q;
    plan.workspace_bytes = plan.splits * rows_all * (p.head_dim + 1) * sizeof(float);
    static const bool fused = [] {
      const char* v = std::getenv("ATTNPROF_DECODE_FUSED_COMBINE");
      return v != nullptr && std::string_view(v) == "1";
    }();
    if (fused) {
      plan.fused_combine = true;
      plan.counters_offset = (plan.workspace_bytes + 15) / 16 * 16;
      plan.counters_bytes = static_cast<std::size_t>(ctas) * sizeof(unsigned);
      plan.workspace_bytes = plan.counters_offset + plan.counters_bytes;
    }
  }
  return plan;
}

cudaError_t zero_decode_counters(const DecodePlan& plan, void* workspace, cudaStream_t stream) {
  if (!plan.fused_combine || workspace == nullptr) return cudaSuccess;
  return cudaMemsetAsync(static_cast<char*>(workspace) + plan.counters_offset, 0, plan.counters_bytes, stream);
}

cudaError_t launch_flash_decode_planned(const FusedParams& p, const DecodePlan& plan, cudaStream_t stream) {
  if (!plan.applies) return cudaErrorInvalidValue;
  const bool paged = p.page_size > 0;
  if (paged && (p.block_table == nullptr || (p.page_size & (p.page_size - 1)) != 0)) return cudaErrorInvalidValue;
  kernels::DecodeArgs d = kernels::DecodeArgs::from(p, plan.rows, plan.row_blocks, plan.splits);
  if (plan.fused_combine && d.num_splits > 1) {
    d.tile_counters = reinterpret_cast<unsigned*>(reinterpret_cast<char*>(p.workspace) + plan.counters_offset);
  }
  // The combine starts by programmatic dependent launch where the GPU has it (sm90 on).
  const bool after_prior = plan.splits > 1 && device_facts().major >= 9;
  return kernels::with_head_dim<kFlashDecodeHeadDims>(p.head_dim, cudaErrorInvalidValue, [&]<int kD>() {
    return kernels::with_element(p.bf16, [&]<kernels::Half16 Element>() {
      return paged ? kernels::launch_flash_decode_kernels<kD, Element, true>(d, after_prior, stream)
                   : kernels::launch_flash_decode_kernels<kD, Element, false>(d, after_prior, stream);
    });
  });
}

}  // namespace attnprof::cuda
