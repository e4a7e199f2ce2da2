// The report layer's public face: what compare, profile, explain, analyze and
// diff return, and their text, JSON and HTML forms. compare and profile run
// the backends (attnprof/runner.h), apply the acceptance rule and the
// findings rule table, and write each backend's trace, table and summary and
// the --json and --html documents; explain says who can take a problem. The
// attnprof command only parses, prints and writes what comes back; the Python
// package calls the same. JSON is handed out as text: no third-party type
// crosses this header.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnprof/analyze.h"
#include "attnprof/html.h"
#include "attnprof/key_averages.h"
#include "attnprof/record.h"
#include "attnprof/runner.h"

namespace attnprof {

// ---- compare and profile -----------------------------------------------------------

struct PipelineOptions {
  RunOptions run;
  Guesses guesses;     // --expect
  TableOptions table;  // the key-averages tables' sort and row limit
  // Where each backend's <stem>.json (Chrome trace), .txt (table) and
  // .summary.json go; none = write nothing per backend.
  std::optional<std::filesystem::path> trace_dir;
  std::optional<std::filesystem::path> json_path;  // the whole report as JSON
  // The HTML report (attnprof/html.h): one self-contained page. Checked,
  // with Plotly.js's presence, before any work.
  std::optional<std::filesystem::path> html_path;
  // --gpus N: flash as ring attention over N GPUs (attnprof/parallel.h);
  // 0 runs on one device as before.
  int gpus = 0;
};

// The files written for one backend.
struct BackendOutputs {
  std::string trace, table, summary;
};

struct PipelineReport {
  Problem problem;
  std::string device_description;       // "NVIDIA H200, driver ..., cuDNN 9.19.0"
  std::vector<RunResult> results;       // compare: every backend explain() lists, in order; profile: one
  std::vector<std::string> tables;      // per result: its key-averages table ("" where it did not run)
  std::vector<BackendOutputs> outputs;  // per result (empty paths where nothing was written)
  std::string collector_note;           // why a collector was unavailable, if one was

  // Every result that ran is within tolerance.
  bool accepted() const;
  // Throws Error(Device) naming a failure, or Error(Unsupported), when no
  // backend ran at all (compare reports that rather than throwing it).
  void require_any_ran() const;
  // The --json document's text: device, problem, results (the DESIGN.md schema).
  std::string json() const;
  // The --html page's input: one run per result, titled `title`. The report
  // must outlive it (the runs point into results).
  HtmlReport html(std::string title) const;
};

// Every backend (or those in `only`) on `p`. Throws Error for a bad output
// path or table sort before any work; a backend's failure lands in its result
// (require_any_ran() turns "none ran" into an error).
PipelineReport compare(const Problem& p, const PipelineOptions& o, const std::vector<std::string>& only = {});

// One backend ("auto" picks one). Throws Error when it cannot take `p` or fails.
PipelineReport profile(const Problem& p, std::string backend, const PipelineOptions& o);

// The stem of a backend's output files: <dir>/<batch>_<heads>_<seq>_<head_dim>_<backend>.
std::filesystem::path output_stem(const std::filesystem::path& dir, const Problem& p, std::string_view backend);

// ---- explain -----------------------------------------------------------------------

struct ExplainReport {
  Problem problem;
  std::vector<Explanation> rows;     // every backend, in display order
  std::optional<AutoChoice> chosen;  // what auto picks; empty when none can run
  std::string auto_refusal;          // why auto picks nothing (empty when it picks one)
  std::string device_description;
  std::optional<DeviceProperties> device;
  std::string cuda_build;  // cuda_build(): which CUDA backends this build has

  std::string table() const;  // what `attnprof explain` prints
  std::string json() const;   // its --json text: device, problem, each backend's eligibility, auto's pick
};

// Each backend's eligibility for `p` and auto's pick on `p`'s device (CPU
// threads `threads`, 0 = all). Throws Error(Unsupported) when the device is
// not there.
ExplainReport explain_report(const Problem& p, int threads = 0);

// ---- text and JSON -----------------------------------------------------------------

// compare's at-a-glance table: per result its counts, times, memory,
// TFLOP/s, error and occupancy, and the findings under it.
std::string compare_table(const std::vector<RunResult>& results);
// profile's lines under its key-averages table: per call of the pass the
// activities, copies, times and peak memory, the error against float64, the findings.
std::string profile_summary(const RunResult& r);
// The problem as the --json documents write it.
std::string problem_json(const Problem& p);

// The rows per table analysis_text and diff_text show: 1 to kMaxTop, the
// one limit every front end takes. check_top throws Error(InvalidArgument)
// naming "top" for any other, before any work.
inline constexpr int kMaxTop = 100000;
void check_top(std::int64_t top);
// What analyze prints: per trace, the at-a-glance table of its steps with
// their findings, then each step's top-level ops and top `top` kernels.
std::string analysis_text(const TraceAnalysis& a, int top = 10);
// {"traces": [{"path", "device", "steps": [{"label", "metrics", "kernels",
// "memcpys", "memsets", ..., "ops": [...], "kernels_by_time": [...],
// "findings": [finding records]}]}]}
std::string analysis_json(const std::vector<TraceAnalysis>& analyses);

// What diff prints: totals side by side, kernels that appeared or vanished,
// the `top` largest changes per kernel and per op, findings on one side only.
std::string diff_text(const TraceDiff& d, int top = 15);
std::string diff_json(const TraceDiff& d);

// The HTML report's content (attnprof/html.h) for analyze (one run per step
// of each trace) and for diff (its rows, then each side's steps). The runs
// point into `analyses` / `d`, which must outlive the report.
HtmlReport analysis_html(const std::vector<TraceAnalysis>& analyses);
HtmlReport diff_html(const TraceDiff& d);

}  // namespace attnprof
