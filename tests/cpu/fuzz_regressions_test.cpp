// The fuzzer's findings, replayed (tests/fuzz/trace_fuzz.cpp, scripts/fuzz.sh):
// every file of tests/fixtures/fuzz/ is a trace that once crashed, hung or
// blew up the reader, analyze or diff, kept minimised. Each must now be
// analysed, rendered and diffed as the fuzz target does, or refused with one
// attnprof::Error of one line; and read the same, or refused for the same
// fault at the same byte, when its text comes a few bytes at a time.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "analysis/trace_stream.h"
#include "analysis/trace_unreadable.h"
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

// The reader's account of `text` fed `chunk` bytes at a time.
std::string read_in_chunks(const std::string& text, std::size_t chunk) {
  std::size_t pos = 0;
  try {
    const Trace t = read_trace_stream(
        [&](char* buf, std::size_t cap) {
          const std::size_t n = std::min({cap, chunk, text.size() - pos});
          std::memcpy(buf, text.data() + pos, n);
          pos += n;
          return n;
        },
        TraceReadOptions{});
    std::string out = std::to_string(t.activities.size()) + " events";
    for (const auto& a : t.activities) out += ", " + a.name + " at " + std::to_string(a.start_ns);
    return out;
  } catch (const trace_reading::Unreadable& u) {
    return "refused: " + u.why;
  }
}

TEST(FuzzRegressions, ReadTheSameWhereverTheChunksEnd) {
  for (const fs::path& f : regressions()) {
    SCOPED_TRACE(f.filename().string());
    std::ifstream in(f, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    if (text.size() >= 2 && text[0] == '\x1f' && text[1] == '\x8b') continue;  // gzip: zlib's chunks
    const std::string whole = read_in_chunks(text, text.size() + 1);
    for (std::size_t chunk : {1, 2, 3, 7, 64}) EXPECT_EQ(read_in_chunks(text, chunk), whole) << chunk << "-byte chunks";
  }
}

}  // namespace
}  // namespace attnprof
