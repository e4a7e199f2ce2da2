// Writes the test fixtures that only a hand-built trace can give on a machine
// without a GPU, for the browser test (tests/browser/) and the Holistic Trace
// Analysis test (tests/hta/):
//
//   report_fixtures html FILE        an HTML report built from a hand-made
//                                    RunResult list, as analyze and diff will
//                                    build one: GPU-shaped runs, findings
//                                    citing events, a run that did not run,
//                                    diff rows, names that need escaping,
//                                    figures orders of magnitude apart,
//                                    errors exact, NaN and not checked, and
//                                    six roofline points nearly on one spot
//   report_fixtures gpu-trace FILE   a Chrome trace of four profiler steps of
//                                    the synthetic GPU forward, through our
//                                    writer (write_chrome_trace)
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include "analysis/trace_index.h"
#include "attnprof/html.h"
#include "attnprof/trace_io.h"
#include "cpu/synthetic_trace.h"

namespace {

using namespace attnprof;

// The synthetic forward repeated `steps` times, 1 ms apart, each in its own
// ProfilerStep#N with its own correlation and external ids.
Trace gpu_trace(int steps) {
  const Trace one = testing::attention_trace();
  Trace t = one;
  t.activities.clear();
  t.steps_recorded = steps;
  t.name = "8_16_1024_64_naive_gpu_shaped";
  for (int s = 0; s < steps; ++s) {
    for (Activity a : one.activities) {
      a.start_ns += s * 1'000'000LL;
      a.step = s;
      if (a.correlation) a.correlation += 100ULL * static_cast<unsigned>(s);
      if (a.external_id) a.external_id += 100ULL * static_cast<unsigned>(s);
      if (a.name == "ProfilerStep#1") a.name = "ProfilerStep#" + std::to_string(s + 1);
      t.activities.push_back(std::move(a));
    }
  }
  return t;
}

Finding cite(const analysis::TraceIndex& index, std::string rule, Severity sev, std::string text,
             std::string_view event_name) {
  Finding f;
  f.rule = std::move(rule);
  f.severity = sev;
  f.text = std::move(text);
  for (analysis::EventIndex i = 0; i < static_cast<analysis::EventIndex>(index.trace().activities.size()); ++i) {
    if (index.at(i).name == event_name) f.evidence.push_back(index.ref(i));
  }
  return f;
}

// An empty trace that recorded `steps` profiler steps.
Trace recorded(int steps) {
  Trace t;
  t.steps_recorded = steps;
  return t;
}

RunResult gpu_run(std::string name, const Trace& trace, double device_us, double kernels, double copies,
                  bool materialises) {
  RunResult r;
  r.backend = std::move(name);
  r.problem.batch = 8;
  r.problem.heads = 16;
  r.problem.seq = 1024;
  r.problem.head_dim = 64;
  r.problem.dtype = DType::BF16;
  r.problem.device = Device::Cuda;
  r.problem.normalize();
  r.eligibility = {.eligible = true, .reason = "eligible"};
  r.trace = trace;
  Metrics& m = r.metrics;
  m.steps = trace.steps_recorded;
  m.device_time_us = device_us;
  m.host_time_us = 42.0;
  m.kernels_per_forward = kernels;
  m.ops_per_forward = materialises ? 5 : 1;
  m.copies_per_forward = copies;
  m.peak_bytes = materialises ? 512LL << 20 : 0;
  m.tflops = r.problem.flops() / (device_us * 1e-6) / 1e12;
  m.ceiling_pct = *m.tflops / 774.0 * 100.0;
  m.occupancy_pct = 12.5;
  r.error = ErrorStats{.max_abs = 3.9e-3, .rel = 5.49e-4, .nan_count = 0};
  r.acceptance = Acceptance{.pass = true, .tolerance = 1e-3, .why = "within 2 x math's error"};
  return r;
}

int write_html(const std::string& path) {
  Trace with_memory = gpu_trace(2);
  with_memory.device->memory_bandwidth_gbs = 4800.0;  // an H200's HBM3e peak
  // A name a kernel could carry, that must not end the page's script element.
  for (Activity& a : with_memory.activities) {
    if (a.name == "softmax_warp_forward") a.name = "softmax_warp_forward<c10::BFloat16, </script><b>&amp;";
  }
  const analysis::TraceIndex index(with_memory);
  RunResult a = gpu_run("a.json step 2", with_memory, 860.0, 7, 1, true);
  a.findings.push_back(cite(index, "hidden-copy", Severity::Warning,
                            "hidden copy: masked_fill makes 1 device-to-device copy per forward (32.0 MiB)",
                            "Memcpy DtoD (Device -> Device)"));
  a.findings.push_back(cite(index, "driver-launch", Severity::Info,
                            "main kernel launched through the driver's cuLaunchKernelEx", "cuLaunchKernelEx"));
  Finding bare;
  bare.rule = "no-evidence";
  bare.severity = Severity::Error;
  bare.text = "a finding citing nothing";
  a.findings.push_back(bare);
  RunResult b = gpu_run("b.json step 2", with_memory, 734.0, 6, 0, true);
  b.findings.push_back(cite(index, "slow-softmax", Severity::Info, "softmax: 25 us per forward",
                            "softmax_warp_forward<c10::BFloat16, </script><b>&amp;"));
  RunResult fused = gpu_run("flash (fused)", with_memory, 75.0, 1, 0, false);
  // Figures three orders of magnitude apart: math at 25 ms, in float64-exact
  // arithmetic, beside fused runs of 75 us.
  RunResult math = gpu_run("math", recorded(2), 25'000.0, 9, 2, true);
  math.metrics.peak_bytes = 2LL << 30;
  math.metrics.host_time_us = 310.0;
  math.error = ErrorStats{.max_abs = 1e-9, .rel = 2.3e-8};
  // A crowd on the roofline: six fused backends at nearly one intensity and
  // one TFLOP/s (their names must not overlap), each with an error the chart
  // must show as what it is: exact, NaN, not checked, failed, float32-small.
  std::vector<RunResult> crowd;
  const char* names[] = {"flash_sm90", "cudnn", "sdpa_flash", "sdpa_mem_efficient", "flex", "xformers_cutlass"};
  for (int k = 0; k < 6; ++k) crowd.push_back(gpu_run(names[k], recorded(2), 75.2 + 0.3 * k, 1, 0, false));
  crowd[1].error = ErrorStats{};  // rel 0: exactly the reference
  crowd[2].error = ErrorStats{.max_abs = 1e-3, .rel = 4.1e-4, .nan_count = 12, .nan_rows = 3};
  crowd[2].acceptance = Acceptance{.pass = false, .tolerance = 1e-3, .why = "NaN in 3 rows"};
  crowd[3].error.reset();  // no reference compared
  crowd[3].acceptance.reset();
  crowd[4].error = ErrorStats{.max_abs = 0.2, .rel = 2.1e-2};
  crowd[4].acceptance = Acceptance{.pass = false, .tolerance = 1e-3, .why = "over 2 x math's error"};
  crowd[5].error = ErrorStats{.max_abs = 1e-6, .rel = 3.2e-7};
  RunResult absent;
  absent.backend = "cudnn";
  absent.eligibility = {.eligible = false, .reason = "not eligible on CPU: cuDNN runs on NVIDIA GPUs only"};

  HtmlReport rep{
      .title = "attnprof diff </script> a.json b.json",
      .subtitle = "hand-made runs, as analyze and diff produce them",
      .device = "NVIDIA H200 (synthetic)",
      .runs = {{.label = "", .result = &a},
               {.label = "", .result = &b},
               {.label = "", .result = &fused},
               {.label = "", .result = &math},
               {.label = "", .result = &absent}},
      .diff =
          {{.kind = "kernel", .name = "Memcpy DtoD (Device -> Device)", .a = 40.0, .unit = "us", .note = "vanished"},
           {.kind = "kernel", .name = "softmax_warp_forward", .a = 25.0, .b = 22.0, .unit = "us"},
           {.kind = "op", .name = "masked_fill", .a = 200.0, .b = 90.0, .unit = "us"},
           {.kind = "memory", .name = "peak", .a = 536870912.0, .b = 268435456.0, .unit = "B"},
           {.kind = "finding", .name = "hidden-copy", .a = 1.0, .unit = "count", .note = "only in A"}},
      .notes = {"synthetic: every figure is made up"},
      .diff_a = "a.json",
      .diff_b = "b.json"};
  for (int k = 0; k < 6; ++k) {
    const RunResult& r = crowd[static_cast<std::size_t>(k)];
    rep.runs.push_back({.label = "", .result = &r, .bytes_moved = html_bytes_moved(r) * (1.0 + 0.004 * k)});
  }
  write_html_report(rep, path);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string usage = "usage: report_fixtures html FILE | gpu-trace FILE\n";
  if (argc != 3) {
    std::fputs(usage.c_str(), stderr);
    return 2;
  }
  const std::string what = argv[1];
  try {
    if (what == "html") return write_html(argv[2]);
    if (what == "gpu-trace") {
      write_chrome_trace(gpu_trace(4), argv[2]);
      return 0;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "report_fixtures: %s\n", e.what());
    return 1;
  }
  std::fputs(usage.c_str(), stderr);
  return 2;
}
