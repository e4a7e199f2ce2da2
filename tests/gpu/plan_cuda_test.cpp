// attnprof::plan on CUDA, the serving contract: a paged decode's Plan::run
// captured in a CUDA graph (stream capture) allocates nothing and, replayed
// after the lengths and block table are rewritten in place on the stream,
// writes what flash's own eager forward writes for those values, bit for bit;
// the plan holds the split-KV workspace the decode needs.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/device_runtime.h"
#include "attnprof/plan.h"
#include "attnprof/problem.h"
#include "attnprof/reference.h"
#include "attnprof/runner.h"
#include "backends/cuda/fused_backend.h"
#include "backends/cuda/launch/fused_kernels.h"
#include "common/test_problem.h"
#include "gpu_test.h"

namespace attnprof {
namespace {

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

TEST(PlanCuda, CapturedPagedDecodeReplaysWithLengthsAndTableRewrittenInPlace) {
  REQUIRE_GPU();
  // Few sequences and kv heads against long caches: the decode splits the keys (a workspace).
  Problem p = testing::to_problem(
      testing::Shape{.batch = 2, .heads = 8, .kv_heads = 2, .seq = 1, .kv_seq = 2048, .head_dim = 128}, DType::BF16,
      MaskKind::CausalBottomRight, Device::Cuda);
  p.kv_cache = KvCache::Paged;
  p.page_size = 64;
  p.validate();
  const cuda::DecodePlan decode = cuda::flash_decode_plan(cuda::fused_params_for(p));
  ASSERT_TRUE(decode.applies);
  ASSERT_GT(decode.splits, 1) << "one split: no workspace to hold";

  Plan plan = attnprof::plan(p, {.form = BatchLayout::Form::Paged}, "flash");
  EXPECT_EQ(plan.workspace_bytes(), decode.workspace_bytes) << plan.explain();

  DeviceRuntime& rt = device_runtime(Device::Cuda);
  const Inputs host = make_inputs(p, 11, cpu_allocator());
  Inputs in = rt.upload(host);
  Tensor host_lens = Tensor::empty({1, 1, p.batch, 1}, DType::I32, cpu_allocator());
  std::vector<std::int32_t> lens{2048, 700};
  std::memcpy(host_lens.data(), lens.data(), lens.size() * sizeof(std::int32_t));
  in.kv_rows = rt.upload(host_lens);
  Tensor out = Tensor::empty(p.q_dims(), DType::BF16, rt.allocator());
  Tensor eager = Tensor::empty(p.q_dims(), DType::BF16, rt.allocator());

  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  plan.run(in, out, stream);  // warm: the kernels' attributes set before the capture
  CUDA_OK(cudaStreamSynchronize(stream));

  const std::int64_t allocated = rt.allocator().stats().allocated;
  cudaGraph_t graph = nullptr;
  CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  plan.run(in, out, stream);
  CUDA_OK(cudaStreamEndCapture(stream, &graph));
  EXPECT_EQ(rt.allocator().stats().allocated, allocated) << "the run allocated";
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

  Backend* flash = find_backend("flash", Device::Cuda);
  ASSERT_NE(flash, nullptr);
  const std::int32_t pages = static_cast<std::int32_t>(p.pages_per_seq());
  for (const std::vector<std::int32_t>& next : {std::vector<std::int32_t>{1, 2048}, {1500, 64}, {2048, 2048}}) {
    // The table's rows swapped and the lengths rewritten on the stream, as a serving step writes them.
    Tensor table = rt.download(in.block_table);
    std::vector<std::int32_t> swapped(table.data_as<std::int32_t>(), table.data_as<std::int32_t>() + 2 * pages);
    std::rotate(swapped.begin(), swapped.begin() + pages, swapped.end());
    CUDA_OK(cudaMemcpyAsync(in.block_table.data(), swapped.data(), swapped.size() * sizeof(std::int32_t),
                            cudaMemcpyHostToDevice, stream));
    CUDA_OK(cudaMemcpyAsync(in.kv_rows.data(), next.data(), next.size() * sizeof(std::int32_t), cudaMemcpyHostToDevice,
                            stream));
    CUDA_OK(cudaGraphLaunch(exec, stream));
    RunContext ctx{rt.allocator(), stream, 0};
    flash->forward(p, in, eager, ctx);  // no plan: sized and allocated by the call itself
    CUDA_OK(cudaStreamSynchronize(stream));
    const Tensor got = rt.download(out), want = rt.download(eager);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.nbytes()), 0) << next[0] << ", " << next[1];
  }
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace attnprof
