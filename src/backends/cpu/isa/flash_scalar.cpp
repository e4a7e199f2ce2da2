// The CPU flash kernels for the scalar level (cpu_isa.h), compiled with that
// level's flags (CMakeLists.txt); run only where cpu_isa.h finds the level.
#define ATTNPROF_ISA_NS scalar
#define ATTNPROF_ISA_TABLE kKernelsScalar
#define ATTNPROF_ISA_LEVEL CpuIsa::Scalar
#define ATTNPROF_ISA_BF16 0
#include "backends/cpu/flash_isa_table.h"
