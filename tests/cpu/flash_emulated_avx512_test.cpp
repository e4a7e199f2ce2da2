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
#include "cpu/flash_emulated_test.h"

namespace attnprof {
namespace {

TEST(FlashEmulated, Avx512Forward) { run_emulated_forward(cpu::flash::kKernelsEmulatedAvx512, "avx512"); }
TEST(FlashEmulated, Avx512Backward) { run_emulated_backward(cpu::flash::kKernelsEmulatedAvx512, "avx512"); }

}  // namespace
}  // namespace attnprof
