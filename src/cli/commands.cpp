#include "cli/commands.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "analysis/findings.h"
#include "attnprof/dispatch.h"
#include "attnprof/error.h"
#include "attnprof/key_averages.h"
#include "attnprof/runner.h"
#include "attnprof/trace_io.h"
#include "analysis/format.h"
#include "report/report.h"

namespace attnprof::cli {
namespace {

// Progress on stderr once a run has taken more than a moment.
class Progress {
 public:
  explicit Progress(bool quiet) : quiet_(quiet), tty_(::isatty(2)), start_(std::chrono::steady_clock::now()) {}
  ~Progress() { clear(); }

  void operator()(std::string_view msg) {
    if (quiet_) return;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (s < 0.5) return;
    if (tty_) {
      std::fprintf(stderr, "\r\033[K[%5.1fs] %.*s", s, static_cast<int>(msg.size()), msg.data());
      shown_ = true;
    } else {
      std::fprintf(stderr, "[%5.1fs] %.*s\n", s, static_cast<int>(msg.size()), msg.data());
    }
    std::fflush(stderr);
  }
  void clear() {
    if (shown_) std::fprintf(stderr, "\r\033[K");
    shown_ = false;
  }

 private:
  bool quiet_, tty_, shown_ = false;
  std::chrono::steady_clock::time_point start_;
};

// Every output path is checked before any work starts.
void check_outputs(const Options& o, bool traces) {
  if (traces) check_output_dir(o.trace_dir, "--trace-dir");
  if (o.json_path) check_output_file(*o.json_path, "--json");
}

RunOptions run_options(const Options& o, Progress& progress) {
  RunOptions r;
  r.schedule = o.schedule;
  r.seed = o.seed;
  r.threads = o.threads;
  r.bshd_inputs = o.bshd;
  r.check_rows = o.check_rows;
  r.unprofiled_calls = o.unprofiled_calls;
  r.progress = [&progress](std::string_view m) { progress(m); };
  return r;
}

std::string stem(const Options& o, const std::string& backend) {
  return (std::filesystem::path(o.trace_dir) / (o.problem.shape_key() + "_" + backend)).string();
}

void write_outputs(const Options& o, const RunResult& r, const std::string& table, const std::string& device_desc) {
  const std::string s = stem(o, r.backend);
  write_chrome_trace(r.trace, s + ".json");
  write_file_atomically(s + ".txt", table, "table");
  nlohmann::json summary = report::result_json(r);
  summary["problem"] = report::problem_json(r.problem);
  summary["device"] = report::device_json(device_desc, r.trace.device, r.problem.device);
  summary["trace"] = s + ".json";
  if (!r.trace.collector_note.empty()) summary["collector_note"] = r.trace.collector_note;
  report::write_json_file(summary, s + ".summary.json");
}

TableOptions table_options(const Options& o) { return {.sort_by = o.sort, .row_limit = o.row_limit}; }

void print_header(const std::string& what, const Problem& p, const std::string& device_desc) {
  std::printf("%s: %s\ndevice: %s\n\n", what.c_str(), p.describe().c_str(), device_desc.c_str());
}

}  // namespace

int run_profile(const Options& o) {
  (void)key_averages_table(Trace{}, table_options(o));  // rejects a bad --sort before any work
  check_outputs(o, /*traces=*/true);
  const Problem& p = o.problem;
  std::string name = o.backend;
  if (name == "auto") {
    name = choose_auto(p).backend;
    std::printf("auto picked %s\n", name.c_str());
  }
  Backend* b = find_backend(name, p.device);
  if (!b || !b->eligibility(p).eligible) {
    for (const auto& e : explain(p)) {
      if (e.backend == name) fail(ErrorKind::Unsupported, "backend " + name + " cannot run this problem: " + e.reason);
    }
  }
  DeviceRuntime& rt = device_runtime(p.device, o.threads);
  Progress progress(o.quiet);
  RunResult r = run_backend(*b, p, run_options(o, progress));
  progress.clear();
  if (r.failure) fail(ErrorKind::Device, name + " failed: " + *r.failure);
  std::vector<RunResult> none;
  r.findings = analysis::findings(r, none, o.guesses);
  const std::string table = key_averages_table(r.trace, table_options(o));
  print_header("profile " + name, p, rt.description());
  std::printf("%s\n", table.c_str());
  if (!r.trace.collector_note.empty()) std::printf("note: %s\n", r.trace.collector_note.c_str());
  std::string unprofiled;
  if (const Metrics& m = r.metrics; m.host_time_unprofiled_us) {
    unprofiled = analysis::format(" (%.1f us with no profiler attached", *m.host_time_unprofiled_us);
    if (m.host_time_unprofiled_p10_us && m.host_time_unprofiled_p90_us) {
      unprofiled += analysis::format(", p10-p90 %.1f", *m.host_time_unprofiled_p10_us) +
                    analysis::format("-%.1f", *m.host_time_unprofiled_p90_us);
    }
    unprofiled += ")";
  }
  std::printf("per forward: %s %.1f, copies %.0f, time %.1f us, host %.1f us%s, peak %.1f MiB\n",
              p.device == Device::Cuda ? "GPU activities" : "ops",
              p.device == Device::Cuda ? r.metrics.kernels_per_forward.value_or(0) : r.metrics.ops_per_forward,
              r.metrics.copies_per_forward, r.metrics.device_time_us.value_or(0), r.metrics.host_time_us,
              unprofiled.c_str(), static_cast<double>(r.metrics.peak_bytes) / (1024.0 * 1024.0));
  if (r.error && r.acceptance) {
    std::printf("error vs float64: %s (%s)\n", r.acceptance->pass ? "ok" : "OVER TOLERANCE", r.acceptance->why.c_str());
  }
  for (const auto& f : r.findings) std::printf("- %s\n", f.text.c_str());
  write_outputs(o, r, table, rt.description());
  std::printf("wrote %s.{json,txt,summary.json}\n", stem(o, name).c_str());
  return r.acceptance && !r.acceptance->pass ? kExitInaccurate : kExitOk;
}

int run_compare(const Options& o) {
  (void)key_averages_table(Trace{}, table_options(o));
  check_outputs(o, /*traces=*/true);
  const Problem& p = o.problem;
  DeviceRuntime& rt = device_runtime(p.device, o.threads);
  Progress progress(o.quiet);
  std::vector<RunResult> results = run_backends(p, run_options(o, progress), o.backends);
  progress.clear();
  analysis::apply_acceptance(results);
  for (auto& r : results) r.findings = analysis::findings(r, results, o.guesses);

  print_header("compare", p, rt.description());
  std::printf("%s", report::compare_table(results).c_str());
  bool inaccurate = false;
  std::string note;
  for (const auto& r : results) {
    if (r.metrics.steps == 0) continue;
    write_outputs(o, r, key_averages_table(r.trace, table_options(o)), rt.description());
    if (r.acceptance && !r.acceptance->pass) {
      inaccurate = true;
      std::printf("\n%s: error over tolerance: %s", r.backend.c_str(), r.acceptance->why.c_str());
    }
    if (!r.trace.collector_note.empty()) note = r.trace.collector_note;
  }
  if (!note.empty()) std::printf("\nnote: %s", note.c_str());
  std::printf(
      "\nerror: relative to a float64 reference on sampled rows; a 16-bit backend passes at <= 2 x math's error "
      "+ a floor. Traces, tables and summaries: %s/%s_<backend>.{json,txt,summary.json}\n",
      o.trace_dir.c_str(), p.shape_key().c_str());
  if (o.json_path) {
    nlohmann::json j;
    std::optional<DeviceProperties> props;
    for (const auto& r : results) {
      if (r.trace.device) props = r.trace.device;
    }
    j["device"] = report::device_json(rt.description(), props, p.device);
    j["problem"] = report::problem_json(p);
    j["results"] = nlohmann::json::array();
    for (const auto& r : results) j["results"].push_back(report::result_json(r));
    report::write_json_file(j, *o.json_path);
  }
  // The table and JSON say what happened to each backend; when none of them
  // ran, the command as a whole failed.
  if (std::none_of(results.begin(), results.end(), [](const RunResult& r) { return r.metrics.steps > 0; })) {
    for (const auto& r : results) {
      if (r.failure) fail(ErrorKind::Device, "no backend ran: " + r.backend + " failed: " + *r.failure);
    }
    fail(ErrorKind::Unsupported, "no backend can run " + p.describe() + " (attnprof explain says why)");
  }
  return inaccurate ? kExitInaccurate : kExitOk;
}

int run_explain(const Options& o) {
  check_outputs(o, /*traces=*/false);
  const Problem& p = o.problem;
  const auto rows = explain(p);
  std::optional<AutoChoice> chosen;
  try {
    chosen = choose_auto(p);
  } catch (const Error& e) {
    std::printf("auto: %s\n", e.what());
  }
  DeviceRuntime& rt = device_runtime(p.device, o.threads);
  print_header("explain", p, rt.description());
  std::printf("%s", report::explain_table(rows, chosen ? &*chosen : nullptr).c_str());
  if (o.json_path) {
    nlohmann::json j;
    j["device"] = report::device_json(rt.description(), rt.properties(), p.device);
    j["problem"] = report::problem_json(p);
    j["results"] = nlohmann::json::array();
    for (const auto& e : rows) {
      j["results"].push_back({{"backend", e.backend}, {"eligible", e.eligible}, {"reason", e.reason}});
    }
    j["auto"] =
        chosen ? nlohmann::json{{"backend", chosen->backend}, {"reason", chosen->reason}} : nlohmann::json(nullptr);
    report::write_json_file(j, *o.json_path);
  }
  return kExitOk;
}

}  // namespace attnprof::cli
