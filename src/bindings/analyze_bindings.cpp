// attnprof._core's analyze and diff (python/attnprof/_analyze.py): traces in,
// the CLI's JSON and text out; module.cpp's one call adds them.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "attnprof/analyze.h"
#include "attnprof/error.h"
#include "attnprof/problem_spec.h"
#include "attnprof/replay.h"
#include "attnprof/report.h"
#include "attnprof/trace_io.h"
#include "bindings/bindings.h"

namespace nb = nanobind;

namespace attnprof::python {

void bind_analyze(nb::module_& m) {
  m.def(
      "analyze",
      [](const std::vector<std::string>& paths, std::optional<int> step, bool replay, std::optional<std::string> device,
         const std::vector<std::string>& backends, int top, std::optional<double> ceiling_tflops) {
        // Every argument before any work: a replay of the wrong backends would run for nothing.
        if (ceiling_tflops && !(*ceiling_tflops > 0 && *ceiling_tflops <= 1e6)) {
          fail(ErrorKind::InvalidArgument, "ceiling_tflops must be a positive number of TFLOP/s", {"ceiling_tflops"});
        }
        check_top(top);
        for (const auto& b : backends) check_backend_name("backends", b, /*auto_ok=*/false);
        std::optional<Device> replay_device;
        if (device) replay_device = device_from_text(*device);
        const ThreadCountsKept kept;
        std::vector<TraceAnalysis> all;
        {
          nb::gil_scoped_release unlocked;
          AnalyzeOptions o;
          o.step = step;
          o.ceiling_tflops = ceiling_tflops;
          for (const auto& p : paths) all.push_back(analyze_trace(read_chrome_trace(p, o.read), p, o));
          if (replay) {
            ReplayOptions r;
            r.device = replay_device;
            r.backends = backends;
            after_runtime_use([&] {
              for (auto& a : all) replay_attention(a, r);
            });
          }
        }
        std::string text;
        for (std::size_t i = 0; i < all.size(); ++i) {
          if (i) text += '\n';
          text += analysis_text(all[i], top);
        }
        return std::make_tuple(analysis_json(all), text);
      },
      nb::arg("paths"), nb::kw_only(), nb::arg("step").none() = nb::none(), nb::arg("replay") = false,
      nb::arg("device").none() = nb::none(), nb::arg("backends") = std::vector<std::string>{}, nb::arg("top") = 10,
      nb::arg("ceiling_tflops").none() = nb::none(), "analyze's JSON and text for the traces");
  m.def(
      "diff",
      [](const std::string& a, const std::string& b, std::optional<int> a_step, std::optional<int> b_step, int top) {
        check_top(top);
        TraceDiff d;
        {
          nb::gil_scoped_release unlocked;
          d = diff_traces({a, a_step}, {b, b_step});
        }
        return std::make_tuple(diff_json(d), diff_text(d, top));
      },
      nb::arg("a"), nb::arg("b"), nb::kw_only(), nb::arg("a_step").none() = nb::none(),
      nb::arg("b_step").none() = nb::none(), nb::arg("top") = 15, "diff's JSON and text for two traces (or two steps)");
}

}  // namespace attnprof::python
