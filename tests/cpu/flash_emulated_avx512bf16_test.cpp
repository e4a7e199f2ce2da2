// The CPU flash's avx512bf16 kernels over stand-ins of their intrinsics, against
// float64, forward and backward (see flash_emulated_test.h).
#define ATTNPROF_FLASH_EMULATE 1

#define ATTNPROF_ISA_NS emulated_avx512bf16
#define ATTNPROF_ISA_TABLE kKernelsEmulatedAvx512Bf16
#define ATTNPROF_ISA_LEVEL CpuIsa::Avx512Bf16
#define ATTNPROF_ISA_BF16 1
// The stand-ins first: the kernels below use them.
// clang-format off
#include "cpu/avx512_emulation.h"
#include "backends/cpu/flash_isa_table.h"
// clang-format on
#include "cpu/flash_emulated_test.h"
#include "cpu/score_range_cases.h"

namespace attnprof {
namespace {

TEST(FlashEmulated, Avx512Bf16Forward) { run_emulated_forward(cpu::flash::kKernelsEmulatedAvx512Bf16, "avx512bf16"); }
TEST(FlashEmulated, Avx512Bf16NanAndInfPassThrough) {
  run_emulated_nan(cpu::flash::kKernelsEmulatedAvx512Bf16, "avx512bf16");
}
TEST(FlashEmulated, Avx512Bf16Bf16Gemm) { run_emulated_bf16_gemm(cpu::flash::kKernelsEmulatedAvx512Bf16); }
TEST(FlashEmulated, Avx512Bf16Backward) { run_emulated_backward(cpu::flash::kKernelsEmulatedAvx512Bf16, "avx512bf16"); }
TEST(FlashEmulated, Avx512Bf16PackedCallIsPerSequenceDenseCallsBitForBit) {
  run_emulated_packed_bits(cpu::flash::kKernelsEmulatedAvx512Bf16, "avx512bf16");
}

// Large scores inside the documented range (score_range_cases.h): the bf16
// kernels take the scale in the exponent (issue 57 item 6).
TEST(FlashEmulated, Avx512Bf16LargeScoresInsideTheRange) {
  const UseKernels use(cpu::flash::kKernelsEmulatedAvx512Bf16);
  auto flash = cpu::make_flash();
  testing::expect_large_scores_computed(*flash, "avx512bf16 (emulated)", true);
}

}  // namespace
}  // namespace attnprof
