// compare and profile as one library call each (attnprof/pipeline.h).
#include "attnprof/pipeline.h"

#include <algorithm>

#include "analysis/findings.h"
#include "attnprof/dispatch.h"
#include "attnprof/error.h"
#include "attnprof/parallel.h"
#include "attnprof/trace_io.h"
#include "report/report.h"

namespace attnprof {
namespace {

// Everything that can be refused without running: the table's sort, every
// output path. Nothing is computed, and nothing is written but directories.
void check_before_work(const PipelineOptions& o) {
  (void)key_averages_table(Trace{}, o.table);  // throws on a bad sort key
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
    rep.tables.push_back(ran ? key_averages_table(r.trace, o.table) : std::string());
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
  if (o.json_path) report::write_json_file(rep.json(), o.json_path->string());
  if (o.html_path) write_html_report(rep.html(title), *o.html_path);
  return rep;
}

}  // namespace

bool PipelineReport::accepted() const {
  return std::all_of(results.begin(), results.end(),
                     [](const RunResult& r) { return r.metrics.steps == 0 || !r.acceptance || r.acceptance->pass; });
}

nlohmann::json PipelineReport::json() const {
  std::optional<DeviceProperties> props;
  for (const auto& r : results) {
    if (r.trace.device) props = r.trace.device;
  }
  nlohmann::json j;
  j["device"] = report::device_json(device_description, props, problem.device);
  j["problem"] = report::problem_json(problem);
  j["results"] = nlohmann::json::array();
  for (const auto& r : results) j["results"].push_back(report::result_json(r));
  return j;
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
  check_before_work(o);
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
  check_before_work(o);
  if (o.gpus > 0) {
    check_ring(p, o.gpus, backend == "auto" ? std::string(kRingBackend) : backend);
    std::vector<RunResult> one;
    one.push_back(run_ring(p, o.gpus, o.run));
    if (one.front().failure)
      fail(ErrorKind::Device, backend + " on " + std::to_string(o.gpus) + " GPUs failed: " + *one.front().failure);
    return finish(p, std::move(one), o, "attnprof profile " + backend + " on " + std::to_string(o.gpus) + " GPUs");
  }
  if (backend == "auto") backend = choose_auto(p).backend;
  Backend* b = find_backend(backend, p.device);
  if (!b || !eligibility_of(*b, p).eligible) {
    for (const auto& e : explain(p)) {
      if (e.backend == backend)
        fail(ErrorKind::Unsupported, "backend " + backend + " cannot run this problem: " + e.reason);
    }
    fail(ErrorKind::Unsupported, "no backend named " + backend + " on " + device_name(p.device));
  }
  (void)device_runtime(p.device, o.run.threads);
  std::vector<RunResult> one;
  one.push_back(run_backend(*b, p, o.run));
  if (one.front().failure) fail(ErrorKind::Device, backend + " failed: " + *one.front().failure);
  return finish(p, std::move(one), o, "attnprof profile " + backend);
}

}  // namespace attnprof
