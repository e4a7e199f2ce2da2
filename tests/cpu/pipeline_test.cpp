// compare and profile as library calls (attnprof/report.h): what the CLI,
// the Python package and the HTML report all call.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "attnprof/error.h"
#include "attnprof/report.h"
#include "common/test_problem.h"

namespace attnprof {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  TempDir() : path(fs::temp_directory_path() / ("attnprof-pipeline-" + std::to_string(std::random_device{}()))) {
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  fs::path path;
};

Problem small() { return testing::to_problem({.heads = 2, .seq = 64}, DType::BF16, MaskKind::Causal); }

PipelineOptions quick(const TempDir& dir) {
  PipelineOptions o;
  o.run.schedule = {.wait = 0, .warmup = 1, .active = 1, .repeat = 1};
  o.trace_dir = dir.path / "traces";
  o.json_path = dir.path / "out.json";
  return o;
}

TEST(Pipeline, CompareRunsEveryBackendAndWritesEveryOutput) {
  TempDir dir;
  const PipelineReport rep = compare(small(), quick(dir), {"naive", "flash", "cudnn"});
  ASSERT_EQ(rep.results.size(), 3u);
  ASSERT_EQ(rep.tables.size(), 3u);
  ASSERT_EQ(rep.outputs.size(), 3u);
  EXPECT_TRUE(rep.accepted());
  EXPECT_NO_THROW(rep.require_any_ran());
  for (std::size_t i = 0; i < 2; ++i) {  // naive and flash ran on the CPU
    EXPECT_GT(rep.results[i].metrics.steps, 0) << rep.results[i].backend;
    EXPECT_FALSE(rep.tables[i].empty());
    for (const auto& f : {rep.outputs[i].trace, rep.outputs[i].table, rep.outputs[i].summary}) {
      EXPECT_TRUE(fs::exists(f)) << f;
    }
  }
  // naive's findings are records with rule ids and severities.
  const auto& naive = rep.results[0].findings;
  ASSERT_FALSE(naive.empty());
  EXPECT_EQ(naive.front().rule, "hidden-copy");
  EXPECT_EQ(naive.front().severity, Severity::Warning);
  // cudnn cannot run on the CPU: a result with the reason, no files.
  EXPECT_EQ(rep.results[2].metrics.steps, 0);
  EXPECT_TRUE(rep.outputs[2].trace.empty());
  // The --json document is what json() returns, and carries the findings' rule ids.
  const auto j = nlohmann::json::parse(std::ifstream(dir.path / "out.json"));
  EXPECT_EQ(j, nlohmann::json::parse(rep.json()));
  EXPECT_EQ(j["results"][0]["findings"][0]["rule"], "hidden-copy");
}

TEST(Pipeline, ProfileRunsOneBackendAutoIncluded) {
  TempDir dir;
  PipelineOptions o = quick(dir);
  o.json_path.reset();
  const PipelineReport rep = profile(small(), "auto", o);
  ASSERT_EQ(rep.results.size(), 1u);
  EXPECT_GT(rep.results[0].metrics.steps, 0);
  EXPECT_TRUE(fs::exists(output_stem(*o.trace_dir, small(), rep.results[0].backend).string() + ".summary.json"));
}

TEST(Pipeline, BadOutputsAndBackendsAreRefusedBeforeAnyWork) {
  TempDir dir;
  std::ofstream(dir.path / "file") << "x";
  PipelineOptions o = quick(dir);
  o.json_path = dir.path / "file" / "out.json";
  try {
    (void)compare(small(), o);
    FAIL() << "an unwritable --json was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Io);
    EXPECT_NE(std::string(e.what()).find("json_path"), std::string::npos) << e.what();
    EXPECT_EQ(e.fields(), std::vector<std::string>{"json_path"});
  }
  EXPECT_FALSE(fs::exists(*o.trace_dir)) << "nothing ran: nothing was written, not even the trace directory";
  o = quick(dir);
  o.table.sort_by = "bogus";
  EXPECT_THROW((void)compare(small(), o), Error);
  EXPECT_THROW((void)profile(small(), "cudnn", quick(dir)), Error);
}

}  // namespace
}  // namespace attnprof
