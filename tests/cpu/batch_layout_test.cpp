// The batch layout (attnprof/batch_layout.h) and the one function that says
// whether a backend takes a problem in it (eligibility_of with a layout):
// every form on every CPU backend and on a backend that declares nothing,
// the band each mask gives, and the layouts a problem contradicts, refused
// in one line naming the layout.
#include "attnprof/batch_layout.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/error.h"
#include "attnprof/plan.h"
#include "attnprof/problem.h"
#include "attnprof/runner.h"
#include "common/test_problem.h"

namespace attnprof {
namespace {

using Form = BatchLayout::Form;

Problem dense(MaskKind mask = MaskKind::Causal, std::int64_t window = 0) {
  Problem p = testing::to_problem(
      testing::Shape{.batch = 2, .heads = 4, .kv_heads = 2, .seq = 48, .head_dim = 32, .window = window}, DType::F32,
      mask);
  p.validate();
  return p;
}

Problem packed() {
  Problem p = varlen_problem(dense(), {20, 48}, {30, 48});
  p.normalize().validate();
  return p;
}

Problem paged() {
  Problem p = dense();
  p.kv_cache = KvCache::Paged;
  p.page_size = 16;
  p.validate();
  return p;
}

// A backend that declares `traits` and takes whatever reaches its own
// eligibility: what eligibility_of refuses for it is the layout's answer
// alone. Plain declares nothing (default Traits); PagedLengthsOnly reads a
// paged cache's key counts but no padded rows (cuDNN's traits): the two are
// separate questions, so a padded batch is refused there, before a launch
// would refuse it.
class Declared final : public Backend {
 public:
  Declared(std::string_view name, Traits traits) : name_(name), traits_(traits) {}
  std::string_view name() const override { return name_; }
  Device device() const override { return Device::Cpu; }
  Eligibility eligibility(const Problem&) const override { return {true, std::string(name_) + "'s own answer"}; }
  std::size_t workspace_bytes(const Problem&) const override { return 0; }
  Expectation expectation(const Problem&) const override { return {}; }
  void forward(const Problem&, const Inputs&, Tensor&, RunContext&) override {}
  Traits traits() const override { return traits_; }

 private:
  std::string_view name_;
  Traits traits_;
};

Declared Plain() { return Declared("plain", {}); }
Declared PagedLengthsOnly() { return Declared("paged_only", {.varlen = true, .paged = true, .paged_lengths = true}); }

struct FormCase {
  const char* label;
  Problem problem;
  BatchLayout layout;
};

std::vector<FormCase> forms() {
  return {
      {"dense", dense(), {}},
      {"padded q_rows", dense(), {.form = Form::Padded, .q_rows = true}},
      {"padded kv_rows", dense(), {.form = Form::Padded, .kv_rows = true}},
      {"packed", packed(), {.form = Form::Packed}},
      {"paged", paged(), {.form = Form::Paged}},
      {"paged with seq_lens", paged(), {.form = Form::Paged, .kv_rows = true}},
  };
}

TEST(BatchLayout, ProblemSaysItsFormAndBand) {
  EXPECT_EQ(dense().layout().form, Form::Dense);
  EXPECT_EQ(packed().layout().form, Form::Packed);
  EXPECT_EQ(paged().layout().form, Form::Paged);
  EXPECT_FALSE(paged().layout().reads_rows());  // key counts come with a call, not the problem

  const Band causal = *dense(MaskKind::Causal).layout().band;
  EXPECT_EQ(causal, (Band{.left = -1, .right = 0, .diagonal = Band::Diagonal::TopLeft}));
  EXPECT_EQ(band_text(causal), "(-1, 0) top-left");
  EXPECT_EQ(*dense(MaskKind::CausalBottomRight).layout().band,
            (Band{.left = -1, .right = 0, .diagonal = Band::Diagonal::BottomRight}));
  EXPECT_EQ(*dense(MaskKind::None).layout().band, (Band{.left = -1, .right = -1}));
  EXPECT_EQ(*dense(MaskKind::SlidingWindow, 8).layout().band,
            (Band{.left = 7, .right = 0, .diagonal = Band::Diagonal::BottomRight}));
  EXPECT_FALSE(dense(MaskKind::Boolean).layout().band.has_value());
  EXPECT_FALSE(dense(MaskKind::Bias).layout().band.has_value());
}

TEST(BatchLayout, ACallsRowsMakeItPadded) {
  const Problem p = dense();
  Inputs in;
  EXPECT_EQ(layout_of(p, in).form, Form::Dense);
  in.kv_rows = Tensor::empty({1, 1, 2, 2}, DType::I32, cpu_allocator());
  const BatchLayout l = layout_of(p, in);
  EXPECT_EQ(l.form, Form::Padded);
  EXPECT_TRUE(l.kv_rows && !l.q_rows);
  EXPECT_EQ(layout_text(l), "padded (kv_rows)");
  // A paged call's key counts ride on kv_rows: still paged, now with them.
  const BatchLayout pl = layout_of(paged(), in);
  EXPECT_EQ(pl.form, Form::Paged);
  EXPECT_TRUE(pl.kv_rows);
  EXPECT_EQ(layout_text(pl), "paged (seq_lens)");
}

// Every form on every CPU backend: flash reads rows and pages; the composites
// read pages and packed batches but no per-sequence rows.
TEST(BatchLayout, EveryFormOnEveryCpuBackend) {
  const std::map<std::string, std::vector<bool>> expected = {
      //                 dense  q_rows kv_rows packed paged  seq_lens
      {"naive", {true, false, false, true, true, false}},
      {"naive_inplace", {true, false, false, true, true, false}},
      {"math", {true, false, false, true, true, false}},
      {"flash", {true, true, true, true, true, true}},
  };
  const std::vector<FormCase> cases = forms();
  for (const auto& [name, answers] : expected) {
    const Backend* b = find_backend(name, Device::Cpu);
    ASSERT_NE(b, nullptr) << name;
    for (std::size_t i = 0; i < cases.size(); ++i) {
      SCOPED_TRACE(name + " / " + cases[i].label);
      const Eligibility e = eligibility_of(*b, cases[i].problem, cases[i].layout);
      EXPECT_EQ(e.eligible, answers[i]) << e.reason;
      if (!answers[i] && cases[i].layout.form == Form::Padded) {
        EXPECT_EQ(e.reason, name + " on cpu reads no per-sequence rows, which layout " + layout_text(cases[i].layout) +
                                " gives every run");
      } else if (!answers[i]) {
        EXPECT_EQ(e.reason, name +
                                " on cpu takes one kv length for every sequence, and layout paged (seq_lens) gives "
                                "each its own (or pad the shorter sequences' pages)");
      }
    }
  }
}

// A backend that declares nothing: each form's refusal, by name, before its
// own eligibility is asked.
TEST(BatchLayout, EveryFormOnABackendThatDeclaresNothing) {
  const Declared plain = Plain();
  const std::vector<FormCase> cases = forms();
  const std::vector<std::string> reasons = {
      "plain's own answer",
      "plain on cpu reads no per-sequence rows, which layout padded (q_rows) gives every run",
      "plain on cpu reads no per-sequence rows, which layout padded (kv_rows) gives every run",
      "packed batches (seq_lens, varlen) are not built for plain on cpu yet",
      "plain on cpu reads no paged KV cache: use kv_cache=contiguous, or a backend that pages",
      "plain on cpu reads no paged KV cache: use kv_cache=contiguous, or a backend that pages",
  };
  for (std::size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].label);
    const Eligibility e = eligibility_of(plain, cases[i].problem, cases[i].layout);
    EXPECT_EQ(e.eligible, i == 0);
    EXPECT_EQ(e.reason, reasons[i]);
  }
  // The two-argument form asks in the problem's own layout.
  EXPECT_EQ(eligibility_of(plain, paged()).reason, reasons[4]);
  EXPECT_EQ(eligibility_of(plain, dense()).reason, reasons[0]);
}

TEST(BatchLayout, ALayoutTheProblemContradictsIsRefusedInOneLine) {
  const Declared plain = Plain();
  const auto refused = [&](const Problem& p, const BatchLayout& l, const std::string& text) {
    const std::string line = testing::invalid_argument_line([&] { (void)eligibility_of(plain, p, l); });
    EXPECT_NE(line.find(text), std::string::npos) << line;
    EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  };
  refused(dense(), {.form = Form::Packed}, "layout packed for a problem without seq_lens");
  refused(packed(), {}, "layout dense for a packed problem (seq_lens)");
  refused(paged(), {}, "layout dense for a paged problem (kv_cache paged)");
  refused(dense(), {.form = Form::Paged}, "layout paged for a problem with a contiguous cache");
  refused(dense(), {.form = Form::Padded}, "names neither q_rows nor kv_rows");
  refused(packed(), {.form = Form::Packed, .kv_rows = true}, "kv_rows belongs to the padded layout");
  refused(paged(), {.form = Form::Paged, .q_rows = true}, "q_rows belongs to the padded layout, not paged");
  refused(dense(MaskKind::Boolean), {.form = Form::Padded, .kv_rows = true},
          "layout padded takes a structural mask (the rows say each sequence's keys), not a boolean tensor");
  BatchLayout window;
  window.band = Band{.left = 7, .right = 0, .diagonal = Band::Diagonal::BottomRight};
  refused(dense(MaskKind::Causal), window,
          "layout band (7, 0) bottom-right but the problem's mask (causal) is (-1, 0) top-left");
  refused(dense(MaskKind::Bias), window, "a band is a structural mask's");
  // The band the mask gives is accepted.
  BatchLayout causal;
  causal.band = Band{.left = -1, .right = 0};
  EXPECT_TRUE(eligibility_of(plain, dense(MaskKind::Causal), causal).eligible);
}

TEST(BatchLayout, PagedKeyCountsAndPaddedRowsAreSeparateQuestions) {
  const Declared b = PagedLengthsOnly();
  const std::vector<FormCase> cases = forms();
  //                            dense  q_rows kv_rows packed paged  seq_lens
  const std::vector<bool> takes = {true, false, false, true, true, true};
  for (std::size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].label);
    const Eligibility e = eligibility_of(b, cases[i].problem, cases[i].layout);
    EXPECT_EQ(e.eligible, takes[i]) << e.reason;
    if (!takes[i]) {
      EXPECT_EQ(e.reason, "paged_only on cpu reads no per-sequence rows, which layout " + layout_text(cases[i].layout) +
                              " gives every run");
    }
  }
}

// Plans ask the same function: a paged plan's runs give seq_lens, which the
// composites do not read.
TEST(BatchLayout, PlansAskTheSameQuestion) {
  try {
    attnprof::plan(paged(), {.form = Form::Paged}, "math", 1);
    ADD_FAILURE() << "not refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
    EXPECT_NE(std::string(e.what()).find("math on cpu takes one kv length for every sequence, and layout paged "
                                         "(seq_lens) gives each its own"),
              std::string::npos)
        << e.what();
  }
  const Plan p = attnprof::plan(paged(), {.form = Form::Paged}, "flash", 1);
  EXPECT_EQ(p.layout(), (BatchLayout{.form = Form::Paged}));  // the caller's, as given
  EXPECT_NE(p.explain().find("layout paged (seq_lens)"), std::string::npos) << p.explain();
}

}  // namespace
}  // namespace attnprof
