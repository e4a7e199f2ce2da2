// attnprof's CUPTI profiler in CUDA graphs (issue 59 item 1) and with long
// schedules (issue 57 item 2), on a real device:
// - a decode plan captured in a graph and replayed N times shows, in key
//   averages, the analysis' figures and the Chrome trace, N calls with their
//   kernels, and the kernel time per call within 2% of the eager call's;
// - a long schedule's steps are folded with their device records (CUPTI and
//   the device-event fallback), so the trace holds the last steps only.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "analysis/metrics.h"
#include "attnprof/device_runtime.h"
#include "attnprof/key_averages.h"
#include "attnprof/plan.h"
#include "attnprof/problem.h"
#include "attnprof/profiler.h"
#include "attnprof/reference.h"
#include "attnprof/runner.h"
#include "attnprof/trace_io.h"
#include "common/test_problem.h"
#include "gpu_test.h"
#include "profiler/cupti/cupti_collector.h"

namespace attnprof {
namespace {

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

constexpr int kCalls = 100;

const KeyAverage* row(const std::vector<KeyAverage>& rows, const std::string& name) {
  const auto it = std::find_if(rows.begin(), rows.end(), [&](const KeyAverage& r) { return r.name == name; });
  return it == rows.end() ? nullptr : &*it;
}

std::int64_t device_rows_ns(const std::vector<KeyAverage>& rows) {
  std::int64_t ns = 0;
  for (const KeyAverage& r : rows) ns += r.on_device ? r.self_cuda_ns : 0;
  return ns;
}

// A serving decode step's attention: one query per sequence against a long cache.
Problem decode_problem() {
  Problem p = testing::to_problem(
      testing::Shape{.batch = 8, .heads = 32, .kv_heads = 8, .seq = 1, .kv_seq = 4096, .head_dim = 128}, DType::BF16,
      MaskKind::CausalBottomRight, Device::Cuda);
  p.validate();
  return p;
}

TEST(GraphReplaysCuda, ReplayedDecodePlanIsProfiledAsItsEagerCalls) {
  REQUIRE_GPU();
  if (const std::string reason = cupti::probe(); !reason.empty()) GTEST_SKIP() << "CUPTI unavailable: " << reason;
  const Problem p = decode_problem();
  Plan plan = attnprof::plan(p, {}, "flash");
  DeviceRuntime& rt = device_runtime(Device::Cuda);
  const Inputs in = rt.upload(make_inputs(p, 5, cpu_allocator()));
  Tensor out = Tensor::empty(p.q_dims(), DType::BF16, rt.allocator());
  cudaStream_t stream = nullptr;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int i = 0; i < 5; ++i) plan.run(in, out, stream);  // warm: attributes set, clocks up
  CUDA_OK(cudaStreamSynchronize(stream));
  const auto call_range = [&] {
    return std::make_unique<RecordFunction>("forward", dtype_name(p.dtype), p.shape_key(),
                                            ActivityType::UserAnnotation);
  };

  // Eager: kCalls calls, each in its range.
  Profiler eager(Schedule{.wait = 0, .warmup = 0, .active = 1, .repeat = 1});
  eager.add_collector(std::make_unique<cupti::CuptiCollector>());
  eager.start();
  for (int i = 0; i < kCalls; ++i) {
    auto r = call_range();
    plan.run(in, out, stream);
  }
  CUDA_OK(cudaStreamSynchronize(stream));
  eager.step();
  eager.stop();

  // Graph: the call captured once inside its range, replayed kCalls times.
  Profiler graphed(Schedule{.wait = 0, .warmup = 0, .active = 1, .repeat = 1});
  graphed.add_collector(std::make_unique<cupti::CuptiCollector>());
  graphed.start();
  cudaGraph_t graph = nullptr;
  {
    auto r = call_range();
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    plan.run(in, out, stream);
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
  }
  cudaGraphExec_t exec = nullptr;
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < kCalls; ++i) {
    RecordFunction r("replay");
    CUDA_OK(cudaGraphLaunch(exec, stream));
  }
  CUDA_OK(cudaStreamSynchronize(stream));
  graphed.step();
  graphed.stop();
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(stream));

  const Trace& et = eager.trace();
  const Trace& gt = graphed.trace();
  EXPECT_EQ(gt.collector_note.find("not tied"), std::string::npos) << gt.collector_note;
  const std::vector<KeyAverage> erows = key_averages(et);
  const std::vector<KeyAverage> grows = key_averages(gt);
  std::cout << "eager:\n" << key_averages_table(erows) << "graph replays:\n" << key_averages_table(grows);
  const KeyAverage* ef = row(erows, "forward");
  const KeyAverage* gf = row(grows, "forward");
  ASSERT_NE(ef, nullptr);
  ASSERT_NE(gf, nullptr) << "no replayed call";
  EXPECT_EQ(gf->count, kCalls);
  ASSERT_NE(row(grows, "forward (graph capture)"), nullptr);
  EXPECT_EQ(row(grows, "forward (graph capture)")->count, 1);
  // Every replayed kernel is a call's: the replay op launched nothing else.
  EXPECT_EQ(gf->cuda_total_ns, device_rows_ns(grows));
  EXPECT_EQ(row(grows, "replay")->self_cuda_ns, 0);
  // The same kernels per call, and the kernel time per call within 2%.
  int eager_kernels = 0, graph_kernels = 0, graph_ids = 0;
  for (const Activity& a : et.activities) eager_kernels += a.type == ActivityType::Kernel;
  for (const Activity& a : gt.activities) {
    graph_kernels += a.type == ActivityType::Kernel;
    graph_ids += a.type == ActivityType::Kernel && a.graph_node_id != 0 && a.graph_id != 0;
  }
  EXPECT_EQ(graph_kernels, eager_kernels);
  EXPECT_EQ(graph_ids, graph_kernels);
  const double eager_us = ef->cuda_avg_ns() / 1e3;
  const double graph_us = gf->cuda_avg_ns() / 1e3;
  std::cout << "kernel time per call: eager " << eager_us << " us, graph replay " << graph_us << " us\n";
  EXPECT_LE(std::abs(graph_us - eager_us), 0.02 * eager_us);

  // The analysis: kCalls calls, the same figures per call.
  const Metrics em = analysis::measure(et, p, 0);
  const Metrics gm = analysis::measure(gt, p, 0);
  ASSERT_TRUE(em.device_time_us && gm.device_time_us);
  EXPECT_LE(std::abs(*gm.device_time_us - *em.device_time_us), 0.02 * *em.device_time_us)
      << *gm.device_time_us << " vs " << *em.device_time_us;
  ASSERT_TRUE(em.kernels_per_forward && gm.kernels_per_forward);
  EXPECT_DOUBLE_EQ(*gm.kernels_per_forward, *em.kernels_per_forward);

  // The Chrome trace: graph and node ids on the replayed kernels, as Kineto writes them.
  const std::string json = chrome_trace_json(gt);
  EXPECT_NE(json.find("\"graph node id\""), std::string::npos);
  EXPECT_NE(json.find("\"graph id\""), std::string::npos);
}

// Issue 57 item 2 on the device: a schedule longer than the trace keeps is
// folded with its device records, under CUPTI and under device events.
void expect_long_schedule_folds(bool cupti_off) {
  if (cupti_off) {
    setenv("ATTNPROF_NO_CUPTI", "1", 1);
  } else {
    unsetenv("ATTNPROF_NO_CUPTI");
  }
  Problem p = testing::to_problem(testing::Shape{.batch = 1, .heads = 2, .seq = 128, .head_dim = 64}, DType::BF16,
                                  MaskKind::None, Device::Cuda);
  p.validate();
  Backend* flash = find_backend("flash", Device::Cuda);
  ASSERT_NE(flash, nullptr);
  RunOptions o;
  o.schedule = {.wait = 0, .warmup = 1, .active = 300, .repeat = 1};
  o.check_rows = 8;
  o.unprofiled_calls = 0;
  const RunResult r = run_backend(*flash, p, o);
  unsetenv("ATTNPROF_NO_CUPTI");
  ASSERT_FALSE(r.failure) << *r.failure;
  EXPECT_EQ(r.trace.steps_recorded, 300);
  EXPECT_EQ(r.trace.steps_folded, 200) << "the trace keeps its last 100 steps";
  const std::size_t steps = static_cast<std::size_t>(std::count_if(
      r.trace.activities.begin(), r.trace.activities.end(),
      [](const Activity& a) { return a.type == ActivityType::UserAnnotation && a.name.starts_with("ProfilerStep#"); }));
  EXPECT_EQ(steps, 100u);
  EXPECT_EQ(r.metrics.steps, 300);
  ASSERT_TRUE(r.metrics.device_time_us.has_value());
  EXPECT_GT(*r.metrics.device_time_us, 0.0);
  const KeyAverage* forward = row(r.key_averages, "forward");
  ASSERT_NE(forward, nullptr);
  EXPECT_EQ(forward->count, 300);
  if (!cupti_off) {
    EXPECT_GT(forward->cuda_total_ns, 0);
    ASSERT_TRUE(r.metrics.kernels_per_forward.has_value());
    EXPECT_DOUBLE_EQ(*r.metrics.kernels_per_forward, 1.0);
  }
}

TEST(LongScheduleCuda, CuptiStepsAreFoldedWithTheirKernels) {
  REQUIRE_GPU();
  if (const std::string reason = cupti::probe(); !reason.empty()) GTEST_SKIP() << "CUPTI unavailable: " << reason;
  expect_long_schedule_folds(false);
}

TEST(LongScheduleCuda, DeviceEventStepsAreFoldedToo) {
  REQUIRE_GPU();
  expect_long_schedule_folds(true);
}

}  // namespace
}  // namespace attnprof
