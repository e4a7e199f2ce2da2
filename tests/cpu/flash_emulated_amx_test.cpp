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

namespace attnprof {
namespace {

TEST(FlashEmulated, AmxForward) { run_emulated_forward(cpu::flash::kKernelsEmulatedAmx, "amx"); }
TEST(FlashEmulated, AmxBf16Gemm) { run_emulated_bf16_gemm(cpu::flash::kKernelsEmulatedAmx); }
TEST(FlashEmulated, AmxBackward) { run_emulated_backward(cpu::flash::kKernelsEmulatedAmx, "amx"); }

}  // namespace
}  // namespace attnprof
