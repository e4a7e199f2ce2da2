// Context parallelism without a GPU: the zigzag layout and its pair table
// (read off Problem::visible), the log-sum-exp merge in float64, and the
// one-line refusals of --gpus through the command.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "analysis/findings.h"
#include "analysis/metrics.h"
#include "attnprof/error.h"
#include "attnprof/trace_io.h"
#include "parallel/merge.h"
#include "parallel/sharding.h"
#include "report/json.h"
#include "synthetic_trace.h"

#ifndef ATTNPROF_CLI_PATH
#error "ATTNPROF_CLI_PATH must name the attnprof executable"
#endif

namespace attnprof::parallel {
namespace {

Problem ring_problem(std::int64_t seq, MaskKind mask) {
  Problem p;
  p.batch = 1;
  p.heads = 2;
  p.seq = seq;
  p.head_dim = 16;
  p.device = Device::Cuda;
  p.mask = mask;
  p.normalize();
  return p;
}

// The kind of a pair by every (query, key) of it, for checking the O(chunk) classifier.
PairKind brute_force_kind(const Problem& p, const ZigzagLayout& l, int qc, int kc) {
  bool full = true, none = true, diag = true;
  for (std::int64_t r = 0; r < l.chunk; ++r) {
    for (std::int64_t c = 0; c < l.chunk; ++c) {
      const bool v = p.visible(qc * l.chunk + r, kc * l.chunk + c);
      full = full && v;
      none = none && !v;
      diag = diag && v == (c <= r);
    }
  }
  EXPECT_TRUE(full || none || diag);
  return full ? PairKind::Full : none ? PairKind::Skip : PairKind::Diagonal;
}

class Sharding : public ::testing::TestWithParam<std::tuple<int, MaskKind>> {};

TEST_P(Sharding, EveryRowOnceAndPairKindsAgreeWithTheMask) {
  const auto [world, mask] = GetParam();
  const Problem p = ring_problem(16 * world, mask);
  const ZigzagLayout l = zigzag_layout(p, world);
  EXPECT_EQ(l.chunk, 8);
  EXPECT_EQ(l.shard_rows() * world, p.seq);
  // Every global row lands on exactly one (rank, local row).
  std::vector<int> seen(static_cast<std::size_t>(p.seq), 0);
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(l.chunks_of(r)[0], r);
    EXPECT_EQ(l.chunks_of(r)[1], 2 * world - 1 - r);
    for (std::int64_t lr = 0; lr < l.shard_rows(); ++lr) ++seen[static_cast<std::size_t>(l.global_row(r, lr))];
  }
  for (std::int64_t g = 0; g < p.seq; ++g) EXPECT_EQ(seen[static_cast<std::size_t>(g)], 1) << "row " << g;

  const auto table = pair_table(p, l);
  for (int qc = 0; qc < l.chunks(); ++qc) {
    for (int kc = 0; kc < l.chunks(); ++kc) {
      const PairKind k = table[static_cast<std::size_t>(qc)][static_cast<std::size_t>(kc)];
      EXPECT_EQ(k, brute_force_kind(p, l, qc, kc)) << qc << "," << kc;
      if (mask == MaskKind::None) EXPECT_EQ(k, PairKind::Full);
      if (mask == MaskKind::Causal) {
        EXPECT_EQ(k, kc < qc ? PairKind::Full : kc == qc ? PairKind::Diagonal : PairKind::Skip) << qc << "," << kc;
      }
    }
  }

  // Work per rank in chunk pairs (a diagonal pair is half of one): zigzag
  // makes it equal to within one chunk pair, and it adds up to the problem's.
  double total = 0, lo = 1e30, hi = 0;
  for (int r = 0; r < world; ++r) {
    double work = 0;
    for (int qc : l.chunks_of(r)) {
      for (int kc = 0; kc < l.chunks(); ++kc) {
        const PairKind k = table[static_cast<std::size_t>(qc)][static_cast<std::size_t>(kc)];
        work += k == PairKind::Full ? 1.0 : k == PairKind::Diagonal ? 0.5 : 0.0;
      }
    }
    total += work;
    lo = std::min(lo, work);
    hi = std::max(hi, work);
  }
  EXPECT_LE(hi - lo, 1.0);
  if (mask == MaskKind::Causal) EXPECT_EQ(hi, lo) << "zigzag balances causal work exactly";
  const double c2 = static_cast<double>(l.chunk * l.chunk);
  // Visible pairs: full pairs count c^2, diagonal pairs c(c+1)/2.
  EXPECT_NEAR(total * c2, static_cast<double>(p.visible_pairs()), l.chunks() * l.chunk / 2.0 + 1e-9);
}

INSTANTIATE_TEST_SUITE_P(Parallel, Sharding,
                         ::testing::Combine(::testing::Values(1, 2, 4),
                                            ::testing::Values(MaskKind::None, MaskKind::Causal)),
                         [](const auto& info) {
                           return "world" + std::to_string(std::get<0>(info.param)) + "_" +
                                  (std::get<1>(info.param) == MaskKind::None ? "none" : "causal");
                         });

TEST(Parallel, SequenceNotCutIntoTwoNChunksIsRefusedSayingSo) {
  const Problem p = ring_problem(1000, MaskKind::Causal);
  try {
    (void)zigzag_layout(p, 3);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_STREQ(e.what(), "seq 1000 must be a multiple of 2N = 6 for zigzag sharding over 3 GPUs");
  }
}

TEST(Parallel, RingProblemRefusesWhatItDoesNotTake) {
  Problem p = ring_problem(64, MaskKind::Causal);
  EXPECT_NO_THROW(check_ring_problem(p, 2));
  EXPECT_THROW(check_ring_problem(p, 0), Error);
  Problem gqa = p;
  gqa.heads = 4;
  gqa.kv_heads = 2;
  EXPECT_THROW(check_ring_problem(gqa, 2), Error);
  Problem cross = p;
  cross.kv_seq = 128;
  EXPECT_THROW(check_ring_problem(cross, 2), Error);
  Problem window = p;
  window.mask = MaskKind::SlidingWindow;
  window.window = 4;
  EXPECT_THROW(check_ring_problem(window, 2), Error);
  Problem cpu = p;
  cpu.device = Device::Cpu;
  EXPECT_THROW(check_ring_problem(cpu, 2), Error);
}

// Attention of `q_rows` query rows over keys [k0, k1) in float64: O and lse
// (natural log of the scaled scores' sum of exponentials; +inf when none).
void attention_piece(const Problem& p, const std::vector<double>& q, const std::vector<double>& k,
                     const std::vector<double>& v, std::int64_t k0, std::int64_t k1, std::vector<double>& o,
                     std::vector<double>& lse) {
  const std::int64_t d = p.head_dim, s = p.seq;
  o.assign(static_cast<std::size_t>(s * d), 0.0);
  lse.assign(static_cast<std::size_t>(s), INFINITY);
  const double scale = p.softmax_scale();
  for (std::int64_t i = 0; i < s; ++i) {
    std::vector<double> sc;
    double m = -INFINITY;
    for (std::int64_t j = k0; j < k1; ++j) {
      if (!p.visible(i, j)) continue;
      double dot = 0;
      for (std::int64_t c = 0; c < d; ++c)
        dot += q[static_cast<std::size_t>(i * d + c)] * k[static_cast<std::size_t>(j * d + c)];
      sc.push_back(dot * scale);
      m = std::max(m, dot * scale);
    }
    if (sc.empty()) continue;
    double sum = 0;
    std::size_t n = 0;
    for (std::int64_t j = k0; j < k1; ++j) {
      if (!p.visible(i, j)) continue;
      const double w = std::exp(sc[n++] - m);
      sum += w;
      for (std::int64_t c = 0; c < d; ++c)
        o[static_cast<std::size_t>(i * d + c)] += w * v[static_cast<std::size_t>(j * d + c)];
    }
    for (std::int64_t c = 0; c < d; ++c) o[static_cast<std::size_t>(i * d + c)] /= sum;
    lse[static_cast<std::size_t>(i)] = m + std::log(sum);
  }
}

class Merge : public ::testing::TestWithParam<MaskKind> {};

TEST_P(Merge, PiecesMergedByLogSumExpEqualFullAttention) {
  const Problem p = ring_problem(48, GetParam());
  std::mt19937_64 gen(7);
  std::normal_distribution<double> n(0.0, 1.0);
  const auto rnd = [&] {
    std::vector<double> x(static_cast<std::size_t>(p.seq * p.head_dim));
    for (double& e : x) e = 2.0 * n(gen);
    return x;
  };
  const auto q = rnd(), k = rnd(), v = rnd();
  std::vector<double> full_o, full_lse;
  attention_piece(p, q, k, v, 0, p.seq, full_o, full_lse);
  // Uneven pieces, merged in an order other than the keys': the running
  // result starts empty (lse -inf); under causal some pieces are fully masked
  // for some rows (lse +inf) and contribute nothing.
  const std::vector<std::pair<std::int64_t, std::int64_t>> pieces = {{30, 48}, {0, 5}, {17, 30}, {5, 17}};
  std::vector<double> o(full_o.size(), 0.0), lse(full_lse.size(), -INFINITY);
  for (const auto& [a, b] : pieces) {
    std::vector<double> po, pl;
    attention_piece(p, q, k, v, a, b, po, pl);
    merge_into(o, lse, po, pl, p.head_dim);
  }
  for (std::size_t i = 0; i < full_lse.size(); ++i) EXPECT_NEAR(lse[i], full_lse[i], 1e-12) << "row " << i;
  for (std::size_t i = 0; i < full_o.size(); ++i) ASSERT_NEAR(o[i], full_o[i], 1e-12) << "element " << i;
}

INSTANTIATE_TEST_SUITE_P(Parallel, Merge, ::testing::Values(MaskKind::None, MaskKind::Causal),
                         [](const auto& info) { return info.param == MaskKind::None ? "none" : "causal"; });

TEST(Parallel, MergeOfTwoEmptyRowsIsEmpty) {
  const MergeWeights<double> w = merge_weights<double>(INFINITY, -INFINITY);
  EXPECT_EQ(w.wa, 0.0);
  EXPECT_EQ(w.wb, 0.0);
  EXPECT_TRUE(std::isinf(w.lse));
  const MergeWeights<double> one = merge_weights<double>(-INFINITY, 1.5);
  EXPECT_EQ(one.wa, 0.0);
  EXPECT_EQ(one.wb, 1.0);
  EXPECT_EQ(one.lse, 1.5);
}

// ---- --gpus through the command ----------------------------------------------

struct CliResult {
  int code = -1;
  std::string err;
};

CliResult attnprof_cli(const std::string& args) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("attnprof_gpus_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path err = dir / "stderr";
  const std::string cmd = "cd '" + dir.string() + "' && '" ATTNPROF_CLI_PATH "' " + args + " --quiet >/dev/null 2>'" +
                          err.string() + "' </dev/null";
  const int status = std::system(cmd.c_str());
  CliResult r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream f(err);
  std::stringstream ss;
  ss << f.rdbuf();
  r.err = ss.str();
  fs::remove_all(dir);
  return r;
}

void expect_one_line(const CliResult& r, const std::string& needle) {
  EXPECT_NE(r.code, 0);
  EXPECT_LT(r.code, 128) << "crashed: " << r.err;
  ASSERT_FALSE(r.err.empty());
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "one line, got:\n" << r.err;
  EXPECT_EQ(r.err.rfind("attnprof: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
}

TEST(CliGpus, ZeroIsRefused) {
  const CliResult r = attnprof_cli("profile --backend flash --gpus 0");
  expect_one_line(r, "--gpus");
  EXPECT_EQ(r.code, 2);
}

TEST(CliGpus, SequenceNotAMultipleOfTwoNIsRefusedSayingSo) {
  const CliResult r = attnprof_cli("profile --backend flash --gpus 3 --seq 1000");
  expect_one_line(r, "--seq 1000 must be a multiple of 2N = 6 for zigzag sharding over 3 GPUs");
  EXPECT_EQ(r.code, 2);
}

TEST(CliGpus, OtherBackendsAreRefused) {
  expect_one_line(attnprof_cli("profile --backend naive --gpus 2 --seq 1024"), "flash");
  expect_one_line(attnprof_cli("compare --backends naive --gpus 2 --seq 1024"), "flash");
}

TEST(CliGpus, UnsupportedProblemsAreRefused) {
  expect_one_line(attnprof_cli("profile --backend flash --gpus 2 --seq 1024 --kv-seq 2048"), "--kv-seq");
  expect_one_line(attnprof_cli("profile --backend flash --gpus 2 --seq 1024 --heads 8 --kv-heads 2"), "--kv-heads");
  expect_one_line(attnprof_cli("profile --backend flash --gpus 2 --seq 1024 --mask sliding-window --window 8"),
                  "--mask");
  expect_one_line(attnprof_cli("profile --backend flash --gpus 2 --seq 1024 --device cpu"), "--device cuda");
  expect_one_line(attnprof_cli("explain --gpus 2"), "--gpus");
}

// Where this machine has fewer GPUs than asked (no GPU at all here, or a
// build without NCCL), one line says so before any work.
TEST(CliGpus, MoreGpusThanTheMachineHasIsOneLine) {
  const CliResult r = attnprof_cli("profile --backend flash --gpus 64 --seq 1024");
  expect_one_line(r, "GPU");
}

// ---- Findings over a two-GPU trace -------------------------------------------

// One profiler step; GPU 0 computes 800 us with 200 us of NCCL all hidden,
// GPU 1 computes 600 us with 200 us of NCCL of which 50 us is hidden, then
// idles 200 us.
Trace two_gpu_trace() {
  using testing::device;
  Trace t;
  t.world_size = 2;
  t.activities.push_back(testing::host(ActivityType::UserAnnotation, "ProfilerStep#1", 0, 1'000'000, 0));
  const auto kernel = [](int dev, const char* name, std::int64_t start, std::int64_t dur) {
    Activity a = device(ActivityType::Kernel, name, start, dur, 0);
    a.device = dev;
    a.stream = std::string_view(name).starts_with("nccl") ? 20 : 7;
    return a;
  };
  t.activities.push_back(kernel(0, "flash_fwd_kernel", 0, 400'000));
  t.activities.push_back(kernel(1, "flash_fwd_kernel", 0, 300'000));
  t.activities.push_back(kernel(0, "ncclDevKernel_SendRecv", 100'000, 200'000));
  t.activities.push_back(kernel(1, "flash_fwd_kernel", 300'000, 300'000));
  t.activities.push_back(kernel(0, "flash_fwd_kernel", 400'000, 400'000));
  t.activities.push_back(kernel(1, "ncclDevKernel_SendRecv", 550'000, 200'000));
  t.steps_recorded = 1;
  return t;
}

const Finding* rule(const std::vector<Finding>& fs, const std::string& id) {
  for (const auto& f : fs) {
    if (f.rule == id) return &f;
  }
  return nullptr;
}

TEST(ParallelFindings, CommOverlapRankWaitAndImbalanceFromTheTrace) {
  RunResult r;
  r.backend = "flash";
  r.problem.device = Device::Cuda;
  r.eligibility.eligible = true;
  r.trace = two_gpu_trace();
  r.metrics = analysis::measure(r.trace, r.problem, 0);
  ASSERT_EQ(r.metrics.device_time_per_rank_us.size(), 2u);
  EXPECT_DOUBLE_EQ(r.metrics.device_time_per_rank_us[0], 800.0);
  EXPECT_DOUBLE_EQ(r.metrics.device_time_per_rank_us[1], 750.0);
  EXPECT_EQ(r.metrics.world_size, 2);
  const auto fs = analysis::findings(r, {r}, {});
  const Finding* comm = rule(fs, "comm-overlap");
  ASSERT_TRUE(comm);
  EXPECT_DOUBLE_EQ(comm->figures.at("comm_us_per_forward"), 400.0);
  EXPECT_DOUBLE_EQ(comm->figures.at("comm_hidden_pct"), 62.5);
  EXPECT_DOUBLE_EQ(comm->figures.at("comm_hidden_pct_gpu0"), 100.0);
  EXPECT_DOUBLE_EQ(comm->figures.at("comm_hidden_pct_gpu1"), 25.0);
  EXPECT_NE(comm->text.find("62.5% of it hidden"), std::string::npos) << comm->text;
  const Finding* wait = rule(fs, "rank-wait");
  ASSERT_TRUE(wait);
  EXPECT_DOUBLE_EQ(wait->figures.at("wait_us_gpu0"), 0.0);
  EXPECT_DOUBLE_EQ(wait->figures.at("wait_us_gpu1"), 200.0);
  const Finding* imb = rule(fs, "load-imbalance");
  ASSERT_TRUE(imb);
  EXPECT_NEAR(imb->figures.at("imbalance"), 800.0 / 700.0, 1e-12);
  // The at-a-glance table and the JSON carry each GPU's time.
  r.findings = fs;
  const std::string table = compare_table({r});
  EXPECT_NE(table.find("GPU time per rank"), std::string::npos) << table;
  EXPECT_NE(table.find("flash x2 GPUs"), std::string::npos) << table;
  const nlohmann::json j = report::result_json(r);
  EXPECT_EQ(j["world_size"], 2);
  EXPECT_EQ(j["device_time_per_rank_us"], (nlohmann::json{800.0, 750.0}));
}

TEST(ParallelFindings, OneGpuWithoutNcclSaysNothing) {
  RunResult r;
  r.backend = "flash";
  r.problem.device = Device::Cuda;
  r.eligibility.eligible = true;
  r.trace = two_gpu_trace();
  std::erase_if(r.trace.activities, [](const Activity& a) { return a.device == 1 || a.name.starts_with("nccl"); });
  r.trace.world_size = 1;
  r.metrics = analysis::measure(r.trace, r.problem, 0);
  EXPECT_TRUE(r.metrics.device_time_per_rank_us.empty());
  const auto fs = analysis::findings(r, {r}, {});
  EXPECT_FALSE(rule(fs, "comm-overlap"));
  EXPECT_FALSE(rule(fs, "rank-wait"));
  EXPECT_FALSE(rule(fs, "load-imbalance"));
}

TEST(ParallelFindings, ChromeTraceHasAProcessLanePerGpuAndTheWorldSize) {
  namespace fs = std::filesystem;
  const fs::path out = fs::temp_directory_path() / ("attnprof_two_gpu_" + std::to_string(::getpid()) + ".json");
  write_chrome_trace(two_gpu_trace(), out.string());
  const nlohmann::json j = nlohmann::json::parse(std::ifstream(out));
  fs::remove(out);
  EXPECT_EQ(j["distributedInfo"]["world_size"], 2);
  std::set<std::int64_t> kernel_pids;
  std::set<std::string> process_names;
  bool nccl = false;
  for (const auto& e : j["traceEvents"]) {
    if (e.value("cat", "") == "kernel") {
      kernel_pids.insert(e["pid"].get<std::int64_t>());
      nccl = nccl || e["name"].get<std::string>().starts_with("ncclDevKernel");
    }
    if (e.value("name", "") == "process_name") process_names.insert(e["args"]["name"].get<std::string>());
  }
  EXPECT_EQ(kernel_pids, (std::set<std::int64_t>{0, 1}));
  EXPECT_TRUE(nccl);
  EXPECT_EQ(process_names.count("GPU 0") + process_names.count("GPU 1"), 2u) << j["traceEvents"].dump().substr(0, 400);
}

}  // namespace
}  // namespace attnprof::parallel
