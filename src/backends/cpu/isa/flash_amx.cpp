// The CPU flash kernels for the amx level (cpu_isa.h), compiled with that
// level's flags (CMakeLists.txt); run only where cpu_isa.h finds the level.
#define ATTNPROF_ISA_NS amx
#define ATTNPROF_ISA_TABLE kKernelsAmx
#define ATTNPROF_ISA_LEVEL CpuIsa::Amx
#define ATTNPROF_ISA_BF16 1
#include "backends/cpu/flash_isa_table.h"
