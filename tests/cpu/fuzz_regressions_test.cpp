// The fuzzer's findings, replayed (tests/fuzz/trace_fuzz.cpp, scripts/fuzz.sh):
// every file of tests/fixtures/fuzz/ is a trace that once crashed, hung or
// blew up the reader, analyze or diff, kept minimised. Each must now be
// analysed, rendered and diffed as the fuzz target does, or refused with one
// attnprof::Error of one line.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "attnprof/analyze.h"
#include "attnprof/error.h"
#include "attnprof/html.h"
#include "attnprof/report.h"

namespace attnprof {
namespace {

namespace fs = std::filesystem;

const fs::path kDir = fs::path(ATTNPROF_TORCH_FIXTURES) / ".." / "fuzz";

std::vector<fs::path> regressions() {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(kDir)) {
    if (e.is_regular_file()) files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

TEST(FuzzRegressions, EveryReproducerIsAnalysedOrRefusedInOneLine) {
  const std::vector<fs::path> files = regressions();
  ASSERT_FALSE(files.empty()) << "no reproducers in " << kDir;
  for (const fs::path& f : files) {
    SCOPED_TRACE(f.filename().string());
    try {
      const std::vector<TraceAnalysis> all = analyze_traces({f});
      ASSERT_EQ(all.size(), 1u);
      EXPECT_FALSE(analysis_text(all.front()).empty());
      EXPECT_FALSE(analysis_json(all).empty());
      EXPECT_FALSE(html_report(analysis_html(all), "").empty());
      const TraceDiff d = diff_analyses(all.front(), std::nullopt, all.front(), std::nullopt);
      EXPECT_FALSE(diff_text(d).empty());
      EXPECT_FALSE(diff_json(d).empty());
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_FALSE(what.empty());
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    }
  }
}

}  // namespace
}  // namespace attnprof
