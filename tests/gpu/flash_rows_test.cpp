// flash's fused kernels (sm90 and sm80, forward and backward) on a dense
// batch's per-sequence rows (Inputs::q_rows, kv_rows: FlashAttention's
// unpadding without its copies). Each run is checked against the float64
// reference of the equivalent Boolean mask: sequence b's queries i and keys j
// inside its rows, the structural band in its own coordinates (i - q0,
// j - k0); rows outside a sequence see nothing, so the reference gives them
// zeros, as flash must write them (its outputs and gradients are NaN-poisoned
// before the call). Right, left and both-side padding, decode, every
// structural mask, soft caps, grouped queries, head dims 32 (sm80) to 256,
// empty sequences and rows out of range (clamped on the device).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/check_inputs.h"
#include "attnprof/error.h"
#include "attnprof/reference.h"
#include "attnprof/runner.h"
#include "backends/cuda/cuda_backends.h"
#include "backends/cuda/launch/fused_kernels.h"
#include "backends/cuda/runtime.h"
#include "common/varlen_cases.h"
#include "core/mask_geometry.h"
#include "cuda_forward.h"
#include "gpu_test.h"

namespace attnprof {
namespace {

using testing::expect_accurate;
using Spans = std::vector<std::pair<int, int>>;  // (begin, end) a sequence; empty: not given

bool sm90_flash() { return testing::has_gpu() && cuda::flash_sm90_runs_here(); }

// The rows as the kernels take them: int32 [1, 1, B, 2] (on the host; run_once uploads them).
Tensor rows_tensor(const Spans& s) {
  if (s.empty()) return {};
  const auto B = static_cast<std::int64_t>(s.size());
  Tensor t = Tensor::empty({1, 1, B, 2}, DType::I32, cpu_allocator());
  for (std::int64_t b = 0; b < B; ++b) {
    t.data_as<std::int32_t>()[2 * b] = s[static_cast<std::size_t>(b)].first;
    t.data_as<std::int32_t>()[2 * b + 1] = s[static_cast<std::size_t>(b)].second;
  }
  return t;
}

// A span as the kernels clamp it: 0 <= begin <= end <= rows.
std::pair<std::int64_t, std::int64_t> clamped(const Spans& s, std::size_t b, std::int64_t rows) {
  if (s.empty()) return {0, rows};
  const std::int64_t begin = std::clamp<std::int64_t>(s[b].first, 0, rows);
  return {begin, std::clamp<std::int64_t>(s[b].second, begin, rows)};
}

// The Boolean mask [B, H, S, Skv] that says what the rows and p's structural mask say.
Tensor equivalent_mask(const Problem& p, const Spans& q, const Spans& kv) {
  Tensor m = Tensor::empty({p.batch, 1, p.seq, p.kv_seq}, DType::Bool, cpu_allocator());
  auto* at = m.data_as<std::uint8_t>();
  for (std::int64_t b = 0; b < p.batch; ++b) {
    const auto [q0, q1] = clamped(q, static_cast<std::size_t>(b), p.seq);
    const auto [k0, k1] = clamped(kv, static_cast<std::size_t>(b), p.kv_seq);
    const geometry::Band<std::int64_t> band = geometry::band_of<std::int64_t>(p.mask, p.window, q1 - q0, k1 - k0);
    for (std::int64_t i = 0; i < p.seq; ++i) {
      for (std::int64_t j = 0; j < p.kv_seq; ++j) {
        const bool inside = i >= q0 && i < q1 && j >= k0 && j < k1;
        at[(b * p.seq + i) * p.kv_seq + j] = inside && geometry::visible(band, i - q0, j - k0);
      }
    }
  }
  return m.expand({p.batch, p.heads, p.seq, p.kv_seq});
}

struct Case {
  std::string name;
  MaskKind mask;
  std::int64_t seq, kv_seq, heads, kv_heads, head_dim;
  Spans q, kv;
  std::int64_t window = 0;
  double softcap = 0;
  DType dtype = DType::BF16;
  bool deterministic = false;
};

Problem problem_of(const Case& c, Pass pass) {
  Problem p{.batch = static_cast<std::int64_t>(std::max(c.q.size(), c.kv.size())),
            .heads = c.heads,
            .kv_heads = c.kv_heads,
            .seq = c.seq,
            .kv_seq = c.kv_seq,
            .head_dim = c.head_dim,
            .dtype = c.dtype,
            .device = Device::Cuda,
            .mask = c.mask,
            .window = c.window};
  p.softcap = c.softcap;
  p.deterministic = c.deterministic;
  p.pass = pass;
  p.normalize();
  p.validate();
  return p;
}

// flash on `c` with its rows, against float64 on the equivalent Boolean mask:
// O, and after a training step dQ, dK and dV.
void expect_rows_match_reference(const Case& c, Pass pass, std::uint64_t seed) {
  const Problem p = problem_of(c, pass);
  const std::string what = c.name + " " + p.describe();
  Inputs in = make_inputs(p, seed, cpu_allocator());
  in.q_rows = rows_tensor(c.q);
  in.kv_rows = rows_tensor(c.kv);
  const Tensor dout = make_dout(p, seed, cpu_allocator());
  const testing::CudaRun r = testing::run_once(*find_backend("flash", Device::Cuda), p, in, dout);

  Problem ref = p;
  ref.mask = MaskKind::Boolean;
  ref.window = 0;
  Inputs ref_in = make_inputs(p, seed, cpu_allocator());
  ref_in.mask = equivalent_mask(p, c.q, c.kv);
  expect_accurate(ref, check_against_reference(ref, ref_in, r.out, sample_rows(ref, 1 << 20)), what + " out");
  if (pass == Pass::Forward) return;
  const GradientErrors e = check_gradients_against_reference(ref, ref_in, dout, r.grads, sample_rows(ref, 1 << 20),
                                                             sample_kv_rows(ref, 1 << 20));
  expect_accurate(ref, e.dq, what + " dQ");
  expect_accurate(ref, e.dk, what + " dK");
  expect_accurate(ref, e.dv, what + " dV");
}

// Batches of 3 (4 where a case needs an empty sequence) over tensors of 200
// queries and 230 keys: across the kernels' tile edges (64, 128) and short.
const Spans kRight = {{0, 200}, {0, 77}, {0, 129}};
const Spans kRightKv = {{0, 230}, {0, 90}, {0, 129}};
const Spans kLeft = {{0, 200}, {123, 200}, {71, 200}};
const Spans kLeftKv = {{0, 230}, {140, 230}, {101, 230}};
const Spans kBoth = {{5, 190}, {64, 128}, {1, 2}};
const Spans kBothKv = {{7, 229}, {60, 200}, {100, 101}};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const std::int64_t d : {32, 64, 128, 256}) {  // 32: the sm80 kernels
    const std::string dim = "_d" + std::to_string(d);
    const auto add = [&](const std::string& name, MaskKind mask, std::int64_t heads, std::int64_t kv_heads, Spans q,
                         Spans kv, std::int64_t window = 0) {
      out.push_back({.name = name + dim,
                     .mask = mask,
                     .seq = 200,
                     .kv_seq = 230,
                     .heads = heads,
                     .kv_heads = kv_heads,
                     .head_dim = d,
                     .q = std::move(q),
                     .kv = std::move(kv),
                     .window = window});
    };
    add("right_causal", MaskKind::Causal, 4, 2, kRight, kRightKv);
    add("left_bottom_right_gqa4", MaskKind::CausalBottomRight, 8, 2, kLeft, kLeftKv);
    add("both_window_mqa", MaskKind::SlidingWindow, 4, 1, kBoth, kBothKv, 48);
    add("keys_only_none", MaskKind::None, 4, 4, {}, kLeftKv);
    add("queries_only_bottom_right", MaskKind::CausalBottomRight, 4, 2, kBoth, {});
    // An empty sequence (no query rows; then no keys), and values out of
    // range: clamped on the device to (0, 200), (0, 230) and empty spans.
    add("empty_and_out_of_range_causal", MaskKind::Causal, 4, 2, {{0, 200}, {50, 50}, {-7, 9000}, {150, 20}},
        {{0, 230}, {3, 100}, {-1, 1 << 30}, {0, 0}});
  }
  return out;
}

class FlashRows : public ::testing::TestWithParam<Case> {};

TEST_P(FlashRows, MatchesTheEquivalentBooleanMaskForwardAndBackward) {
  REQUIRE_GPU();
  const Case& c = GetParam();
  if (c.head_dim != 32 && !sm90_flash()) GTEST_SKIP() << "flash at this head dim needs its sm90 kernels";
  expect_rows_match_reference(c, Pass::Forward, 500 + c.head_dim);
  expect_rows_match_reference(c, Pass::Train, 600 + c.head_dim);
}

INSTANTIATE_TEST_SUITE_P(All, FlashRows, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

// Decode (one query, left-padded keys), fp16, the deterministic backward
// (sm90's ordered dQ, sm80's dQ kernel) and, on sm90, soft caps (under a
// window too): each against float64.
TEST(FlashRowsMore, DecodeFp16DeterministicAndSoftcap) {
  REQUIRE_GPU();
  const bool sm90 = sm90_flash();
  std::uint64_t seed = 700;
  for (const std::int64_t d : {32, 64, 128, 256}) {
    if (d != 32 && !sm90) continue;
    const Spans decode_kv = {{0, 230}, {200, 230}, {17, 230}, {229, 230}};
    for (const MaskKind mask : {MaskKind::None, MaskKind::CausalBottomRight}) {
      expect_rows_match_reference({.name = "decode",
                                   .mask = mask,
                                   .seq = 1,
                                   .kv_seq = 230,
                                   .heads = 8,
                                   .kv_heads = 2,
                                   .head_dim = d,
                                   .kv = decode_kv},
                                  Pass::Forward, ++seed);
    }
    expect_rows_match_reference({.name = "fp16",
                                 .mask = MaskKind::Causal,
                                 .seq = 200,
                                 .kv_seq = 230,
                                 .heads = 4,
                                 .kv_heads = 2,
                                 .head_dim = d,
                                 .q = kLeft,
                                 .kv = kLeftKv,
                                 .dtype = DType::F16},
                                Pass::Train, ++seed);
    expect_rows_match_reference({.name = "deterministic",
                                 .mask = MaskKind::CausalBottomRight,
                                 .seq = 200,
                                 .kv_seq = 230,
                                 .heads = 4,
                                 .kv_heads = 1,
                                 .head_dim = d,
                                 .q = kBoth,
                                 .kv = kBothKv,
                                 .deterministic = true},
                                Pass::Train, ++seed);
    if (d == 32) continue;  // soft caps: the sm90 kernels only
    for (const MaskKind mask : {MaskKind::None, MaskKind::SlidingWindow}) {
      expect_rows_match_reference({.name = "softcap",
                                   .mask = mask,
                                   .seq = 200,
                                   .kv_seq = 230,
                                   .heads = 4,
                                   .kv_heads = 2,
                                   .head_dim = d,
                                   .q = kRight,
                                   .kv = kLeftKv,
                                   .window = mask == MaskKind::SlidingWindow ? 64 : 0,
                                   .softcap = 30},
                                  Pass::Train, ++seed);
    }
  }
}

// The saved log-sum-exp of rows outside a sequence's query rows is +inf (as
// a row that sees no key: the backward then takes P = 0), and the rows inside
// are finite.
TEST(FlashRowsMore, LseOutsideTheRowsIsInfinite) {
  REQUIRE_GPU();
  for (const std::int64_t d : {32, 128}) {
    if (d != 32 && !sm90_flash()) continue;
    const Case c{.name = "lse",
                 .mask = MaskKind::Causal,
                 .seq = 200,
                 .kv_seq = 200,
                 .heads = 2,
                 .kv_heads = 2,
                 .head_dim = d,
                 .q = kBoth,
                 .kv = kBoth};
    const Problem p = problem_of(c, Pass::Train);
    Inputs host = make_inputs(p, 9, cpu_allocator());
    host.q_rows = rows_tensor(c.q);
    host.kv_rows = rows_tensor(c.kv);
    DeviceRuntime& rt = cuda::runtime();
    const Inputs in = rt.upload(host);
    RunContext ctx{rt.allocator(), rt.stream(), 0};
    Tensor out = Tensor::empty(p.q_dims(), p.dtype, rt.allocator());
    Saved saved;
    find_backend("flash", Device::Cuda)->forward_train(p, in, out, saved, ctx);
    rt.synchronize();
    const Tensor lse = rt.download(saved.lse);
    for (std::int64_t b = 0; b < p.batch; ++b) {
      const auto [q0, q1] = clamped(c.q, static_cast<std::size_t>(b), p.seq);
      for (std::int64_t h = 0; h < p.heads; ++h) {
        for (std::int64_t i = 0; i < p.seq; ++i) {
          const float v = lse.get(b, h, i, 0);
          if (i < q0 || i >= q1) {
            EXPECT_TRUE(std::isinf(v) && v > 0) << "d " << d << " sequence " << b << " row " << i << ": " << v;
          } else {
            EXPECT_TRUE(std::isfinite(v)) << "d " << d << " sequence " << b << " row " << i << ": " << v;
          }
        }
      }
    }
  }
}

// What flash does not take with rows, refused in one line naming them: a
// packed batch beside them, rows of the wrong dtype or shape; efficient takes
// none; a Boolean mask tensor is never read back on CUDA (rows instead).
TEST(FlashRowsMore, WhatItDoesNotTakeIsRefusedInOneLine) {
  REQUIRE_GPU();
  const Case c{.name = "refused",
               .mask = MaskKind::Causal,
               .seq = 64,
               .kv_seq = 64,
               .heads = 2,
               .kv_heads = 2,
               .head_dim = 32,
               .q = {{0, 64}, {3, 64}},
               .kv = {{0, 64}, {3, 64}}};
  const Problem p = problem_of(c, Pass::Forward);
  const auto expect_refused = [&](Backend& b, const Problem& problem, const Inputs& in, const std::string& named) {
    try {
      testing::run_once(b, problem, in, {});
      ADD_FAILURE() << b.name() << " took what it should refuse (" << named << ")";
    } catch (const Error& e) {
      const std::string text = e.what();
      EXPECT_NE(text.find(named), std::string::npos) << text;
      EXPECT_EQ(text.find('\n'), std::string::npos) << text;
    }
  };
  Backend& flash = *find_backend("flash", Device::Cuda);
  Inputs in = make_inputs(p, 3, cpu_allocator());
  in.kv_rows = Tensor::empty({1, 1, 2, 2}, DType::F32, cpu_allocator());
  expect_refused(flash, p, in, "kv_rows");
  in.kv_rows = Tensor::empty({1, 1, 3, 2}, DType::I32, cpu_allocator());
  expect_refused(flash, p, in, "kv_rows");
  in.kv_rows = {};
  in.q_rows = Tensor::empty({1, 1, 2, 1}, DType::I32, cpu_allocator());
  expect_refused(flash, p, in, "q_rows");
  in.q_rows = rows_tensor(c.q);
  expect_refused(*cuda::make_efficient(), p, in, "rows");

  Problem boolean = p;
  boolean.mask = MaskKind::Boolean;
  const Eligibility el = flash.eligibility(boolean);
  EXPECT_FALSE(el.eligible);
  EXPECT_NE(el.reason.find("kv_rows"), std::string::npos) << el.reason;
  EXPECT_EQ(el.reason.find('\n'), std::string::npos) << el.reason;
}

// The checking mode reads the rows in the stream's order and refuses a bad
// entry in one line naming it, as the CPU does; without it the same rows run,
// clamped on the device (FlashRows' empty_and_out_of_range cases).
TEST(FlashRowsMore, CheckingModeRefusesABadEntryInOneLine) {
  REQUIRE_GPU();
  const Case c{.name = "checked",
               .mask = MaskKind::Causal,
               .seq = 200,
               .kv_seq = 230,
               .heads = 2,
               .kv_heads = 2,
               .head_dim = 32,
               .q = {{0, 200}, {0, 200}, {0, 200}},
               .kv = {{0, 230}, {5, 100}, {-1, 1 << 30}}};
  const Problem p = problem_of(c, Pass::Forward);
  Inputs in = make_inputs(p, 11, cpu_allocator());
  in.q_rows = rows_tensor(c.q);
  in.kv_rows = rows_tensor(c.kv);
  Backend& flash = *find_backend("flash", Device::Cuda);
  const auto refusal = [&](const Inputs& bad) -> std::string {
    const CheckingInputs on(true);
    try {
      testing::run_once(flash, p, bad, {});
    } catch (const Error& e) {
      return e.what();
    }
    return "(taken)";
  };
  const std::string kv = refusal(in);
  EXPECT_NE(kv.find("kv_rows[2] = (-1, 1073741824) is outside 0 .. 230"), std::string::npos) << kv;
  EXPECT_EQ(kv.find('\n'), std::string::npos) << kv;
  in.kv_rows = {};
  in.q_rows = rows_tensor({{0, 200}, {150, 20}, {0, 200}});
  const std::string q = refusal(in);
  EXPECT_NE(q.find("q_rows[1] = (150, 20)"), std::string::npos) << q;
  EXPECT_EQ(q.find('\n'), std::string::npos) << q;
}

// explain says what flash does with a call's rows (the problem alone does not have them).
TEST(FlashRowsMore, ExplainSaysWhatItDoesWithRows) {
  REQUIRE_GPU();
  const Case c{.name = "explain",
               .mask = MaskKind::Causal,
               .seq = 256,
               .kv_seq = 256,
               .heads = 2,
               .kv_heads = 2,
               .head_dim = 64,
               .q = kRight,
               .kv = kRightKv};
  const Eligibility el = find_backend("flash", Device::Cuda)->eligibility(problem_of(c, Pass::Train));
  ASSERT_TRUE(el.eligible) << el.reason;
  EXPECT_NE(el.reason.find("per-sequence rows (q_rows, kv_rows"), std::string::npos) << el.reason;
}

}  // namespace
}  // namespace attnprof
