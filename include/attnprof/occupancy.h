// Theoretical occupancy of a kernel launch, computed from its record (block
// size, registers per thread, shared memory per block) and the device's
// properties with the CUDA occupancy calculator's formula, in plain C++: the
// CUPTI collector fills its kernel records with it, and a CPU-only build that
// reads a GPU trace computes the same figure, for every kernel, libraries' and
// driver-API (cuLaunchKernelEx) launches included.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

#include "attnprof/activity.h"

namespace attnprof {

// What bounds the resident blocks per SM.
enum class OccupancyLimit : std::uint8_t { Warps, Blocks, Registers, SharedMemory };

constexpr std::string_view occupancy_limit_name(OccupancyLimit l) {
  constexpr std::array<std::string_view, 4> kNames{"warps", "blocks", "registers",
                                                   "shared memory"};  // the enum's order
  return kNames[static_cast<std::size_t>(l)];
}

struct Occupancy {
  int blocks_per_sm = 0;  // resident blocks per SM
  int warps_per_sm = 0;   // resident warps per SM
  double pct = 0;         // warps_per_sm / the SM's maximum warps, in percent
  OccupancyLimit limited_by = OccupancyLimit::Warps;
};

// The per-architecture constants the formula needs, for the compute
// capabilities attnprof knows (7.0, 7.5, 8.0, 8.6, 8.7, 8.9, 9.0, 10.0, 12.0);
// none for others. Fields a trace's deviceProperties carries take precedence.
struct ArchLimits {
  int max_threads_per_sm;
  int max_blocks_per_sm;
  int regs_per_sm;
  int shared_per_sm;              // bytes usable by blocks (the largest carveout)
  int reserved_shared_per_block;  // bytes the system keeps per block (1 KiB from sm80)
  int shared_granularity;         // bytes a block's shared memory is rounded up to
};
std::optional<ArchLimits> arch_limits(int compute_major, int compute_minor);

// The occupancy of one launch; none when the device is unknown (no compute
// capability and no limits in `device`) or the record has no block size. A
// launch that cannot fit on an SM (too many threads, registers or shared
// memory per block) has 0 blocks and 0%.
std::optional<Occupancy> theoretical_occupancy(const KernelInfo& kernel, const DeviceProperties& device);

}  // namespace attnprof
