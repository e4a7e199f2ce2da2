#include "cli/commands.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

#include "attnprof/error.h"
#include "attnprof/replay.h"
#include "attnprof/report.h"
#include "attnprof/runner.h"
#include "attnprof/trace_io.h"

namespace attnprof::cli {
namespace {

// Progress on stderr once a run has taken more than a moment. On a terminal
// one line rewritten in place; elsewhere (a log, a pipe) a line each. A
// message that only moves a counter ("naive: step 812/100100") is a repeat of
// the last one's phase: on a terminal it is shown at most 10 times a second,
// elsewhere at most once in 2 seconds, so a 100,000-step run logs a handful
// of lines, not one per step; a new phase waits a quarter second at most.
class Progress {
 public:
  explicit Progress(bool quiet) : quiet_(quiet), tty_(::isatty(2)), start_(Clock::now()) {}
  ~Progress() { clear(); }

  void operator()(std::string_view msg) {
    if (quiet_) return;
    const auto now = Clock::now();
    const double s = seconds(now - start_);
    if (s < 0.5) return;
    const std::string_view phase = phase_of(msg);
    const bool repeat = phase == last_phase_;
    const double since = shown_any_ ? seconds(now - last_shown_) : 1e9;
    if (since < (repeat ? (tty_ ? 0.1 : 2.0) : (tty_ ? 0.0 : 0.25))) return;
    if (tty_) {
      std::fprintf(stderr, "\r\033[K[%5.1fs] %.*s", s, static_cast<int>(msg.size()), msg.data());
      shown_ = true;
    } else {
      std::fprintf(stderr, "[%5.1fs] %.*s\n", s, static_cast<int>(msg.size()), msg.data());
    }
    std::fflush(stderr);
    last_phase_.assign(phase);
    last_shown_ = now;
    shown_any_ = true;
  }
  void clear() {
    if (shown_) std::fprintf(stderr, "\r\033[K");
    shown_ = false;
  }

 private:
  using Clock = std::chrono::steady_clock;
  static double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
  // The message without its trailing counter ("naive: step 3/10" -> "naive: step ").
  static std::string_view phase_of(std::string_view msg) {
    std::size_t n = msg.size();
    while (n > 0 && (std::isdigit(static_cast<unsigned char>(msg[n - 1])) || msg[n - 1] == '/')) --n;
    return msg.substr(0, n);
  }

  bool quiet_, tty_, shown_ = false, shown_any_ = false;
  Clock::time_point start_, last_shown_;
  std::string last_phase_;
};

RunOptions run_options(const Options& o, Progress& progress) {
  RunOptions r = o.run;
  r.progress = [&progress](std::string_view m) { progress(m); };
  return r;
}

PipelineOptions pipeline_options(const Options& o, Progress& progress) {
  return {.run = run_options(o, progress),
          .guesses = o.guesses,
          .table = o.table,
          .trace_dir = o.trace_dir,
          .json_path = o.json_path ? std::optional<std::filesystem::path>(*o.json_path) : std::nullopt,
          .html_path = o.html_path ? std::optional<std::filesystem::path>(*o.html_path) : std::nullopt,
          .gpus = o.gpus};
}

void print_header(const std::string& what, const Problem& p, const std::string& device_desc) {
  std::printf("%s: %s\ndevice: %s\n\n", what.c_str(), p.describe().c_str(), device_desc.c_str());
}

}  // namespace

int run_profile(const Options& o) {
  const Problem& p = o.problem;
  Progress progress(o.quiet);
  const PipelineReport rep = profile(p, o.backend, pipeline_options(o, progress));
  progress.clear();
  const RunResult& r = rep.results.front();
  if (o.backend == "auto") std::printf("auto picked %s\n", r.backend.c_str());
  print_header("profile " + r.backend, p, rep.device_description);
  std::printf("%s\n", rep.tables.front().c_str());
  if (!rep.collector_note.empty()) std::printf("note: %s\n", rep.collector_note.c_str());
  std::printf("%s", profile_summary(r).c_str());
  std::printf("wrote %s.{json,txt,summary.json}\n", output_stem(o.trace_dir, p, r.backend).c_str());
  if (o.html_path) std::printf("wrote the HTML report to %s\n", o.html_path->c_str());
  return rep.accepted() ? kExitOk : kExitInaccurate;
}

int run_compare(const Options& o) {
  const Problem& p = o.problem;
  Progress progress(o.quiet);
  const PipelineReport rep = compare(p, pipeline_options(o, progress), o.backends);
  progress.clear();
  print_header("compare", p, rep.device_description);
  std::printf("%s", compare_table(rep.results).c_str());
  for (const auto& r : rep.results) {
    if (r.metrics.steps > 0 && r.acceptance && !r.acceptance->pass) {
      std::printf("\n%s: error over tolerance: %s", r.backend.c_str(), r.acceptance->why.c_str());
    }
  }
  if (!rep.collector_note.empty()) std::printf("\nnote: %s", rep.collector_note.c_str());
  std::printf(
      "\nerror: relative to a float64 reference on sampled rows; a 16-bit backend passes at <= 2 x math's error "
      "+ a floor%s.",
      is_fp8(p.dtype) ? " (fp8: against the real bf16 inputs' reference, math in FP8 semantics, floor 3.6e-2; "
                        "bf16 error: the same backend on those inputs in bf16)"
                      : "");
  // The files of the backends that ran (none when none did).
  const bool any_ran =
      std::any_of(rep.results.begin(), rep.results.end(), [](const RunResult& r) { return r.metrics.steps > 0; });
  if (any_ran) {
    std::printf(" Traces, tables and summaries of the backends that ran: %s/%s_<backend>.{json,txt,summary.json}\n",
                o.trace_dir.c_str(), p.file_stem().c_str());
  } else {
    std::printf(" No backend ran: no trace, table or summary was written.\n");
  }
  if (o.html_path) std::printf("HTML report: %s\n", o.html_path->c_str());
  rep.require_any_ran();  // the table and JSON said what happened to each backend
  return rep.accepted() ? kExitOk : kExitInaccurate;
}

int run_explain(const Options& o) {
  if (o.json_path) check_output_file(*o.json_path, "--json");
  const ExplainReport e = explain_report(o.problem, o.run.threads);
  if (!e.auto_refusal.empty()) std::printf("auto: %s\n", e.auto_refusal.c_str());
  print_header("explain", o.problem, e.device_description);
  std::printf("%s", e.table().c_str());
  if (o.json_path) write_file_atomically(*o.json_path, e.json(), "JSON");
  return kExitOk;
}

namespace {

AnalyzeOptions analyze_options(const Options& o) {
  AnalyzeOptions a;
  a.read.max_bytes = static_cast<std::uint64_t>(o.max_gib) << 30;
  a.ceiling_tflops = o.ceiling_tflops;  // unset: the library reads ATTNPROF_CEILING_TFLOPS
  return a;
}

}  // namespace

// --json and --html checked, and Plotly found, before any trace is read:
// neither may be the other, nor one of the traces read.
void check_trace_outputs(const Options& o) {
  std::vector<NamedFile> files;
  if (o.json_path) files.push_back({"--json", *o.json_path});
  if (o.html_path) files.push_back({"--html", *o.html_path});
  for (const auto& t : o.traces) {
    if (t != "-") files.push_back({"the trace", t, /*output=*/false});
  }
  check_distinct_files(files);
  if (o.json_path) check_output_file(*o.json_path, "--json");
  if (o.html_path) {
    check_output_file(*o.html_path, "--html");
    (void)find_plotly_js();
  }
}

int run_analyze(const Options& o) {
  check_trace_outputs(o);
  // Every trace is read and analysed before anything is printed or written:
  // one unreadable file stops the command with its one line.
  std::vector<TraceAnalysis> all;
  for (std::size_t i = 0; i < o.traces.size(); ++i) {
    AnalyzeOptions a = analyze_options(o);
    a.step = o.trace_steps[i];
    all.push_back(analyze_trace(read_chrome_trace(o.traces[i], a.read), o.traces[i], a));
  }
  if (o.replay) {
    Progress progress(o.quiet);
    ReplayOptions r;
    if (o.device_given) r.device = o.problem.device;
    r.backends = o.backends;
    r.cpu_max_gflop = o.replay_max_gflop;
    r.run.threads = o.run.threads;
    r.run.progress = [&progress](std::string_view m) { progress(m); };
    for (auto& a : all) replay_attention(a, r);
    progress.clear();
  }
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (i > 0) std::printf("\n");
    std::printf("%s", analysis_text(all[i], o.top).c_str());
  }
  if (o.json_path) write_file_atomically(*o.json_path, analysis_json(all), "JSON");
  if (o.html_path) write_html_report(analysis_html(all), *o.html_path);
  return kExitOk;
}

int run_diff(const Options& o) {
  check_trace_outputs(o);
  const TraceDiff d = diff_traces({o.traces[0], o.trace_steps[0]}, {o.traces[1], o.trace_steps[1]}, analyze_options(o));
  std::printf("%s", diff_text(d, o.top).c_str());
  if (o.json_path) write_file_atomically(*o.json_path, diff_json(d), "JSON");
  if (o.html_path) write_html_report(diff_html(d), *o.html_path);
  return kExitOk;
}

}  // namespace attnprof::cli
