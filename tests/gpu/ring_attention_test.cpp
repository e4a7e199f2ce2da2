// Ring attention over NCCL (--gpus): world size 1 (a self-ring through NCCL on
// one GPU) and, where the machine has two GPUs, world size 2; none and causal
// masks; the gathered output against float64; the trace has every GPU's
// kernels (NCCL's on two) and the findings read them.
#include <cuda_runtime.h>

#include <set>
#include <string>

#include "analysis/findings.h"
#include "attnprof/error.h"
#include "attnprof/parallel.h"
#include "gpu_test.h"

namespace attnprof {
namespace {

int gpu_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  cudaGetLastError();
  return n;
}

Problem ring_problem(std::int64_t seq, std::int64_t head_dim, MaskKind mask) {
  Problem p;
  p.batch = 2;
  p.heads = 4;
  p.seq = seq;
  p.head_dim = head_dim;
  p.dtype = DType::BF16;
  p.device = Device::Cuda;
  p.mask = mask;
  p.normalize().validate();
  return p;
}

RunResult run(const Problem& p, int gpus) {
  RunOptions o;
  o.schedule = Schedule{.wait = 0, .warmup = 1, .active = 2, .repeat = 1};
  o.unprofiled_calls = 4;
  o.check_rows = 1 << 13;  // every row at seq 1000, half of them at 2048
  return run_ring(p, gpus, o);
}

const Finding* rule(const RunResult& r, const std::string& id) {
  for (const auto& f : r.findings) {
    if (f.rule == id) return &f;
  }
  return nullptr;
}

void expect_matches_float64(const RunResult& r, const std::string& what) {
  ASSERT_FALSE(r.failure) << what << ": " << *r.failure;
  ASSERT_TRUE(r.error && r.acceptance) << what;
  EXPECT_EQ(r.error->nan_count, 0) << what;
  EXPECT_TRUE(r.acceptance->pass) << what << ": rel error " << r.error->rel << " over tolerance "
                                  << r.acceptance->tolerance;
  EXPECT_GT(r.metrics.steps, 0) << what;
  ASSERT_TRUE(r.metrics.device_time_us) << what;
  EXPECT_GT(*r.metrics.device_time_us, 0) << what;
}

class RingAttention : public ::testing::TestWithParam<MaskKind> {};

TEST_P(RingAttention, WorldSizeOneThroughNcclMatchesFloat64) {
  REQUIRE_GPU();
  // Chunks of 250 and 500 rows: tiles that do not divide them.
  for (const auto& [seq, d] : {std::pair{1000, 64}, std::pair{512, 128}}) {
    const Problem p = ring_problem(seq, d, GetParam());
    const RunResult r = run(p, 1);
    if (r.failure && r.failure->find("NCCL; this one has neither") != std::string::npos) {
      GTEST_SKIP() << "built without NCCL: " << *r.failure;
    }
    expect_matches_float64(r, p.describe());
    EXPECT_EQ(r.trace.world_size, 1);
  }
}

TEST_P(RingAttention, WorldSizeTwoMatchesFloat64WithNcclKernelsOnBothGpus) {
  REQUIRE_GPU();
  if (gpu_count() < 2) {
    GTEST_SKIP() << "world size 2 needs 2 GPUs; this machine has " << gpu_count();
  }
  for (const auto& [seq, d] : {std::pair{1000, 64}, std::pair{2048, 128}}) {
    const Problem p = ring_problem(seq, d, GetParam());
    RunResult r = run(p, 2);
    expect_matches_float64(r, p.describe());
    EXPECT_EQ(r.trace.world_size, 2);
    std::set<int> devices;
    bool nccl = false;
    for (const Activity& a : r.trace.activities) {
      if (a.type != ActivityType::Kernel) continue;
      devices.insert(a.device);
      nccl = nccl || a.name.starts_with("ncclDevKernel") || a.name.starts_with("ncclKernel");
    }
    if (!r.metrics.kernels_per_forward) GTEST_SKIP() << "no CUPTI activities: cannot see the kernels";
    EXPECT_EQ(devices, (std::set<int>{0, 1}));
    EXPECT_TRUE(nccl) << "no NCCL kernel recorded";
    ASSERT_EQ(r.metrics.device_time_per_rank_us.size(), 2u);
    r.findings = analysis::findings(r, {r}, {});
    EXPECT_TRUE(rule(r, "comm-overlap")) << p.describe();
    EXPECT_TRUE(rule(r, "load-imbalance")) << p.describe();
  }
}

INSTANTIATE_TEST_SUITE_P(Ring, RingAttention, ::testing::Values(MaskKind::None, MaskKind::Causal),
                         [](const auto& info) { return info.param == MaskKind::None ? "none" : "causal"; });

TEST(RingAttentionRefuses, MoreGpusThanTheMachineHasInOneLine) {
  REQUIRE_GPU();
  const int have = gpu_count();
  const Problem p = ring_problem(64 * 2 * (have + 1), 64, MaskKind::Causal);
  try {
    check_ring(p, have + 1);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    EXPECT_TRUE(m.find("more GPUs than this machine has") != std::string::npos ||
                m.find("NCCL; this one has neither") != std::string::npos)
        << m;
  }
}

}  // namespace
}  // namespace attnprof
