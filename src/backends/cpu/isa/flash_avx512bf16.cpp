// The CPU flash kernels for the avx512bf16 level (cpu_isa.h), compiled with that
// level's flags (CMakeLists.txt); run only where cpu_isa.h finds the level.
#define ATTNPROF_ISA_NS avx512bf16
#define ATTNPROF_ISA_TABLE kKernelsAvx512Bf16
#define ATTNPROF_ISA_LEVEL CpuIsa::Avx512Bf16
#define ATTNPROF_ISA_BF16 1
#include "backends/cpu/flash_isa_table.h"
