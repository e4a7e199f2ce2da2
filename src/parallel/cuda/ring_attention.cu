// Ring attention over NCCL (parallel/cuda/ring_attention.h): per rank its Q shard,
// its own K/V shard, a double buffer for the K/V block in flight, the running
// (O, lse) in FP32 and the partial (O, lse) of one launch. Step s computes on
// the block of rank r - s while the communication stream sends that block to
// rank r + 1 and receives the next from rank r - 1.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "attnprof/error.h"
#include "backends/cuda/kernels/element.cuh"
#include "backends/cuda/kernels/static_switch.cuh"
#include "backends/cuda/launch/fused_kernels.h"
#include "core/cuda_check.h"
#include "parallel/cuda/nccl_check.h"
#include "parallel/cuda/ring_attention.h"
#include "parallel/merge.h"
#include "parallel/sharding.h"

namespace attnprof::parallel {
namespace {

constexpr int kThreads = 128;

__global__ void init_running(float* o, float* lse, std::int64_t rows, int dim) {
  const std::int64_t row = blockIdx.x;
  if (row >= rows) return;
  for (int d = threadIdx.x; d < dim; d += blockDim.x) o[row * dim + d] = 0.f;
  if (threadIdx.x == 0) lse[row] = -INFINITY;
}

// Merges the partial (o_part, lse_part) of `part_rows` query rows per head
// into the running result's rows [row0, row0 + part_rows) of each head
// (`acc_rows` rows a head). One block a row.
template <cuda::kernels::Half16 Element>
__global__ void merge_partial(float* o_acc, float* lse_acc, const std::uint16_t* o_part, const float* lse_part,
                              std::int64_t heads_total, std::int64_t part_rows, std::int64_t acc_rows,
                              std::int64_t row0, int dim) {
  const std::int64_t idx = blockIdx.x;  // head * part_rows + row
  if (idx >= heads_total * part_rows) return;
  const std::int64_t head = idx / part_rows, row = idx % part_rows;
  const std::int64_t acc = head * acc_rows + row0 + row;
  const MergeWeights<float> w = merge_weights<float>(lse_acc[acc], lse_part[idx]);
  for (int d = threadIdx.x; d < dim; d += blockDim.x) {
    float& o = o_acc[acc * dim + d];
    o = w.wa * o + w.wb * cuda::kernels::to_float<Element>(o_part[idx * dim + d]);
  }
  __syncthreads();
  if (threadIdx.x == 0) lse_acc[acc] = w.lse;
}

template <cuda::kernels::Half16 Element>
__global__ void finish_output(const float* o_acc, std::uint16_t* out, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t(blockDim.x) + threadIdx.x; i < n;
       i += std::int64_t(gridDim.x) * blockDim.x) {
    out[i] = cuda::kernels::from_float<Element>(o_acc[i]);
  }
}

// Puts the caller's current device back: the ring visits every rank's
// device, and the runtime the profiler and the float64 check use works on
// the device that was current before.
class DeviceGuard {
 public:
  DeviceGuard() { cudaGetDevice(&device_); }
  ~DeviceGuard() { cudaSetDevice(device_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int device_ = 0;
};

struct Rank {
  int device = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t compute = nullptr, comm_stream = nullptr;
  void* q = nullptr;       // [B, H, 2C, D]
  void* kv_own = nullptr;  // K then V, each [B, H, 2C, D]
  void* ring[2] = {nullptr, nullptr};
  float* o_acc = nullptr;                        // [B, H, 2C, D]
  float* lse_acc = nullptr;                      // [B, H, 2C]
  void* o_part = nullptr;                        // [B, H, C, D]
  float* lse_part = nullptr;                     // [B, H, C]
  void* out = nullptr;                           // [B, H, 2C, D]
  cudaEvent_t received[2] = {nullptr, nullptr};  // the comm stream filled ring[i]
  cudaEvent_t consumed[2] = {nullptr, nullptr};  // the compute stream is done reading ring[i]
  cudaEvent_t sent = nullptr;                    // the comm stream is done with this forward
};

}  // namespace

int cuda_device_count(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    cudaGetLastError();
    if (why) *why = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
    return 0;
  }
  return n;
}

struct RingAttention::Impl {
  Problem p;
  ZigzagLayout layout;
  std::vector<std::vector<PairKind>> pairs;
  std::vector<Rank> ranks;
  std::size_t es = 0;            // element bytes
  std::size_t shard_elems = 0;   // B * H * 2C * D
  std::size_t part_elems = 0;    // B * H * C * D
  std::int64_t heads_total = 0;  // B * H

  ~Impl() {
    const DeviceGuard guard;
    for (Rank& r : ranks) {
      cudaSetDevice(r.device);
      cudaDeviceSynchronize();
      for (void* ptr : {r.q, r.kv_own, r.ring[0], r.ring[1], static_cast<void*>(r.o_acc), static_cast<void*>(r.lse_acc),
                        r.o_part, static_cast<void*>(r.lse_part), r.out}) {
        if (ptr) cudaFree(ptr);
      }
      for (cudaEvent_t e : {r.received[0], r.received[1], r.consumed[0], r.consumed[1], r.sent}) {
        if (e) cudaEventDestroy(e);
      }
      if (r.compute) cudaStreamDestroy(r.compute);
      if (r.comm_stream) cudaStreamDestroy(r.comm_stream);
      if (r.comm) nccl().comm_destroy(r.comm);
    }
    cudaGetLastError();
  }

  // One flash launch: query rows [q_row0, q_row0 + C) of the shard against
  // `k_rows` key rows from k_row0 of the block at `kv`, into the partial.
  void launch(Rank& r, const void* kv, std::int64_t q_row0, std::int64_t k_row0, std::int64_t k_rows, MaskKind mask) {
    const std::int64_t s2 = layout.shard_rows(), d = p.head_dim, c = layout.chunk;
    const char* qb = static_cast<const char*>(r.q);
    const char* kb = static_cast<const char*>(kv);
    cuda::FusedParams f;
    f.q = qb + static_cast<std::size_t>(q_row0 * d) * es;
    f.k = kb + static_cast<std::size_t>(k_row0 * d) * es;
    f.v = kb + (shard_elems + static_cast<std::size_t>(k_row0 * d)) * es;
    f.o = r.o_part;
    f.lse = r.lse_part;
    f.q_batch_stride = f.k_batch_stride = f.v_batch_stride = p.heads * s2 * d;
    f.q_head_stride = f.k_head_stride = f.v_head_stride = s2 * d;
    f.q_row_stride = f.k_row_stride = f.v_row_stride = d;
    f.o_batch_stride = p.heads * c * d;
    f.o_head_stride = c * d;
    f.o_row_stride = d;
    f.batch = static_cast<int>(p.batch);
    f.heads = f.kv_heads = static_cast<int>(p.heads);
    f.seq_q = static_cast<int>(c);
    f.seq_k = static_cast<int>(k_rows);
    f.head_dim = static_cast<int>(d);
    f.scale = static_cast<float>(p.softmax_scale());
    f.mask = mask;
    f.bf16 = p.dtype == DType::BF16;
    if (const char* why = cuda::fused_unsupported_reason(f, /*flash=*/true)) {
      fail(ErrorKind::Unsupported, std::string("ring attention: flash cannot take a chunk pair: ") + why);
    }
    ATTNPROF_CUDA_CHECK(cuda::launch_flash(f, r.compute));
    const auto blocks = static_cast<unsigned>(heads_total * c);
    const std::int64_t acc_rows = s2;
    cuda::kernels::with_element(p.dtype == DType::BF16, [&]<cuda::kernels::Half16 Element>() {
      merge_partial<Element>
          <<<blocks, kThreads, 0, r.compute>>>(r.o_acc, r.lse_acc, static_cast<const std::uint16_t*>(r.o_part),
                                               r.lse_part, heads_total, c, acc_rows, q_row0, static_cast<int>(d));
    });
    ATTNPROF_CUDA_CHECK(cudaGetLastError());
  }

  // This rank's query chunks against the block of rank `src` at `kv`.
  void compute_step(int rank, int src, const void* kv) {
    Rank& r = ranks[static_cast<std::size_t>(rank)];
    const auto qcs = layout.chunks_of(rank), kcs = layout.chunks_of(src);
    const std::int64_t c = layout.chunk;
    for (int qi = 0; qi < 2; ++qi) {
      const PairKind k0 = pairs[static_cast<std::size_t>(qcs[qi])][static_cast<std::size_t>(kcs[0])];
      const PairKind k1 = pairs[static_cast<std::size_t>(qcs[qi])][static_cast<std::size_t>(kcs[1])];
      // Adjacent key chunks in one launch where one mask says it: both full
      // (no mask), or full then diagonal (bottom-right causal over 2C keys).
      if (k0 == PairKind::Full && k1 == PairKind::Full) {
        launch(r, kv, qi * c, 0, 2 * c, MaskKind::None);
        continue;
      }
      if (k0 == PairKind::Full && k1 == PairKind::Diagonal) {
        launch(r, kv, qi * c, 0, 2 * c, MaskKind::CausalBottomRight);
        continue;
      }
      for (int ki = 0; ki < 2; ++ki) {
        const PairKind k = ki == 0 ? k0 : k1;
        if (k == PairKind::Skip) continue;
        launch(r, kv, qi * c, ki * c, c, k == PairKind::Full ? MaskKind::None : MaskKind::Causal);
      }
    }
  }
};

RingAttention::RingAttention(const Problem& p, int world, const Inputs& host) : impl_(std::make_unique<Impl>()) {
  check_ring_problem(p, world);
  const DeviceGuard guard;
  Impl& m = *impl_;
  m.p = p;
  m.layout = zigzag_layout(p, world);
  m.pairs = pair_table(p, m.layout);
  m.es = element_size(p.dtype);
  m.heads_total = p.batch * p.heads;
  m.shard_elems = static_cast<std::size_t>(m.heads_total * m.layout.shard_rows() * p.head_dim);
  m.part_elems = static_cast<std::size_t>(m.heads_total * m.layout.chunk * p.head_dim);

  std::vector<int> devices(static_cast<std::size_t>(world));
  for (int i = 0; i < world; ++i) devices[static_cast<std::size_t>(i)] = i;
  std::vector<ncclComm_t> comms(static_cast<std::size_t>(world));
  if (const ncclResult_t st = nccl().comm_init_all(comms.data(), world, devices.data()); st != ncclSuccess) {
    fail(ErrorKind::Device,
         "NCCL failed to start on " + std::to_string(world) + " GPU(s): ncclCommInitAll: " + nccl().error_string(st));
  }
  m.ranks.resize(static_cast<std::size_t>(world));
  for (int i = 0; i < world; ++i) {
    m.ranks[static_cast<std::size_t>(i)].device = i;
    m.ranks[static_cast<std::size_t>(i)].comm = comms[static_cast<std::size_t>(i)];
  }

  // Each rank's shard of a [B, H, S, D] host tensor, rows in local order.
  const std::int64_t d = p.head_dim, s2 = m.layout.shard_rows();
  const std::size_t row_bytes = static_cast<std::size_t>(d) * m.es;
  std::vector<char> staging(m.shard_elems * m.es);
  const auto shard_of = [&](const Tensor& t, int rank) {
    if (!t.rows_contiguous()) fail(ErrorKind::Internal, "ring attention: inputs need contiguous rows");
    const char* base = static_cast<const char*>(t.data());
    for (std::int64_t b = 0; b < p.batch; ++b) {
      for (std::int64_t h = 0; h < p.heads; ++h) {
        for (std::int64_t lr = 0; lr < s2; ++lr) {
          const std::int64_t g = m.layout.global_row(rank, lr);
          const std::int64_t src = b * t.stride(0) + h * t.stride(1) + g * t.stride(2);
          char* dst = staging.data() + static_cast<std::size_t>(((b * p.heads + h) * s2 + lr) * d) * m.es;
          std::memcpy(dst, base + static_cast<std::size_t>(src) * m.es, row_bytes);
        }
      }
    }
  };
  const std::size_t shard_bytes = m.shard_elems * m.es;
  for (int i = 0; i < world; ++i) {
    Rank& r = m.ranks[static_cast<std::size_t>(i)];
    ATTNPROF_CUDA_CHECK(cudaSetDevice(r.device));
    ATTNPROF_CUDA_CHECK(cudaStreamCreateWithFlags(&r.compute, cudaStreamNonBlocking));
    ATTNPROF_CUDA_CHECK(cudaStreamCreateWithFlags(&r.comm_stream, cudaStreamNonBlocking));
    for (int b = 0; b < 2; ++b) {
      ATTNPROF_CUDA_CHECK(cudaEventCreateWithFlags(&r.received[b], cudaEventDisableTiming));
      ATTNPROF_CUDA_CHECK(cudaEventCreateWithFlags(&r.consumed[b], cudaEventDisableTiming));
    }
    ATTNPROF_CUDA_CHECK(cudaEventCreateWithFlags(&r.sent, cudaEventDisableTiming));
    ATTNPROF_CUDA_CHECK(cudaMalloc(&r.q, shard_bytes));
    ATTNPROF_CUDA_CHECK(cudaMalloc(&r.kv_own, 2 * shard_bytes));
    if (world > 1) {
      ATTNPROF_CUDA_CHECK(cudaMalloc(&r.ring[0], 2 * shard_bytes));
      ATTNPROF_CUDA_CHECK(cudaMalloc(&r.ring[1], 2 * shard_bytes));
    }
    ATTNPROF_CUDA_CHECK(cudaMalloc(&r.o_acc, m.shard_elems * sizeof(float)));
    ATTNPROF_CUDA_CHECK(cudaMalloc(&r.lse_acc, static_cast<std::size_t>(m.heads_total * s2) * sizeof(float)));
    ATTNPROF_CUDA_CHECK(cudaMalloc(&r.o_part, m.part_elems * m.es));
    ATTNPROF_CUDA_CHECK(
        cudaMalloc(&r.lse_part, static_cast<std::size_t>(m.heads_total * m.layout.chunk) * sizeof(float)));
    ATTNPROF_CUDA_CHECK(cudaMalloc(&r.out, shard_bytes));
    shard_of(host.q, i);
    ATTNPROF_CUDA_CHECK(cudaMemcpy(r.q, staging.data(), shard_bytes, cudaMemcpyHostToDevice));
    shard_of(host.k, i);
    ATTNPROF_CUDA_CHECK(cudaMemcpy(r.kv_own, staging.data(), shard_bytes, cudaMemcpyHostToDevice));
    shard_of(host.v, i);
    ATTNPROF_CUDA_CHECK(
        cudaMemcpy(static_cast<char*>(r.kv_own) + shard_bytes, staging.data(), shard_bytes, cudaMemcpyHostToDevice));
  }
}

RingAttention::~RingAttention() = default;

void RingAttention::forward() {
  const DeviceGuard guard;
  Impl& m = *impl_;
  const int n = m.layout.world;
  const std::size_t block_bytes = 2 * m.shard_elems * m.es;
  const auto rows = static_cast<unsigned>(m.heads_total * m.layout.shard_rows());
  for (Rank& r : m.ranks) {
    ATTNPROF_CUDA_CHECK(cudaSetDevice(r.device));
    init_running<<<rows, kThreads, 0, r.compute>>>(r.o_acc, r.lse_acc, rows, static_cast<int>(m.p.head_dim));
    ATTNPROF_CUDA_CHECK(cudaGetLastError());
  }
  // The block rank r computes on at step s came from rank r - s: its own at
  // step 0, then ring[(s - 1) % 2].
  const auto block_at = [&](Rank& r, int s) -> void* { return s == 0 ? r.kv_own : r.ring[(s - 1) % 2]; };
  for (int s = 0; s < n; ++s) {
    if (s + 1 < n) {
      // Send this step's block on, receive the next one, while computing.
      const int into = s % 2;
      for (Rank& r : m.ranks) {
        ATTNPROF_CUDA_CHECK(cudaSetDevice(r.device));
        // The buffer received into was last read by the compute at step s - 1.
        ATTNPROF_CUDA_CHECK(cudaStreamWaitEvent(r.comm_stream, r.consumed[into], 0));
      }
      ATTNPROF_NCCL_CHECK(nccl().group_start());
      for (int i = 0; i < n; ++i) {
        Rank& r = m.ranks[static_cast<std::size_t>(i)];
        ATTNPROF_NCCL_CHECK(nccl().send(block_at(r, s), block_bytes, ncclChar, (i + 1) % n, r.comm, r.comm_stream));
        ATTNPROF_NCCL_CHECK(nccl().recv(r.ring[into], block_bytes, ncclChar, (i + n - 1) % n, r.comm, r.comm_stream));
      }
      ATTNPROF_NCCL_CHECK(nccl().group_end());
      for (Rank& r : m.ranks) {
        ATTNPROF_CUDA_CHECK(cudaSetDevice(r.device));
        ATTNPROF_CUDA_CHECK(cudaEventRecord(r.received[into], r.comm_stream));
      }
    }
    for (int i = 0; i < n; ++i) {
      Rank& r = m.ranks[static_cast<std::size_t>(i)];
      ATTNPROF_CUDA_CHECK(cudaSetDevice(r.device));
      if (s > 0) ATTNPROF_CUDA_CHECK(cudaStreamWaitEvent(r.compute, r.received[(s - 1) % 2], 0));
      m.compute_step(i, (i - s + n) % n, block_at(r, s));
      if (s > 0) ATTNPROF_CUDA_CHECK(cudaEventRecord(r.consumed[(s - 1) % 2], r.compute));
    }
  }
  const auto elems = static_cast<std::int64_t>(m.shard_elems);
  for (Rank& r : m.ranks) {
    ATTNPROF_CUDA_CHECK(cudaSetDevice(r.device));
    // The communication of this forward is done before the next one starts
    // sending from buffers its compute may still read: the compute stream
    // waits for the comm stream at the end.
    ATTNPROF_CUDA_CHECK(cudaEventRecord(r.sent, r.comm_stream));
    ATTNPROF_CUDA_CHECK(cudaStreamWaitEvent(r.compute, r.sent, 0));
    const unsigned blocks = static_cast<unsigned>(std::min<std::int64_t>((elems + 255) / 256, 65535));
    cuda::kernels::with_element(m.p.dtype == DType::BF16, [&]<cuda::kernels::Half16 Element>() {
      finish_output<Element><<<blocks, 256, 0, r.compute>>>(r.o_acc, static_cast<std::uint16_t*>(r.out), elems);
    });
    ATTNPROF_CUDA_CHECK(cudaGetLastError());
  }
}

void RingAttention::synchronize() {
  const DeviceGuard guard;
  for (Rank& r : impl_->ranks) {
    ATTNPROF_CUDA_CHECK(cudaSetDevice(r.device));
    ATTNPROF_CUDA_CHECK(cudaStreamSynchronize(r.compute));
    ATTNPROF_CUDA_CHECK(cudaStreamSynchronize(r.comm_stream));
  }
}

Tensor RingAttention::gather_output() {
  const DeviceGuard guard;
  Impl& m = *impl_;
  synchronize();
  const Problem& p = m.p;
  Tensor out = Tensor::empty({p.batch, p.heads, p.seq, p.head_dim}, p.dtype, cpu_allocator());
  const std::int64_t d = p.head_dim, s2 = m.layout.shard_rows();
  const std::size_t row_bytes = static_cast<std::size_t>(d) * m.es;
  std::vector<char> staging(m.shard_elems * m.es);
  char* dst = static_cast<char*>(out.data());
  for (int i = 0; i < m.layout.world; ++i) {
    Rank& r = m.ranks[static_cast<std::size_t>(i)];
    ATTNPROF_CUDA_CHECK(cudaSetDevice(r.device));
    ATTNPROF_CUDA_CHECK(cudaMemcpy(staging.data(), r.out, staging.size(), cudaMemcpyDeviceToHost));
    for (std::int64_t bh = 0; bh < m.heads_total; ++bh) {
      for (std::int64_t lr = 0; lr < s2; ++lr) {
        const std::int64_t g = m.layout.global_row(i, lr);
        std::memcpy(dst + static_cast<std::size_t>((bh * p.seq + g) * d) * m.es,
                    staging.data() + static_cast<std::size_t>((bh * s2 + lr) * d) * m.es, row_bytes);
      }
    }
  }
  return out;
}

}  // namespace attnprof::parallel
