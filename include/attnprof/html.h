// The HTML report: one self-contained page (Plotly.js and every figure
// inlined, so it opens from disk with no network) for a list of runs. compare
// gives one run per backend; analyze and diff one per trace or profiler step.
//
// The page shows, per run, the CPU and GPU timeline of one profiler step on
// one time axis; bars of time, kernels (or ops) per forward, peak memory and
// error across runs; a roofline (TFLOP/s against arithmetic intensity under
// the measured ceiling and the memory-bandwidth line); the findings with the
// events they cite (a click marks the event on its timeline); the
// key-averages tables; and, for diff, the rows that changed.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnprof/record.h"

namespace attnprof {

// One run on the page. `result` must outlive the call; nothing is copied.
struct HtmlRun {
  std::string label;                  // "naive", "trace a.json step 3"; empty: result->backend
  const RunResult* result = nullptr;  // runs that did not run (steps == 0) appear with their reason only
  std::string table{};                // its key-averages table; empty: computed from result->trace
  // Bytes one forward moves to and from memory, for the roofline; empty: the
  // model below (html_bytes_moved). A caller that knows better (a trace
  // reader with no Problem) sets it, or leaves metrics.tflops empty to draw
  // no point.
  std::optional<double> bytes_moved{};
  // analyze: a JSON object drawn under the run (its attention calls and the
  // replay, its top kernels' durations, its memory over time); empty: none.
  std::string extra_json{};
};

// One line of `attnprof diff`: something that differs between run A and run B.
struct HtmlDiffRow {
  std::string kind;  // "kernel", "op", "memory", "finding" ...
  std::string name;  // the kernel, op or finding
  std::optional<double> a{}, b{};
  std::string unit;    // "us", "B", "count"; how a and b read
  std::string note{};  // "appeared", "vanished", "2.1x slower" ...
};

struct HtmlReport {
  std::string title;     // "attnprof compare"
  std::string subtitle;  // the problem, the traces compared ...
  std::string device;    // "NVIDIA H200, driver ..."
  std::vector<HtmlRun> runs;
  std::vector<HtmlDiffRow> diff;           // diff only; the section is left out when empty
  std::vector<std::string> notes;          // lines shown under the title (collector notes ...)
  std::string diff_a = "A", diff_b = "B";  // the two sides' names, diff only
  // analyze and diff: the runs are steps of traces from elsewhere, so only
  // what a trace holds is drawn (no bars of error against float64 or peak
  // memory it lacks, no roofline of runs without a FLOP count).
  bool from_traces = false;
};

// The roofline's bytes model for one forward, when HtmlRun::bytes_moved is
// empty: Q, K and V read once and O written once. A decomposed forward (three
// or more top-level ops per forward: two matrix products and a softmax at
// least; naive, naive_inplace, math) materialises the [S, Skv] scores too:
// written by the first matrix product, read and written once by each of the
// three elementwise steps (scale, mask, softmax), read by the second product,
// and read and written once more per copy per forward: (8 + 2 x copies) x
// B x H x S x Skv x element size, FP32 elements where the backend computes
// in FP32 (Traits::reference_precision, and every composite on fp8 inputs;
// their O is bf16). A lower bound on the traffic (caches
// and extra passes only add to it), so the intensity drawn is an upper bound.
double html_bytes_moved(const RunResult& r);

// The page as text. `plotly_js` is the Plotly.js bundle inlined into it.
std::string html_report(const HtmlReport& report, std::string_view plotly_js);

// Where Plotly.js is: $ATTNPROF_PLOTLY_JS when set (and then only there);
// else <prefix>/share/attnprof/plotly.min.js beside an installed attnprof,
// then the source tree's third_party/plotly/ (scripts/setup.sh fetches it
// there). Throws Error(Unsupported) in one line saying to run
// scripts/setup.sh when none has it.
std::filesystem::path find_plotly_js();

// html_report with Plotly.js from find_plotly_js(), written all at once
// (write_file_atomically). Throws Error(Io) or Error(Unsupported).
void write_html_report(const HtmlReport& report, const std::filesystem::path& path);

}  // namespace attnprof
