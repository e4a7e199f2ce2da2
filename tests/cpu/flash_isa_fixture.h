// What the CPU flash kernels' level tests share (flash_isa_test.cpp, the
// level-by-level forward, backward and choice; flash_isa_inputs_test.cpp,
// the inputs that take paths of their own: fp8 and decoding): forcing a
// level, a case's shape, a poisoned forward checked against float64, and the
// fixture that skips a level this CPU lacks, with what it lacks.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include "attnprof/backend.h"
#include "attnprof/reference.h"
#include "backends/cpu/cpu_isa.h"
#include "common/test_problem.h"

namespace attnprof::testing {

using cpu::CpuIsa;

// Sets ATTNPROF_CPU_ISA for one scope, restoring what was there.
class ForceIsa {
 public:
  explicit ForceIsa(const std::string& value) {
    if (const char* old = std::getenv("ATTNPROF_CPU_ISA")) old_ = old;
    ::setenv("ATTNPROF_CPU_ISA", value.c_str(), 1);
  }
  ~ForceIsa() {
    if (old_) {
      ::setenv("ATTNPROF_CPU_ISA", old_->c_str(), 1);
    } else {
      ::unsetenv("ATTNPROF_CPU_ISA");
    }
  }
  ForceIsa(const ForceIsa&) = delete;
  ForceIsa& operator=(const ForceIsa&) = delete;

 private:
  std::optional<std::string> old_;
};

struct Case {
  const char* name;
  Shape shape;
  DType dtype;
  MaskKind mask;
};

// p's forward on flash into a NaN-poisoned output, 2 threads, checked against
// float64 on up to `rows` sampled rows.
inline ErrorStats flash_forward_errors(Backend& flash, const Problem& p, const Inputs& in, std::int64_t rows) {
  Tensor out = nan_tensor(p.q_dims(), p.dtype);
  RunContext ctx{.allocator = cpu_allocator(), .threads = 2};
  flash.forward(p, in, out, ctx);
  return check_against_reference(p, in, out, sample_rows(p, rows));
}

class FlashIsa : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    const std::string missing = cpu::isa_missing(GetParam());
    if (!missing.empty()) {
      GTEST_SKIP() << "flash cpu kernel " << cpu::isa_name(GetParam()) << " cannot run here: this CPU lacks "
                   << missing;
    }
  }
};

}  // namespace attnprof::testing
