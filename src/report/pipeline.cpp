// compare, profile and explain as one library call each (attnprof/report.h).
#include <algorithm>

#include "analysis/findings.h"
#include "attnprof/environment.h"
#include "attnprof/error.h"
#include "attnprof/parallel.h"
#include "attnprof/report.h"
#include "attnprof/trace_io.h"
#include "report/json.h"

namespace attnprof {
namespace {

// Everything that can be refused without running: the table's sort, every
// output path, and outputs that would overwrite one another (--json onto
// --html, or onto a trace, table or summary of a backend the run may write).
// Nothing is computed, and nothing is written but directories.
void check_before_work(const Problem& p, const PipelineOptions& o) {
  (void)key_averages_table(Trace{}, o.table);  // throws on a bad sort key
  // The measuring variables, read when the run is measured: a bad one refused now, not after the run.
  (void)environment_real("ATTNPROF_CEILING_TFLOPS", kMaxCeilingTflops, "TFLOP/s");
  (void)environment_real("ATTNPROF_COPY_GBS", kMaxCopyGbs, "GB/s");
  // The run's counts, as the command line bounds them (a library caller,
  // Python's among them, gets the same refusals in field names).
  const auto within = [](const char* field, std::int64_t v, std::int64_t lo, std::int64_t hi) {
    if (v < lo || v > hi) {
      fail(ErrorKind::InvalidArgument, std::string(field) + " must be from " + std::to_string(lo) + " to " +
                                           std::to_string(hi) + ", got " + std::to_string(v));
    }
  };
  const Schedule& s = o.run.schedule;
  within("schedule.wait", s.wait, 0, 1000);
  within("schedule.warmup", s.warmup, 0, 1000);
  within("schedule.active", s.active, 1, 1000);
  within("schedule.repeat", s.repeat, 1, 100);
  within("threads", o.run.threads, 0, 4096);  // 0: every core
  within("check_rows", o.run.check_rows, 1, std::int64_t{1} << 24);
  within("unprofiled_calls", o.run.unprofiled_calls, 0, 10000);
  std::vector<NamedFile> outputs;
  if (o.json_path) outputs.push_back({"json_path", *o.json_path});
  if (o.html_path) outputs.push_back({"html_path", *o.html_path});
  if (o.trace_dir) {
    for (const std::string_view backend : backend_names()) {
      const std::string stem = output_stem(*o.trace_dir, p, backend).string();
      const std::string b(backend);
      outputs.push_back({"the " + b + " trace", stem + ".json"});
      outputs.push_back({"the " + b + " table", stem + ".txt"});
      outputs.push_back({"the " + b + " summary", stem + ".summary.json"});
    }
  }
  check_distinct_files(outputs);
  if (o.trace_dir) check_output_dir(*o.trace_dir, "trace_dir");
  if (o.json_path) check_output_file(*o.json_path, "json_path");
  if (o.html_path) {
    check_output_file(*o.html_path, "html_path");
    (void)find_plotly_js();  // throws: run scripts/setup.sh
  }
}

// Acceptance, findings, tables and per-backend files for results that ran.
PipelineReport finish(const Problem& p, std::vector<RunResult> results, const PipelineOptions& o,
                      const std::string& title) {
  PipelineReport rep;
  rep.problem = p;
  rep.device_description = device_runtime(p.device, o.run.threads).description();
  analysis::apply_acceptance(results);
  for (auto& r : results) r.findings = analysis::findings(r, results, o.guesses);
  rep.results = std::move(results);
  for (const RunResult& r : rep.results) {
    const bool ran = r.metrics.steps > 0;
    // Every recorded step's rows: a long schedule's trace holds its last steps only.
    const auto table = [&] {
      return r.key_averages.empty() ? key_averages_table(r.trace, o.table)
                                    : key_averages_table(r.key_averages, o.table);
    };
    rep.tables.push_back(ran ? table() : std::string());
    BackendOutputs out;
    if (ran && o.trace_dir) {
      const std::string stem = output_stem(*o.trace_dir, p, r.backend).string();
      out = {stem + ".json", stem + ".txt", stem + ".summary.json"};
      write_chrome_trace(r.trace, out.trace);
      write_file_atomically(out.table, rep.tables.back(), "table");
      nlohmann::json summary = report::result_json(r);
      summary["problem"] = report::problem_json(r.problem);
      summary["device"] = report::device_json(rep.device_description, r.trace.device, r.problem.device);
      summary["trace"] = out.trace;
      if (!r.trace.collector_note.empty()) summary["collector_note"] = r.trace.collector_note;
      report::write_json_file(summary, out.summary);
    }
    rep.outputs.push_back(std::move(out));
    if (!r.trace.collector_note.empty()) rep.collector_note = r.trace.collector_note;
  }
  if (o.json_path) write_file_atomically(*o.json_path, rep.json(), "JSON");
  if (o.html_path) write_html_report(rep.html(title), *o.html_path);
  return rep;
}

}  // namespace

bool PipelineReport::accepted() const {
  return std::all_of(results.begin(), results.end(),
                     [](const RunResult& r) { return r.metrics.steps == 0 || !r.acceptance || r.acceptance->pass; });
}

std::string PipelineReport::json() const {
  std::optional<DeviceProperties> props;
  for (const auto& r : results) {
    if (r.trace.device) props = r.trace.device;
  }
  nlohmann::json j;
  j["device"] = report::device_json(device_description, props, problem.device);
  j["problem"] = report::problem_json(problem);
  j["results"] = nlohmann::json::array();
  for (const auto& r : results) j["results"].push_back(report::result_json(r));
  return j.dump(2) + "\n";
}

HtmlReport PipelineReport::html(std::string title) const {
  HtmlReport h;
  h.title = std::move(title);
  h.subtitle = problem.describe();
  h.device = device_description;
  if (!collector_note.empty()) h.notes.push_back(collector_note);
  for (std::size_t i = 0; i < results.size(); ++i) {
    h.runs.push_back(
        {.label = results[i].backend, .result = &results[i], .table = i < tables.size() ? tables[i] : std::string()});
  }
  return h;
}

std::filesystem::path output_stem(const std::filesystem::path& dir, const Problem& p, std::string_view backend) {
  std::string name = p.file_stem();
  name += '_';
  name += backend;
  return dir / name;
}

PipelineReport compare(const Problem& p, const PipelineOptions& o, const std::vector<std::string>& only) {
  check_before_work(p, o);
  if (o.gpus > 0) {
    // Only flash shards: another backend asked for by name is refused.
    for (const auto& b : only) check_ring(p, o.gpus, b);
    check_ring(p, o.gpus);
    std::vector<RunResult> one;
    one.push_back(run_ring(p, o.gpus, o.run));
    return finish(p, std::move(one), o, "attnprof compare on " + std::to_string(o.gpus) + " GPUs");
  }
  (void)device_runtime(p.device, o.run.threads);  // no usable device: refused before any backend runs
  return finish(p, run_backends(p, o.run, only), o, "attnprof compare");
}

void PipelineReport::require_any_ran() const {
  if (std::any_of(results.begin(), results.end(), [](const RunResult& r) { return r.metrics.steps > 0; })) return;
  for (const auto& r : results) {
    if (r.failure) fail(ErrorKind::Device, "no backend ran: " + r.backend + " failed: " + *r.failure);
  }
  fail(ErrorKind::Unsupported, "no backend can run " + problem.describe() + " (attnprof explain says why)");
}

PipelineReport profile(const Problem& p, std::string backend, const PipelineOptions& o) {
  check_before_work(p, o);
  if (o.gpus > 0) {
    check_ring(p, o.gpus, backend == "auto" ? std::string(kRingBackend) : backend);
    std::vector<RunResult> one;
    one.push_back(run_ring(p, o.gpus, o.run));
    if (one.front().failure)
      fail(ErrorKind::Device, backend + " on " + std::to_string(o.gpus) + " GPUs failed: " + *one.front().failure);
    return finish(p, std::move(one), o, "attnprof profile " + backend + " on " + std::to_string(o.gpus) + " GPUs");
  }
  Backend& b = resolve_backend(p, backend);
  (void)device_runtime(p.device, o.run.threads);
  std::vector<RunResult> one;
  one.push_back(run_backend(b, p, o.run));
  const std::string name(b.name());
  if (one.front().failure) fail(ErrorKind::Device, name + " failed: " + *one.front().failure);
  return finish(p, std::move(one), o, "attnprof profile " + name);
}

ExplainReport explain_report(const Problem& p, int threads) {
  ExplainReport e;
  e.problem = p;
  e.rows = explain(p);
  DeviceRuntime& rt = device_runtime(p.device, threads);
  e.device_description = rt.description();
  e.cuda_build = cuda_build();
  e.device = rt.properties();
  try {
    e.chosen = choose_auto(p);
  } catch (const Error& err) {
    e.auto_refusal = err.what();
  }
  return e;
}

}  // namespace attnprof
