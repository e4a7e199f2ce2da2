// The report: findings read off real CPU runs, the compare and explain tables,
// and the --json schema of DESIGN.md.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "analysis/findings.h"
#include "analysis/format.h"
#include "attnprof/error.h"
#include "attnprof/runner.h"
#include "findings_lookup.h"
#include "report/json.h"

namespace attnprof {
namespace {

using testing::dump;
using testing::only;

Problem cpu_problem(std::int64_t seq, std::int64_t kv_seq, MaskKind mask, DType dt = DType::BF16) {
  Problem p;
  p.batch = 1;
  p.heads = 2;
  p.seq = seq;
  p.kv_seq = kv_seq;
  p.head_dim = 64;
  p.dtype = dt;
  p.mask = mask;
  p.device = Device::Cpu;
  p.normalize().validate();
  return p;
}

// What `compare` does: every backend (ineligible ones as rows with a reason),
// acceptance with math's error, then the findings.
std::vector<RunResult> compare(const Problem& p, const Guesses& guesses = {}) {
  RunOptions o;
  o.schedule = {.wait = 0, .warmup = 1, .active = 2, .repeat = 1};
  o.check_rows = 128;
  o.threads = 1;  // small problems: a team's spin-waits cost more than they save on a loaded machine
  std::vector<RunResult> results = run_backends(p, o);
  analysis::apply_acceptance(results);
  for (auto& r : results) r.findings = analysis::findings(r, results, guesses);
  return results;
}

const RunResult& get(const std::vector<RunResult>& all, const std::string& name) {
  for (const auto& r : all) {
    if (r.backend == name) return r;
  }
  throw std::runtime_error("no result for " + name);
}

bool has(const std::vector<Finding>& findings, const std::string& needle) {
  return std::any_of(findings.begin(), findings.end(),
                     [&](const Finding& f) { return f.text.find(needle) != std::string::npos; });
}

class Report : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    results_ = new std::vector<RunResult>(compare(cpu_problem(512, 512, MaskKind::Causal)));
  }
  static void TearDownTestSuite() {
    delete results_;
    results_ = nullptr;
  }
  static const std::vector<RunResult>& results() { return *results_; }

 private:
  static std::vector<RunResult>* results_;
};
std::vector<RunResult>* Report::results_ = nullptr;

void EveryBackendHasAResultAndTheCpuOnesRan(const std::vector<RunResult>& results) {
  ASSERT_EQ(results.size(), backend_names().size());
  for (std::string_view n : backend_names()) {
    const RunResult& r = get(results, std::string(n));
    const bool cpu = n == "naive" || n == "naive_inplace" || n == "math" || n == "flash";
    EXPECT_EQ(r.eligibility.eligible, cpu) << n;
    if (cpu) {
      ASSERT_FALSE(r.failure) << n << ": " << *r.failure;
      ASSERT_TRUE(r.acceptance.has_value()) << n;
      EXPECT_TRUE(r.acceptance->pass) << n << ": " << r.acceptance->why;
      EXPECT_EQ(r.metrics.steps, 2) << n;
    } else {
      EXPECT_NE(r.eligibility.reason.find("not eligible on CPU"), std::string::npos) << r.eligibility.reason;
      EXPECT_TRUE(r.findings.empty());
    }
  }
}

void NaiveHasAHiddenCopyFinding(const std::vector<RunResult>& results) {
  const auto& f = get(results, "naive").findings;
  EXPECT_TRUE(has(f, "hidden copy")) << dump(f);
  EXPECT_TRUE(has(f, "masked_fill")) << dump(f);
  EXPECT_FALSE(has(f, "in place")) << dump(f);
  EXPECT_FALSE(has(f, "expected ops")) << "the trace departs from naive's own expectation:" << dump(f);
}

void NaiveInplaceSaysNoCopyAndWhatItSaved(const std::vector<RunResult>& results) {
  const auto& f = get(results, "naive_inplace").findings;
  EXPECT_TRUE(has(f, "in place: no copy")) << dump(f);
  EXPECT_TRUE(has(f, "less allocated per forward than naive")) << dump(f);
  EXPECT_FALSE(has(f, "hidden copy")) << dump(f);
  EXPECT_FALSE(has(f, "expected ops")) << dump(f);
}

void MathShowsUpcastFp32GemmMaskRebuiltAndSafeSoftmax(const std::vector<RunResult>& results) {
  const auto& f = get(results, "math").findings;
  EXPECT_TRUE(has(f, "upcasts")) << dump(f);
  EXPECT_TRUE(has(f, "FP32 GEMM on bf16")) << dump(f);
  EXPECT_TRUE(has(f, "mask rebuilt")) << dump(f);
  EXPECT_TRUE(has(f, "NaN-safe")) << dump(f);
  EXPECT_FALSE(has(f, "hidden copy")) << dump(f);
  EXPECT_FALSE(has(f, "expected ops")) << dump(f);
  // None of math's habits are pinned on naive, which computes in bf16 with a cached mask.
  const auto& n = get(results, "naive").findings;
  EXPECT_FALSE(has(n, "upcasts")) << dump(n);
  EXPECT_FALSE(has(n, "mask rebuilt")) << dump(n);
  EXPECT_FALSE(has(n, "NaN-safe")) << dump(n);
}

void FlashMemoryAgainstNaive(const std::vector<RunResult>& results) {
  const RunResult& flash = get(results, "flash");
  const RunResult& naive = get(results, "naive");
  ASSERT_GT(flash.metrics.peak_bytes, 0);
  ASSERT_GE(naive.metrics.peak_bytes, 4 * flash.metrics.peak_bytes);
  EXPECT_TRUE(has(flash.findings, "below naive's")) << dump(flash.findings);
  EXPECT_FALSE(has(flash.findings, "hidden copy")) << dump(flash.findings);
  // Alone, without naive to compare with, there is no memory finding.
  const auto alone = analysis::findings(flash, {}, {});
  EXPECT_FALSE(has(alone, "naive")) << dump(alone);
}

void GuessesAreConfirmedOrMissed(const std::vector<RunResult>& results) {
  const RunResult& naive = get(results, "naive");
  const auto right = analysis::findings(naive, results, {{"naive", 5}});
  EXPECT_TRUE(has(right, "guess confirmed")) << dump(right);
  const auto wrong = analysis::findings(naive, results, {{"naive", 6}});
  EXPECT_TRUE(has(wrong, "guess missed")) << dump(wrong);
  const auto other = analysis::findings(naive, results, {{"math", 6}});
  EXPECT_FALSE(has(other, "guess")) << dump(other);
}

// The same findings as records: the rule that made each, its severity, the
// events it read and the figures behind its text.
void FindingsAreRecordsWithEvidence(const std::vector<RunResult>& results) {
  for (const auto& r : results) {
    for (const auto& f : r.findings) {
      EXPECT_FALSE(f.rule.empty()) << f.text;
      for (const auto& e : f.evidence) {
        ASSERT_GE(e.index, 0) << f.rule;
        ASSERT_LT(static_cast<std::size_t>(e.index), r.trace.activities.size()) << f.rule;
        EXPECT_EQ(r.trace.activities[static_cast<std::size_t>(e.index)].name, e.name) << f.rule;
      }
    }
  }
  const RunResult& naive = get(results, "naive");
  const Finding& copy = only(naive.findings, "hidden-copy");
  EXPECT_EQ(copy.severity, Severity::Warning);
  EXPECT_EQ(copy.text.rfind("hidden copy: masked_fill (out of place) allocates and copies ", 0), 0u) << copy.text;
  ASSERT_GE(copy.evidence.size(), 2u);
  EXPECT_EQ(copy.evidence[0].name, "masked_fill");
  EXPECT_EQ(copy.evidence[0].category, "cpu_op");
  EXPECT_EQ(copy.evidence[1].name, "copy_");
  EXPECT_DOUBLE_EQ(copy.figures.at("copies_per_forward"), 1);
  EXPECT_EQ(copy.text, "hidden copy: masked_fill (out of place) allocates and copies " +
                           analysis::mib(copy.figures.at("bytes_per_forward")) + " per forward");
  EXPECT_EQ(copy.evidence.size(), 1 + 2u) << "the op once, then the copy of each of the two forwards";

  const Finding& in_place = only(get(results, "naive_inplace").findings, "masked-fill-in-place");
  EXPECT_EQ(in_place.severity, Severity::Info);
  EXPECT_GT(in_place.figures.at("saved_bytes_per_forward"), 0);
  ASSERT_FALSE(in_place.evidence.empty());
  EXPECT_EQ(in_place.evidence[0].name, "masked_fill_");

  const auto& math = get(results, "math").findings;
  const Finding& up = only(math, "upcast-fp32");
  EXPECT_EQ(up.severity, Severity::Warning);
  EXPECT_EQ(up.text,
            analysis::format("upcasts %.0f bf16 tensors to FP32 per forward", up.figures.at("upcasts_per_forward")));
  for (const auto& e : up.evidence) EXPECT_EQ(e.name, "to");
  EXPECT_EQ(only(math, "fp32-gemm").text, "FP32 GEMM on bf16 inputs");
  EXPECT_EQ(only(math, "mask-rebuilt").text, "mask rebuilt on every call (ones, tril, where)");
  EXPECT_EQ(only(math, "nan-safe-softmax").severity, Severity::Info);
  EXPECT_EQ(only(math, "nan-safe-softmax").text, "NaN-safe softmax: a fully masked row gives zeros");

  const Finding& mem = only(get(results, "flash").findings, "memory-below-baseline");
  EXPECT_EQ(mem.severity, Severity::Info);
  EXPECT_GE(mem.figures.at("ratio"), 4);
  EXPECT_DOUBLE_EQ(mem.figures.at("baseline_peak_bytes"),
                   static_cast<double>(get(results, "naive").metrics.peak_bytes));

  const auto missed = analysis::findings(naive, results, {{"naive", 6}});
  EXPECT_EQ(only(missed, "guess-missed").severity, Severity::Warning);
  EXPECT_EQ(only(missed, "guess-missed").text, "guess missed: you expected 6 ops per forward, the trace shows 5.0");
  EXPECT_DOUBLE_EQ(only(missed, "guess-missed").figures.at("guess_per_forward"), 6);
}

void CompareTableHasEveryBackendRow(const std::vector<RunResult>& results) {
  const std::string table = compare_table(results);
  for (const char* col :
       {"backend", "ops/fwd", "copies/fwd", "peak mem", "TFLOP/s", "rel error", "what the trace shows"}) {
    EXPECT_NE(table.find(col), std::string::npos) << col << "\n" << table;
  }
  std::vector<std::string> lines;
  for (std::size_t a = 0, b; a < table.size(); a = b + 1) {
    b = table.find('\n', a);
    if (b == std::string::npos) b = table.size();
    lines.push_back(table.substr(a, b - a));
  }
  for (std::string_view n : backend_names()) {
    const std::string name(n);
    const bool row =
        std::any_of(lines.begin(), lines.end(), [&](const std::string& l) { return l.rfind(name + " ", 0) == 0; });
    EXPECT_TRUE(row) << "no row for " << name << "\n" << table;
  }
  EXPECT_NE(table.find("not eligible on CPU"), std::string::npos) << table;
  EXPECT_NE(table.find("hidden copy"), std::string::npos) << table;
  EXPECT_NE(table.find(" ok"), std::string::npos) << table;
  EXPECT_EQ(table.find("FAIL"), std::string::npos) << table;
}

void ExplainTableListsEveryBackend(const std::vector<RunResult>&) {
  const auto rows = explain(cpu_problem(512, 512, MaskKind::Causal));
  AutoChoice pick{"flash", "fastest measured"};
  const std::string t = ExplainReport{.rows = rows, .chosen = pick}.table();
  for (std::string_view n : backend_names()) EXPECT_NE(t.find(std::string(n)), std::string::npos) << n;
  EXPECT_NE(t.find("picks flash"), std::string::npos) << t;
  EXPECT_NE(t.find("not eligible"), std::string::npos) << t;
}

const char* const kResultFields[] = {"backend",
                                     "eligible",
                                     "reason",
                                     "kernels_per_forward",
                                     "ops_per_forward",
                                     "copies_per_forward",
                                     "device_time_us",
                                     "host_time_us",
                                     "host_time_unprofiled_us",
                                     "host_time_unprofiled_p10_us",
                                     "host_time_unprofiled_p90_us",
                                     "peak_bytes",
                                     "tflops",
                                     "ceiling_pct",
                                     "max_abs_error",
                                     "rel_error",
                                     "nan_count",
                                     "occupancy_pct",
                                     "findings"};

void ResultJsonHasEveryFieldOfTheSchema(const std::vector<RunResult>& results) {
  for (const auto& r : results) {
    const nlohmann::json j = report::result_json(r);
    for (const char* f : kResultFields) ASSERT_TRUE(j.contains(f)) << r.backend << " lacks " << f;
    EXPECT_EQ(j["backend"], r.backend);
    EXPECT_EQ(j["eligible"], r.eligibility.eligible);
    EXPECT_TRUE(j["reason"].is_string());
    EXPECT_FALSE(j["reason"].get<std::string>().empty()) << r.backend;
    ASSERT_TRUE(j["findings"].is_array());
    EXPECT_EQ(j["findings"].size(), r.findings.size());
    for (std::size_t k = 0; k < r.findings.size(); ++k) {
      const auto& f = j["findings"][k];
      ASSERT_TRUE(f.is_object()) << f;
      EXPECT_EQ(f["rule"], r.findings[k].rule);
      EXPECT_EQ(f["text"], r.findings[k].text);
      EXPECT_TRUE(f["severity"] == "info" || f["severity"] == "warning" || f["severity"] == "error") << f;
      ASSERT_TRUE(f["evidence"].is_array()) << f;
      EXPECT_EQ(f["evidence"].size(), r.findings[k].evidence.size());
      for (const auto& e : f["evidence"]) {
        for (const char* field : {"index", "name", "cat", "ts", "dur", "correlation"}) {
          EXPECT_TRUE(e.contains(field)) << field << " missing in " << e;
        }
      }
      EXPECT_TRUE(f["figures"].is_object()) << f;
    }
    if (r.eligibility.eligible) {
      // A CPU run: no GPU activities, no occupancy; everything else measured.
      EXPECT_TRUE(j["kernels_per_forward"].is_null()) << r.backend;
      EXPECT_TRUE(j["occupancy_pct"].is_null()) << r.backend;
      // On the CPU the call is the work: there is no separate unprofiled host cost.
      for (const char* f : {"host_time_unprofiled_us", "host_time_unprofiled_p10_us", "host_time_unprofiled_p90_us"}) {
        EXPECT_TRUE(j[f].is_null()) << r.backend << "." << f;
      }
      for (const char* f : {"ops_per_forward", "copies_per_forward", "device_time_us", "host_time_us", "peak_bytes",
                            "tflops", "max_abs_error", "rel_error", "nan_count"}) {
        EXPECT_TRUE(j[f].is_number()) << r.backend << "." << f << " = " << j[f];
      }
      EXPECT_GT(j["ops_per_forward"].get<double>(), 0);
      EXPECT_GT(j["tflops"].get<double>(), 0);
      EXPECT_EQ(j["nan_count"].get<std::int64_t>(), 0);
      EXPECT_DOUBLE_EQ(j["rel_error"].get<double>(), r.error->rel);
      EXPECT_EQ(j["peak_bytes"].get<std::int64_t>(), r.metrics.peak_bytes);
    } else {
      for (const char* f : kResultFields) {
        const std::string k = f;
        if (k == "backend" || k == "eligible" || k == "reason" || k == "findings") continue;
        EXPECT_TRUE(j[f].is_null()) << r.backend << "." << f << " should be null, is " << j[f];
      }
    }
  }
  EXPECT_DOUBLE_EQ(report::result_json(get(results, "naive"))["copies_per_forward"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(report::result_json(get(results, "naive_inplace"))["copies_per_forward"].get<double>(), 0.0);
}

// One compare run (about two seconds on a loaded 2-core machine) shared by
// the checks, which CTest runs as three processes.
TEST_F(Report, Findings) {
  EveryBackendHasAResultAndTheCpuOnesRan(results());
  NaiveHasAHiddenCopyFinding(results());
  NaiveInplaceSaysNoCopyAndWhatItSaved(results());
  MathShowsUpcastFp32GemmMaskRebuiltAndSafeSoftmax(results());
  FlashMemoryAgainstNaive(results());
  GuessesAreConfirmedOrMissed(results());
  FindingsAreRecordsWithEvidence(results());
}

TEST_F(Report, Tables) {
  CompareTableHasEveryBackendRow(results());
  ExplainTableListsEveryBackend(results());
}

TEST_F(Report, Json) { ResultJsonHasEveryFieldOfTheSchema(results()); }

TEST(ReportJson, ProblemAndDevice) {
  Problem p = cpu_problem(256, 320, MaskKind::Causal);
  const nlohmann::json j = report::problem_json(p);
  EXPECT_EQ(j["batch"], 1);
  EXPECT_EQ(j["heads"], 2);
  EXPECT_EQ(j["kv_heads"], 2);
  EXPECT_EQ(j["seq"], 256);
  EXPECT_EQ(j["kv_seq"], 320);
  EXPECT_EQ(j["head_dim"], 64);
  EXPECT_EQ(j["dtype"], "bf16");
  EXPECT_EQ(j["mask"], "causal");
  EXPECT_EQ(j["device"], "cpu");
  EXPECT_DOUBLE_EQ(j["scale"].get<double>(), 0.125);
  EXPECT_DOUBLE_EQ(j["flops"].get<double>(), p.flops());
  EXPECT_TRUE(j["window"].is_null());
  p.mask = MaskKind::SlidingWindow;
  p.window = 7;
  EXPECT_EQ(report::problem_json(p)["window"], 7);
  const nlohmann::json d = report::device_json("some CPU", std::nullopt, Device::Cpu);
  EXPECT_EQ(d["type"], "cpu");
  EXPECT_EQ(d["description"], "some CPU");
}

TEST(ReportJson, FindingRecord) {
  Finding f{
      .rule = "hidden-copy",
      .severity = Severity::Warning,
      .text = "hidden copy: masked_fill (its copy_) makes 1 device-to-device copy per forward (32.0 MiB)",
      .evidence = {EventRef{.index = 9,
                            .name = "Memcpy DtoD (Device -> Device)",
                            .category = "gpu_memcpy",
                            .ts_us = 245.0,
                            .dur_us = 40.0,
                            .correlation = 3},
                   EventRef{.index = 6, .name = "masked_fill", .category = "cpu_op", .ts_us = 200.0, .dur_us = 200.0}},
      .figures = {{"copies_per_forward", 1}, {"bytes_per_forward", 33554432}}};
  const nlohmann::json j = report::finding_json(f);
  EXPECT_EQ(j["rule"], "hidden-copy");
  EXPECT_EQ(j["severity"], "warning");
  EXPECT_EQ(j["text"], f.text);
  ASSERT_EQ(j["evidence"].size(), 2u);
  EXPECT_EQ(j["evidence"][0]["index"], 9);
  EXPECT_EQ(j["evidence"][0]["name"], "Memcpy DtoD (Device -> Device)");
  EXPECT_EQ(j["evidence"][0]["cat"], "gpu_memcpy");
  EXPECT_DOUBLE_EQ(j["evidence"][0]["ts"].get<double>(), 245.0);
  EXPECT_DOUBLE_EQ(j["evidence"][0]["dur"].get<double>(), 40.0);
  EXPECT_EQ(j["evidence"][0]["correlation"], 3);
  EXPECT_TRUE(j["evidence"][1]["correlation"].is_null());
  EXPECT_DOUBLE_EQ(j["figures"]["bytes_per_forward"].get<double>(), 33554432);
  EXPECT_EQ(report::finding_json(Finding{})["figures"], nlohmann::json::object());
}

TEST(ReportJson, FailedRunIsAllNullWithTheReason) {
  Problem p;
  p.batch = 4096;
  p.heads = 64;
  p.seq = 65536;
  p.device = Device::Cpu;
  p.normalize().validate();
  RunResult r = run_backend(*find_backend("naive", Device::Cpu), p, RunOptions{});
  ASSERT_TRUE(r.failure.has_value());
  std::vector<RunResult> all{r};
  analysis::apply_acceptance(all);
  all[0].findings = analysis::findings(all[0], all, {});
  EXPECT_TRUE(all[0].findings.empty());
  const nlohmann::json j = report::result_json(all[0]);
  EXPECT_EQ(j["reason"], *r.failure);
  for (const char* f :
       {"kernels_per_forward", "ops_per_forward", "copies_per_forward", "device_time_us", "host_time_us", "peak_bytes",
        "tflops", "ceiling_pct", "max_abs_error", "rel_error", "nan_count", "occupancy_pct"}) {
    EXPECT_TRUE(j[f].is_null()) << f << " = " << j[f];
  }
  EXPECT_NE(compare_table(all).find("failed: "), std::string::npos);
}

TEST(ReportFindings, NanInNaiveOnBottomRightCausalWithShortKv) {
  // seq 96 > kv_seq 64: the first 32 query rows see no key at all.
  const Problem p = cpu_problem(96, 64, MaskKind::CausalBottomRight);
  RunOptions o;
  o.schedule = {.wait = 0, .warmup = 0, .active = 1, .repeat = 1};
  o.check_rows = 1 << 20;
  o.threads = 1;
  std::vector<RunResult> all;
  for (const char* name : {"naive", "math"}) all.push_back(run_backend(*find_backend(name, Device::Cpu), p, o));
  analysis::apply_acceptance(all);
  for (auto& r : all) r.findings = analysis::findings(r, all, {});
  const RunResult& naive = all[0];
  const RunResult& math = all[1];
  ASSERT_FALSE(naive.failure) << *naive.failure;
  ASSERT_TRUE(naive.error.has_value());
  EXPECT_EQ(naive.error->nan_rows, p.batch * p.heads * 32);
  EXPECT_TRUE(has(naive.findings, "NaN in")) << dump(naive.findings);
  EXPECT_TRUE(has(naive.findings, "fully masked")) << dump(naive.findings);
  ASSERT_TRUE(naive.acceptance.has_value());
  EXPECT_TRUE(naive.acceptance->pass) << "naive's NaN on fully masked rows is documented: " << naive.acceptance->why;
  EXPECT_FALSE(has(math.findings, "NaN in")) << dump(math.findings);
  EXPECT_EQ(math.error->nan_rows, 0);
  const std::string table = compare_table(all);
  EXPECT_NE(table.find("NaN"), std::string::npos) << table;
  EXPECT_GT(report::result_json(naive)["nan_count"].get<std::int64_t>(), 0);
}

// A refusal says only why; explain() names the backends that can take the
// problem, once, from the same answers. deterministic=true on a training
// pass: only flash's backward sums dQ in the order its blocks finish.
TEST(Explain, RefusalsEndWithTheBackendsThatCanAndNameNoOther) {
  Problem p = cpu_problem(64, 64, MaskKind::Causal);
  p.pass = Pass::Train;
  p.deterministic = true;
  p.validate();
  const std::vector<Explanation> rows = explain(p);
  std::vector<std::string> can;
  for (const Explanation& e : rows) {
    if (e.eligible) can.push_back(e.backend);
  }
  EXPECT_EQ(can, std::vector<std::string>{"flash"});
  const std::string tail = "; eligible here: flash";
  for (const Explanation& e : rows) {
    if (e.eligible) continue;
    ASSERT_GT(e.reason.size(), tail.size()) << e.reason;
    EXPECT_EQ(e.reason.substr(e.reason.size() - tail.size()), tail) << e.reason;
    EXPECT_EQ(e.reason.find('\n'), std::string::npos) << e.reason;
    const std::string why = e.reason.substr(0, e.reason.size() - tail.size());
    for (std::string_view n : backend_names()) {
      if (n == e.backend) continue;
      EXPECT_FALSE(std::regex_search(why, std::regex("\\b" + std::string(n) + "\\b")))
          << e.backend << "'s reason names " << n << ": " << why;
    }
  }
}

}  // namespace
}  // namespace attnprof
