// The HTML report's text: the embedded data reads back whole, no string in it
// can end its script element, the timeline holds one step, and the
// roofline's bytes model is the one html.h documents. The browser test
// (tests/browser/) opens real pages; these check what a browser cannot tell.
#include "attnprof/html.h"

#include <gtest/gtest.h>

#include <limits>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "synthetic_trace.h"

namespace attnprof {
namespace {

using json = nlohmann::json;

RunResult synthetic_run() {
  RunResult r;
  r.backend = "naive";
  r.problem.batch = 2;
  r.problem.heads = 4;
  r.problem.seq = 256;
  r.problem.head_dim = 64;
  r.problem.dtype = DType::BF16;
  r.problem.device = Device::Cuda;
  r.problem.normalize();
  r.eligibility.eligible = true;
  r.trace = testing::attention_trace();
  r.metrics.steps = 1;
  r.metrics.ops_per_forward = 5;
  r.metrics.copies_per_forward = 1;
  r.metrics.tflops = 10.0;
  r.metrics.ceiling_pct = 2.0;
  return r;
}

json embedded(const std::string& page) {
  const std::string open = "<script type=\"application/json\" id=\"report-data\">";
  const std::size_t from = page.find(open);
  EXPECT_NE(from, std::string::npos);
  const std::size_t start = from + open.size();
  return json::parse(page.substr(start, page.find("</script>", start) - start));
}

std::size_t count(const std::string& s, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

TEST(Html, NamesThatCouldEndAScriptStayInsideTheData) {
  RunResult r = synthetic_run();
  const std::string evil = "k</script><script>alert(1)</script><!--&";
  for (Activity& a : r.trace.activities) {
    if (a.name == "masked_fill_kernel") a.name = evil;
  }
  HtmlReport rep{.title = "t </script> & <b>", .runs = {{.result = &r}}};
  const std::string page = html_report(rep, "/* plotly */ var s = '</script>';");
  // The error trap, Plotly.js, the data and the page script: four elements, four ends.
  EXPECT_EQ(count(page, "</script>"), 4u);
  EXPECT_EQ(page.find("<!--&"), std::string::npos);
  EXPECT_NE(page.find("<title>t &lt;/script&gt; &amp; &lt;b&gt;</title>"), std::string::npos);
  const json data = embedded(page);
  EXPECT_EQ(data["title"], "t </script> & <b>");
  bool found = false;
  // A kernel's whole name is "f" ("n" is its short form, analysis/kernel_names.h).
  for (const json& e : data["runs"][0]["timeline"]["events"]) found |= e["f"] == evil;
  EXPECT_TRUE(found) << "the name reads back unchanged";
}

TEST(Html, TimelineIsTheLastStepOnOneAxisWithLanesByDepthAndStream) {
  const RunResult r = synthetic_run();
  HtmlReport rep{.runs = {{.label = "mine", .result = &r}}};
  const json run = embedded(html_report(rep, ""))["runs"][0];
  EXPECT_EQ(run["label"], "mine");
  const json& tl = run["timeline"];
  EXPECT_EQ(tl["step"], "ProfilerStep#1");
  EXPECT_EQ(tl["lanes"],
            (json{"CPU depth 0", "CPU depth 1", "CPU depth 2", "CPU depth 3", "CPU depth 4", "GPU 0 stream 7"}));
  // Every host range and device activity of the synthetic step; no allocations.
  EXPECT_EQ(tl["events"].size(), 14u + 6u);
  for (const json& e : tl["events"]) {
    EXPECT_NE(e["c"], "[memory]");
    if (e["c"] == "kernel" || e["c"] == "gpu_memcpy") EXPECT_EQ(tl["lanes"][e["l"].get<int>()], "GPU 0 stream 7");
    if (e["n"] == "copy_") EXPECT_EQ(tl["lanes"][e["l"].get<int>()], "CPU depth 3");
  }
  EXPECT_DOUBLE_EQ(tl["from"], 0.0);
  EXPECT_DOUBLE_EQ(tl["to"], 900.0);
  EXPECT_FALSE(run["table"].get<std::string>().empty()) << "computed from the trace when not given";
}

TEST(Html, BytesModelAddsTheScoresOnlyForADecomposedForward) {
  RunResult r = synthetic_run();
  const double qkvo = 4.0 * 2 * 4 * 256 * 64 * 2;  // Q, K, V, O in bf16
  const double scores = 2.0 * 4 * 256 * 256 * 2;   // B x H x S x Skv in bf16
  EXPECT_DOUBLE_EQ(html_bytes_moved(r), qkvo + (8 + 2 * 1) * scores);
  r.traits.reference_precision = true;  // math: FP32 scores, no copy
  r.metrics.copies_per_forward = 0;
  EXPECT_DOUBLE_EQ(html_bytes_moved(r), qkvo + 8 * scores * 2);
  r.metrics.ops_per_forward = 1;  // fused
  EXPECT_DOUBLE_EQ(html_bytes_moved(r), qkvo);

  HtmlReport rep{.runs = {{.result = &r, .bytes_moved = 1e6}}};
  const json data = embedded(html_report(rep, ""));
  const json& roof = data["runs"][0]["roofline"];
  EXPECT_DOUBLE_EQ(roof["bytes"], 1e6);
  EXPECT_DOUBLE_EQ(roof["intensity"], r.problem.flops() / 1e6);
  EXPECT_FALSE(roof["modelled"]);
  EXPECT_DOUBLE_EQ(data["ceiling_tflops"], 500.0);  // 10 TFLOP/s at 2% of it
  EXPECT_TRUE(data["bandwidth_tbs"].is_null()) << "the synthetic device gives no bandwidth";
}

TEST(Html, BandwidthComesFromTheDeviceOrIsNull) {
  RunResult r = synthetic_run();
  HtmlReport rep{.runs = {{.result = &r}}};
  EXPECT_TRUE(embedded(html_report(rep, ""))["bandwidth_tbs"].is_null());
  r.trace.device->memory_bandwidth_gbs = 4800;
  EXPECT_DOUBLE_EQ(embedded(html_report(rep, ""))["bandwidth_tbs"], 4.8);
}

TEST(Html, RunsThatDidNotRunCarryTheirReasonOnly) {
  RunResult r;
  r.backend = "cudnn";
  r.eligibility = {.eligible = false, .reason = "cuDNN runs on NVIDIA GPUs only"};
  HtmlReport rep{.runs = {{.result = &r}},
                 .diff = {{.kind = "kernel", .name = "gemm", .a = 1.0, .unit = "us", .note = "vanished"}}};
  const json data = embedded(html_report(rep, ""));
  EXPECT_FALSE(data["runs"][0]["ran"]);
  EXPECT_EQ(data["runs"][0]["reason"], "cuDNN runs on NVIDIA GPUs only");
  EXPECT_FALSE(data["runs"][0].contains("timeline"));
  EXPECT_TRUE(data["diff"][0]["b"].is_null());
  EXPECT_EQ(data["diff"][0]["note"], "vanished");
}

TEST(Html, ErrorStateSaysExactNanAndUncheckedOutright) {
  RunResult r = synthetic_run();
  HtmlReport rep{.runs = {{.result = &r}}};
  const auto shown = [&] { return embedded(html_report(rep, ""))["runs"][0]; };
  r.error = ErrorStats{.max_abs = 1e-3, .rel = 5e-4};
  EXPECT_EQ(shown()["error_state"], "measured");
  EXPECT_DOUBLE_EQ(shown()["rel_error"], 5e-4);
  r.error = ErrorStats{};
  EXPECT_EQ(shown()["error_state"], "zero") << "a log axis cannot place 0: said, not dropped";
  r.error = ErrorStats{.max_abs = 1e-3, .rel = 5e-4, .nan_count = 7, .nan_rows = 1};
  EXPECT_EQ(shown()["error_state"], "nan") << "the finite rows' error must not hide NaN output";
  EXPECT_EQ(shown()["nan_count"], 7);
  r.error = ErrorStats{.rel = std::numeric_limits<double>::quiet_NaN()};
  EXPECT_EQ(shown()["error_state"], "nan");
  EXPECT_TRUE(shown()["rel_error"].is_null()) << "JSON has no NaN: the state carries it";
  r.error.reset();
  EXPECT_EQ(shown()["error_state"], "unchecked");
  EXPECT_TRUE(shown()["nan_count"].is_null());
}

}  // namespace
}  // namespace attnprof
