// attnprof::plan and Plan::run (attnprof/plan.h): the backend resolved,
// checked and prepared once; each run checks its tensors against the plan and
// calls the backend's forward with the plan's state.
#include "attnprof/plan.h"

#include <array>
#include <mutex>
#include <string>
#include <utility>

#include "attnprof/device_runtime.h"
#include "attnprof/error.h"
#include "attnprof/runner.h"

namespace attnprof {

// What every run reads: the problem, the backend and its prepared state, and
// the tensors' expected sizes, worked out once.
struct Plan::State {
  Problem problem;
  BatchLayout layout;
  Backend* backend = nullptr;
  Allocator* allocator = nullptr;
  int threads = 0;
  std::unique_ptr<BackendState> prepared;
  // Held for each run: the prepared state (a CPU flash's scratch) serves one
  // forward at a time, so runs from several threads take turns.
  std::mutex running;
  std::string story;  // the backend's eligibility reason
  std::string how;    // how the backend was picked
  DType out_dtype = DType::BF16;
  Dims q_dims{}, kv_dims{}, pages_dims{}, table_dims{}, q_rows_dims{}, kv_rows_dims{}, cu_dims{};
};

namespace {

using Form = BatchLayout::Form;

// What check_layout (core) leaves to plans: they run forwards.
void check_pass(const Problem& p) {
  if (p.pass != Pass::Forward) {
    fail(ErrorKind::Unsupported,
         "a plan runs forwards (inference); pass " + std::string(pass_name(p.pass)) + " goes through attention_train",
         {"pass"});
  }
}

// A plan's paged runs always give each sequence's key count (Plan::run's
// seq_lens), whether or not the caller's layout said so: what eligibility and
// explain() are asked with (Plan::layout() stays the caller's).
BatchLayout planned(BatchLayout l) {
  if (l.form == Form::Paged) l.kv_rows = true;
  return l;
}

// The backend `requested` names for p in layout l ("auto": auto's rule,
// asked with the layout), with how it was picked.
std::pair<Backend*, std::string> pick(const Problem& p, const BatchLayout& l, std::string_view requested) {
  if (requested != "auto") return {&resolve_backend(p, l, requested), "asked for by name"};
  const AutoChoice c = choose_auto(p, l);
  return {&resolve_backend(p, l, c.backend), "picked by auto: " + c.reason};
}

// The axes of a run's 4-D view that the caller's array has, as it gave them:
// q, k, v, out and the caches all four; block_table and rows [B, W] axes 2
// and 3; seq_lens [B] axis 2; cumulative lengths [B + 1] axis 3.
struct Axes {
  int first = 0, count = 4;
};
constexpr Axes kTable{2, 2}, kLengths{2, 1}, kCumulative{3, 1};

std::string described(DType dtype, const Dims& dims, Device device, Axes shown) {
  std::string shape = "[";
  for (int i = shown.first; i < shown.first + shown.count; ++i) {
    shape += (i > shown.first ? ", " : "") + std::to_string(dims[static_cast<std::size_t>(i)]);
  }
  return std::string(dtype_name(dtype)) + shape + "] on " + std::string(device_name(device));
}

// One tensor of a run against the plan: defined, its sizes, dtype and device.
// `skip_first`: a paged cache's page count is the pool's, any size.
void expect(const char* name, const Tensor& t, const Dims& dims, DType dtype, Device device, Axes shown = {},
            bool skip_first = false) {
  if (!t.defined()) {
    fail(ErrorKind::InvalidArgument,
         std::string(name) + " is missing: the plan was made for " + described(dtype, dims, device, shown), {name});
  }
  bool same = t.dtype() == dtype && t.device() == device;
  for (std::size_t i = skip_first ? 1 : 0; i < 4; ++i) same = same && t.size(static_cast<int>(i)) == dims[i];
  if (same) return;
  Dims want = dims;
  if (skip_first) want[0] = t.size(0);
  fail(ErrorKind::InvalidArgument,
       std::string(name) + " is " + described(t.dtype(), t.sizes(), t.device(), shown) + " but the plan was made for " +
           described(dtype, want, device, shown),
       {name});
}

void expect_absent(const char* name, const Tensor& t, const BatchLayout& l) {
  if (!t.defined()) return;
  fail(ErrorKind::InvalidArgument,
       std::string(name) + " given, but the plan was made without it (layout " + std::string(layout_name(l.form)) +
           "): make a plan for the layout that has it",
       {name});
}

}  // namespace

Plan::Plan() = default;
Plan::~Plan() = default;
Plan::Plan(Plan&&) noexcept = default;
Plan& Plan::operator=(Plan&&) noexcept = default;

const Plan::State& Plan::live() const {
  if (!state_) {
    fail(ErrorKind::InvalidArgument,
         "this plan holds nothing (released, moved from, or never made): make another plan");
  }
  return *state_;
}

const Problem& Plan::problem() const { return live().problem; }
const BatchLayout& Plan::layout() const { return live().layout; }
Backend& Plan::backend() const { return *live().backend; }
std::size_t Plan::workspace_bytes() const {
  const State& s = live();
  return s.prepared ? s.prepared->bytes() : 0;
}

std::string Plan::explain() const {
  const State& s = live();
  std::string out =
      std::string(s.backend->name()) + " (" + s.how + "): " + s.story + "; layout " + layout_text(planned(s.layout));
  out += "; " + s.problem.describe() + "; ";
  const std::size_t held = workspace_bytes();
  out += held > 0 ? "the plan holds " + std::to_string(held) + " bytes of workspace for its runs"
                  : "no workspace held (the backend allocates none per run, or sizes it per call)";
  return out;
}

void Plan::release() { state_.reset(); }

void Plan::run(const Inputs& in, Tensor& out, void* stream) {
  const State& s = live();
  const Problem& p = s.problem;
  expect("q", in.q, s.q_dims, p.dtype, p.device);
  expect("out", out, s.q_dims, s.out_dtype, p.device);
  if (s.layout.form == Form::Paged) {
    expect("k_pages", in.k_pages, s.pages_dims, p.dtype, p.device, {}, /*skip_first=*/true);
    expect("v_pages", in.v_pages, s.pages_dims, p.dtype, p.device, {}, /*skip_first=*/true);
    if (in.k_pages.size(0) != in.v_pages.size(0)) {
      fail(ErrorKind::InvalidArgument,
           "v_pages has " + std::to_string(in.v_pages.size(0)) + " pages but k_pages " +
               std::to_string(in.k_pages.size(0)) + ": the two caches are one pool",
           {"v_pages"});
    }
    expect("block_table", in.block_table, s.table_dims, DType::I32, p.device, kTable);
    expect("seq_lens", in.kv_rows, s.kv_rows_dims, DType::I32, p.device, kLengths);
    expect_absent("q_rows", in.q_rows, s.layout);
  } else {
    expect("k", in.k, s.kv_dims, p.dtype, p.device);
    expect("v", in.v, s.kv_dims, p.dtype, p.device);
    expect_absent("block_table", in.block_table, s.layout);
    // A packed batch's lengths on the device are each run's own tensors (the
    // kernels read them); host lengths are the problem's.
    if (p.lengths_on_device) {
      expect("cu_seqlens_q", in.cu_seqlens_q, s.cu_dims, DType::I32, p.device, kCumulative);
      expect("cu_seqlens_k", in.cu_seqlens_k, s.cu_dims, DType::I32, p.device, kCumulative);
    } else {
      expect_absent("cu_seqlens_q", in.cu_seqlens_q, s.layout);
      expect_absent("cu_seqlens_k", in.cu_seqlens_k, s.layout);
    }
    if (s.layout.q_rows) {
      expect("q_rows", in.q_rows, s.q_rows_dims, DType::I32, p.device, kTable);
    } else {
      expect_absent("q_rows", in.q_rows, s.layout);
    }
    if (s.layout.kv_rows) {
      // (begin, end) pairs, or key ends alone ([1, 1, B, 1]: begin 0), as Inputs::kv_rows takes them.
      Dims pairs_or_ends = s.kv_rows_dims;
      if (in.kv_rows.defined() && in.kv_rows.size(3) == 1) pairs_or_ends[3] = 1;
      expect("kv_rows", in.kv_rows, pairs_or_ends, DType::I32, p.device, kTable);
    } else {
      expect_absent("kv_rows", in.kv_rows, s.layout);
    }
  }
  if (p.mask == MaskKind::Boolean && (!in.mask.defined() || in.mask.device() != p.device)) {
    fail(ErrorKind::InvalidArgument, "mask: the plan's Boolean mask must be given on its device", {"mask"});
  }
  if (p.mask == MaskKind::Bias && (!in.bias.defined() || in.bias.device() != p.device)) {
    fail(ErrorKind::InvalidArgument, "bias: the plan's bias mask must be given on its device", {"bias"});
  }
  RunContext ctx{*s.allocator, stream, s.threads, s.prepared.get()};
  const std::lock_guard lock(state_->running);
  s.backend->forward(p, in, out, ctx);
}

Plan plan(const Problem& problem, const BatchLayout& layout, std::string_view backend, int threads) {
  Problem p = problem;
  p.normalize().validate();
  check_layout(p, layout);
  check_pass(p);
  auto [b, how] = pick(p, planned(layout), backend);
  Plan made = plan(p, layout, *b, threads);
  made.state_->how = std::move(how);
  return made;
}

Plan plan(const Problem& problem, const BatchLayout& layout, Backend& backend, int threads, void* stream) {
  Problem p = problem;
  p.normalize().validate();
  check_layout(p, layout);
  check_pass(p);
  if (backend.device() != p.device) {
    fail(ErrorKind::InvalidArgument, "backend " + std::string(backend.name()) + " runs on " +
                                         std::string(device_name(backend.device())) + ", the problem on " +
                                         std::string(device_name(p.device)));
  }
  // The problem, the layout and the backend's traits in one answer
  // (eligibility_of, core): per-sequence rows, pages, packed lengths.
  const Eligibility e = eligibility_of(backend, p, planned(layout));
  if (!e.eligible) {
    fail(ErrorKind::Unsupported, "backend " + std::string(backend.name()) + " cannot run this problem: " + e.reason);
  }
  auto s = std::make_unique<Plan::State>();
  s->problem = p;
  s->layout = layout;
  s->backend = &backend;
  // The CPU's allocator directly: the CPU runtime would set the process's
  // thread counts, which a plan leaves to its caller.
  s->allocator = p.device == Device::Cpu ? &cpu_allocator() : &device_runtime(p.device).allocator();
  s->threads = threads;
  s->story = e.reason;
  s->how = "given";
  s->out_dtype = output_dtype(p.dtype);
  s->q_dims = p.q_dims();
  s->kv_dims = p.kv_dims();
  s->pages_dims = {0, p.kv_heads, p.page_size, p.head_dim};
  s->table_dims = {1, 1, p.batch, p.pages_per_seq()};
  s->q_rows_dims = {1, 1, p.batch, 2};
  s->kv_rows_dims = {1, 1, p.batch, layout.form == Form::Paged ? 1 : 2};
  s->cu_dims = {1, 1, 1, p.batch + 1};
  RunContext ctx{*s->allocator, stream, threads, nullptr};
  s->prepared = backend.prepare(p, ctx);
  Plan made;
  made.state_ = std::move(s);
  return made;
}

}  // namespace attnprof
