// TMA on sm90a: tensor-map descriptors of [batch, heads, rows, head_dim]
// tensors (host), the 4-d tiled loads and the plain bulk copies of contiguous
// bytes that complete on an mbarrier, and the bulk reduce-add of f32 from
// shared into global memory (device).
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>

#include "backends/cuda/kernels/element.cuh"

namespace attnprof::cuda::kernels::sm90 {

// A 4-d TMA descriptor of a [batch, heads, rows, cols] tensor of Element
// (16-bit or e4m3) with the given element strides; boxes of one 128-byte
// swizzle region (64 16-bit columns, 128 e4m3 ones) x box_rows, or with
// box_bytes 64, 64-byte rows in the 64-byte swizzle.
template <InputElement Element>
cudaError_t make_map(CUtensorMap& map, const void* data, int cols, int rows, int heads, int batch,
                     std::int64_t row_stride, std::int64_t head_stride, std::int64_t batch_stride, int box_rows,
                     int box_bytes = 128) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (encode == nullptr) return cudaErrorNotSupported;
  constexpr cuuint64_t kBytes = sizeof(typename Element::Storage);
  const CUtensorMapDataType type = kIsFp8<Element>               ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                   : std::same_as<Element, Bf16> ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                                 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const cuuint64_t dims[4] = {cuuint64_t(cols), cuuint64_t(rows), cuuint64_t(heads), cuuint64_t(batch)};
  const cuuint64_t strides[3] = {cuuint64_t(row_stride) * kBytes, cuuint64_t(head_stride) * kBytes,
                                 cuuint64_t(batch_stride) * kBytes};
  const cuuint32_t box[4] = {cuuint32_t(box_bytes / kBytes), cuuint32_t(box_rows), 1, 1};
  const cuuint32_t unit[4] = {1, 1, 1, 1};
  const CUresult r =
      encode(&map, type, 4, const_cast<void*>(data), dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
             box_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B : CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// What a kernel's descriptors are made from: the tensors' addresses, their
// strides and the problem's sizes (the forward's: Q, K, V; the backward's
// add dO).
template <int kTensors>
struct MapKeyOf {
  std::array<const void*, kTensors> data;
  std::array<std::int64_t, 3 * kTensors> strides;
  std::array<int, 5> sizes;
  bool operator==(const MapKeyOf&) const = default;
};
using MapKey = MapKeyOf<3>;

// The last kSlots descriptor sets made, replaced round robin: a benchmark
// or a serving loop calls with the same few tensor sets over and over.
template <class Params, int kSlots = 4, class MapKey = MapKey>
class MapCache {
 public:
  const Params* find(const MapKey& key) const {
    for (int i = 0; i < used_; ++i) {
      if (keys_[i] == key) return &params_[i];
    }
    return nullptr;
  }
  void insert(const MapKey& key, const Params& params) {
    const int slot = used_ < kSlots ? used_++ : (next_++ % kSlots);
    keys_[slot] = key;
    params_[slot] = params;
  }

 private:
  std::array<MapKey, kSlots> keys_{};
  std::array<Params, kSlots> params_{};
  int used_ = 0, next_ = 0;
};

// A box of a 4-d tensor map (column, row, head, batch) into shared memory.
__device__ __forceinline__ void tma_load_4d(std::uint32_t dst, const void* map, std::uint32_t bar, int c0, int c1,
                                            int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<std::uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

// `bytes` contiguous bytes (a multiple of 16, both ends 16-byte aligned) from
// global to shared memory, completing on bar.
__device__ __forceinline__ void bulk_load(std::uint32_t dst, const void* src, std::uint32_t bytes, std::uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// Adds `bytes` of f32 (a multiple of 16, both ends 16-byte aligned) from
// shared memory into global memory element by element (the adds happen in
// L2), as an operation of this thread's bulk group.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, std::uint32_t src, std::uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Until at most kPending of this thread's bulk groups are still reading
// their shared-memory sources (the sources may then be overwritten).
template <int kPending>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kPending) : "memory");
}
// Until at most kPending of this thread's bulk groups are incomplete (their
// writes performed).
template <int kPending>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace attnprof::cuda::kernels::sm90
