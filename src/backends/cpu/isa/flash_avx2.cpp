// The CPU flash kernels for the avx2 level (cpu_isa.h), compiled with that
// level's flags (CMakeLists.txt); run only where cpu_isa.h finds the level.
#define ATTNPROF_ISA_NS avx2
#define ATTNPROF_ISA_TABLE kKernelsAvx2
#define ATTNPROF_ISA_LEVEL CpuIsa::Avx2
#define ATTNPROF_ISA_BF16 0
#include "backends/cpu/flash_isa_table.h"
