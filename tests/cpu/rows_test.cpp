// Per-sequence rows (Inputs::q_rows and kv_rows, core/rows.h) on the CPU
// flash, forward and backward at every instruction-set level: each case
// against the float64 reference on the same problem with the rows lowered to
// the Boolean mask that says the same (core/rows.h's lower_rows), rows
// outside a sequence's exactly zero; and the bad rows, refused in one line.
#include "core/rows.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/error.h"
#include "attnprof/reference.h"
#include "backends/cpu/cpu_backends.h"
#include "common/test_problem.h"
#include "flash_accuracy.h"
#include "flash_isa_fixture.h"

namespace attnprof {
namespace {

using testing::ForceIsa;

// The levels' fixture (skips a level this CPU lacks) under a suite of its own.
class FlashRows : public testing::FlashIsa {};

// int32 [1, 1, B, 2] of (begin, end) pairs.
Tensor rows_tensor(const std::vector<std::int32_t>& pairs) {
  const auto B = static_cast<std::int64_t>(pairs.size() / 2);
  Tensor t = Tensor::empty({1, 1, B, 2}, DType::I32, cpu_allocator());
  std::memcpy(t.data(), pairs.data(), sizeof(std::int32_t) * pairs.size());
  return t;
}

struct RowsCase {
  std::string name;
  testing::Shape shape;
  MaskKind mask;
  double softcap;
  std::vector<std::int32_t> q_rows, kv_rows;  // empty: every row
  DType dtype = DType::F32;
};

// Right, left and both-side padding, decode, each mask, a window shorter
// than the sequences, a soft cap, grouped heads, a sequence of no rows, odd
// lengths across the 64-row query and key blocks.
std::vector<RowsCase> cases() {
  const testing::Shape padded{.batch = 4, .heads = 4, .kv_heads = 2, .seq = 150, .kv_seq = 150, .head_dim = 32};
  return {
      {"right_causal", padded, MaskKind::Causal, 0, {0, 150, 0, 97, 0, 1, 0, 0}, {0, 150, 0, 97, 0, 1, 0, 0}},
      {"left_causal",
       padded,
       MaskKind::Causal,
       0,
       {0, 150, 53, 150, 149, 150, 150, 150},
       {0, 150, 53, 150, 149, 150, 150, 150}},
      {"left_bottom_right",
       padded,
       MaskKind::CausalBottomRight,
       0,
       {3, 150, 70, 150, 10, 140, 0, 65},
       {0, 150, 40, 150, 10, 140, 0, 129}},
      {"both_sides_none_capped",
       padded,
       MaskKind::None,
       25.0,
       {5, 120, 64, 129, 0, 150, 17, 18},
       {9, 77, 0, 150, 33, 101, 17, 18}},
      {"window_shorter",
       {.batch = 3, .heads = 2, .seq = 140, .kv_seq = 200, .head_dim = 64, .window = 37},
       MaskKind::SlidingWindow,
       0,
       {0, 140, 11, 140, 20, 99},
       {0, 200, 59, 200, 0, 131}},
      {"window_capped_gqa",
       {.batch = 2, .heads = 6, .kv_heads = 2, .seq = 77, .kv_seq = 77, .head_dim = 40, .window = 19},
       MaskKind::SlidingWindow,
       10.0,
       {7, 77, 0, 51},
       {7, 77, 0, 51}},
      {"decode",
       {.batch = 3, .heads = 8, .kv_heads = 2, .seq = 1, .kv_seq = 300, .head_dim = 64},
       MaskKind::CausalBottomRight,
       0,
       {},
       {0, 300, 120, 300, 299, 300}},
      {"decode_window",
       {.batch = 2, .heads = 4, .seq = 3, .kv_seq = 90, .head_dim = 32, .window = 8},
       MaskKind::SlidingWindow,
       0,
       {},
       {0, 41, 60, 90}},
      {"left_causal_bf16",
       padded,
       MaskKind::Causal,
       0,
       {0, 150, 53, 150, 149, 150, 150, 150},
       {0, 150, 53, 150, 149, 150, 150, 150},
       DType::BF16},
      {"kv_rows_only_odd",
       {.batch = 3, .heads = 2, .seq = 67, .kv_seq = 131, .head_dim = 24},
       MaskKind::Causal,
       0,
       {},
       {0, 131, 65, 130, 1, 2}},
  };
}

Inputs inputs_of(const Problem& p, const RowsCase& c) {
  Inputs in = make_inputs(p, 17, cpu_allocator());
  if (!c.q_rows.empty()) in.q_rows = rows_tensor(c.q_rows);
  if (!c.kv_rows.empty()) in.kv_rows = rows_tensor(c.kv_rows);
  return in;
}

Problem problem_of(const RowsCase& c, Pass pass) {
  Problem p = testing::to_problem(c.shape, c.dtype, c.mask);
  if (c.mask != MaskKind::SlidingWindow) p.window = 0;
  p.softcap = c.softcap;
  p.pass = pass;
  p.validate();
  return p;
}

// Every element of t's rows outside the sequences' rows is 0.
void expect_zero_outside(const Tensor& t, const std::vector<SequenceRows>& rows, bool queries,
                         const std::string& what) {
  std::int64_t nonzero = 0;
  for (std::int64_t b = 0; b < t.size(0); ++b) {
    const auto keep = queries ? rows[static_cast<std::size_t>(b)].q : rows[static_cast<std::size_t>(b)].k;
    for (std::int64_t h = 0; h < t.size(1); ++h)
      for (std::int64_t i = 0; i < t.size(2); ++i)
        for (std::int64_t d = 0; d < t.size(3) && (i < keep.begin || i >= keep.end); ++d)
          nonzero += t.get(b, h, i, d) != 0.0f;
  }
  EXPECT_EQ(nonzero, 0) << what << ": elements outside the rows are not zero";
}

TEST_P(FlashRows, RowsForwardMatchesFloat64WithTheirMask) {
  const ForceIsa force(std::string(cpu::isa_name(GetParam())));
  auto flash = cpu::make_flash();
  ASSERT_TRUE(flash->traits().rows);
  for (const RowsCase& c : cases()) {
    const Problem p = problem_of(c, Pass::Forward);
    const Inputs in = inputs_of(p, c);
    Tensor out = testing::nan_tensor(p.q_dims(), p.dtype);
    RunContext ctx{.allocator = cpu_allocator(), .threads = 2};
    flash->forward(p, in, out, ctx);
    const std::string what = std::string(cpu::isa_name(GetParam())) + " " + c.name;
    const ErrorStats e = check_against_reference(p, in, out, sample_rows(p, 1 << 20));
    EXPECT_EQ(e.nan_rows, 0) << what;
    EXPECT_LT(e.rel, c.dtype == DType::F32 ? 1e-5 : 1e-2) << what;
    expect_zero_outside(out, sequence_rows(p, in), true, what);
  }
}

TEST_P(FlashRows, RowsBackwardMatchesFloat64WithTheirMask) {
  const ForceIsa force(std::string(cpu::isa_name(GetParam())));
  auto flash = cpu::make_flash();
  for (const RowsCase& c : cases()) {
    const Problem p = problem_of(c, Pass::Train);
    const Inputs in = inputs_of(p, c);
    Tensor out = testing::nan_tensor(p.q_dims(), p.dtype);
    const Tensor dout = make_dout(p, 5, cpu_allocator());
    Gradients g{testing::nan_tensor(p.q_dims(), p.dtype), testing::nan_tensor(p.kv_dims(), p.dtype),
                testing::nan_tensor(p.kv_dims(), p.dtype)};
    RunContext ctx{.allocator = cpu_allocator(), .threads = 2};
    Saved saved;
    flash->forward_train(p, in, out, saved, ctx);
    flash->backward(p, in, out, dout, saved, g, ctx);
    const std::string what = std::string(cpu::isa_name(GetParam())) + " " + c.name;
    const GradientErrors e =
        check_gradients_against_reference(p, in, dout, g, sample_rows(p, 1 << 20), sample_kv_rows(p, 1 << 20));
    for (const ErrorStats* s : {&e.dq, &e.dk, &e.dv}) {
      EXPECT_EQ(s->nan_rows, 0) << what;
      EXPECT_LT(s->rel, c.dtype == DType::F32 ? 1e-4 : 3e-2) << what;
    }
    const std::vector<SequenceRows> rows = sequence_rows(p, in);
    expect_zero_outside(g.dq, rows, true, what + " dq");
    expect_zero_outside(g.dk, rows, false, what + " dk");
    expect_zero_outside(g.dv, rows, false, what + " dv");
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, FlashRows, ::testing::ValuesIn(cpu::kAllCpuIsas),
                         [](const ::testing::TestParamInfo<cpu::CpuIsa>& info) {
                           return std::string(cpu::isa_name(info.param));
                         });

// Rows [first, first + n) of batch b of t, as a batch of one.
Tensor batch_rows(const Tensor& t, std::int64_t b, std::int64_t first, std::int64_t n) {
  return t.as_strided({1, t.size(1), n, t.size(3)}, t.strides(), t.offset() + b * t.stride(0) + first * t.stride(2));
}

// Each sequence's rows of a call with rows are its own dense call on views of
// those rows, bit for bit, forward and backward, at the level the dispatcher
// picks (tests/CMakeLists.txt runs every level): a sequence left a few
// queries decodes as its dense call does, and one left fewer keys than the
// batch takes the query rows a forward item of its own takes.
TEST(Rows, EachSequencesRowsAreItsDenseCallBitForBit) {
  const std::vector<RowsCase> bit_cases = {
      {"bottom_right_bf16",
       {.batch = 3, .heads = 4, .kv_heads = 2, .seq = 150, .kv_seq = 200, .head_dim = 64},
       MaskKind::CausalBottomRight,
       0,
       {0, 150, 148, 150, 3, 6},
       {0, 200, 10, 190, 0, 40},
       DType::BF16},
      {"window_long_keys_fp32",
       {.batch = 2, .heads = 2, .seq = 150, .kv_seq = 4200, .head_dim = 64, .window = 40},
       MaskKind::SlidingWindow,
       0,
       {0, 150, 0, 150},
       {0, 4200, 4050, 4200}},
  };
  auto backend = cpu::make_flash();
  Backend& flash = *backend;
  const std::string level(cpu::isa_name(cpu::choose_isa().isa));
  for (const RowsCase& c : bit_cases) {
    const Problem p = problem_of(c, Pass::Train);
    const Inputs in = inputs_of(p, c);
    const Tensor dout = make_dout(p, 5, cpu_allocator());
    RunContext ctx{.allocator = cpu_allocator(), .threads = 2};
    Tensor out = testing::nan_tensor(p.q_dims(), p.dtype);
    Gradients g{testing::nan_tensor(p.q_dims(), p.dtype), testing::nan_tensor(p.kv_dims(), p.dtype),
                testing::nan_tensor(p.kv_dims(), p.dtype)};
    Saved saved;
    flash.forward_train(p, in, out, saved, ctx);
    flash.backward(p, in, out, dout, saved, g, ctx);
    const std::vector<SequenceRows> rows = sequence_rows(p, in);
    for (std::int64_t b = 0; b < p.batch; ++b) {
      const SequenceRows& r = rows[static_cast<std::size_t>(b)];
      const std::int64_t nq = r.q_len(), nk = r.k_len();
      Problem one = p;
      one.batch = 1;
      one.seq = nq;
      one.kv_seq = nk;
      one.validate();
      Inputs alone;
      alone.q = batch_rows(in.q, b, r.q.begin, nq);
      alone.k = batch_rows(in.k, b, r.k.begin, nk);
      alone.v = batch_rows(in.v, b, r.k.begin, nk);
      Tensor o = Tensor::empty(alone.q.sizes(), p.dtype, cpu_allocator());
      Gradients dg{Tensor::empty(alone.q.sizes(), p.dtype, cpu_allocator()),
                   Tensor::empty(alone.k.sizes(), p.dtype, cpu_allocator()),
                   Tensor::empty(alone.k.sizes(), p.dtype, cpu_allocator())};
      Saved ds;
      flash.forward_train(one, alone, o, ds, ctx);
      flash.backward(one, alone, o, batch_rows(dout, b, r.q.begin, nq), ds, dg, ctx);
      const std::pair<Tensor, Tensor> pairs[] = {{o, batch_rows(out, b, r.q.begin, nq)},
                                                 {dg.dq, batch_rows(g.dq, b, r.q.begin, nq)},
                                                 {dg.dk, batch_rows(g.dk, b, r.k.begin, nk)},
                                                 {dg.dv, batch_rows(g.dv, b, r.k.begin, nk)}};
      const char* names[] = {"O", "dQ", "dK", "dV"};
      for (int k = 0; k < 4; ++k) {
        const auto& [dense, of_rows] = pairs[k];
        std::int64_t differ = 0;
        testing::for_each_index(dense, [&](auto i0, auto i1, auto i2, auto i3) {
          const float x = dense.get(i0, i1, i2, i3), y = of_rows.get(i0, i1, i2, i3);
          differ += std::memcmp(&x, &y, sizeof x) != 0;
        });
        EXPECT_EQ(differ, 0) << c.name << " sequence " << b << " (" << nq << " queries, " << nk << " keys) " << names[k]
                             << " at kernel level " << level;
      }
    }
  }
}

// ---- bad rows ----------------------------------------------------------------

std::string refusal(const std::function<void()>& f) { return testing::invalid_argument_line(f); }

TEST(Rows, BadRowsAreRefusedInOneLineNamingThem) {
  testing::Shape s{.batch = 2, .heads = 2, .seq = 16, .kv_seq = 24, .head_dim = 32};
  Problem p = testing::to_problem(s, DType::F32, MaskKind::Causal);
  p.validate();
  auto flash = cpu::make_flash();
  const auto run = [&](const Inputs& in) {
    return refusal([&] {
      Tensor out = testing::nan_tensor(p.q_dims(), p.dtype);
      RunContext ctx{.allocator = cpu_allocator(), .threads = 1};
      flash->forward(p, in, out, ctx);
    });
  };
  Inputs in = make_inputs(p, 1, cpu_allocator());
  in.kv_rows = rows_tensor({0, 24, 5, 9000});
  EXPECT_EQ(run(in), "kv_rows[1] = (5, 9000) is outside 0 .. 24");
  in.kv_rows = rows_tensor({-1, 3, 0, 24});
  EXPECT_EQ(run(in), "kv_rows[0] = (-1, 3) is outside 0 .. 24");
  in.kv_rows = {};
  in.q_rows = rows_tensor({0, 16, 9, 4});
  EXPECT_EQ(run(in), "q_rows[1] = (9, 4) begins after it ends (begin <= end)");
  in.q_rows = rows_tensor({0, 16});  // one sequence's rows for two
  EXPECT_NE(run(in).find("q_rows must be int32 [B, 2] = [2, 2]"), std::string::npos);
  Tensor wide = Tensor::empty({1, 1, 2, 2}, DType::F32, cpu_allocator());
  in.q_rows = wide;
  EXPECT_NE(run(in).find("q_rows must be int32"), std::string::npos);
  static std::int32_t fake[4];
  in.q_rows = Tensor::from_blob(fake, {1, 1, 2, 2}, {4, 4, 2, 1}, DType::I32, Device::Cuda);
  EXPECT_NE(run(in).find("q_rows is read on the host here and is on cuda"), std::string::npos);
  // Rows with a tensor mask.
  in.q_rows = rows_tensor({0, 16, 0, 16});
  Problem boolean = p;
  boolean.mask = MaskKind::Boolean;
  in.mask = Tensor::empty({1, 1, 16, 24}, DType::Bool, cpu_allocator()).expand({2, 2, 16, 24});
  EXPECT_NE(refusal([&] { (void)sequence_rows(boolean, in); }).find("q_rows with a tensor mask"), std::string::npos);
}

// kv_rows as key ends alone ([1, 1, B, 1], a paged call's seq_lens as the GPU
// path passes them) reads as (0, end) pairs; q_rows has no such form.
TEST(Rows, KeyEndsAloneReadAsRowsFromZero) {
  Problem p = testing::to_problem(testing::Shape{.batch = 2, .heads = 2, .seq = 16, .kv_seq = 24, .head_dim = 32},
                                  DType::F32, MaskKind::CausalBottomRight);
  Inputs in;
  Tensor ends = Tensor::empty({1, 1, 2, 1}, DType::I32, cpu_allocator());
  ends.data_as<std::int32_t>()[0] = 24;
  ends.data_as<std::int32_t>()[1] = 7;
  in.kv_rows = ends;
  const std::vector<SequenceRows> rows = sequence_rows(p, in);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].k.begin, 0);
  EXPECT_EQ(rows[0].k.end, 24);
  EXPECT_EQ(rows[1].k.begin, 0);
  EXPECT_EQ(rows[1].k.end, 7);
  EXPECT_EQ(rows[1].q.end, 16);  // no q_rows: every query row
  ends.data_as<std::int32_t>()[1] = 25;
  EXPECT_EQ(refusal([&] { (void)sequence_rows(p, in); }), "kv_rows[1] = 25 is outside 0 .. 24");
  // A paged problem's key ends are the caller's seq_lens, named so, with the table's capacity.
  Problem paged = p;
  paged.kv_cache = KvCache::Paged;
  paged.page_size = 8;
  EXPECT_EQ(refusal([&] { (void)sequence_rows(paged, in); }),
            "seq_lens[1] = 25 is outside 0 .. 24 (the block table's 3 pages of 8 keys)");
  in.kv_rows = {};
  in.q_rows = ends;
  EXPECT_NE(refusal([&] { (void)sequence_rows(p, in); }).find("q_rows must be int32 [B, 2]"), std::string::npos);
}

TEST(Rows, RowsWithAPackedBatchAreRefused) {
  Problem p = testing::to_problem(testing::Shape{.heads = 2, .seq = 16, .head_dim = 32}, DType::F32, MaskKind::None);
  p.seq_lens = {10, 6};
  p.normalize();
  Inputs in;
  in.kv_rows = rows_tensor({0, 10, 0, 6});
  EXPECT_NE(refusal([&] { (void)sequence_rows(p, in); }).find("kv_rows with a packed batch (cu_seqlens)"),
            std::string::npos);
}

// The lowering the reference and the row-less backends read: a bottom-right
// mask at each sequence's own last rows, top-left causal at its first.
TEST(Rows, LoweredMaskAlignsEachSequencesOwnRows) {
  Problem p =
      testing::to_problem(testing::Shape{.batch = 1, .seq = 6, .kv_seq = 8}, DType::F32, MaskKind::CausalBottomRight);
  const std::vector<SequenceRows> rows{{.q = {2, 5}, .k = {1, 7}}};
  const Tensor m = rows_mask(p, rows, cpu_allocator());
  const auto sees = [&](std::int64_t i, std::int64_t j) { return m.get(0, 0, i, j) != 0.0f; };
  // Query row 4 (the sequence's last) sees keys 1..6; row 2 (its first) keys 1..4.
  for (std::int64_t j = 0; j < 8; ++j) {
    EXPECT_EQ(sees(4, j), j >= 1 && j <= 6) << j;
    EXPECT_EQ(sees(2, j), j >= 1 && j <= 4) << j;
    EXPECT_FALSE(sees(1, j));
    EXPECT_FALSE(sees(5, j));
  }
  p.mask = MaskKind::Causal;
  const Tensor tl = rows_mask(p, rows, cpu_allocator());
  for (std::int64_t j = 0; j < 8; ++j) EXPECT_EQ(tl.get(0, 0, 2, j) != 0.0f, j == 1) << j;
}

}  // namespace
}  // namespace attnprof
