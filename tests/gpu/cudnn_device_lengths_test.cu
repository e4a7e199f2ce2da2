// cudnn in the caller's stream order (issue 56 item 2): a packed batch whose
// cumulative lengths stay on the device (Problem::lengths_on_device, what
// attention_varlen makes on a GPU) gets its ragged offsets and lengths from
// one small kernel on the caller's stream, and a boolean mask becomes its
// bias on the device; neither is read on the host. Each is written by the
// stream behind a long kernel and the call made at once: the call returns
// while the stream is still busy (it waited for nothing), and the result is
// the float64 reference's and, for the packed batch, bit for bit the result
// with the lengths on the host. Before, cudnn read cu_seqlens (through the
// bindings) and the mask on the host.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/mask_tensor.h"
#include "attnprof/reference.h"
#include "attnprof/runner.h"
#include "backends/cuda/cuda_backends.h"
#include "common/test_problem.h"
#include "common/varlen_cases.h"
#include "gpu_test.h"

namespace attnprof {
namespace {

// A long kernel: the caller's stream is busy for about `cycles` clocks.
__global__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

__global__ void fill_ints(int* dst, int value, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = value;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

TEST(CudnnDeviceLengths, PackedLengthsWrittenBehindABusyStreamAreReadOnTheDevice) {
  REQUIRE_GPU();
  Backend* cudnn = find_backend("cudnn", Device::Cuda);
  ASSERT_NE(cudnn, nullptr);
  DeviceRuntime& rt = cuda::runtime();
  const auto stream = static_cast<cudaStream_t>(rt.stream());
  const std::vector<std::int64_t> lens = {100, 1, 300, 55, 17};
  Problem base{.heads = 8, .kv_heads = 2, .head_dim = 128, .dtype = DType::BF16, .device = Device::Cuda};
  base.mask = MaskKind::Causal;
  Problem host_p = varlen_problem(base, lens, lens);
  host_p.normalize().validate();

  Problem dev_p = base;
  dev_p.lengths_on_device = true;
  dev_p.batch = static_cast<std::int64_t>(lens.size());
  dev_p.packed_total_q = dev_p.packed_total_kv = host_p.total_q();
  dev_p.seq = dev_p.kv_seq = *std::max_element(lens.begin(), lens.end());
  dev_p.normalize().validate();
  const Eligibility e = eligibility_of(*cudnn, dev_p);
  if (!e.eligible) GTEST_SKIP() << "cudnn takes no lengths left on the device here: " << e.reason << " (SKIPPED)";
  EXPECT_NE(e.reason.find("made on the device from the caller's cu_seqlens"), std::string::npos) << e.reason;

  Problem ref_p = host_p;
  ref_p.device = Device::Cpu;
  const Inputs host = make_inputs(ref_p, 3, cpu_allocator());
  const Inputs in_host = rt.upload(host);
  RunContext ctx{rt.allocator(), rt.stream(), 0};
  Tensor want = Tensor::empty(host_p.q_dims(), DType::BF16, rt.allocator());
  cudnn->forward(host_p, in_host, want, ctx);

  // The cumulative lengths, holding 64s (garbage: "cu_seqlens_q[0] is 64"),
  // written by the stream after a long kernel; the call made at once.
  std::vector<std::int32_t> cu(lens.size() + 1, 0);
  std::partial_sum(lens.begin(), lens.end(), cu.begin() + 1);
  const auto n = static_cast<std::int64_t>(cu.size());
  Tensor cu_dev = Tensor::empty({1, 1, 1, n}, DType::I32, rt.allocator());
  int* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, cu.size() * sizeof(int)), cudaSuccess);
  std::copy(cu.begin(), cu.end(), pinned);
  Inputs in_dev = in_host;
  in_dev.cu_seqlens_q = in_dev.cu_seqlens_k = cu_dev;
  Tensor got = Tensor::empty(host_p.q_dims(), DType::BF16, rt.allocator());
  for (int round = 0; round < 3; ++round) {
    fill_ints<<<1, 64, 0, stream>>>(cu_dev.data_as<int>(), 64, static_cast<int>(n));
    spin<<<1, 1, 0, stream>>>(200'000'000);  // about 0.1 s
    ASSERT_EQ(cudaMemcpyAsync(cu_dev.data(), pinned, cu.size() * sizeof(int), cudaMemcpyHostToDevice, stream),
              cudaSuccess);
    cudnn->forward(dev_p, in_dev, got, ctx);
    EXPECT_EQ(cudaStreamQuery(stream), cudaErrorNotReady) << "round " << round << ": the call waited for the stream";
    rt.synchronize();
    EXPECT_TRUE(same_bits(rt.download(want), rt.download(got))) << "round " << round;
  }
  testing::expect_accurate(ref_p, check_against_reference(ref_p, host, rt.download(got), sample_rows(ref_p, 1 << 20)),
                           "cudnn, lengths on the device");
  cudaFreeHost(pinned);
}

TEST(CudnnDeviceLengths, ABooleanMaskWrittenBehindABusyStreamIsReadOnTheDevice) {
  REQUIRE_GPU();
  Backend* cudnn = find_backend("cudnn", Device::Cuda);
  ASSERT_NE(cudnn, nullptr);
  DeviceRuntime& rt = cuda::runtime();
  const auto stream = static_cast<cudaStream_t>(rt.stream());
  Problem p = testing::to_problem(
      testing::Shape{.batch = 3, .heads = 4, .kv_heads = 2, .seq = 128, .kv_seq = 160, .head_dim = 64}, DType::BF16,
      MaskKind::Boolean, Device::Cuda);
  p.validate();
  const Eligibility e = eligibility_of(*cudnn, p);
  ASSERT_TRUE(e.eligible) << e.reason;
  // A key-padding mask [B, 1, 1, Skv]: sequence b keeps its first 160, 77 and 1 keys.
  Problem host_p = p;
  host_p.device = Device::Cpu;
  Tensor m = Tensor::empty({p.batch, 1, 1, p.kv_seq}, DType::Bool, cpu_allocator());
  const std::int64_t keep[] = {160, 77, 1};
  for (std::int64_t b = 0; b < p.batch; ++b)
    for (std::int64_t j = 0; j < p.kv_seq; ++j) m.data_as<std::uint8_t>()[b * p.kv_seq + j] = j < keep[b];
  Inputs host = make_inputs(host_p, 11, cpu_allocator());
  attach_mask(host_p, m, host, "the test's mask");
  Inputs in = rt.upload(host);
  // The device mask [B, 1, 1, Skv] holds all-false until the stream, after a
  // long kernel, writes the real one.
  Tensor mask = Tensor::empty(m.sizes(), DType::Bool, rt.allocator());
  attach_mask(p, mask, in, "the device mask");
  void* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, m.nbytes()), cudaSuccess);
  std::memcpy(pinned, m.data(), m.nbytes());
  Tensor out = Tensor::empty(p.q_dims(), DType::BF16, rt.allocator());
  RunContext ctx{rt.allocator(), rt.stream(), 0};
  // A first call builds the graph and allocates the bias: host work that can
  // outlast the busy kernel below (the stream would then be idle by the
  // query, whatever the call read), so the measured call is the second.
  cudnn->forward(p, in, out, ctx);
  rt.synchronize();
  ASSERT_EQ(cudaMemsetAsync(mask.data(), 0, mask.nbytes(), stream), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(out.data(), 0xff, out.nbytes(), stream), cudaSuccess);  // poisoned: NaN in bf16
  spin<<<1, 1, 0, stream>>>(200'000'000);
  ASSERT_EQ(cudaMemcpyAsync(mask.data(), pinned, mask.nbytes(), cudaMemcpyHostToDevice, stream), cudaSuccess);
  cudnn->forward(p, in, out, ctx);
  EXPECT_EQ(cudaStreamQuery(stream), cudaErrorNotReady) << "the call waited for the stream (read the mask)";
  rt.synchronize();
  testing::expect_accurate(host_p,
                           check_against_reference(host_p, host, rt.download(out), sample_rows(host_p, 1 << 20)),
                           "cudnn, key-padding mask written behind a busy stream");
  cudaFreeHost(pinned);
}

}  // namespace
}  // namespace attnprof
