// The CPU flash's amx kernels over stand-ins of their intrinsics, against
// float64, forward and backward (see flash_emulated_test.h).
#define ATTNPROF_FLASH_EMULATE 1
#define ATTNPROF_FLASH_EMULATE_AMX 1
#define ATTNPROF_ISA_NS emulated_amx
#define ATTNPROF_ISA_TABLE kKernelsEmulatedAmx
#define ATTNPROF_ISA_LEVEL CpuIsa::Amx
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

TEST(FlashEmulated, AmxForward) { run_emulated_forward(cpu::flash::kKernelsEmulatedAmx, "amx"); }
TEST(FlashEmulated, AmxNanAndInfPassThrough) { run_emulated_nan(cpu::flash::kKernelsEmulatedAmx, "amx"); }
TEST(FlashEmulated, AmxBf16Gemm) { run_emulated_bf16_gemm(cpu::flash::kKernelsEmulatedAmx); }
TEST(FlashEmulated, AmxBackward) { run_emulated_backward(cpu::flash::kKernelsEmulatedAmx, "amx"); }
TEST(FlashEmulated, AmxPackedCallIsPerSequenceDenseCallsBitForBit) {
  run_emulated_packed_bits(cpu::flash::kKernelsEmulatedAmx, "amx");
}

// What the amx level says it runs: tiles for bf16 at head dims the tiles
// take, both passes; the FP32 products (not VDPBF16PS) for the others, and why.
TEST(FlashEmulated, AmxProductsPerHeadDim) {
  const cpu::flash::Kernels& k = cpu::flash::kKernelsEmulatedAmx;
  const auto has = [](const char* s, const char* part) { return std::string(s).find(part) != std::string::npos; };
  const Problem tiled = testing::to_problem({.heads = 1, .seq = 64, .head_dim = 64}, DType::BF16, MaskKind::None);
  EXPECT_TRUE(has(k.forward_products(tiled), "AMX tile products")) << k.forward_products(tiled);
  EXPECT_TRUE(has(k.backward_products(tiled), "AMX tile products")) << k.backward_products(tiled);
  const Problem odd = testing::to_problem({.heads = 1, .seq = 64, .head_dim = 40}, DType::BF16, MaskKind::None);
  for (const char* s : {k.forward_products(odd), k.backward_products(odd)}) {
    EXPECT_TRUE(has(s, "FP32 FMA products")) << s;
    EXPECT_TRUE(has(s, "AMX tiles take head_dim a multiple of 32")) << s;
  }
  const Problem fp32 = testing::to_problem({.heads = 1, .seq = 64, .head_dim = 64}, DType::F32, MaskKind::None);
  EXPECT_FALSE(has(k.forward_products(fp32), "AMX")) << k.forward_products(fp32);
}

// Large scores inside the documented range (score_range_cases.h): the bf16
// kernels take the scale in the exponent (issue 57 item 6).
TEST(FlashEmulated, AmxLargeScoresInsideTheRange) {
  const UseKernels use(cpu::flash::kKernelsEmulatedAmx);
  auto flash = cpu::make_flash();
  testing::expect_large_scores_computed(*flash, "amx (emulated)", true);
}

}  // namespace
}  // namespace attnprof
