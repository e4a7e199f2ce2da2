// The CPU flash kernels for the avx512 level (cpu_isa.h), compiled with that
// level's flags (CMakeLists.txt); run only where cpu_isa.h finds the level.
#define ATTNPROF_ISA_NS avx512
#define ATTNPROF_ISA_TABLE kKernelsAvx512
#define ATTNPROF_ISA_LEVEL CpuIsa::Avx512
#define ATTNPROF_ISA_BF16 0
#include "backends/cpu/flash_isa_table.h"
