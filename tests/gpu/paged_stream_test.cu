// Paged decode with its block table and lengths read in stream order
// (issue 51 items 1, 2 and 4): flash's decode kernel reads seq_lens
// (Inputs::kv_rows, key ends) and the table on the device only.
//   - The race: the table and lengths are written by GPU work queued behind a
//     long kernel on the caller's stream, and the call is made at once, 1000
//     times, every result against a float64 reference. Today's code read
//     them on the host (another stream, before they were written) or not at
//     all (flash on CUDA ignored unequal lengths).
//   - Lengths from 1 to 32k in one batch, one launch.
//   - Entries out of range without the checking mode: no fault, the
//     out-of-range pages' keys skipped, the counts clamped, the device's
//     input-error word set (memcheck, in scripts/gpu.sh, says nothing is read
//     outside the cache or the table).
//   - The trace of a decode step (CUPTI) has no synchronisation and no
//     device-to-host copy.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/error.h"
#include "attnprof/runner.h"
#include "backends/cuda/cuda_backends.h"
#include "backends/cuda/fused_params.h"
#include "backends/cuda/sequence_lengths.h"
#include "gpu_test.h"
#include "profiler/cupti/cupti_collector.h"

namespace attnprof {
namespace {

// A long kernel: the caller's stream is busy for about `cycles` clocks.
__global__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

// dst[i] = src[i]: the table and lengths written by the stream, not the host.
__global__ void copy_ints(int* dst, const int* src, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src[i];
}

// Rounds through bf16 (the values the kernel reads).
float bf16_round(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&x, &u, 4);
  return x;
}
std::uint16_t bf16_bits(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  return static_cast<std::uint16_t>(u >> 16);
}

// One decode batch: q [B, H, 1, D], the caches [num_pages, Hkv, page, D], a
// table [B, pages_per_seq] and lengths, on the host and on the device.
struct Batch {
  static constexpr int kHeads = 8, kKvHeads = 2, kDim = 128, kPage = 16;
  std::vector<int> lens;  // the lengths the kernel should see
  int pages_per_seq = 0, num_pages = 0;
  std::vector<float> q, k, v;  // host values, bf16-rounded: q [B][H][D], k, v [page][Hkv][row][D]
  std::vector<int> table;      // [B][pages_per_seq]
  // Device: q, caches, out, and the table and lengths the call reads.
  std::uint16_t *dq = nullptr, *dk = nullptr, *dv = nullptr, *dout = nullptr;
  int *dtable = nullptr, *dlens = nullptr;

  Batch(std::vector<int> lengths, int capacity_pages) : lens(std::move(lengths)), pages_per_seq(capacity_pages) {
    const int b = static_cast<int>(lens.size());
    std::vector<int> order;
    for (int s = 0; s < b; ++s) num_pages += (lens[s] + kPage - 1) / kPage;
    num_pages = std::max(num_pages, 1);
    order.resize(num_pages);
    std::iota(order.begin(), order.end(), 0);
    std::uint64_t state = 12345;
    auto next = [&] {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      return static_cast<std::uint32_t>(state >> 33);
    };
    for (int i = num_pages - 1; i > 0; --i) std::swap(order[i], order[next() % (i + 1)]);
    table.assign(static_cast<std::size_t>(b) * pages_per_seq, 0);  // unused slots: page 0 (never read)
    int at = 0;
    for (int s = 0; s < b; ++s) {
      for (int l = 0; l < (lens[s] + kPage - 1) / kPage; ++l) table[s * pages_per_seq + l] = order[at++];
    }
    auto fill = [&](std::vector<float>& x, std::size_t n) {
      x.resize(n);
      for (float& e : x) e = bf16_round(static_cast<float>(next() % 2001) / 1000.f - 1.f);
    };
    fill(q, static_cast<std::size_t>(b) * kHeads * kDim);
    fill(k, static_cast<std::size_t>(num_pages) * kKvHeads * kPage * kDim);
    fill(v, k.size());
    dq = upload(q);
    dk = upload(k);
    dv = upload(v);
    cudaMalloc(&dout, q.size() * 2);
    cudaMalloc(&dtable, table.size() * 4);
    cudaMalloc(&dlens, lens.size() * 4);
  }
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;
  ~Batch() {
    for (void* p : {static_cast<void*>(dq), static_cast<void*>(dk), static_cast<void*>(dv), static_cast<void*>(dout),
                    static_cast<void*>(dtable), static_cast<void*>(dlens)}) {
      cudaFree(p);
    }
  }
  static std::uint16_t* upload(const std::vector<float>& x) {
    std::vector<std::uint16_t> bits(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) bits[i] = bf16_bits(x[i]);
    std::uint16_t* d = nullptr;
    cudaMalloc(&d, bits.size() * 2);
    cudaMemcpy(d, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice);
    return d;
  }

  int batch() const { return static_cast<int>(lens.size()); }

  Problem problem() const {
    Problem p;
    p.batch = batch();
    p.heads = kHeads;
    p.kv_heads = kKvHeads;
    p.seq = 1;
    p.kv_seq = static_cast<std::int64_t>(pages_per_seq) * kPage;  // the table's capacity, as the bindings set it
    p.head_dim = kDim;
    p.dtype = DType::BF16;
    p.device = Device::Cuda;
    p.mask = MaskKind::CausalBottomRight;
    p.kv_cache = KvCache::Paged;
    p.page_size = kPage;
    p.normalize().validate();
    return p;
  }

  Inputs inputs() const {
    Inputs in;
    const std::int64_t b = batch();
    in.q = Tensor::from_blob(dq, {b, kHeads, 1, kDim}, {kHeads * kDim, kDim, kDim, 1}, DType::BF16, Device::Cuda);
    const Dims cache{num_pages, kKvHeads, kPage, kDim};
    const Dims strides{kKvHeads * kPage * kDim, kPage * kDim, kDim, 1};
    in.k_pages = Tensor::from_blob(dk, cache, strides, DType::BF16, Device::Cuda);
    in.v_pages = Tensor::from_blob(dv, cache, strides, DType::BF16, Device::Cuda);
    // The logical K and V are not read by a paged backend: the caches stand in.
    in.k = in.k_pages;
    in.v = in.v_pages;
    in.block_table =
        Tensor::from_blob(dtable, {1, 1, b, pages_per_seq}, {0, 0, pages_per_seq, 1}, DType::I32, Device::Cuda);
    in.kv_rows = Tensor::from_blob(dlens, {1, 1, b, 1}, {0, 0, 1, 1}, DType::I32, Device::Cuda);
    return in;
  }

  Tensor out() const {
    const std::int64_t b = batch();
    return Tensor::from_blob(dout, {b, kHeads, 1, kDim}, {kHeads * kDim, kDim, kDim, 1}, DType::BF16, Device::Cuda);
  }

  // float64 reference of sequence s, head h over keys 0 .. n - 1 (a page
  // outside [0, num_pages) in `tbl` skips its keys): D values.
  std::vector<double> reference(int s, int h, int n, const std::vector<int>& tbl) const {
    const int hk = h / (kHeads / kKvHeads);
    const double scale = 1.0 / std::sqrt(static_cast<double>(kDim));
    std::vector<double> scores, o(kDim, 0.0);
    std::vector<std::size_t> rows;
    for (int j = 0; j < n; ++j) {
      const int page = tbl[s * pages_per_seq + j / kPage];
      if (page < 0 || page >= num_pages) continue;
      const std::size_t row = ((static_cast<std::size_t>(page) * kKvHeads + hk) * kPage + j % kPage) * kDim;
      double dot = 0;
      for (int d = 0; d < kDim; ++d) dot += static_cast<double>(q[(s * kHeads + h) * kDim + d]) * k[row + d];
      scores.push_back(dot * scale);
      rows.push_back(row);
    }
    if (scores.empty()) return o;
    const double m = *std::max_element(scores.begin(), scores.end());
    double sum = 0;
    for (std::size_t i = 0; i < scores.size(); ++i) {
      const double w = std::exp(scores[i] - m);
      sum += w;
      for (int d = 0; d < kDim; ++d) o[d] += w * v[rows[i] + d];
    }
    for (double& x : o) x /= sum;
    return o;
  }

  // The largest |out - reference| over the batch, for lengths `n` and table `tbl`.
  double error(const std::vector<int>& n, const std::vector<int>& tbl) const {
    std::vector<std::uint16_t> got(q.size());
    cudaMemcpy(got.data(), dout, got.size() * 2, cudaMemcpyDeviceToHost);
    double worst = 0;
    for (int s = 0; s < batch(); ++s) {
      for (int h = 0; h < kHeads; ++h) {
        const std::vector<double> want = reference(s, h, n[s], tbl);
        for (int d = 0; d < kDim; ++d) {
          std::uint32_t u = static_cast<std::uint32_t>(got[(s * kHeads + h) * kDim + d]) << 16;
          float f;
          std::memcpy(&f, &u, 4);
          const double e = std::fabs(f - want[d]);
          worst = std::isnan(e) ? INFINITY : std::max(worst, e);
        }
      }
    }
    return worst;
  }
};

Backend& flash() {
  Backend* b = find_backend("flash", Device::Cuda);
  if (b == nullptr) throw std::runtime_error("no CUDA flash backend in this build");
  return *b;
}

int* upload_ints(const std::vector<int>& x) {
  int* d = nullptr;
  cudaMalloc(&d, x.size() * 4);
  cudaMemcpy(d, x.data(), x.size() * 4, cudaMemcpyHostToDevice);
  return d;
}

TEST(PagedStreamOrder, TableAndLengthsWrittenBehindABusyStream) {
  REQUIRE_GPU();
  Batch batch({37, 1, 300, 129, 64, 5}, 20);
  const Problem p = batch.problem();
  const Inputs in = batch.inputs();
  Tensor out = batch.out();
  DeviceRuntime& rt = cuda::runtime();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  int* src_table = upload_ints(batch.table);
  int* src_lens = upload_ints(batch.lens);
  RunContext ctx{rt.allocator(), stream, 0};
  int bad = 0;
  for (int call = 0; call < 1000; ++call) {
    // Garbage first (what an unwritten buffer holds), then the busy stream, then the values.
    cudaMemsetAsync(batch.dtable, 0x3c, batch.table.size() * 4, stream);
    cudaMemsetAsync(batch.dlens, 0x3c, batch.lens.size() * 4, stream);
    spin<<<1, 1, 0, stream>>>(200'000);
    copy_ints<<<(static_cast<int>(batch.table.size()) + 255) / 256, 256, 0, stream>>>(
        batch.dtable, src_table, static_cast<int>(batch.table.size()));
    copy_ints<<<1, 32, 0, stream>>>(batch.dlens, src_lens, batch.batch());
    flash().forward(p, in, out, ctx);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    bad += !(batch.error(batch.lens, batch.table) < 2e-2);
  }
  EXPECT_EQ(bad, 0) << "of 1000 calls, " << bad << " read a table or lengths the stream had not written";
  EXPECT_EQ(cuda::take_input_errors(stream), 0u) << "nothing out of range was given";
  cudaFree(src_table);
  cudaFree(src_lens);
  cudaStreamDestroy(stream);
}

TEST(PagedStreamOrder, LengthsFrom1To32kInOneLaunch) {
  REQUIRE_GPU();
  const std::vector<int> lens = {1, 2, 15, 16, 17, 63, 64, 65, 100, 1000, 4095, 4096, 10000, 20000, 32767, 32768};
  Batch batch(lens, 32768 / Batch::kPage);
  cudaMemcpy(batch.dtable, batch.table.data(), batch.table.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(batch.dlens, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice);
  DeviceRuntime& rt = cuda::runtime();
  RunContext ctx{rt.allocator(), rt.stream(), 0};
  Tensor out = batch.out();
  flash().forward(batch.problem(), batch.inputs(), out, ctx);
  ASSERT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(rt.stream())), cudaSuccess);
  EXPECT_LT(batch.error(lens, batch.table), 2e-2);
  EXPECT_EQ(cuda::take_input_errors(static_cast<cudaStream_t>(rt.stream())), 0u);
}

TEST(PagedStreamOrder, OutOfRangeEntriesAreClampedAndFlagged) {
  REQUIRE_GPU();
  Batch batch({40, 40, 40, 40}, 4);
  std::vector<int> table = batch.table, lens = {40, -5, 1 << 30, 40};
  table[0 * 4 + 1] = 1003829616;  // sequence 0's second page: not in the cache, its 16 keys skipped
  table[3 * 4 + 0] = -1;          // sequence 3's first page
  cudaMemcpy(batch.dtable, table.data(), table.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(batch.dlens, lens.data(), lens.size() * 4, cudaMemcpyHostToDevice);
  DeviceRuntime& rt = cuda::runtime();
  const auto stream = static_cast<cudaStream_t>(rt.stream());
  (void)cuda::take_input_errors(stream);
  RunContext ctx{rt.allocator(), stream, 0};
  Tensor out = batch.out();
  flash().forward(batch.problem(), batch.inputs(), out, ctx);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess) << "the kernel faulted";
  // -5 reads as 0 keys (zeros), 2^30 as the table's 64 keys (its unused slots are page 0).
  std::vector<int> table_seen = table;
  EXPECT_LT(batch.error({40, 0, 64, 40}, table_seen), 2e-2);
  EXPECT_EQ(cuda::take_input_errors(stream), cuda::kInputBadKeyCount | cuda::kInputBadPage);
  EXPECT_EQ(cuda::take_input_errors(stream), 0u) << "taken, the word is cleared";
}

TEST(PagedStreamOrder, TheTraceOfADecodeStepHasNoSyncAndNoCopyToTheHost) {
  REQUIRE_GPU();
  Batch batch({300, 17, 129}, 20);
  cudaMemcpy(batch.dtable, batch.table.data(), batch.table.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(batch.dlens, batch.lens.data(), batch.lens.size() * 4, cudaMemcpyHostToDevice);
  DeviceRuntime& rt = cuda::runtime();
  const auto stream = static_cast<cudaStream_t>(rt.stream());
  RunContext ctx{rt.allocator(), stream, 0};
  const Problem p = batch.problem();
  const Inputs in = batch.inputs();
  Tensor out = batch.out();
  flash().forward(p, in, out, ctx);  // the first call's one-time work (module load, the error word)
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cupti::CuptiCollector c;
  try {
    c.start();
  } catch (const Error& e) {
    GTEST_SKIP() << "CUPTI could not start: " << e.what();
  }
  for (int i = 0; i < 3; ++i) flash().forward(p, in, out, ctx);
  c.stop();  // flushes after the calls: the collector's own waits come after them
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<Activity> all;
  c.drain(all);
  int kernels = 0;
  for (const Activity& a : all) {
    kernels += a.type == ActivityType::Kernel;
    EXPECT_NE(a.type, ActivityType::CudaSync) << a.name;
    EXPECT_EQ(a.name.find("Synchronize"), std::string::npos) << a.name;
    if (a.type == ActivityType::Memcpy) {
      EXPECT_NE(a.transfer ? a.transfer->kind : std::string(), "DtoH") << a.name;
      EXPECT_NE(a.transfer ? a.transfer->kind : std::string(), "HtoD") << a.name;
    }
  }
  EXPECT_GE(kernels, 3) << "the decode kernels were recorded";
  EXPECT_LT(batch.error(batch.lens, batch.table), 2e-2);
}

}  // namespace
}  // namespace attnprof
