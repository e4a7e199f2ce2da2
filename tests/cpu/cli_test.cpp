// The attnprof executable: every bad input is refused with one line on stderr
// that starts with "attnprof:" and names the problem, and nothing half-written
// is left behind. What the commands write on the good paths:
// cli_commands_test.cpp.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "common/cli_run.h"
#include "common/temp_dir.h"

namespace attnprof {
namespace {

namespace fs = std::filesystem;
using testing::attnprof;
using testing::CliRun;
using testing::expect_refused;
using testing::listing;
using testing::slurp;
using testing::TempDir;
using testing::with;

const std::vector<std::string> kProfile = {"profile", "--backend", "naive", "--device", "cpu", "--quiet"};

struct BadArgs {
  const char* label;
  std::vector<std::string> args;
  const char* needle;
};

void PrintTo(const BadArgs& b, std::ostream* os) { *os << b.label; }

class CliRefuses : public ::testing::TestWithParam<BadArgs> {};

TEST_P(CliRefuses, WithOneLineNamingTheProblem) {
  TempDir dir;
  const BadArgs& c = GetParam();
  // The trace dir goes right after the command, so a flag missing its value can come last.
  std::vector<std::string> args = c.args;
  args.insert(args.begin() + 1, {"--trace-dir", dir.str("traces")});
  const CliRun r = attnprof(args, dir);
  expect_refused(r, c.needle);
  EXPECT_EQ(r.code, 2) << "a bad flag is a usage error";
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_TRUE(listing(dir.path() / "traces").empty()) << "a refused command wrote files";
}

std::vector<std::string> p(std::vector<std::string> more) { return with(kProfile, more); }

INSTANTIATE_TEST_SUITE_P(
    Cli, CliRefuses,
    ::testing::Values(
        BadArgs{"seq_zero", p({"--seq", "0"}), "--seq"}, BadArgs{"batch_negative", p({"--batch", "-1"}), "--batch"},
        BadArgs{"batch_zero", p({"--batch", "0"}), "--batch"}, BadArgs{"heads_zero", p({"--heads", "0"}), "--heads"},
        BadArgs{"scale_overflows", p({"--scale", "1e300"}), "overflow"},
        BadArgs{"heads_negative", p({"--heads", "-4"}), "--heads"},
        BadArgs{"head_dim_zero", p({"--head-dim", "0"}), "--head-dim"},
        BadArgs{"kv_seq_zero", p({"--kv-seq", "0"}), "--kv-seq"},
        BadArgs{"seq_absurd", p({"--seq", "99999999999"}), "--seq"},
        BadArgs{"seq_overflow", p({"--seq", "99999999999999999999999"}), "--seq"},
        BadArgs{"batch_absurd", p({"--batch", "99999999999"}), "--batch"},
        BadArgs{"batch_heads_overflow", p({"--batch", "4294967296", "--heads", "4294967296"}), "--batch"},
        BadArgs{"head_dim_1000", p({"--head-dim", "1000"}), "--head-dim"},
        BadArgs{"head_dim_257", p({"--head-dim", "257"}), "--head-dim"},
        BadArgs{"seq_text", p({"--seq", "abc"}), "--seq"}, BadArgs{"seq_float", p({"--seq", "12.5"}), "--seq"},
        BadArgs{"seq_empty", p({"--seq="}), "--seq"}, BadArgs{"batch_suffix", p({"--batch", "4x"}), "--batch"},
        BadArgs{"scale_text", p({"--scale", "big"}), "--scale"}, BadArgs{"scale_nan", p({"--scale", "nan"}), "--scale"},
        BadArgs{"scale_inf", p({"--scale", "inf"}), "--scale"}, BadArgs{"scale_zero", p({"--scale", "0"}), "--scale"},
        BadArgs{"warmup_text", p({"--warmup", "x"}), "--warmup"},
        BadArgs{"active_zero", p({"--active", "0"}), "--active"},
        BadArgs{"unprofiled_calls_negative", p({"--unprofiled-calls", "-1"}), "--unprofiled-calls"},
        BadArgs{"kv_heads_mismatch", p({"--kv-heads", "3", "--heads", "8"}), "--kv-heads"},
        BadArgs{"kv_heads_more", p({"--kv-heads", "16", "--heads", "8"}), "--kv-heads"},
        BadArgs{"unknown_backend", {"profile", "--backend", "turbo", "--device", "cpu"}, "turbo"},
        BadArgs{"unknown_backends", {"compare", "--backends", "naive,turbo", "--device", "cpu"}, "turbo"},
        BadArgs{"unknown_dtype", p({"--dtype", "fp4"}), "fp4"},
        // issue 24: FP8's bad input, one line each, nothing written.
        BadArgs{"fp8_descale_zero", p({"--dtype", "fp8", "--fp8-descale", "0"}),
                "--fp8-descale must be a finite positive number"},
        BadArgs{"fp8_descale_negative", p({"--dtype", "fp8", "--fp8-descale", "-0.5"}),
                "--fp8-descale must be a finite positive number"},
        BadArgs{"fp8_descale_nan", p({"--dtype", "fp8", "--fp8-descale", "nan"}), "--fp8-descale takes auto or"},
        BadArgs{"fp8_descale_inf", p({"--dtype", "fp8", "--fp8-descale", "inf"}), "--fp8-descale takes auto or"},
        BadArgs{"fp8_descale_text", p({"--dtype", "fp8", "--fp8-descale", "big"}), "--fp8-descale takes auto or"},
        BadArgs{"fp8_descale_without_fp8", p({"--fp8-descale", "0.01"}), "--fp8-descale applies to --dtype fp8"},
        BadArgs{"fp8_backward", p({"--dtype", "fp8", "--pass", "backward"}),
                "--dtype fp8 is forward only (e4m3 inputs, bf16 output): use --pass forward"},
        BadArgs{"fp8_train", p({"--dtype", "e4m3", "--pass", "train"}), "--dtype fp8 is forward only"},
        BadArgs{"unknown_mask", p({"--mask", "diagonal"}), "diagonal"},
        BadArgs{"unknown_device", p({"--device", "tpu"}), "tpu"},
        BadArgs{"unknown_layout", p({"--layout", "sbhd"}), "sbhd"},
        BadArgs{"unknown_option", p({"--frobnicate", "1"}), "--frobnicate"},
        BadArgs{"unknown_command", {"frobnicate", "--device", "cpu"}, "frobnicate"},
        BadArgs{"missing_value", p({"--seq"}), "--seq"},
        BadArgs{"sliding_without_window", p({"--mask", "sliding-window"}), "--window"},
        BadArgs{"window_without_sliding", p({"--mask", "causal", "--window", "8"}), "--window"},
        BadArgs{"window_zero", p({"--mask", "sliding-window", "--window", "0"}), "--window"},
        BadArgs{"profile_without_backend", {"profile", "--device", "cpu"}, "--backend"},
        BadArgs{"bad_expect", p({"--expect", "naive"}), "--expect"},
        // One strict number parser for every numeric flag (issue 20 item 13).
        BadArgs{"scale_hex", p({"--scale", "0x10"}), "--scale expects a decimal number"},
        BadArgs{"scale_leading_space", p({"--scale", " 0.1"}), "--scale expects a decimal number"},
        BadArgs{"scale_trailing_space", p({"--scale", "0.1 "}), "--scale expects a decimal number"},
        BadArgs{"scale_plus", p({"--scale", "+0.1"}), "--scale"},
        BadArgs{"scale_huge", p({"--scale", "1e999"}), "--scale 1e999 is out of range"},
        // issue 22 item 3: a soft cap of zero or less, or not a finite number.
        BadArgs{"softcap_zero", p({"--softcap", "0"}), "--softcap must be positive"},
        BadArgs{"softcap_negative", p({"--softcap", "-30"}), "--softcap must be positive"},
        BadArgs{"softcap_nan", p({"--softcap", "nan"}), "--softcap"},
        BadArgs{"softcap_inf", p({"--softcap", "inf"}), "--softcap must be a finite number"},
        BadArgs{"softcap_text", p({"--softcap", "big"}), "--softcap expects a decimal number"},
        BadArgs{"softcap_missing", p({"--softcap"}), "--softcap"},
        BadArgs{"seq_hex", p({"--seq", "0x10"}), "--seq expects a whole number"},
        BadArgs{"seq_space", p({"--seq", " 64"}), "--seq expects a whole number"},
        BadArgs{"head_dim_plus", p({"--head-dim", "+64"}), "--head-dim expects a whole number"},
        BadArgs{"page_size_hex", p({"--kv-cache", "paged", "--page-size", "0x10"}), "--page-size"},
        BadArgs{"seed_negative", p({"--seed", "-1"}), "--seed"},
        BadArgs{"expect_auto", p({"--expect", "auto=3"}), "--expect"},
        // issue 20 item 11: a list that shows auto takes it, one that does not take it does not show it.
        BadArgs{"backends_auto",
                {"compare", "--backends", "naive,auto", "--device", "cpu"},
                "auto is not a backend to list in --backends"},
        // issue 22 item 2: a packed batch's lengths, one line naming the flag.
        BadArgs{"seq_lens_text", p({"--seq-lens", "64,abc"}), "--seq-lens expects a whole number"},
        BadArgs{"seq_lens_negative", p({"--seq-lens", "64,-3"}), "--seq-lens[1] is -3: lengths are 0 or more"},
        BadArgs{"seq_lens_empty_entry", p({"--seq-lens", "64,,8"}), "--seq-lens expects a whole number"},
        BadArgs{"seq_lens_trailing_comma", p({"--seq-lens", "64,"}), "--seq-lens expects a whole number"},
        BadArgs{"seq_lens_all_zero", p({"--seq-lens", "0,0", "--kv-seq-lens", "4,4", "--seq", "8"}),
                "--seq-lens are all 0"},
        // issue 49 item 14: lengths all 0 blame --seq-lens, not the --seq never given.
        BadArgs{"seq_lens_all_zero_alone", p({"--seq-lens", "0,0,0"}), "--seq-lens are all 0"},
        BadArgs{"kv_seq_lens_all_zero", p({"--seq-lens", "4,4", "--kv-seq-lens", "0,0"}), "--kv-seq-lens are all 0"},
        BadArgs{"seq_lens_count_vs_batch", p({"--seq-lens", "64,8", "--batch", "3"}),
                "--seq-lens has 2 lengths but --batch is 3"},
        BadArgs{"kv_seq_lens_count", p({"--seq-lens", "64,8", "--kv-seq-lens", "64"}),
                "--kv-seq-lens has 1 lengths but --batch is 2"},
        BadArgs{"kv_seq_lens_alone", p({"--kv-seq-lens", "64"}), "--kv-seq-lens needs --seq-lens"},
        BadArgs{"seq_lens_max_too_small", p({"--seq-lens", "64,8", "--seq", "32"}),
                "--seq (the maximum length) is 32, smaller than --seq-lens[0] = 64"},
        // A --seq above the lengths' maximum, whichever comes first, is refused (it sized the padded batch).
        BadArgs{"seq_above_seq_lens", p({"--seq-lens", "64,8", "--seq", "100"}),
                "--seq (the maximum length) is 100, but the longest of --seq-lens is 64"},
        BadArgs{"seq_above_seq_lens_first", p({"--seq", "100", "--seq-lens", "64,8"}), "--seq-lens"},
        // A flag the command does not read is refused, not dropped.
        BadArgs{"profile_backends", p({"--backends", "math"}), "--backends is for compare; profile takes --backend B"},
        BadArgs{"profile_expect_other", p({"--expect", "math=3"}),
                "--expect math=3 guesses about math, which profile --backend naive does not run"},
        BadArgs{"compare_expect_left_out",
                {"compare", "--device", "cpu", "--backends", "naive", "--expect", "math=3"},
                "--expect math=3 guesses about math, which --backends leaves out"},
        BadArgs{"seq_lens_boolean_mask", p({"--seq-lens", "64,8", "--mask", "boolean"}), "structural masks only"},
        BadArgs{"seq_lens_paged", p({"--seq-lens", "64,8", "--kv-cache", "paged", "--page-size", "16"}),
                "--kv-cache contiguous"},
        // issue 20 item 12: 2^64 scores, refused before any estimate can wrap.
        BadArgs{"scores_overflow",
                {"compare", "--device", "cpu", "--batch", "1024", "--heads", "1024", "--seq", "4194304", "--kv-seq",
                 "4194304", "--head-dim", "256"},
                "--batch x --heads x --seq x --kv-seq is 1.84e+19 attention scores"}),
    [](const auto& info) { return std::string(info.param.label); });

// The library names fields; the CLI shows its flags, with the values cited.
TEST(Cli, LibraryErrorsNameTheFlags) {
  TempDir dir;
  const auto refused = [&](const std::vector<std::string>& more) {
    return attnprof(with(kProfile, with({"--seq", "64", "--trace-dir", dir.str("t")}, more)), dir);
  };
  expect_refused(refused({"--mask", "sliding-window"}), "--mask sliding-window needs --window N (N >= 1 keys)");
  expect_refused(refused({"--kv-cache", "paged"}), "--kv-cache paged needs --page-size N");
  expect_refused(refused({"--head-dim", "300"}), "--head-dim 300 is above the largest supported, 256");
  expect_refused(refused({"--deterministic"}),
                 "--deterministic applies to the backward (--pass backward or train): the forward has no atomics");
  const CliRun scale = refused({"--dtype", "fp16", "--scale", "2000"});
  expect_refused(scale, "|--scale| x --head-dim reaches 1.28e+05");
  EXPECT_NE(scale.err.find("use |--scale| <= 1.02e+03"), std::string::npos) << scale.err;
  expect_refused(refused({"--batch", "0"}), "attnprof: --batch must be positive, got 0");
  expect_refused(refused({"--kv-heads", "3", "--heads", "8"}), "attnprof: --kv-heads 3 must divide --heads 8");
  const CliRun backends = attnprof({"compare", "--device", "cpu", "--backends", "auto"}, dir);
  expect_refused(backends, "--backends");
  EXPECT_EQ(backends.err.find(", auto"), std::string::npos) << "lists auto as valid: " << backends.err;
}

// The spellings Python takes, the CLI takes: cuda:0 and gpu for cuda, '_' in mask names.
TEST(Cli, TakesTheLibrarysSpellings) {
  TempDir dir;
  for (const std::string cuda : {"cuda", "cuda:0", "gpu"}) {
    const CliRun r = attnprof({"explain", "--device", cuda, "--seq", "64"}, dir);
    EXPECT_EQ(r.err.find("unknown"), std::string::npos) << cuda << ": " << r.err;
    if (r.code != 0) EXPECT_EQ(r.err.find("device="), std::string::npos) << "a field cited unmapped: " << r.err;
  }
  const CliRun r =
      attnprof({"explain", "--device", "cpu", "--seq", "64", "--mask", "sliding_window", "--window", "8"}, dir);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("sliding-window 8"), std::string::npos) << r.out;
}

TEST(Cli, SortBogusIsRefusedBeforeAnyWork) {
  TempDir dir;
  const CliRun r = attnprof(with(kProfile, {"--sort", "bogus", "--seq", "64", "--trace-dir", dir.str("t")}), dir);
  expect_refused(r, "bogus");
  EXPECT_LT(r.seconds, 10);
  EXPECT_TRUE(listing(dir.path() / "t").empty());
  const CliRun c =
      attnprof({"compare", "--device", "cpu", "--sort", "bogus", "--seq", "64", "--trace-dir", dir.str("t")}, dir);
  expect_refused(c, "bogus");
}

TEST(Cli, PassAndDeterministicAreCheckedBeforeAnyWork) {
  TempDir dir;
  expect_refused(attnprof(p({"--pass", "sideways", "--seq", "64", "--trace-dir", dir.str("t")}), dir),
                 "unknown --pass 'sideways': use forward, backward or train");
  expect_refused(attnprof(p({"--deterministic", "--seq", "64", "--trace-dir", dir.str("t")}), dir),
                 "--deterministic applies to the backward");
  EXPECT_TRUE(listing(dir.path() / "t").empty());
  const CliRun help = attnprof({"profile", "--help"}, dir);
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("--pass P"), std::string::npos);
  EXPECT_NE(help.out.find("--deterministic"), std::string::npos);
}

TEST(Cli, TraceDirUnderARegularFileIsRefused) {
  TempDir dir;
  const fs::path file = dir.path() / "plain_file";
  std::ofstream(file) << "not a directory\n";
  for (const std::string cmd : {"profile", "compare"}) {
    std::vector<std::string> args = {cmd,  "--device", "cpu",         "--seq",
                                     "64", "--quiet",  "--trace-dir", (file / "sub").string()};
    if (cmd == "profile") args = with(args, {"--backend", "naive"});
    const CliRun r = attnprof(args, dir);
    expect_refused(r, "--trace-dir", 1);
    EXPECT_NE(r.err.find((file / "sub").string()), std::string::npos) << r.err;
    EXPECT_EQ(slurp(file), "not a directory\n");
  }
  // The trace dir itself a regular file.
  const CliRun r = attnprof(with(kProfile, {"--seq", "64", "--trace-dir", file.string()}), dir);
  expect_refused(r, "--trace-dir", 1);
}

TEST(Cli, UnwritableJsonIsRefusedBeforeAnyWorkAndBlamesJson) {
  TempDir dir;
  const fs::path file = dir.path() / "plain_file";
  std::ofstream(file) << "x\n";
  for (const std::string cmd : {"compare", "explain"}) {
    const CliRun r = attnprof({cmd, "--device", "cpu", "--seq", "64", "--quiet", "--trace-dir", dir.str("t"), "--json",
                               (file / "out.json").string()},
                              dir);
    expect_refused(r, "--json", 1);
    EXPECT_EQ(r.err.find("--trace-dir"), std::string::npos) << r.err;
    EXPECT_LT(r.seconds, 5.0) << "refused before the run, not after it";
    EXPECT_TRUE(listing(dir.path() / "t").empty()) << "no traces left behind";
  }
  const CliRun d = attnprof({"explain", "--device", "cpu", "--json", dir.path().string()}, dir);
  expect_refused(d, "directory", 1);
}

TEST(Cli, UnwritableHtmlIsRefusedBeforeAnyWork) {
  TempDir dir;
  const fs::path file = dir.path() / "plain_file";
  std::ofstream(file) << "x\n";
  for (const auto& args : {std::vector<std::string>{"compare"}, kProfile}) {
    const CliRun r = attnprof(with(args, {"--device", "cpu", "--seq", "64", "--quiet", "--trace-dir", dir.str("t"),
                                          "--html", (file / "out.html").string()}),
                              dir);
    expect_refused(r, "--html", 1);
    EXPECT_LT(r.seconds, 5.0) << "refused before the run, not after it";
    EXPECT_TRUE(listing(dir.path() / "t").empty()) << "no traces left behind";
  }
  expect_refused(attnprof({"explain", "--device", "cpu", "--html", dir.str("x.html")}, dir), "--html", 2);
}

TEST(Cli, HtmlWithoutPlotlyIsOneLineSayingRunSetup) {
  TempDir dir;
  // $ATTNPROF_PLOTLY_JS, when set, is the only place looked: a missing file
  // stands for a machine where scripts/setup.sh never ran.
  const std::string missing = (dir.path() / "missing" / "plotly.min.js").string();
  ASSERT_EQ(::setenv("ATTNPROF_PLOTLY_JS", missing.c_str(), 1), 0);
  const CliRun r =
      attnprof(with(kProfile, {"--seq", "64", "--trace-dir", dir.str("t"), "--html", dir.str("r.html")}), dir);
  ::unsetenv("ATTNPROF_PLOTLY_JS");
  expect_refused(r, "scripts/setup.sh", 1);
  EXPECT_LT(r.seconds, 5.0) << "refused before the run, not after it";
  EXPECT_FALSE(fs::exists(dir.path() / "r.html"));
  EXPECT_TRUE(listing(dir.path() / "t").empty()) << "no traces left behind";
}

TEST(Cli, CompareAndProfileWriteAnHtmlReport) {
  TempDir dir;
  for (const auto& args : {with({"compare", "--backends", "naive,flash"}, {}), kProfile}) {
    const fs::path html = dir.path() / ("reports-" + args[0]) / (args[0] + ".html");
    const CliRun r = attnprof(with(args, {"--device", "cpu", "--batch", "1", "--heads", "2", "--seq", "64", "--quiet",
                                          "--trace-dir", dir.str("t"), "--html", html.string()}),
                              dir);
    ASSERT_EQ(r.code, 0) << r.err;
    const std::string page = slurp(html);
    EXPECT_EQ(page.rfind("<!DOCTYPE html>", 0), 0u);
    EXPECT_NE(page.find("plotly.js v"), std::string::npos) << "Plotly.js inlined";
    EXPECT_EQ(page.find("<script src"), std::string::npos) << "nothing loaded from elsewhere";
    EXPECT_NE(r.out.find(html.string()), std::string::npos) << r.out;
    EXPECT_EQ(listing(html.parent_path()), std::set<std::string>{args[0] + ".html"}) << "no temporary left";
  }
}

TEST(Cli, ReadOnlyTraceDirIsRefused) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes into read-only directories";
  TempDir dir;
  const fs::path ro = dir.path() / "ro";
  fs::create_directory(ro);
  fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
  const CliRun r = attnprof(with(kProfile, {"--seq", "64", "--trace-dir", ro.string()}), dir);
  expect_refused(r, "--trace-dir", 1);
  fs::permissions(ro, fs::perms::owner_all);
  EXPECT_TRUE(listing(ro).empty());
}

TEST(Cli, ProblemTooLargeForMemoryIsRefusedQuicklyWithoutAllocating) {
  TempDir dir;
  const std::vector<std::string> huge = {"--device", "cpu",   "--batch", "4096",        "--heads",   "64",
                                         "--seq",    "65536", "--quiet", "--trace-dir", dir.str("t")};
  const CliRun r = attnprof(with({"profile", "--backend", "naive"}, huge), dir);
  expect_refused(r, "GiB");
  // A run's failure is text (RunResult::failure), which no flag table reads: the fields in prose.
  EXPECT_NE(r.err.find("use a smaller batch, heads or seq"), std::string::npos) << "says what to change: " << r.err;
  EXPECT_LT(r.seconds, 5.0) << "refused by the estimate, not by trying";
  const CliRun f = attnprof(with({"profile", "--backend", "flash"}, huge), dir);
  expect_refused(f, "GiB");
  EXPECT_LT(f.seconds, 5.0);
  // Nothing half-written: the directory holds no output, temporary or probe file.
  EXPECT_TRUE(listing(dir.path() / "t").empty());
}

TEST(Cli, CompareFailsWhenNoBackendRuns) {
  TempDir dir;
  const CliRun r = attnprof({"compare", "--device", "cpu", "--batch", "4096", "--heads", "64", "--seq", "65536",
                             "--quiet", "--trace-dir", dir.str("t"), "--json", dir.str("out.json")},
                            dir);
  EXPECT_LT(r.seconds, 10.0);
  expect_refused(r, "GiB", 1);
  EXPECT_NE(r.out.find("failed: "), std::string::npos) << "the table still shows each backend:\n" << r.out;
  EXPECT_TRUE(listing(dir.path() / "t").empty());
  // The JSON for scripts is complete: every backend, each failed or not eligible.
  const auto j = nlohmann::json::parse(slurp(dir.path() / "out.json"));
  ASSERT_EQ(j["results"].size(), 6u);
  for (const auto& res : j["results"]) {
    EXPECT_TRUE(res["rel_error"].is_null()) << res["backend"];
    EXPECT_TRUE(res["peak_bytes"].is_null()) << res["backend"];
  }
  // Only backends that cannot run on this device.
  const CliRun n = attnprof({"compare", "--device", "cpu", "--seq", "64", "--backends", "efficient,cudnn", "--quiet",
                             "--trace-dir", dir.str("t")},
                            dir);
  expect_refused(n, "no backend can run");
}

TEST(Cli, DeviceCudaOnACpuOnlyBuild) {
  TempDir dir;
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"profile", "--backend", "naive", "--device", "cuda", "--seq", "64"},
        std::vector<std::string>{"compare", "--device", "cuda", "--seq", "64"},
        std::vector<std::string>{"explain", "--device", "cuda", "--seq", "64"}}) {
    const CliRun r = attnprof(with(args, {"--trace-dir", dir.str("t")}), dir);
    expect_refused(r, "CUDA");
    EXPECT_TRUE(listing(dir.path() / "t").empty());
  }
}

TEST(Cli, FailedOutputWriteLeavesNoTemporaryFiles) {
  TempDir dir;
  const fs::path t = dir.path() / "t";
  // The table's path is taken by a directory: the .txt cannot be renamed into place.
  fs::create_directories(t / "1_2_64_64_naive.txt");
  const CliRun r =
      attnprof(with(kProfile, {"--batch", "1", "--heads", "2", "--seq", "64", "--trace-dir", t.string()}), dir);
  expect_refused(r, "1_2_64_64_naive.txt", 1);
  for (const auto& name : listing(t)) {
    EXPECT_EQ(name.find(".tmp"), std::string::npos) << "temporary left behind: " << name;
    EXPECT_EQ(name.find("probe"), std::string::npos) << "probe left behind: " << name;
  }
}

// explain takes the run's flags (one command line serves every command) and checks them as a run would: a bad
// --sort is refused there too; a guess about runs (--expect) is refused, as it would be dropped unread.
TEST(Cli, ExplainChecksTheRunsFlags) {
  TempDir dir;
  const std::vector<std::string> explain = {"explain", "--device", "cpu", "--seq", "64"};
  expect_refused(attnprof(with(explain, {"--sort", "bogus"}), dir), "unknown --sort 'bogus'", 2);
  expect_refused(attnprof(with(explain, {"--expect", "naive=3"}), dir),
                 "--expect is for compare and profile (explain runs nothing)", 2);
  const CliRun r = attnprof(with(explain, {"--sort", "count", "--warmup", "0", "--threads", "1"}), dir);
  EXPECT_EQ(r.code, 0) << r.err;
}

// Output that cannot reach standard output is an error, not exit 0 with the tables lost.
TEST(Cli, AFailedWriteToStandardOutputIsAnError) {
  TempDir dir;
  for (const std::string& redirect : {std::string(">/dev/full"), std::string(">&-")}) {
    const fs::path err = dir.path() / "err";
    const std::string cmd = testing::shell_quote(ATTNPROF_CLI_PATH) + " explain --device cpu --seq 64 " + redirect +
                            " 2>" + testing::shell_quote(err.string());
    const int status = std::system(cmd.c_str());
    ASSERT_TRUE(WIFEXITED(status)) << redirect;
    EXPECT_EQ(WEXITSTATUS(status), 1) << redirect;
    const std::string text = slurp(err);
    EXPECT_EQ(text.rfind("attnprof: cannot write to standard output (", 0), 0u) << redirect << ": " << text;
    EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 1) << text;
  }
}

// The measuring variables are numbers or refused before any work, never read in part ("5x" as 5) or ignored.
TEST(Cli, BadCeilingVariablesAreRefusedBeforeAnyWork) {
  TempDir dir;
  for (const std::string& setting :
       {std::string("ATTNPROF_CEILING_TFLOPS=5x"), std::string("ATTNPROF_CEILING_TFLOPS=0"),
        std::string("ATTNPROF_COPY_GBS=1e999"), std::string("ATTNPROF_COPY_GBS=-3")}) {
    const fs::path err = dir.path() / "err";
    std::string cmd = "env " + setting + " " + testing::shell_quote(ATTNPROF_CLI_PATH);
    for (const auto& a : with(kProfile, {"--seq", "64", "--trace-dir", dir.str("t")}))
      cmd += " " + testing::shell_quote(a);
    cmd += " >/dev/null 2>" + testing::shell_quote(err.string());
    const int status = std::system(cmd.c_str());
    EXPECT_EQ(WEXITSTATUS(status), 2) << setting;
    const std::string text = slurp(err);
    const std::string name = setting.substr(0, setting.find('='));
    EXPECT_EQ(text.rfind("attnprof: " + name, 0), 0u) << setting << ": " << text;
    EXPECT_EQ(text.find("failed"), std::string::npos) << "refused after the run: " << text;
    EXPECT_FALSE(fs::exists(dir.path() / "t")) << setting;
  }
}

// A --mask-file that is a FIFO (opening it would wait for a writer) or a directory: one line, at once.
TEST(Cli, MaskFileThatIsNoRegularFileIsRefusedAtOnce) {
  TempDir dir;
  const fs::path fifo = dir.path() / "m.npy";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const CliRun r = attnprof({"explain", "--device", "cpu", "--seq", "32", "--mask-file", fifo.string()}, dir);
  expect_refused(r, "it is not a regular file (a FIFO, device or socket)", 4);
  EXPECT_LT(r.seconds, 10);
  expect_refused(attnprof({"explain", "--device", "cpu", "--seq", "32", "--mask-file", dir.str("")}, dir),
                 "it is a directory, not a .npy file", 4);
}

// More threads than OpenBLAS's build allows (its MAX_THREADS): the device line says the count the matrix
// products run with beside the one asked for, where before it said only the one asked for.
TEST(Cli, TheDeviceLineSaysWhenOpenBlasRunsFewerThreads) {
  TempDir dir;
  const CliRun r = attnprof({"explain", "--device", "cpu", "--seq", "64", "--threads", "4096"}, dir);
  ASSERT_EQ(r.code, 0) << r.err;
  const std::size_t at = r.out.find("4096 threads");
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string after = r.out.substr(at + 12, 40);
  const std::size_t cap_at = r.out.find("MAX_THREADS=");
  if (after.rfind(" (OpenBLAS ", 0) == 0) {
    const int blas = std::stoi(after.substr(11));
    EXPECT_LT(blas, 4096) << after;
    if (cap_at != std::string::npos) EXPECT_EQ(blas, std::stoi(r.out.substr(cap_at + 12))) << r.out;
  } else {
    // An OpenBLAS that runs every thread asked for (its banner's cap, where it gives one, at least 4096).
    if (cap_at != std::string::npos) EXPECT_GE(std::stoi(r.out.substr(cap_at + 12)), 4096) << r.out;
  }
}

}  // namespace
}  // namespace attnprof
