// compare and profile behind one call each: refuse bad outputs before any
// work, run the backends under the profiler, apply the acceptance rule, run
// the findings rules, write each backend's trace, table and summary, and the
// --json document. The attnprof command only parses, prints and writes what
// comes back; the Python package and the HTML report call the same.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "attnprof/findings.h"
#include "attnprof/html.h"
#include "attnprof/key_averages.h"
#include "attnprof/runner.h"

namespace attnprof {

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
  // The --json document: device, problem, results (the DESIGN.md schema).
  nlohmann::json json() const;
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

}  // namespace attnprof
