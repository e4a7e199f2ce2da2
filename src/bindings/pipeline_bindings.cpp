// The profiler's pipeline from Python: a Problem from keywords, compare,
// profile and explain with their reports, and the library's spellings and
// defaults (python/attnprof/__init__.py shapes what comes back).
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "attnprof/error.h"
#include "attnprof/problem_spec.h"
#include "attnprof/reference.h"
#include "attnprof/report.h"
#include "bindings/bindings.h"
#include "bindings/def_call.h"

namespace attnprof::python {
namespace {

// A problem from Python's keywords as typed values (None: the default;
// batch and heads the device's): the names read as the CLI reads them, every
// number and list as itself, each checked once by the library. The call's
// plain options it takes (call_options.h's kProblemTakes: those of what is
// computed) are its keywords too (def_call.h); a problem names its mask ("" is none).
void make_problem(const CallOptions& o, Problem* self, std::optional<std::int64_t> batch,
                  std::optional<std::int64_t> heads, std::optional<std::int64_t> kv_heads, std::int64_t seq,
                  std::optional<std::int64_t> kv_seq, std::int64_t head_dim, const std::string& dtype,
                  const std::string& device, const std::string& pass, std::optional<std::vector<std::int64_t>> seq_lens,
                  std::optional<std::vector<std::int64_t>> kv_seq_lens) {
  ProblemArgs a = problem_args(o, pass_from_text(pass));
  a.batch = batch;
  a.heads = heads;
  a.kv_heads = kv_heads;
  a.seq = seq;
  a.kv_seq = kv_seq;
  a.head_dim = head_dim;
  a.dtype = dtype_from_text(dtype);
  a.device = device_from_text(device);
  a.mask = mask_from_text(o.mask);
  a.seq_lens = std::move(seq_lens);
  a.kv_seq_lens = std::move(kv_seq_lens);
  new (self) Problem(problem_from_args(a));
}

// Ctrl-C during a long call: Python's handler only sets a flag while the
// library runs without the GIL, so each progress step takes the GIL and runs
// the handlers; a KeyboardInterrupt (or any exception they raise) unwinds
// the run as this exception, and is raised once the GIL is back (rethrow).
struct Interrupted {};

void check_signals(std::string_view) {
  nb::gil_scoped_acquire held;
  if (PyErr_CheckSignals() != 0) throw Interrupted{};
}

template <class Work>
auto interruptible(Work&& work) {
  try {
    nb::gil_scoped_release unlocked;
    return work();
  } catch (const Interrupted&) {
    throw nb::python_error();  // the error PyErr_CheckSignals set
  }
}

PipelineOptions make_options(const std::optional<std::string>& trace_dir, const std::optional<std::string>& json_path,
                             std::uint64_t seed, int threads, bool bshd, std::int64_t check_rows,
                             std::tuple<int, int, int, int> schedule, int unprofiled_calls,
                             const std::map<std::string, int>& expect, const std::string& sort_by, int row_limit,
                             const Problem& p, std::optional<double> fp8_descale) {
  PipelineOptions o;
  if (fp8_descale) {
    if (!is_fp8(p.dtype)) {
      fail(ErrorKind::InvalidArgument, "fp8_descale applies to dtype fp8 only", {"fp8_descale"});
    }
    check_fp8_descale("fp8_descale", *fp8_descale);
    o.run.fp8_descale = fp8_descale;
  }
  o.run.seed = seed;
  o.run.threads = threads;
  o.run.bshd_inputs = bshd;
  o.run.check_rows = check_rows;
  std::tie(o.run.schedule.wait, o.run.schedule.warmup, o.run.schedule.active, o.run.schedule.repeat) = schedule;
  o.run.unprofiled_calls = unprofiled_calls;
  o.run.progress = check_signals;
  for (const auto& [name, n] : expect) {
    check_backend_name("expect", name, /*auto_ok=*/false);
    o.guesses.emplace(name, n);
  }
  o.table = {.sort_by = sort_by, .row_limit = row_limit};
  if (trace_dir) o.trace_dir = *trace_dir;
  if (json_path) o.json_path = *json_path;
  return o;
}

}  // namespace

void bind_pipeline(nb::module_& m) {
  nb::class_<Problem> problem(m, "Problem");
  def_call<kProblemTakes>(problem, "__init__", &make_problem, nb::kw_only(), nb::arg("batch").none() = nb::none(),
                          nb::arg("heads").none() = nb::none(), nb::arg("kv_heads").none() = nb::none(), nb::arg("seq"),
                          nb::arg("kv_seq").none() = nb::none(), nb::arg("head_dim"), nb::arg("dtype"),
                          nb::arg("device"), nb::arg("pass_") = "forward", nb::arg("seq_lens").none() = nb::none(),
                          nb::arg("kv_seq_lens").none() = nb::none());
  problem.def("describe", &Problem::describe)
      .def_prop_ro("seq_lens", [](const Problem& p) { return p.seq_lens; })
      .def_prop_ro("kv_seq_lens", [](const Problem& p) { return p.kv_seq_lens; })
      .def_prop_ro("batch", [](const Problem& p) { return p.batch; })
      .def_prop_ro("seq", [](const Problem& p) { return p.seq; })
      .def("forward_flops", &Problem::forward_flops)
      .def("padded_forward_flops", [](const Problem& p) { return p.padded().forward_flops(); })
      .def("file_stem", &Problem::file_stem)
      .def("shape_key", &Problem::shape_key)
      .def("json", [](const Problem& p) { return problem_json(p); });

  nb::class_<PipelineReport>(m, "PipelineReport")
      .def_ro("device_description", &PipelineReport::device_description)
      .def_ro("tables", &PipelineReport::tables)
      .def_ro("collector_note", &PipelineReport::collector_note)
      .def_prop_ro("outputs",
                   [](const PipelineReport& r) {
                     std::vector<std::tuple<std::string, std::string, std::string>> out;
                     for (const auto& o : r.outputs) out.emplace_back(o.trace, o.table, o.summary);
                     return out;
                   })
      .def_prop_ro("problem_description", [](const PipelineReport& r) { return r.problem.describe(); })
      .def("accepted", &PipelineReport::accepted)
      .def("json", &PipelineReport::json)
      .def("compare_table", [](const PipelineReport& r) { return compare_table(r.results); });

  m.def(
      "compare",
      [](const Problem& p, const std::vector<std::string>& only, const std::optional<std::string>& trace_dir,
         const std::optional<std::string>& json_path, std::uint64_t seed, int threads, bool bshd,
         std::int64_t check_rows, std::tuple<int, int, int, int> schedule, int unprofiled_calls,
         const std::map<std::string, int>& expect, const std::string& sort_by, int row_limit,
         std::optional<double> fp8_descale) {
        const ThreadCountsKept kept;
        for (const auto& b : only) check_backend_name("backends", b, /*auto_ok=*/false);
        const PipelineOptions o = make_options(trace_dir, json_path, seed, threads, bshd, check_rows, schedule,
                                               unprofiled_calls, expect, sort_by, row_limit, p, fp8_descale);
        return after_runtime_use([&] { return interruptible([&] { return compare(p, o, only); }); });
      },
      nb::arg("problem"), nb::kw_only(), nb::arg("backends"), nb::arg("trace_dir").none(), nb::arg("json_path").none(),
      nb::arg("seed"), nb::arg("threads"), nb::arg("bshd"), nb::arg("check_rows"), nb::arg("schedule"),
      nb::arg("unprofiled_calls"), nb::arg("expect"), nb::arg("sort_by"), nb::arg("row_limit"),
      nb::arg("fp8_descale").none() = nb::none());

  m.def(
      "profile",
      [](const Problem& p, const std::string& backend, const std::optional<std::string>& trace_dir,
         const std::optional<std::string>& json_path, std::uint64_t seed, int threads, bool bshd,
         std::int64_t check_rows, std::tuple<int, int, int, int> schedule, int unprofiled_calls,
         const std::map<std::string, int>& expect, const std::string& sort_by, int row_limit,
         std::optional<double> fp8_descale) {
        const ThreadCountsKept kept;
        check_backend_name("backend", backend, /*auto_ok=*/true);
        const PipelineOptions o = make_options(trace_dir, json_path, seed, threads, bshd, check_rows, schedule,
                                               unprofiled_calls, expect, sort_by, row_limit, p, fp8_descale);
        return after_runtime_use([&] { return interruptible([&] { return profile(p, backend, o); }); });
      },
      nb::arg("problem"), nb::kw_only(), nb::arg("backend"), nb::arg("trace_dir").none(), nb::arg("json_path").none(),
      nb::arg("seed"), nb::arg("threads"), nb::arg("bshd"), nb::arg("check_rows"), nb::arg("schedule"),
      nb::arg("unprofiled_calls"), nb::arg("expect"), nb::arg("sort_by"), nb::arg("row_limit"),
      nb::arg("fp8_descale").none() = nb::none());

  // explain: (the --json document, the table, the device's description).
  m.def(
      "explain",
      [](const Problem& p, int threads) {
        check_threads(threads);
        const ThreadCountsKept kept;
        nb::gil_scoped_release unlocked;
        const ExplainReport e = after_runtime_use([&] { return explain_report(p, threads); });
        return std::make_tuple(e.json(), e.table(), e.device_description, e.auto_refusal);
      },
      nb::arg("problem"), nb::kw_only(), nb::arg("threads"));
  // What a call checks of its backend and thread count, for a caller that
  // takes them now and calls later (integrations.transformers.register).
  m.def(
      "check_call_args",
      [](const std::string& backend, int threads) {
        check_backend_name("backend", backend, /*auto_ok=*/true);
        check_threads(threads);
      },
      nb::kw_only(), nb::arg("backend"), nb::arg("threads"));

  m.def("backend_names", [] {
    std::vector<std::string> out;
    for (auto n : backend_names()) out.emplace_back(n);
    return out;
  });
  m.def("cuda_built", &cuda_built);
  // The library's spellings and defaults, so that Python keeps no copies.
  m.def(
      "is_bshd", [](const std::string& layout) { return layout_from_text(layout) == Layout::Bshd; }, nb::arg("layout"));
  m.def("defaults", [] {
    const Problem p;
    const RunOptions r;
    const TableOptions t;
    nb::dict d;
    d["seq"] = p.seq;
    d["head_dim"] = p.head_dim;
    d["dtype"] = std::string(dtype_name(p.dtype));
    d["mask"] = std::string(mask_name(p.mask));
    d["pass_"] = std::string(pass_name(p.pass));
    d["seed"] = r.seed;
    d["threads"] = r.threads;
    d["check_rows"] = r.check_rows;
    d["unprofiled_calls"] = r.unprofiled_calls;
    d["schedule"] = std::make_tuple(r.schedule.wait, r.schedule.warmup, r.schedule.active, r.schedule.repeat);
    d["sort_by"] = t.sort_by;
    d["row_limit"] = t.row_limit;
    return d;
  });
  // Bytes live in the library's own allocator on a device (the tests check
  // that a refused call leaves nothing behind).
  m.def(
      "allocated_bytes",
      [](const std::string& device) {
        const Device d = device_from_text(device);
        const ThreadCountsKept kept;
        return after_runtime_use([&] { return device_runtime(d).allocator().stats().allocated; });
      },
      nb::arg("device"));
}

}  // namespace attnprof::python
