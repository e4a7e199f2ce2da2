// ProblemSpec: every field of a problem read from text (the one spelling each
// front end shares), numbers read strictly, shapes whose scores or memory
// would overflow refused by field, and what tells two problems' plans apart.
#include "attnprof/problem_spec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <regex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/error.h"
#include "attnprof/problem.h"
#include "attnprof/runner.h"

namespace attnprof {
namespace {

// set_problem_field(p, field, text), expected to be refused naming `field`.
void expect_refused_field(std::string_view field, const std::string& text, const std::string& says = {}) {
  Problem p;
  try {
    set_problem_field(p, field, text);
    ADD_FAILURE() << field << " took '" << text << "'";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument) << what;
    ASSERT_EQ(e.fields(), std::vector<std::string>{std::string(field)}) << what;
    EXPECT_EQ(what.find("--"), std::string::npos) << what;
    EXPECT_NE(what.find(field), std::string::npos) << what;
    if (!says.empty()) EXPECT_NE(what.find(says), std::string::npos) << what << " lacks " << says;
  }
}

TEST(ProblemSpec, EveryFieldParsesFromText) {
  Problem p;
  const std::vector<std::pair<std::string_view, std::string>> text = {{"batch", "3"},
                                                                      {"heads", "6"},
                                                                      {"kv_heads", "2"},
                                                                      {"seq", "40"},
                                                                      {"kv_seq", "50"},
                                                                      {"head_dim", "32"},
                                                                      {"dtype", "fp16"},
                                                                      {"device", "cpu"},
                                                                      {"mask", "sliding_window"},
                                                                      {"window", "7"},
                                                                      {"scale", "-0.125"},
                                                                      {"softcap", "30"},
                                                                      {"pass", "train"},
                                                                      {"deterministic", "true"},
                                                                      {"kv_cache", "contiguous"},
                                                                      {"page_size", "16"},
                                                                      {"seq_lens", "3,40,0"},
                                                                      {"kv_seq_lens", "50,1,2"}};
  ASSERT_EQ(text.size(), problem_fields().size()) << "a field without a case here";
  for (const auto& [field, value] : text) set_problem_field(p, field, value);
  EXPECT_EQ(p.batch, 3);
  EXPECT_EQ(p.heads, 6);
  EXPECT_EQ(p.kv_heads, 2);
  EXPECT_EQ(p.seq, 40);
  EXPECT_EQ(p.kv_seq, 50);
  EXPECT_EQ(p.head_dim, 32);
  EXPECT_EQ(p.dtype, DType::F16);
  EXPECT_EQ(p.device, Device::Cpu);
  EXPECT_EQ(p.mask, MaskKind::SlidingWindow);
  EXPECT_EQ(p.window, 7);
  EXPECT_EQ(p.softcap, 30.0);
  EXPECT_EQ(p.scale, -0.125);
  EXPECT_EQ(p.pass, Pass::Train);
  EXPECT_TRUE(p.deterministic);
  EXPECT_EQ(p.page_size, 16);
  EXPECT_EQ(p.seq_lens, (std::vector<std::int64_t>{3, 40, 0}));
  EXPECT_EQ(p.kv_seq_lens, (std::vector<std::int64_t>{50, 1, 2}));
}

TEST(ProblemSpec, OneSpellingOfEachNameForEveryFrontEnd) {
  // The CLI took "gpu", Python "cuda:0": both take all three now.
  for (const char* cuda : {"cuda", "cuda:0", "gpu"}) EXPECT_EQ(parse_device(cuda), Device::Cuda) << cuda;
  EXPECT_EQ(parse_device("cpu"), Device::Cpu);
  EXPECT_FALSE(parse_device("cuda:1"));
  EXPECT_FALSE(parse_device("tpu"));
  // Masks with '_' as Python keyword values spell them.
  EXPECT_EQ(parse_mask("causal_bottom_right"), MaskKind::CausalBottomRight);
  EXPECT_EQ(parse_mask("sliding_window"), MaskKind::SlidingWindow);
  EXPECT_EQ(parse_layout("bshd"), Layout::Bshd);
  EXPECT_FALSE(parse_layout("sbhd"));
  expect_refused_field("device", "tpu", "unknown device 'tpu'");
  expect_refused_field("dtype", "fp4", "unknown dtype 'fp4'");
  for (const char* fp8 : {"fp8", "e4m3", "float8_e4m3fn"}) {
    Problem f;
    set_problem_field(f, "dtype", fp8);
    EXPECT_EQ(f.dtype, DType::F8E4M3) << fp8;
  }
  expect_refused_field("mask", "diagonal", "unknown mask 'diagonal'");
  expect_refused_field("pass", "sideways", "use forward, backward or train");
  expect_refused_field("kv_cache", "blocks", "contiguous, paged");
  expect_refused_field("deterministic", "yes", "true or false");
  EXPECT_THROW(layout_from_text("sbhd"), Error);
  EXPECT_EQ(default_batch(Device::Cuda), 8);
  Problem d;
  d.batch = d.heads = 0;
  d.device = Device::Cpu;
  fill_device_defaults(d);
  EXPECT_EQ(d.batch, default_batch(Device::Cpu));
  EXPECT_EQ(d.heads, default_heads(Device::Cpu));
}

TEST(ProblemSpec, NumbersAreReadStrictly) {
  // issue 20 item 13: --scale took 0x10 and " 0.1", which integer flags refuse.
  for (const char* bad : {"0x10", " 0.1", "0.1 ", "+0.1", "", "0.1f", "1,5", "inf", "-inf", "nan", "1e999"}) {
    expect_refused_field("scale", bad);
  }
  for (const char* bad : {"0x10", " 64", "64 ", "+64", "", "6.4", "1e2", "99999999999999999999"}) {
    expect_refused_field("seq", bad);
  }
  for (const char* bad : {"0", "-3"}) {
    for (const char* size : {"batch", "heads", "kv_heads", "seq", "kv_seq", "window", "page_size"}) {
      expect_refused_field(size, bad, "must be positive");
    }
  }
  EXPECT_EQ(parse_real("scale", "0.1"), 0.1);
  EXPECT_EQ(parse_real("scale", "-2.5e-3"), -2.5e-3);
  EXPECT_EQ(parse_real("scale", ".5"), 0.5);
  EXPECT_EQ(parse_integer("seq", "007"), 7);
  EXPECT_EQ(parse_integer("top", "5", 1, 5), 5);
  EXPECT_THROW(parse_integer("top", "6", 1, 5), Error);
}

TEST(ProblemSpec, BackendNamesAgreeWithTheirList) {
  // issue 20 item 11: a list that shows auto must take auto, and one that refuses it must not show it.
  EXPECT_NO_THROW(check_backend_name("backend", "auto", true));
  EXPECT_NO_THROW(check_backend_name("backends", "flash", false));
  EXPECT_NE(backend_choices(true).find("auto"), std::string::npos);
  EXPECT_EQ(backend_choices(false).find("auto"), std::string::npos);
  try {
    check_backend_name("backends", "auto", false);
    ADD_FAILURE() << "auto taken in a list of backends to run";
  } catch (const Error& e) {
    const std::string what = e.what();
    const std::string list = what.substr(what.find("use "));
    EXPECT_EQ(list.find("auto"), std::string::npos) << "the refusal lists auto as valid: " << what;
    EXPECT_EQ(e.fields(), std::vector<std::string>{"backends"});
  }
  try {
    check_backend_name("backend", "turbo", true);
    ADD_FAILURE() << "turbo taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown backend 'turbo': use naive"), std::string::npos) << e.what();
  }
}

// issue 20 item 12: batch 1024, heads 1024, seq and kv_seq 4194304 made the
// memory estimate wrap past 2^64 ("needs about 8404992.00 GiB").
Problem huge(std::int64_t batch) {
  Problem p;
  p.batch = batch;
  p.heads = 1024;
  p.seq = p.kv_seq = std::int64_t{1} << 22;
  p.head_dim = 256;
  p.mask = MaskKind::None;
  p.device = Device::Cpu;
  return p.normalize();
}

TEST(ProblemSpec, ShapesWhoseScoresOverflowAreRefusedByField) {
  try {
    huge(1024).validate();
    FAIL() << "2^64 scores accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("batch x heads x seq x kv_seq is 1.84e+19 attention scores"), std::string::npos) << what;
    EXPECT_EQ(e.fields(), (std::vector<std::string>{"batch", "heads", "seq", "kv_seq"}));
  }
  // 2^56 scores, the most taken: every byte count below is exact.
  Problem p = huge(4);
  EXPECT_NO_THROW(p.validate());
  Problem over = huge(5);
  EXPECT_THROW(over.validate(), Error);
  const double q = 4.0 * 1024 * (1 << 22) * 256 * 2;
  EXPECT_EQ(static_cast<double>(p.q_bytes()), q);
  EXPECT_EQ(static_cast<double>(p.kv_bytes()), q);
  p.pass = Pass::Train;
  // Train: forward (Q, K, V in, O out) + LSE + backward (Q, O, dO, K, V, LSE in; dQ, dK, dV out).
  const double lse = 4.0 * 1024 * (1 << 22) * 4;
  EXPECT_EQ(static_cast<double>(p.io_bytes()), 4 * q + lse + (5 * q + lse + 3 * q));
  EXPECT_EQ(static_cast<double>(p.gradient_bytes()), 4 * q);
}

TEST(ProblemSpec, TheMemoryEstimateOfTheLargestShapeDoesNotWrap) {
  // Above the inputs, naive materialises [B, H, S, Skv] scores: 2^56 of them in
  // bf16 are 2^27 GiB, so the estimate must say at least that.
  Problem p = huge(4);
  p.dtype = DType::BF16;
  Backend* naive = find_backend("naive", Device::Cpu);
  ASSERT_NE(naive, nullptr);
  const RunResult r = run_backend(*naive, p, RunOptions{});
  ASSERT_TRUE(r.failure.has_value()) << "the run was not refused";
  std::smatch m;
  ASSERT_TRUE(std::regex_search(*r.failure, m, std::regex("needs about ([0-9.]+) GiB"))) << *r.failure;
  const double gib = std::stod(m[1]);
  EXPECT_GE(gib, std::ldexp(1.0, 27)) << *r.failure;
  EXPECT_LT(gib, std::ldexp(1.0, 34)) << *r.failure;
  EXPECT_NE(r.failure->find("use a smaller batch, heads or seq"), std::string::npos) << *r.failure;
}

TEST(ProblemSpec, EverythingThatDecidesAPlanTellsProblemsApart) {
  // The plan caches key by the whole Problem: a training call after a
  // forward of the same shape must not find the forward's plan.
  Problem fwd;
  fwd.normalize();
  std::map<Problem, int> plans{{fwd, 0}};
  Problem train = fwd;
  train.pass = Pass::Train;
  Problem det = train;
  det.deterministic = true;
  Problem paged = fwd;
  paged.kv_cache = KvCache::Paged;
  paged.page_size = 16;
  Problem scaled = fwd;
  scaled.scale = 0.5;
  for (const Problem& p : {train, det, paged, scaled}) {
    EXPECT_NE(p, fwd);
    EXPECT_TRUE(plans.emplace(p, 1).second) << p.describe();
  }
  EXPECT_FALSE(plans.emplace(fwd, 2).second);
}

}  // namespace
}  // namespace attnprof
