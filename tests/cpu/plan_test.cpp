// attnprof::plan (attnprof/plan.h) on the CPU: a plan made once runs many
// times on fresh inputs and writes what the backend's own forward writes;
// its runs resolve nothing and ask the backend nothing but the forward (a
// counting backend shows it); tensors of another shape, dtype or device, a
// missing index tensor and a released plan are refused in one line naming
// the tensor; a paged plan follows seq_lens rewritten in place. CPU flash's
// plan holds its scratch (its runs allocate nothing), and the runner's
// forward steps run through one plan.
#include "attnprof/plan.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/error.h"
#include "attnprof/problem.h"
#include "attnprof/reference.h"
#include "attnprof/runner.h"
#include "common/test_problem.h"

namespace attnprof {
namespace {

using Form = BatchLayout::Form;

Problem dense(MaskKind mask = MaskKind::Causal) {
  Problem p = testing::to_problem(testing::Shape{.batch = 2, .heads = 4, .kv_heads = 2, .seq = 48, .head_dim = 32},
                                  DType::F32, mask);
  p.validate();
  return p;
}

Tensor output(const Problem& p) { return Tensor::empty(p.q_dims(), output_dtype(p.dtype), cpu_allocator()); }

// The backend's own forward, as attention() calls it: no plan, no state.
Tensor direct(Backend& b, const Problem& p, const Inputs& in) {
  Tensor out = output(p);
  RunContext ctx{cpu_allocator(), nullptr, 1};
  b.forward(p, in, out, ctx);
  return out;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

Backend& cpu(const char* name) {
  Backend* b = find_backend(name, Device::Cpu);
  if (!b) throw std::runtime_error(std::string("no CPU backend ") + name);
  return *b;
}

TEST(Plan, RunsManyTimesWithFreshInputsAsTheBackendsForward) {
  const Problem p = dense();
  Plan plan = attnprof::plan(p, {}, "flash", 1);
  EXPECT_EQ(plan.backend().name(), "flash");
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    const Inputs in = make_inputs(p, seed, cpu_allocator());
    Tensor out = output(p);
    plan.run(in, out);
    EXPECT_TRUE(same_bytes(out, direct(cpu("flash"), p, in))) << "seed " << seed;
  }
}

TEST(Plan, AutoKeepsItsBackendAndRunsResolveNothing) {
  const Problem p = dense(MaskKind::None);
  Plan plan = attnprof::plan(p, {}, "auto", 1);
  const std::string picked(plan.backend().name());
  EXPECT_NE(plan.explain().find("picked by auto"), std::string::npos) << plan.explain();
  const std::uint64_t before = backend_resolutions();
  for (std::uint64_t seed = 1; seed <= 4; ++seed) {
    const Inputs in = make_inputs(p, seed, cpu_allocator());
    Tensor out = output(p);
    plan.run(in, out);
    EXPECT_TRUE(same_bytes(out, direct(cpu(picked.c_str()), p, in)));
  }
  EXPECT_EQ(backend_resolutions(), before);
  EXPECT_EQ(plan.backend().name(), picked);
}

// CPU flash, counting what it is asked; its prepare() hands out a state that
// each forward must get back.
class Counting final : public Backend {
 public:
  struct Mine final : BackendState {};
  int eligibility_calls = 0, prepare_calls = 0, forward_calls = 0, other_calls = 0;
  const BackendState* made = nullptr;
  bool state_passed = true;

  std::string_view name() const override { return "counting"; }
  Device device() const override { return Device::Cpu; }
  Eligibility eligibility(const Problem& p) const override {
    ++const_cast<Counting*>(this)->eligibility_calls;
    return inner().eligibility(p);
  }
  std::size_t workspace_bytes(const Problem& p) const override {
    ++const_cast<Counting*>(this)->other_calls;
    return inner().workspace_bytes(p);
  }
  Expectation expectation(const Problem& p) const override {
    ++const_cast<Counting*>(this)->other_calls;
    return inner().expectation(p);
  }
  Traits traits() const override { return inner().traits(); }
  std::unique_ptr<BackendState> prepare(const Problem&, RunContext&) override {
    ++prepare_calls;
    auto s = std::make_unique<Mine>();
    made = s.get();
    return s;
  }
  void forward(const Problem& p, const Inputs& in, Tensor& out, RunContext& ctx) override {
    ++forward_calls;
    state_passed = state_passed && ctx.state == made && made != nullptr;
    inner().forward(p, in, out, ctx);
  }

 private:
  static Backend& inner() { return cpu("flash"); }
};

TEST(Plan, RunsAskTheBackendForTheForwardAloneWithThePlansState) {
  const Problem p = dense();
  Counting counting;
  Plan plan = attnprof::plan(p, {}, counting, 1);
  const int eligibility = counting.eligibility_calls;
  EXPECT_GE(eligibility, 1);
  EXPECT_EQ(counting.prepare_calls, 1);
  const Inputs in = make_inputs(p, 7, cpu_allocator());
  for (int i = 0; i < 5; ++i) {
    Tensor out = output(p);
    plan.run(in, out);
  }
  EXPECT_EQ(counting.forward_calls, 5);
  EXPECT_EQ(counting.eligibility_calls, eligibility);
  EXPECT_EQ(counting.prepare_calls, 1);
  EXPECT_EQ(counting.other_calls, 0);
  EXPECT_TRUE(counting.state_passed);
}

TEST(Plan, RefusesTensorsOfAnotherShapeDtypeOrDeviceInOneLine) {
  const Problem p = dense();
  Plan plan = attnprof::plan(p, {}, "flash", 1);
  Problem longer = p;
  longer.seq = 64;
  longer.kv_seq = 64;
  const Inputs other = make_inputs(longer, 1, cpu_allocator());
  Inputs in = make_inputs(p, 1, cpu_allocator());
  Tensor out = output(p);

  Inputs wrong = in;
  wrong.q = other.q;
  std::string line = testing::invalid_argument_line([&] { plan.run(wrong, out); });
  EXPECT_NE(line.find("q is fp32[2, 4, 64, 32] on cpu but the plan was made for fp32[2, 4, 48, 32] on cpu"),
            std::string::npos)
      << line;

  Problem half = p;
  half.dtype = DType::BF16;
  wrong = in;
  wrong.k = make_inputs(half, 1, cpu_allocator()).k;
  line = testing::invalid_argument_line([&] { plan.run(wrong, out); });
  EXPECT_NE(line.find("k is bf16[2, 2, 48, 32]"), std::string::npos) << line;
  EXPECT_NE(line.find("made for fp32[2, 2, 48, 32]"), std::string::npos) << line;

  // Another device: a view that says CUDA (never dereferenced: refused first).
  wrong = in;
  wrong.v = Tensor::from_blob(in.v.data(), in.v.sizes(), in.v.strides(), DType::F32, Device::Cuda);
  line = testing::invalid_argument_line([&] { plan.run(wrong, out); });
  EXPECT_NE(line.find("v is fp32[2, 2, 48, 32] on cuda but the plan was made for fp32[2, 2, 48, 32] on cpu"),
            std::string::npos)
      << line;

  Tensor short_out = output(longer);
  line = testing::invalid_argument_line([&] { plan.run(in, short_out); });
  EXPECT_NE(line.find("out is fp32[2, 4, 64, 32]"), std::string::npos) << line;

  wrong = in;
  wrong.kv_rows = Tensor::empty({1, 1, 2, 2}, DType::I32, cpu_allocator());
  line = testing::invalid_argument_line([&] { plan.run(wrong, out); });
  EXPECT_NE(line.find("kv_rows given, but the plan was made without it (layout dense)"), std::string::npos) << line;

  plan.release();
  line = testing::invalid_argument_line([&] { plan.run(in, out); });
  EXPECT_NE(line.find("this plan holds nothing"), std::string::npos) << line;
}

TEST(Plan, RefusesAtPlanTimeWhatItCannotRun) {
  const Problem p = dense();
  std::string line = testing::invalid_argument_line([&] { attnprof::plan(p, {.form = Form::Packed}, "flash"); });
  EXPECT_NE(line.find("layout packed"), std::string::npos) << line;
  line = testing::invalid_argument_line([&] { attnprof::plan(p, {.form = Form::Padded}, "flash"); });
  EXPECT_NE(line.find("names neither q_rows nor kv_rows"), std::string::npos) << line;
  line = testing::invalid_argument_line([&] { attnprof::plan(p, {}, "no_such"); });
  EXPECT_NE(line.find("unknown backend 'no_such'"), std::string::npos) << line;
  // The composites read no rows: a padded plan on them is refused by name.
  try {
    attnprof::plan(p, {.form = Form::Padded, .kv_rows = true}, "math");
    ADD_FAILURE() << "not refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Unsupported);
    EXPECT_NE(std::string(e.what()).find("math on cpu reads no per-sequence rows"), std::string::npos) << e.what();
  }
  Problem train = p;
  train.pass = Pass::Train;
  EXPECT_THROW(attnprof::plan(train, {}, "flash"), Error);
}

// Sequence b's keys as (0, len) pairs, as the CPU's paged call passes unequal lengths.
Tensor pairs_of(const std::vector<std::int32_t>& lens) {
  Tensor t = Tensor::empty({1, 1, static_cast<std::int64_t>(lens.size()), 2}, DType::I32, cpu_allocator());
  for (std::size_t b = 0; b < lens.size(); ++b) {
    t.data_as<std::int32_t>()[2 * b] = 0;
    t.data_as<std::int32_t>()[2 * b + 1] = lens[b];
  }
  return t;
}

TEST(Plan, PagedPlanFollowsSeqLensRewrittenInPlace) {
  Problem p =
      testing::to_problem(testing::Shape{.batch = 3, .heads = 4, .kv_heads = 2, .seq = 1, .kv_seq = 64, .head_dim = 32},
                          DType::F32, MaskKind::CausalBottomRight);
  p.kv_cache = KvCache::Paged;
  p.page_size = 16;
  p.validate();
  Plan plan = attnprof::plan(p, {.form = Form::Paged}, "auto", 1);
  EXPECT_EQ(plan.backend().name(), "flash");  // the CPU backend that reads pages and rows
  Inputs in = make_inputs(p, 3, cpu_allocator());
  // One seq_lens tensor, rewritten in place between runs, as a serving engine does.
  Tensor seq_lens = Tensor::empty({1, 1, p.batch, 1}, DType::I32, cpu_allocator());
  in.kv_rows = seq_lens;
  for (const std::vector<std::int32_t>& lens :
       {std::vector<std::int32_t>{64, 17, 40}, std::vector<std::int32_t>{5, 64, 33}}) {
    std::memcpy(seq_lens.data(), lens.data(), lens.size() * sizeof(std::int32_t));
    Tensor out = output(p);
    plan.run(in, out);
    Inputs expected = in;
    expected.kv_rows = pairs_of(lens);
    EXPECT_TRUE(same_bytes(out, direct(cpu("flash"), p, expected))) << lens[0] << ", " << lens[1];
  }
  Inputs missing = in;
  missing.kv_rows = {};
  const std::string line = testing::invalid_argument_line([&] {
    Tensor out = output(p);
    plan.run(missing, out);
  });
  EXPECT_NE(line.find("seq_lens is missing"), std::string::npos) << line;
}

TEST(Plan, PaddedAndPackedPlansRunAsTheBackendsForward) {
  const Problem p = dense(MaskKind::CausalBottomRight);
  Plan padded = attnprof::plan(p, {.form = Form::Padded, .kv_rows = true}, "flash", 1);
  Inputs in = make_inputs(p, 5, cpu_allocator());
  in.kv_rows = Tensor::empty({1, 1, 2, 2}, DType::I32, cpu_allocator());
  const std::int32_t rows[] = {0, 30, 11, 48};  // right and left padding
  std::memcpy(in.kv_rows.data(), rows, sizeof rows);
  Tensor out = output(p);
  padded.run(in, out);
  EXPECT_TRUE(same_bytes(out, direct(cpu("flash"), p, in)));

  Problem packed = varlen_problem(p, {20, 48, 7}, {48, 12, 30});
  packed.normalize().validate();
  Plan plan = attnprof::plan(packed, {.form = Form::Packed}, "flash", 1);
  for (std::uint64_t seed = 1; seed <= 2; ++seed) {
    const Inputs pin = make_inputs(packed, seed, cpu_allocator());
    Tensor pout = output(packed);
    plan.run(pin, pout);
    EXPECT_TRUE(same_bytes(pout, direct(cpu("flash"), packed, pin)));
  }
}

// Counts the CPU allocator's allocations while it is installed.
class CountAllocations final : public AllocationObserver {
 public:
  CountAllocations() { cpu_allocator().set_observer(this); }
  ~CountAllocations() override { cpu_allocator().clear_observer(this); }
  CountAllocations(const CountAllocations&) = delete;
  CountAllocations& operator=(const CountAllocations&) = delete;
  void on_allocation(Device, const void*, std::int64_t delta, const MemoryStats&) override { allocations += delta > 0; }
  int allocations = 0;
};

// A decode over 1300 keys as well: its three key ranges' partial results are the plan's too.
Problem long_decode() {
  Problem p = testing::to_problem(
      testing::Shape{.batch = 2, .heads = 4, .kv_heads = 1, .seq = 2, .kv_seq = 1300, .head_dim = 32}, DType::BF16,
      MaskKind::CausalBottomRight);
  p.validate();
  return p;
}

TEST(Plan, CpuFlashHoldsItsScratchAndItsRunsAllocateNothing) {
  for (const Problem& p : {dense(), dense(MaskKind::None), long_decode()}) {
    Plan plan = attnprof::plan(p, {}, "flash", 2);
    EXPECT_GT(plan.workspace_bytes(), 0U) << plan.explain();
    const Inputs in = make_inputs(p, 3, cpu_allocator());
    Tensor out = output(p);
    int allocations = -1;
    {
      const CountAllocations count;
      for (int i = 0; i < 3; ++i) plan.run(in, out);
      allocations = count.allocations;
    }
    EXPECT_EQ(allocations, 0) << "a planned forward allocated its scratch again";
    EXPECT_TRUE(same_bytes(out, direct(cpu("flash"), p, in)));
  }
  // The backend's own forward (no plan) still sizes and allocates its scratch itself.
  const Problem p = dense();
  const Inputs in = make_inputs(p, 3, cpu_allocator());
  Tensor out = output(p);
  RunContext ctx{cpu_allocator(), nullptr, 2};
  const CountAllocations count;
  cpu("flash").forward(p, in, out, ctx);
  EXPECT_GE(count.allocations, 1);
}

TEST(Plan, RunsFromSeveralThreadsTakeTurnsOnThePlansScratch) {
  const Problem p = dense();
  Plan plan = attnprof::plan(p, {}, "flash", 2);
  const Inputs in = make_inputs(p, 11, cpu_allocator());
  const Tensor want = direct(cpu("flash"), p, in);
  std::vector<Tensor> outs(4);
  for (Tensor& o : outs) o = output(p);
  std::vector<std::thread> threads;
  for (Tensor& o : outs) {
    threads.emplace_back([&plan, &in, &o] {
      for (int i = 0; i < 5; ++i) plan.run(in, o);
    });
  }
  for (std::thread& t : threads) t.join();
  for (const Tensor& o : outs) EXPECT_TRUE(same_bytes(o, want));
}

// The runner (and through it compare and profile) runs a forward's steps
// through one plan of the backend and problem: prepare() once, every step's
// forward with its state.
TEST(Plan, TheRunnersForwardStepsRunThroughOnePlan) {
  const Problem p = dense();
  Counting counting;
  RunOptions options;
  options.schedule = Schedule{.wait = 0, .warmup = 1, .active = 3, .repeat = 1};
  options.threads = 1;
  const RunResult r = run_backend(counting, p, options);
  ASSERT_FALSE(r.failure) << *r.failure;
  EXPECT_EQ(counting.prepare_calls, 1);
  EXPECT_EQ(counting.forward_calls, options.schedule.total_steps());
  EXPECT_TRUE(counting.state_passed) << "a step ran without the plan's state";
  ASSERT_TRUE(r.acceptance.has_value());
  EXPECT_TRUE(r.acceptance->pass) << r.acceptance->why;
}

}  // namespace
}  // namespace attnprof
