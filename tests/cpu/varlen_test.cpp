// Packed (variable-length) batches (issue 22 item 2) on the CPU: the problem's
// per-sequence counts against hand counts, its refusals, and the CPU flash
// forward and backward and the composites against the float64 reference on
// random length sets (empty and one-row sequences, keys longer or shorter
// than queries under the bottom-right diagonal, grouped-query heads, a
// window), plus a packed call against per-sequence dense calls, bit for bit.
#include "attnprof/varlen.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/error.h"
#include "attnprof/problem_spec.h"
#include "attnprof/reference.h"
#include "attnprof/runner.h"
#include "backends/cpu/cpu_backends.h"
#include "backends/cpu/cpu_isa.h"
#include "common/test_problem.h"
#include "common/varlen_cases.h"
#include "cpu/packed_bits.h"

namespace attnprof {
namespace {

using testing::expect_accurate;
using testing::length_sets;
using testing::Lens;

Problem packed(const Lens& q, const Lens& kv, MaskKind mask, DType dtype = DType::F32, std::int64_t heads = 2,
               std::int64_t kv_heads = 2, std::int64_t head_dim = 32, std::int64_t window = 0) {
  Problem base;
  base.heads = heads;
  base.kv_heads = kv_heads;
  base.head_dim = head_dim;
  base.dtype = dtype;
  base.mask = mask;
  base.window = window;
  Problem p = varlen_problem(base, q, kv);
  p.normalize();
  return p;
}

using testing::refusal;

TEST(VarlenProblem, CountsEachSequenceAtItsOwnLengthsByHand) {
  // Sequence 0: 3 queries, 4 keys; sequence 1: empty; sequence 2: 5 and 5.
  const Lens q{3, 0, 5}, kv{4, 2, 5};
  // Bottom-right: sequence 0's row i sees keys 0..i+1 (2 + 3 + 4), sequence 2's 0..i (15).
  const Problem br = packed(q, kv, MaskKind::CausalBottomRight, DType::BF16, 2, 2, 8);
  ASSERT_EQ(refusal(br), "");
  EXPECT_EQ(br.batch, 3);
  EXPECT_EQ(br.seq, 5);
  EXPECT_EQ(br.kv_seq, 5);
  EXPECT_EQ(br.total_q(), 8);
  EXPECT_EQ(br.total_kv(), 11);
  EXPECT_EQ(br.visible_pairs(), 9 + 0 + 15);
  EXPECT_DOUBLE_EQ(br.forward_flops(), 4.0 * 2 * 24 * 8);
  // The padded batch: 3 sequences of 5 x 5 under the same mask.
  EXPECT_DOUBLE_EQ(br.padded().forward_flops(), 4.0 * 3 * 2 * 15 * 8);
  EXPECT_DOUBLE_EQ(br.flops(), br.forward_flops());
  // Top-left causal: sequence 0's row i sees keys 0..i (1 + 2 + 3).
  EXPECT_EQ(packed(q, kv, MaskKind::Causal).visible_pairs(), 6 + 15);
  // A window of 2 at the bottom-right diagonal: 2 + 2 + 2, then 1 + 2 + 2 + 2 + 2.
  EXPECT_EQ(packed(q, kv, MaskKind::SlidingWindow, DType::F32, 2, 2, 32, 2).visible_pairs(), 6 + 9);
  EXPECT_EQ(packed(q, kv, MaskKind::None).visible_pairs(), 12 + 0 + 25);
  // Keys no query reaches are not read: sequence 0 under top-left causal reads keys 0..2.
  EXPECT_EQ(packed(q, kv, MaskKind::Causal).kv_rows_read(), 3 + 0 + 5);
  EXPECT_EQ(packed(q, kv, MaskKind::None).kv_rows_read(), 11);
  // Queries without keys are fully masked.
  EXPECT_EQ(packed({2, 1}, {0, 1}, MaskKind::Causal).fully_masked_rows(), 2);
  // Bytes of the packed tensors, not the padded ones.
  EXPECT_EQ(br.q_bytes(), static_cast<std::size_t>(2 * 8 * 8 * 2));
  EXPECT_EQ(br.kv_bytes(), static_cast<std::size_t>(2 * 11 * 8 * 2));
  EXPECT_EQ(br.lse_bytes(), static_cast<std::size_t>(2 * 8 * 4));
  EXPECT_EQ(br.q_dims(), (Dims{1, 2, 8, 8}));
  EXPECT_EQ(br.kv_dims(), (Dims{1, 2, 11, 8}));
  EXPECT_EQ(br.cu_seqlens_q(), (Lens{0, 3, 3, 8}));
  EXPECT_EQ(br.cu_seqlens_k(), (Lens{0, 4, 6, 11}));
  // The forward's least traffic: Q and O, and the K and V rows some query sees.
  const std::size_t kv_read = static_cast<std::size_t>(2 * (4 + 0 + 5) * 8 * 2);
  EXPECT_EQ(br.io_bytes(), 2 * br.q_bytes() + 2 * kv_read);
  // One sequence alone is a dense problem of its own lengths.
  const Problem s0 = br.sequence(0);
  EXPECT_FALSE(s0.varlen());
  EXPECT_EQ(s0.batch, 1);
  EXPECT_EQ(s0.seq, 3);
  EXPECT_EQ(s0.kv_seq, 4);
  EXPECT_EQ(s0.visible_pairs(), 9);
}

TEST(VarlenProblem, DenseCountsAreUnchanged) {
  Problem p = testing::to_problem(testing::Shape{.batch = 2, .heads = 4, .seq = 16, .kv_seq = 24, .head_dim = 8},
                                  DType::BF16, MaskKind::CausalBottomRight);
  EXPECT_FALSE(p.varlen());
  EXPECT_EQ(p.total_q(), 32);
  EXPECT_EQ(p.q_dims(), (Dims{2, 4, 16, 8}));
  EXPECT_EQ(p.padded(), p);
  EXPECT_DOUBLE_EQ(p.forward_flops(), 4.0 * 2 * 4 * p.visible_pairs() * 8);
}

TEST(VarlenProblem, DescribedFiledAndKeyedByItsLengths) {
  const Problem a = packed({3, 7}, {}, MaskKind::Causal);
  const Problem b = packed({7, 3}, {}, MaskKind::Causal);
  EXPECT_NE(a.describe().find("packed batch of 2 sequences, seq lens 3,7"), std::string::npos) << a.describe();
  EXPECT_NE(a.describe().find("of the padded batch's FLOPs"), std::string::npos) << a.describe();
  EXPECT_NE(a.file_stem().find("_varlen10_"), std::string::npos) << a.file_stem();
  EXPECT_NE(a.file_stem(), b.file_stem()) << "two length sets of one count and maximum share files";
  // The plan caches' key: the lengths decide the plan.
  EXPECT_NE(a, b);
  std::map<Problem, int> plans{{a, 1}, {b, 2}};
  EXPECT_EQ(plans.size(), 2u);
  EXPECT_EQ(plans.at(packed({3, 7}, {}, MaskKind::Causal)), 1);
  const Problem kv = packed({3, 7}, {5, 9}, MaskKind::CausalBottomRight);
  EXPECT_NE(kv.describe().find("kv lens 5,9"), std::string::npos) << kv.describe();
}

TEST(VarlenProblem, RefusesInOneLineNamingTheField) {
  Problem count = packed({3, 4}, {3, 4}, MaskKind::Causal);
  count.batch = 3;
  EXPECT_NE(refusal(count).find("seq_lens has 2 lengths but batch is 3"), std::string::npos) << refusal(count);
  Problem kv_count = packed({3, 4}, {3, 4}, MaskKind::Causal);
  kv_count.kv_seq_lens = {3};
  EXPECT_NE(refusal(kv_count).find("kv_seq_lens has 1 lengths"), std::string::npos) << refusal(kv_count);
  Problem max_small = packed({3, 9}, {}, MaskKind::Causal);
  max_small.seq = 8;
  EXPECT_NE(refusal(max_small).find("seq (the maximum length) is 8, smaller than seq_lens[1] = 9"), std::string::npos)
      << refusal(max_small);
  Problem negative = packed({3, 4}, {}, MaskKind::Causal);
  negative.seq_lens[0] = -1;
  EXPECT_NE(refusal(negative).find("seq_lens[0] is -1"), std::string::npos) << refusal(negative);
  // All 0 leaves seq, their longest, 0 too: the lengths are named, not seq (issue 49 item 14).
  Problem empty = packed({0, 0}, {2, 2}, MaskKind::None);
  EXPECT_NE(refusal(empty).find("seq_lens are all 0"), std::string::npos) << refusal(empty);
  empty.seq = 4;  // a max_seqlen given with no queries
  EXPECT_NE(refusal(empty).find("seq_lens are all 0"), std::string::npos) << refusal(empty);
  EXPECT_NE(refusal(packed({2, 2}, {}, MaskKind::Boolean)).find("structural masks only"), std::string::npos);
  Problem paged = packed({2, 2}, {}, MaskKind::None);
  paged.kv_cache = KvCache::Paged;
  paged.page_size = 16;
  EXPECT_NE(refusal(paged).find("contiguous"), std::string::npos) << refusal(paged);
  Problem kv_only;
  kv_only.kv_seq_lens = {4};
  EXPECT_NE(refusal(kv_only.normalize()).find("kv_seq_lens needs seq_lens"), std::string::npos);
}

// lengths_from_cu_seqlens' one line.
std::string cu_refusal(const std::vector<std::int32_t>& cu, std::int64_t total) {
  try {
    lengths_from_cu_seqlens(cu.data(), cu.size(), total, "cu_seqlens_q");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    return e.what();
  }
  return {};
}

TEST(VarlenProblem, CumulativeLengthsAreCheckedEntryByEntry) {
  const std::vector<std::int32_t> cu{0, 3, 3, 10};
  EXPECT_EQ(lengths_from_cu_seqlens(cu.data(), cu.size(), 10, "cu_seqlens_q"), (Lens{3, 0, 7}));
  EXPECT_NE(cu_refusal({1, 3, 10}, 10).find("cu_seqlens_q[0] is 1: cumulative lengths start at 0"), std::string::npos);
  EXPECT_NE(cu_refusal({0, 5, 3, 10}, 10).find("decreases at entry 2 (5 then 3)"), std::string::npos);
  EXPECT_NE(cu_refusal({0, 5, 12}, 10).find("cu_seqlens_q[2] = 12 overruns the packed tensor's 10 rows"),
            std::string::npos);
  EXPECT_NE(cu_refusal({0, 5, 8}, 10).find("ends at 8 but the packed tensor has 10 rows"), std::string::npos);
  EXPECT_NE(cu_refusal({0}, 10).find("needs batch + 1 >= 2"), std::string::npos);
}

TEST(VarlenProblem, ParsedFromTextWithTheBatchItsCount) {
  Problem p;
  p.batch = 0;
  p.heads = 0;
  set_problem_field(p, "seq_lens", "5,0,9");
  set_problem_field(p, "kv_seq_lens", "6,1,9");
  fill_device_defaults(p).normalize();
  EXPECT_EQ(p.batch, 3);
  EXPECT_EQ(p.seq, 9);
  EXPECT_EQ(p.kv_seq, 9);
  EXPECT_EQ(refusal(p), "");
  for (const char* bad : {"", "1,,2", "a", "1,2,", "1.5"}) {
    Problem q;
    EXPECT_THROW(set_problem_field(q, "seq_lens", bad), Error) << bad;
  }
  // A whole number out of range is read, and refused once, by validate(), naming its entry.
  Problem negative;
  negative.batch = negative.heads = 0;
  set_problem_field(negative, "seq_lens", "3,-1");
  fill_device_defaults(negative).normalize();
  EXPECT_NE(refusal(negative).find("seq_lens[1] is -1"), std::string::npos) << refusal(negative);
}

using Config = testing::PackedConfig;

const Config kConfigs[] = {
    {"none_f32", MaskKind::None, 2, 2, 32, 0, DType::F32},
    {"causal_gqa_bf16", MaskKind::Causal, 4, 2, 64, 0, DType::BF16},
    {"bottom_right_mqa_f32", MaskKind::CausalBottomRight, 4, 1, 40, 0, DType::F32},
    {"window_gqa_f16", MaskKind::SlidingWindow, 4, 2, 32, 24, DType::F16},
};

using testing::nan_tensor;

class VarlenBackends : public ::testing::TestWithParam<Config> {};

// Every CPU backend, forward and one training step, on every length set.
TEST_P(VarlenBackends, MatchFloat64ForwardAndBackward) {
  const Config& c = GetParam();
  for (const auto& [q, kv] : length_sets()) {
    for (const char* name : {"flash", "naive", "naive_inplace", "math"}) {
      Problem p = packed(q, kv, c.mask, c.dtype, c.heads, c.kv_heads, c.head_dim, c.window);
      p.pass = Pass::Train;
      ASSERT_EQ(refusal(p), "");
      Backend* b = find_backend(name, Device::Cpu);
      ASSERT_NE(b, nullptr);
      const Eligibility el = eligibility_of(*b, p);
      ASSERT_TRUE(el.eligible) << name << ": " << el.reason;
      EXPECT_NE(el.reason.find("packed"), std::string::npos) << el.reason;
      std::string what = std::string(name) + " " + p.describe();
      const Inputs in = make_inputs(p, 3, cpu_allocator());
      const Tensor dout = make_dout(p, 3, cpu_allocator());
      Tensor out = nan_tensor(p.q_dims(), p.dtype);
      Gradients g{nan_tensor(p.q_dims(), p.dtype), nan_tensor(p.kv_dims(), p.dtype), nan_tensor(p.kv_dims(), p.dtype)};
      RunContext ctx{.allocator = cpu_allocator(), .threads = 2};
      Saved saved;
      b->forward_train(p, in, out, saved, ctx);
      b->backward(p, in, out, dout, saved, g, ctx);
      // naive's NaN on fully masked rows is documented (every key masked),
      // and through P^T dO it reaches every dV row of that sequence.
      const bool nan_ok = b->traits().nan_on_fully_masked;
      const bool dv_nan = nan_ok && p.fully_masked_rows() > 0;
      expect_accurate(p, check_against_reference(p, in, out, sample_rows(p, 1 << 20)), what + " out", nan_ok);
      const GradientErrors e =
          check_gradients_against_reference(p, in, dout, g, sample_rows(p, 1 << 20), sample_kv_rows(p, 1 << 20));
      expect_accurate(p, e.dq, what + " dQ", nan_ok);
      expect_accurate(p, e.dk, what + " dK");
      if (!dv_nan) expect_accurate(p, e.dv, what + " dV", nan_ok);
      // The inference forward writes what the training forward does.
      Tensor again = nan_tensor(p.q_dims(), p.dtype);
      Problem fwd = p;
      fwd.pass = Pass::Forward;
      b->forward(fwd, in, again, ctx);
      expect_accurate(fwd, check_against_reference(fwd, in, again, sample_rows(fwd, 1 << 20)), what + " forward",
                      nan_ok);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, VarlenBackends, ::testing::ValuesIn(kConfigs),
                         [](const auto& info) { return std::string(info.param.name); });

// The reference itself must see a wrong answer: a packed output with one
// sequence's rows swapped for another's fails the check.
TEST(VarlenReference, CatchesRowsOfTheWrongSequence) {
  Problem p = packed({40, 40}, {40, 40}, MaskKind::Causal);
  const Inputs in = make_inputs(p, 5, cpu_allocator());
  Tensor out = Tensor::empty(p.q_dims(), p.dtype, cpu_allocator());
  RunContext ctx{.allocator = cpu_allocator(), .threads = 1};
  Backend& flash = *find_backend("flash", Device::Cpu);
  flash.forward(p, in, out, ctx);
  ASSERT_LT(check_against_reference(p, in, out, sample_rows(p, 1 << 20)).rel, 1e-5);
  // Sequence 1 computed against sequence 0's keys: what ignoring the offsets gives.
  Tensor o1 = sequence_q_rows(p, out, 1);
  Inputs one = sequence_inputs(p, in, 1);
  one.k = sequence_kv_rows(p, in.k, 0);
  one.v = sequence_kv_rows(p, in.v, 0);
  flash.forward(p.sequence(1), one, o1, ctx);
  EXPECT_GT(check_against_reference(p, in, out, sample_rows(p, 1 << 20)).rel, 1e-2);
}

// Flash and math, with sequences of one to three queries (which a dense call
// decodes: flash_tiles.h's decodes()) beside longer ones, at the level the
// dispatcher picks (tests/CMakeLists.txt runs the suite at every level).
TEST(VarlenBackends, PackedCallIsPerSequenceDenseCallsBitForBit) {
  const Lens q{70, 1, 0, 130, 3, 2}, kv{90, 1, 5, 128, 77, 300};
  for (const char* name : {"flash", "math"}) {
    Problem p = packed(q, kv, MaskKind::CausalBottomRight, DType::BF16, 4, 2, 64);
    p.pass = Pass::Train;
    if (std::string(name) == "flash") {
      const std::string why = find_backend(name, Device::Cpu)->eligibility(p).reason;
      EXPECT_NE(why.find("(those of at most 4 queries decoded"), std::string::npos) << why;
    }
    testing::expect_packed_is_dense_calls(*find_backend(name, Device::Cpu), p);
  }
  // Decoding sequences over several key ranges (kDecodeChunkKeys), merged in
  // key order. Deterministic: their dQ sums many key blocks, whose adds
  // otherwise follow thread timing (flash_backward.cpp).
  Problem ranges = packed({2, 1, 4}, {1300, 40, 700}, MaskKind::CausalBottomRight, DType::BF16, 4, 2, 64);
  ranges.pass = Pass::Train;
  ranges.deterministic = true;
  testing::expect_packed_is_dense_calls(*find_backend("flash", Device::Cpu), ranges);
}

// Flash in FP32 under a window, beside a sequence long enough that the packed
// call's items would take twice the query rows (forward_rows_fp32): a
// shorter sequence's rows still walk the key blocks its dense call walks.
TEST(VarlenBackends, PackedWindowCallIsPerSequenceDenseCallsBitForBit) {
  Problem p = packed({150, 4100, 1}, {150, 4100, 40}, MaskKind::SlidingWindow, DType::F32, 2, 1, 64, 40);
  p.pass = Pass::Train;
  testing::expect_packed_is_dense_calls(*find_backend("flash", Device::Cpu), p);
}

// Fully masked rows (queries of a sequence with no keys) are zeros in flash
// and math, never NaN; their LSE is -inf, and keys of a sequence with no
// queries get zero gradients.
TEST(VarlenBackends, EmptySequencesGiveZerosNotNan) {
  Problem p = packed({4, 0, 3}, {0, 6, 3}, MaskKind::None);
  p.pass = Pass::Train;
  for (const char* name : {"flash", "math"}) {
    Backend& b = *find_backend(name, Device::Cpu);
    const Inputs in = make_inputs(p, 2, cpu_allocator());
    const Tensor dout = make_dout(p, 2, cpu_allocator());
    RunContext ctx{.allocator = cpu_allocator(), .threads = 1};
    Tensor out = nan_tensor(p.q_dims(), p.dtype);
    Gradients g{nan_tensor(p.q_dims(), p.dtype), nan_tensor(p.kv_dims(), p.dtype), nan_tensor(p.kv_dims(), p.dtype)};
    Saved saved;
    b.forward_train(p, in, out, saved, ctx);
    b.backward(p, in, out, dout, saved, g, ctx);
    for (std::int64_t i = 0; i < 4; ++i)
      for (std::int64_t d = 0; d < p.head_dim; ++d) {
        EXPECT_EQ(out.get(0, 1, i, d), 0.0f) << name;
        EXPECT_EQ(g.dq.get(0, 1, i, d), 0.0f) << name;
      }
    for (std::int64_t j = 0; j < 6; ++j)  // sequence 1's keys, rows 0..5 of K
      for (std::int64_t d = 0; d < p.head_dim; ++d) {
        EXPECT_EQ(g.dk.get(0, 0, j, d), 0.0f) << name;
        EXPECT_EQ(g.dv.get(0, 0, j, d), 0.0f) << name;
      }
    if (std::string(name) == "flash") {
      ASSERT_EQ(saved.lse.sizes(), (Dims{1, p.heads, 7, 1}));
      EXPECT_EQ(saved.lse.get(0, 0, 0, 0), -std::numeric_limits<float>::infinity());
      EXPECT_TRUE(std::isfinite(saved.lse.get(0, 0, 4, 0)));
    }
  }
}

// Through the runner, as compare runs them: checked against float64, and the
// composites' expectation is their ops once per sequence.
TEST(VarlenRunner, EveryCpuBackendRunsAndPasses) {
  Problem p = packed({50, 1, 100}, {60, 3, 100}, MaskKind::CausalBottomRight, DType::BF16, 2, 1, 64);
  p.pass = Pass::Backward;
  RunOptions o;
  o.schedule = {.wait = 0, .warmup = 0, .active = 1, .repeat = 1};
  o.threads = 2;
  for (const RunResult& r : run_backends(p, o)) {
    const bool cpu = r.backend != "efficient" && r.backend != "cudnn";
    EXPECT_EQ(r.eligibility.eligible, cpu) << r.backend << ": " << r.eligibility.reason;
    if (!cpu) continue;
    ASSERT_FALSE(r.failure) << r.backend << ": " << *r.failure;
    ASSERT_TRUE(r.acceptance) << r.backend;
    EXPECT_TRUE(r.acceptance->pass) << r.backend << ": " << r.acceptance->why;
  }
  Problem fwd = p;
  fwd.pass = Pass::Forward;
  const Expectation dense = find_backend("naive", Device::Cpu)->expectation(fwd.sequence(0));
  const Expectation loop = find_backend("naive", Device::Cpu)->expectation(fwd);
  EXPECT_EQ(loop.cpu_ops.size(), 3 * dense.cpu_ops.size());
  EXPECT_EQ(loop.copies, 3 * dense.copies);
}

// Backends without packed batches are refused by name, in one line.
class Dense final : public Backend {
 public:
  std::string_view name() const override { return "dense_only"; }
  Device device() const override { return Device::Cuda; }
  Eligibility eligibility(const Problem&) const override { return {true, "fine"}; }
  std::size_t workspace_bytes(const Problem&) const override { return 0; }
  Expectation expectation(const Problem&) const override { return {}; }
  void forward(const Problem&, const Inputs&, Tensor&, RunContext&) override {}
};

// Every CPU backend takes packed batches, soft caps and fp8 (their traits);
// the refusals of those that do not (no_varlen) say why and name no taker:
// explain() appends those.
TEST(VarlenEligibility, EveryCpuBackendTakesItAndRefusalsNameNoTaker) {
  std::vector<std::string> varlen, softcap, fp8;
  for (const std::string_view name : backend_names()) {
    const Backend* b = find_backend(name, Device::Cpu);
    if (b == nullptr) continue;
    if (b->traits().varlen) varlen.emplace_back(name);
    if (b->traits().softcap) softcap.emplace_back(name);
    if (b->traits().fp8) fp8.emplace_back(name);
  }
  const std::vector<std::string> named = {"flash", "math", "naive", "naive_inplace"};  // sorted
  for (auto* list : {&varlen, &softcap, &fp8}) std::sort(list->begin(), list->end());
  EXPECT_EQ(varlen, named);
  EXPECT_EQ(softcap, named);
  EXPECT_EQ(fp8, named) << "no_fp8 names the same list";
  EXPECT_EQ(no_varlen("x", Device::Cpu).reason, "packed batches (seq_lens, varlen) are not built for x on cpu yet");
}

TEST(VarlenEligibility, BackendsWithoutItAreRefusedByName) {
  Dense d;
  const Eligibility e = eligibility_of(d, packed({3, 4}, {}, MaskKind::Causal));
  EXPECT_FALSE(e.eligible);
  EXPECT_EQ(e.reason, "packed batches (seq_lens, varlen) are not built for dense_only on cuda yet");
  EXPECT_TRUE(eligibility_of(d, packed({3, 4}, {}, MaskKind::Causal).sequence(1)).eligible);
}

// A packed batch whose lengths only a GPU's kernels read (issue 56 item 2):
// the problem follows from the shapes and the caller's maxima; validation
// names the field; no host backend takes it; host code asking for a
// sequence's lengths is an internal error, never a silent guess.
Problem lengths_on_device(std::int64_t batch, std::int64_t total_q, std::int64_t total_kv, std::int64_t max_q,
                          std::int64_t max_kv) {
  Problem p;
  p.device = Device::Cuda;
  p.heads = 4;
  p.kv_heads = 2;
  p.head_dim = 64;
  p.mask = MaskKind::Causal;
  p.lengths_on_device = true;
  p.batch = batch;
  p.packed_total_q = total_q;
  p.packed_total_kv = total_kv;
  p.seq = max_q;
  p.kv_seq = max_kv;
  return p.normalize();
}

TEST(VarlenLengthsOnDevice, ShapesAndBoundsFollowFromTheCallAlone) {
  const Problem p = lengths_on_device(3, 100, 120, 60, 80);
  EXPECT_NO_THROW(p.validate());
  EXPECT_TRUE(p.varlen());
  EXPECT_EQ(p.total_q(), 100);
  EXPECT_EQ(p.total_kv(), 120);
  EXPECT_EQ(p.q_dims(), (Dims{1, 4, 100, 64}));
  EXPECT_EQ(p.kv_dims(), (Dims{1, 2, 120, 64}));
  EXPECT_EQ(p.seq_len(2), 60) << "a sequence's bound, the caller's max_seqlen_q";
  EXPECT_NE(p.describe().find("packed batch of 3 sequences, lengths on the device (100 query rows, 120 key rows)"),
            std::string::npos)
      << p.describe();
  // Upper bounds: the padded batch's counts.
  EXPECT_EQ(p.forward_flops(), p.padded().forward_flops());
  EXPECT_THROW((void)p.sequence(0), Error);
  EXPECT_THROW((void)p.cu_seqlens_q(), Error);
  Problem q = p;
  q.packed_total_q = 101;
  EXPECT_NE(p, q) << "the totals are part of the plan's key";
}

TEST(VarlenLengthsOnDevice, RefusesInOneLineNamingTheField) {
  EXPECT_EQ(refusal(lengths_on_device(0, 10, 10, 5, 5)), "batch must be positive, got 0");
  EXPECT_EQ(refusal(lengths_on_device(2, 0, 10, 1, 5)), "the packed batch has no query rows");
  EXPECT_EQ(refusal(lengths_on_device(2, 10, 10, 11, 5)),
            "max_seqlen_q is 11: from 1 to the packed batch's query rows (10)");
  EXPECT_EQ(refusal(lengths_on_device(2, 10, 10, 5, 0)),
            "max_seqlen_k is 0: from 1 to the packed batch's key rows (10)");
  Problem both = lengths_on_device(2, 10, 10, 5, 5);
  both.seq_lens = {5, 5};
  EXPECT_EQ(refusal(both),
            "a packed batch has its lengths on the host (seq_lens) or on the device (cu_seqlens), not both");
}

TEST(VarlenLengthsOnDevice, NoBackendThatReadsLengthsOnTheHostTakesIt) {
  Problem p = lengths_on_device(2, 10, 10, 5, 5);
  p.device = Device::Cpu;
  for (const std::string_view name : backend_names()) {
    const Backend* b = find_backend(name, Device::Cpu);
    if (b == nullptr || !b->traits().varlen) continue;
    EXPECT_FALSE(b->traits().device_lengths) << name;
    const Eligibility e = eligibility_of(*b, p);
    EXPECT_FALSE(e.eligible) << name;
    EXPECT_EQ(e.reason, std::string(name) +
                            " on cpu reads a packed batch's lengths on the host (the call reads "
                            "cu_seqlens first)");
  }
}

}  // namespace
}  // namespace attnprof
