// The CPU flash's avx512 kernels over stand-ins of their intrinsics, against
// float64, forward and backward (see flash_emulated_test.h).
#define ATTNPROF_FLASH_EMULATE 1

#define ATTNPROF_ISA_NS emulated_avx512
#define ATTNPROF_ISA_TABLE kKernelsEmulatedAvx512
#define ATTNPROF_ISA_LEVEL CpuIsa::Avx512
#define ATTNPROF_ISA_BF16 0
// The stand-ins first: the kernels below use them.
// clang-format off
#include "cpu/avx512_emulation.h"
#include "backends/cpu/flash_isa_table.h"
// clang-format on
#include <bit>
#include <cmath>
#include <cstdint>

#include "cpu/flash_emulated_test.h"

namespace attnprof {
namespace {

TEST(FlashEmulated, Avx512Forward) { run_emulated_forward(cpu::flash::kKernelsEmulatedAvx512, "avx512"); }
TEST(FlashEmulated, Avx512NanAndInfPassThrough) { run_emulated_nan(cpu::flash::kKernelsEmulatedAvx512, "avx512"); }
TEST(FlashEmulated, Avx512Backward) { run_emulated_backward(cpu::flash::kKernelsEmulatedAvx512, "avx512"); }
TEST(FlashEmulated, Avx512PackedCallIsPerSequenceDenseCallsBitForBit) {
  run_emulated_packed_bits(cpu::flash::kKernelsEmulatedAvx512, "avx512");
}

// The kernels' branch-free e4m3 (flash_forward_kernels.h), which FP8 rows go
// through on their way into the products: every byte is the format's value
// (e4m3_to_float's, -0 and the subnormals included), the NaNs NaN, as FP32
// and as bf16 bits, from a row read in place and one read with a stride.
TEST(FlashEmulated, E4m3RowsAreTheFormatsValues) {
  namespace k = cpu::flash::emulated_avx512;
  std::uint8_t bytes[512];
  for (int b = 0; b < 256; ++b) bytes[b] = bytes[256 + b] = static_cast<std::uint8_t>(b);
  float f[256], strided[128];
  std::uint16_t h[256];
  k::e4m3_row(bytes, 1, 256, f);
  k::e4m3_row(bytes, 1, 256, h);
  k::e4m3_row(bytes, 2, 128, strided);  // the even bytes
  for (int b = 0; b < 256; ++b) {
    const float want = e4m3_to_float(static_cast<std::uint8_t>(b));
    for (const float got : {f[b], bf16_to_float(h[b])}) {
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << b;
      } else {
        EXPECT_EQ(std::bit_cast<std::uint32_t>(got), std::bit_cast<std::uint32_t>(want)) << b << ": " << got;
      }
    }
    if (b % 2 == 0 && !std::isnan(want)) EXPECT_EQ(strided[b / 2], want) << b;
  }
}

}  // namespace
}  // namespace attnprof
