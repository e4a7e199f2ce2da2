// Device-side sequence lengths and the input-error word (sequence_lengths.h).
#include "backends/cuda/sequence_lengths.h"

#include <map>
#include <mutex>
#include <utility>

#include "backends/cuda/caching_allocator.h"
#include "backends/cuda/runtime.h"
#include "core/cuda_check.h"
#include "core/mask_lowering.h"

namespace attnprof::cuda {

Tensor device_ints(const std::vector<std::int32_t>& values, Allocator& allocator, cudaStream_t stream) {
  Tensor t = Tensor::empty({static_cast<std::int64_t>(values.size()), 1, 1, 1}, DType::I32, allocator);
  ATTNPROF_CUDA_CHECK(cudaMemcpyAsync(t.data(), values.data(), t.nbytes(), cudaMemcpyHostToDevice, stream));
  ATTNPROF_CUDA_CHECK(cudaStreamSynchronize(stream));
  return t;
}

const Tensor* KeptInts::find(const std::vector<std::int32_t>& values) const {
  const auto it = kept_.find(values);
  return it == kept_.end() ? nullptr : &it->second;
}

const Tensor& KeptInts::get(const std::vector<std::int32_t>& values, Allocator& allocator, cudaStream_t stream) {
  if (const Tensor* t = find(values)) return *t;
  return kept_.emplace(values, device_ints(values, allocator, stream)).first->second;
}

PackedLengths device_cu_seqlens(const Problem& p, cudaStream_t stream) {
  // Per device, made on its first packed batch and never destroyed (a kernel
  // may read a set until the process ends): the memory (an allocator of its
  // own, which no run's profile counts) and the sets, each
  // [cu_q (batch + 1), cu_k (batch + 1)].
  struct PerDevice {
    explicit PerDevice(int device) : memory(device) {}
    CachingAllocator memory;
    KeptInts sets;
  };
  static std::mutex mutex;
  static auto& devices = *new std::map<int, PerDevice>;
  int device = 0;
  ATTNPROF_CUDA_CHECK(cudaGetDevice(&device));
  const std::size_t n = p.seq_lens.size() + 1;
  std::vector<std::int32_t> host;
  host.reserve(2 * n);
  for (const std::int64_t c : p.cu_seqlens_q()) host.push_back(static_cast<std::int32_t>(c));
  for (const std::int64_t c : p.cu_seqlens_k()) host.push_back(static_cast<std::int32_t>(c));
  std::lock_guard lock(mutex);
  PerDevice& d = devices.try_emplace(device, device).first->second;
  const Tensor* set = d.sets.find(host);
  if (set == nullptr) {
    if (d.sets.size() >= kKeptLengthSets) {
      ATTNPROF_CUDA_CHECK(cudaDeviceSynchronize());  // no kernel reads the old sets any more
      d.sets.clear();
      d.memory.release_cached();
    }
    set = &d.sets.get(host, d.memory, stream);
  }
  const auto* cu = static_cast<const std::int32_t*>(set->data());
  return {cu, cu + n};
}

unsigned* device_input_errors() {
  static std::mutex mutex;
  static auto& words = *new std::map<int, unsigned*>;  // never destroyed: see the header
  int device = 0;
  ATTNPROF_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard lock(mutex);
  unsigned*& word = words[device];
  if (word == nullptr) {
    void* memory = nullptr;
    ATTNPROF_CUDA_CHECK(cudaMalloc(&memory, sizeof(unsigned)));
    ATTNPROF_CUDA_CHECK(cudaMemset(memory, 0, sizeof(unsigned)));
    word = static_cast<unsigned*>(memory);
  }
  return word;
}

unsigned take_input_errors(cudaStream_t stream) {
  unsigned* word = device_input_errors();
  unsigned bits = 0;
  ATTNPROF_CUDA_CHECK(cudaMemcpyAsync(&bits, word, sizeof bits, cudaMemcpyDeviceToHost, stream));
  ATTNPROF_CUDA_CHECK(cudaMemsetAsync(word, 0, sizeof(unsigned), stream));
  ATTNPROF_CUDA_CHECK(cudaStreamSynchronize(stream));
  return bits;
}

}  // namespace attnprof::cuda
