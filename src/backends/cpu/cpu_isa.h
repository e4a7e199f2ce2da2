// The instruction-set levels the CPU flash kernels are built for, what this
// CPU and its OS allow, and the level a run uses: the best the machine has, or
// the one ATTNPROF_CPU_ISA forces (tests, benchmarks). The library itself is
// built for baseline x86-64; only the kernels' translation units
// (src/backends/cpu/isa/) are compiled per level, and nothing calls into one
// before the check here says the CPU and the OS can run it, so one binary
// runs on every x86-64 (a level the machine lacks is refused in one line,
// never by SIGILL).
#pragma once

#include <array>
#include <string>
#include <string_view>

namespace attnprof::cpu {

// In increasing order; each level's machine also has every level below it.
enum class CpuIsa {
  Scalar,      // baseline x86-64 (SSE2): 8-lane arrays the compiler vectorizes
  Avx2,        // AVX2 + FMA + F16C (x86-64-v3): 8 lanes
  Avx512,      // AVX-512 F/BW/VL/DQ: 16 lanes
  Avx512Bf16,  // + AVX512-BF16: bf16 dot products (VDPBF16PS) for bf16 inputs
  Amx,         // + AMX-TILE/AMX-BF16: tile products of Q K^T and P V for bf16 inputs
};
constexpr int kCpuIsaCount = 5;
constexpr std::array<CpuIsa, kCpuIsaCount> kAllCpuIsas = {CpuIsa::Scalar, CpuIsa::Avx2, CpuIsa::Avx512,
                                                          CpuIsa::Avx512Bf16, CpuIsa::Amx};

// "scalar", "avx2", "avx512", "avx512bf16", "amx": ATTNPROF_CPU_ISA's values.
std::string_view isa_name(CpuIsa isa);

// What a level needs that this machine lacks ("avx512f, avx512bw", "OS
// permission for AMX tile data (arch_prctl ARCH_REQ_XCOMP_PERM refused)"),
// empty when it can run here. Asks cpuid, xgetbv (the OS saves the vector
// and mask registers) and, for AMX, the kernel for the tile state once.
std::string isa_missing(CpuIsa isa);
// The best level this machine runs, and why not the next one up
// ("avx2 (no avx512f)"); the whole list when the best is the top.
CpuIsa best_isa();

// The level a run uses and the story of the choice: ATTNPROF_CPU_ISA when set
// (refused by `error` if unknown or missing here), else best_isa().
struct IsaChoice {
  CpuIsa isa = CpuIsa::Scalar;
  std::string why;    // "avx512 (the best this CPU has; no avx512bf16)", "avx2 (forced by ATTNPROF_CPU_ISA)"
  std::string error;  // non-empty: the forced level cannot run here, in one line
};
// Read once per call: tests set and unset the variable between runs.
IsaChoice choose_isa();

// The CPU's model name and the flags that matter to these levels, for
// benchmark and report headers ("avx2 fma f16c avx512f ... amx_bf16").
std::string isa_flags_present();

}  // namespace attnprof::cpu
