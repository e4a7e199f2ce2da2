// The suite at one kernel level: tests/CMakeLists.txt's IsaLevel.* entries run
// this binary with ATTNPROF_CPU_ISA=<level> for every level the dispatcher
// has (cpu_isa.h), so that every flash call of every test runs that level's
// kernels. Where the level is one this CPU lacks, no test runs: one line
// names what is missing and the exit code is CTest's skip (SKIP_RETURN_CODE),
// so the level is reported skipped, never passed. A name that is no level
// fails the run (a typo must not read as a skip).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "backends/cpu/cpu_isa.h"

namespace attnprof {
namespace {

// CTest's SKIP_RETURN_CODE for the IsaLevel.* entries (gtest itself would
// count tests skipped by an environment as passed).
constexpr int kSkipped = 77;

class ForcedLevel final : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* env = std::getenv("ATTNPROF_CPU_ISA");
    const std::string forced = env ? env : "";
    if (forced.empty() || forced == "auto") return;
    const cpu::IsaChoice c = cpu::choose_isa();
    if (c.error.empty()) {
      std::printf("attnprof_tests: flash cpu kernel %s\n", c.why.c_str());
      return;
    }
    for (cpu::CpuIsa isa : cpu::kAllCpuIsas) {
      if (forced != cpu::isa_name(isa)) continue;
      std::printf("attnprof_tests: every test skipped at kernel level %s: this CPU lacks %s\n", forced.c_str(),
                  cpu::isa_missing(isa).c_str());
      std::fflush(stdout);
      std::exit(kSkipped);
    }
    std::fprintf(stderr, "attnprof_tests: %s\n", c.error.c_str());
    std::exit(1);
  }
};

[[maybe_unused]] ::testing::Environment* const kForcedLevel = ::testing::AddGlobalTestEnvironment(new ForcedLevel);

// tests/CMakeLists.txt's levels (ATTNPROF_TEST_ISA_LEVELS, comma-separated) are every level
// the dispatcher has, in its order: a level added to cpu_isa.h without an
// IsaLevel.* entry fails here.
TEST(IsaLevels, CTestRunsTheSuiteAtEveryLevelTheDispatcherHas) {
  std::string levels;
  for (cpu::CpuIsa isa : cpu::kAllCpuIsas) levels += (levels.empty() ? "" : ",") + std::string(cpu::isa_name(isa));
  EXPECT_EQ(std::string(ATTNPROF_TEST_ISA_LEVELS), levels);
}

}  // namespace
}  // namespace attnprof
