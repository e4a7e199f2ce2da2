// Device-side sequence lengths (sequence_lengths.h).
#include "backends/cuda/sequence_lengths.h"

#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "backends/cuda/runtime.h"
#include "core/cuda_check.h"
#include "core/mask_lowering.h"

namespace attnprof::cuda {

PackedLengths device_cu_seqlens(const Problem& p) {
  using Key = std::tuple<int, std::vector<std::int64_t>, std::vector<std::int64_t>>;
  static std::mutex mutex;
  static std::map<Key, std::int32_t*> kept;  // [cu_q (batch + 1), cu_k (batch + 1)] a set
  int device = 0;
  ATTNPROF_CUDA_CHECK(cudaGetDevice(&device));
  Key key{device, p.seq_lens, p.kv_seq_lens};
  std::lock_guard lock(mutex);
  const std::size_t n = p.seq_lens.size() + 1;
  if (const auto it = kept.find(key); it != kept.end()) return {it->second, it->second + n};
  if (kept.size() >= kKeptLengthSets) {
    ATTNPROF_CUDA_CHECK(cudaDeviceSynchronize());  // no kernel reads the old sets any more
    for (auto& [k, ptr] : kept) ATTNPROF_CUDA_CHECK(cudaFree(ptr));
    kept.clear();
  }
  std::vector<std::int32_t> host;
  host.reserve(2 * n);
  for (const std::int64_t c : p.cu_seqlens_q()) host.push_back(static_cast<std::int32_t>(c));
  for (const std::int64_t c : p.cu_seqlens_k()) host.push_back(static_cast<std::int32_t>(c));
  std::int32_t* buffer = nullptr;
  ATTNPROF_CUDA_CHECK(cudaMalloc(&buffer, host.size() * sizeof(std::int32_t)));
  ATTNPROF_CUDA_CHECK(cudaMemcpy(buffer, host.data(), host.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice));
  kept.emplace(std::move(key), buffer);
  return {buffer, buffer + n};
}

std::optional<std::vector<std::int32_t>> lowered_key_padding(const Tensor& mask, cudaStream_t stream) {
  return key_padding_lengths(download_on(mask, stream));
}

void copy_key_counts(const std::vector<std::int32_t>& lens, void* device_buffer, cudaStream_t stream) {
  // From pageable memory: staged before the call returns, so `lens` may go.
  ATTNPROF_CUDA_CHECK(
      cudaMemcpyAsync(device_buffer, lens.data(), lens.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice, stream));
}

}  // namespace attnprof::cuda
