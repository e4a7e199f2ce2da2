// The CUDA occupancy calculator's formula (cuda_occupancy.h, the occupancy
// spreadsheet): resident blocks per SM are the least of four limits.
//   warps:     max warps per SM / warps per block
//   blocks:    the architecture's cap on resident blocks
//   registers: registers are allocated per warp in units of 256, and each of
//              the SM's 4 sub-partitions holds a quarter of the register file,
//              so whole warps fit per sub-partition
//   shared:    (shared per block + the 1 KiB reserved per block from sm80),
//              rounded up to the allocation unit, into the SM's shared memory
// The one occupancy calculator: in the profiler layer so that the CUPTI
// collector fills live kernel records with it and the trace reader (analysis)
// computes the same figure for a trace read back. tests/gpu/occupancy_test.cu
// checks it against CUDA's own (cudaOccupancyMaxActiveBlocksPerMultiprocessor).
#include "attnprof/occupancy.h"

#include <algorithm>
#include <array>

namespace attnprof {
namespace {

constexpr int kRegisterAllocationUnit = 256;  // registers, per warp (sm70 through sm120)
constexpr int kMaxRegistersPerThread = 255;
constexpr int kSubPartitions = 4;

struct ArchRow {
  int major, minor;
  ArchLimits limits;
};

// From the CUDA C++ Programming Guide's compute-capability table.
constexpr std::array<ArchRow, 9> kArchs{{
    {7, 0, {2048, 32, 65536, 98304, 0, 256}},
    {7, 5, {1024, 16, 65536, 65536, 0, 256}},
    {8, 0, {2048, 32, 65536, 167936, 1024, 128}},
    {8, 6, {1536, 16, 65536, 102400, 1024, 128}},
    {8, 7, {1536, 16, 65536, 167936, 1024, 128}},
    {8, 9, {1536, 24, 65536, 102400, 1024, 128}},
    {9, 0, {2048, 32, 65536, 233472, 1024, 128}},
    {10, 0, {2048, 32, 65536, 233472, 1024, 128}},
    {12, 0, {1536, 32, 65536, 102400, 1024, 128}},
}};

// In 64 bits: a trace's registers per thread times its warp size (1 << 30 at
// most) can pass 2^31, and an int would wrap, to 0 at 2^32 (a division by zero).
std::int64_t round_up(std::int64_t x, int unit) { return (x + unit - 1) / unit * unit; }

}  // namespace

std::optional<ArchLimits> arch_limits(int compute_major, int compute_minor) {
  for (const auto& row : kArchs) {
    if (row.major == compute_major && row.minor == compute_minor) return row.limits;
  }
  return std::nullopt;
}

std::optional<Occupancy> theoretical_occupancy(const KernelInfo& k, const DeviceProperties& d) {
  const std::optional<ArchLimits> arch = arch_limits(d.compute_major, d.compute_minor);
  // The trace's own figures first; the architecture table fills the gaps
  // (Kineto's deviceProperties carry no block cap and no reserved memory).
  const int max_threads = d.max_threads_per_sm > 0 ? d.max_threads_per_sm : arch ? arch->max_threads_per_sm : 0;
  const int max_blocks = d.max_blocks_per_sm > 0 ? d.max_blocks_per_sm : arch ? arch->max_blocks_per_sm : 0;
  const int regs_per_sm = d.regs_per_sm > 0 ? d.regs_per_sm : arch ? arch->regs_per_sm : 0;
  const std::int64_t shared_per_sm = d.shared_mem_per_sm > 0 ? d.shared_mem_per_sm : arch ? arch->shared_per_sm : 0;
  const int reserved = arch ? arch->reserved_shared_per_block : (d.compute_major >= 8 ? 1024 : 0);
  const int shared_unit = arch ? arch->shared_granularity : 128;
  const int warp = d.warp_size > 0 ? d.warp_size : 32;
  if (max_threads <= 0 || max_blocks <= 0 || regs_per_sm <= 0 || shared_per_sm <= 0) return std::nullopt;

  if (k.block[0] <= 0 || k.block[1] <= 0 || k.block[2] <= 0) return std::nullopt;
  // A trace's dimensions reach 2^30 each, and three of them pass an int64:
  // the count saturates at 2^62, a block no launch takes.
  constexpr std::int64_t kManyThreads = std::int64_t{1} << 62;
  const std::int64_t xy = static_cast<std::int64_t>(k.block[0]) * k.block[1];
  const std::int64_t threads = xy > kManyThreads / k.block[2] ? kManyThreads : xy * k.block[2];
  const int max_warps = max_threads / warp;
  if (max_warps <= 0) return std::nullopt;  // a warp wider than the SM's threads: a corrupt deviceProperties
  const std::int64_t warps_per_block = (threads + warp - 1) / warp;
  const int max_threads_per_block = d.max_threads_per_block > 0 ? d.max_threads_per_block : 1024;

  Occupancy o;
  if (threads > max_threads_per_block || k.registers_per_thread > kMaxRegistersPerThread ||
      k.registers_per_thread < 0 || k.static_shared_bytes < 0 || k.dynamic_shared_bytes < 0) {
    return o;  // cannot launch: 0 blocks
  }

  int blocks = max_blocks;
  o.limited_by = OccupancyLimit::Blocks;
  const auto limit = [&](std::int64_t by, OccupancyLimit why) {
    if (by < blocks) {
      blocks = static_cast<int>(std::max<std::int64_t>(by, 0));
      o.limited_by = why;
    }
  };
  limit(max_warps / warps_per_block, OccupancyLimit::Warps);
  if (k.registers_per_thread > 0) {
    const std::int64_t regs_per_warp =
        round_up(static_cast<std::int64_t>(k.registers_per_thread) * warp, kRegisterAllocationUnit);
    const std::int64_t warps_per_partition = regs_per_sm / kSubPartitions / regs_per_warp;
    limit(warps_per_partition * kSubPartitions / warps_per_block, OccupancyLimit::Registers);
  }
  const std::int64_t shared = static_cast<std::int64_t>(k.static_shared_bytes) + k.dynamic_shared_bytes;
  if (shared > 0) {
    const std::int64_t per_block = round_up(shared + reserved, shared_unit);
    limit(shared_per_sm / per_block, OccupancyLimit::SharedMemory);
  }
  o.blocks_per_sm = blocks;
  o.warps_per_sm = static_cast<int>(blocks * warps_per_block);
  o.pct = 100.0 * o.warps_per_sm / max_warps;
  return o;
}

}  // namespace attnprof
