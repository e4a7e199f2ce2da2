// analyze at scale: writes a torch.profiler-shaped trace of about a million
// events (tests/common/kineto_trace.h: naive attention forwards, a thousand
// per ProfilerStep, with python_function events and flow arrows as Kineto
// writes them), then times reading it and analysing every step, and reports
// the peak resident memory. docs/perf/analyze-scale.md records its figures.
//
// --graph writes a decode loop under CUDA graphs instead (kineto_graph_trace:
// 32 layers captured once, then replayed, each replay a step whose attention
// is tied to the capture), the trace issue 59's target is read on;
// --no-graph-ids writes it as PyTorch 2.11's Kineto with CUDA 13 does, with
// no graph or node ids (analyze numbers the replays from their launches).
//
//   analyze_scale [--events N] [--gzip] [--graph [--no-graph-ids]] [--keep PATH]
#include <sys/resource.h>
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "attnprof/analyze.h"
#include "attnprof/trace_reader.h"
#include "common/kineto_trace.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // KiB on Linux
}

}  // namespace

int main(int argc, char** argv) {
  long events = 1'000'000;
  bool gzip = false, graph = false, no_graph_ids = false;
  std::string keep;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--events" && i + 1 < argc) {
      events = std::atol(argv[++i]);
    } else if (a == "--gzip") {
      gzip = true;
    } else if (a == "--graph") {
      graph = true;
    } else if (a == "--no-graph-ids") {
      no_graph_ids = true;
    } else if (a == "--keep" && i + 1 < argc) {
      keep = argv[++i];
    } else {
      std::fprintf(stderr, "usage: analyze_scale [--events N] [--gzip] [--graph [--no-graph-ids]] [--keep PATH]\n");
      return 2;
    }
  }
  // One layer writes 37 events (12 ops, 6 launches with their device record
  // and two flow arrows, one python_function).
  constexpr int kEventsPerLayer = 37, kLayersPerStep = 1000;
  const int layers = static_cast<int>(events / kEventsPerLayer);
  attnprof::testing::KinetoTraceSpec spec;
  spec.steps = std::max(1, layers / kLayersPerStep);
  spec.layers_per_step = std::min(layers, kLayersPerStep);

  // A graph replay of 32 layers writes 10 events a layer (5 nodes, each with
  // its flow arrow) and 6 around it (its step, the argmax, the launches).
  attnprof::testing::KinetoGraphSpec graph_spec;
  graph_spec.layers = 32;
  graph_spec.replays = std::max(1, static_cast<int>(events / (graph_spec.layers * 10 + 6)));
  graph_spec.no_graph_ids = no_graph_ids;
  const auto t_gen = std::chrono::steady_clock::now();
  std::string text = graph ? attnprof::testing::kineto_graph_trace(graph_spec) : attnprof::testing::kineto_trace(spec);
  namespace fs = std::filesystem;
  const fs::path path = keep.empty()
                            ? fs::temp_directory_path() / (gzip ? "attnprof_scale.json.gz" : "attnprof_scale.json")
                            : fs::path(keep);
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb6");
    gzwrite(f, text.data(), static_cast<unsigned>(text.size()));
    gzclose(f);
  } else {
    std::ofstream(path, std::ios::binary) << text;
  }
  const double json_mb = static_cast<double>(text.size()) / 1e6;
  const double file_mb = static_cast<double>(fs::file_size(path)) / 1e6;
  std::printf("generated %d %s x %d layers: %.1f MB of JSON, file %.1f MB (%.1f s)\n",
              graph ? graph_spec.replays : spec.steps, graph ? "graph replays" : "steps",
              graph ? graph_spec.layers : spec.layers_per_step, json_mb, file_mb, seconds_since(t_gen));
  const double rss_before = peak_rss_mib();
  std::string().swap(text);  // the reader gets the file alone

  const auto t0 = std::chrono::steady_clock::now();
  attnprof::Trace trace = attnprof::read_chrome_trace(path);
  const double read_s = seconds_since(t0);
  const std::size_t kept = trace.activities.size();
  const auto t1 = std::chrono::steady_clock::now();
  const attnprof::TraceAnalysis a = attnprof::analyze_trace(std::move(trace), path.string());
  const double analyse_s = seconds_since(t1);
  std::size_t findings = 0;
  for (const auto& s : a.steps) findings += s.result.findings.size();
  std::printf("read: %.2f s (%.0f MB/s), %zu events kept of about %ld\n", read_s, json_mb / read_s, kept,
              graph ? static_cast<long>(graph_spec.replays) * (graph_spec.layers * 10 + 6)
                    : static_cast<long>(layers) * kEventsPerLayer);
  std::printf("analyse: %.2f s for %zu steps, %zu findings\n", analyse_s, a.steps.size(), findings);
  std::printf("total: %.2f s; peak RSS %.0f MiB (%.0f MiB before reading, the generated text included)\n",
              read_s + analyse_s, peak_rss_mib(), rss_before);
  if (keep.empty()) fs::remove(path);
  return 0;
}
