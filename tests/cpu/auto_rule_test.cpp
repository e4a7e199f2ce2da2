// `auto` picks by a rule, not a timing (issue 57 item 7): it measured the
// eligible backends once per process, so the same inputs ran on flash in one
// process and naive in the next, with different NaN rows and bits. The rule
// (runner.h auto_order) gives the same backend, for the same stated reason,
// in every process, and explain says which rule picked it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attnprof/runner.h"
#include "common/cli_run.h"
#include "common/temp_dir.h"
#include "common/test_problem.h"

namespace attnprof {
namespace {

using testing::attnprof;
using testing::CliRun;
using testing::slurp;
using testing::TempDir;

// A problem small enough that timing noise decided the old pick.
const std::vector<std::string> kTiny = {"--device", "cpu",    "--batch", "1",         "--heads", "1",          "--seq",
                                        "16",       "--mask", "none",    "--threads", "1",       "--head-dim", "8"};

nlohmann::json explain_json(const TempDir& dir, const std::string& name) {
  std::vector<std::string> args = {"explain"};
  args.insert(args.end(), kTiny.begin(), kTiny.end());
  args.push_back("--json");
  args.push_back(dir.str(name));
  const CliRun r = attnprof(args, dir);
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("auto's rule for cpu"), std::string::npos) << r.out;
  return nlohmann::json::parse(slurp(dir.path() / name));
}

TEST(AutoRule, TwoFreshProcessesPickTheSameBackendForTheSameReason) {
  TempDir dir;
  const nlohmann::json a = explain_json(dir, "a.json");
  const nlohmann::json b = explain_json(dir, "b.json");
  ASSERT_TRUE(a["auto"].is_object()) << a.dump();
  EXPECT_EQ(a["auto"]["backend"], "flash") << a["auto"].dump();
  EXPECT_EQ(a["auto"], b["auto"]) << a["auto"].dump() << "\n" << b["auto"].dump();
  const std::string reason = a["auto"]["reason"];
  EXPECT_NE(reason.find("the first eligible of flash > math > naive_inplace > naive"), std::string::npos) << reason;
  EXPECT_EQ(reason.find(" us"), std::string::npos) << "a timing in the reason: " << reason;
}

// The order on each device, and a pick that passes over a backend that
// cannot take the problem: flash refuses an instruction-set level that does
// not exist, so auto falls to math and says why.
TEST(AutoRule, TheFirstEligibleInTheOrderAndWhatItPassedOver) {
  EXPECT_EQ(auto_order(Device::Cpu), (std::vector<std::string_view>{"flash", "math", "naive_inplace", "naive"}));
  EXPECT_EQ(auto_order(Device::Cuda),
            (std::vector<std::string_view>{"flash", "cudnn", "efficient", "math", "naive_inplace", "naive"}));
  const Problem p =
      testing::to_problem(testing::Shape{.heads = 2, .seq = 64, .head_dim = 32}, DType::F32, MaskKind::Causal);
  const AutoChoice first = choose_auto(p);
  EXPECT_EQ(first.backend, "flash") << first.reason;
  EXPECT_EQ(first.reason.find("not eligible"), std::string::npos) << first.reason;

  const char* saved = std::getenv("ATTNPROF_CPU_ISA");
  const std::string keep = saved ? saved : "";
  ::setenv("ATTNPROF_CPU_ISA", "no_such_level", 1);
  const AutoChoice fallback = choose_auto(p);
  if (saved) {
    ::setenv("ATTNPROF_CPU_ISA", keep.c_str(), 1);
  } else {
    ::unsetenv("ATTNPROF_CPU_ISA");
  }
  EXPECT_EQ(fallback.backend, "math") << fallback.reason;
  EXPECT_NE(fallback.reason.find("(flash not eligible)"), std::string::npos) << fallback.reason;
  EXPECT_EQ(choose_auto(p).backend, "flash");  // nothing cached from the fallback
}

}  // namespace
}  // namespace attnprof
