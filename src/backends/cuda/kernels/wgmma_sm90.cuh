// Warpgroup-level primitives of sm90a: the shared-memory matrix descriptor and
// the 128-byte-swizzled tile layout it describes, wgmma.mma_async m64nNk16
// (N = 64, 80, 128; RS: 64, 128) with f32 accumulation and its A operand from shared memory
// (SS) or from registers (RS); the SS form with both operands read
// MN-major (N = 32, 64, 96, 128), which the backward's dQ = dS K takes; and the e4m3
// forms m64n128k32 (SS and RS), both operands K-major (FP8 has no transpose). (mbarriers: pipeline_sm90.cuh; TMA:
// tma_sm90.cuh.)
//
// Layout. A tile of 16-bit elements is kept as column regions of 64 elements
// (128 bytes a row); region r holds columns [64r, 64r + 64) of every row,
// rows 128 bytes apart, and the 16-byte chunk c of row i sits at chunk
// c ^ (i % 8) (CUTLASS's Swizzle<3,4,3>, which TMA's 128-byte swizzle
// writes). Regions start 1024-byte aligned.
// Read K-major (Q, K: the reduction runs along the row), the descriptor steps
// 8-row groups by SBO = 1024 bytes and the k-steps of 16 elements by moving
// its start 32 bytes inside the region. Read MN-major (V, whose rows are the
// reduction), 8-key groups are SBO = 1024 bytes apart and 64-column regions
// LBO bytes apart.
//
// Accumulators: warp w of the warpgroup holds rows 16w..16w+15, and d[j][e]
// is the element of mma.m16n8k16's C fragment e in n-tile j (mma_sm80.cuh):
// the same per-thread layout, so the masking and online softmax of the sm80
// kernels apply unchanged. The RS form's A fragment is mma.m16n8k16's A.
#pragma once

#include <cstdint>

#include "backends/cuda/kernels/element.cuh"

namespace attnprof::cuda::kernels::sm90 {

// The descriptor of a 128-byte-swizzled operand at shared address `addr`.
__device__ __forceinline__ std::uint64_t smem_desc(std::uint32_t addr, std::uint32_t lbo_bytes) {
  std::uint64_t d = 0;
  d |= static_cast<std::uint64_t>((addr & 0x3FFFF) >> 4);
  d |= static_cast<std::uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16;
  d |= static_cast<std::uint64_t>(1024 >> 4) << 32;  // SBO: 8 rows of 128 bytes
  d |= static_cast<std::uint64_t>(1) << 62;          // 128-byte swizzle
  return d;
}

// The descriptor of an operand in 64-byte-swizzled rows (TMA's 64-byte
// swizzle: 16-byte chunk c of row i at c ^ (i / 2 % 4); regions of 32
// columns), 8-row groups 512 bytes apart, regions LBO bytes apart when read
// MN-major: the e4m3 V^T's 64 keys past a 128-key region (K-major), the
// backward's tiles at head dim 192 (mainloop_bwd_sm90.cuh).
__device__ __forceinline__ std::uint64_t smem_desc_sw64(std::uint32_t addr, std::uint32_t lbo_bytes = 0) {
  std::uint64_t d = 0;
  d |= static_cast<std::uint64_t>((addr & 0x3FFFF) >> 4);
  d |= static_cast<std::uint64_t>((lbo_bytes >> 4) & 0x3FFF) << 16;
  d |= static_cast<std::uint64_t>(512 >> 4) << 32;  // SBO: 8 rows of 64 bytes
  d |= static_cast<std::uint64_t>(2) << 62;         // 64-byte swizzle
  return d;
}

// The descriptor of an operand without swizzle, core matrices 128 bytes
// apart either way: a small constant tile (every byte read lies within 512
// bytes of addr), such as the forward's tile of ones.
__device__ __forceinline__ std::uint64_t smem_desc_plain(std::uint32_t addr) {
  std::uint64_t d = 0;
  d |= static_cast<std::uint64_t>((addr & 0x3FFFF) >> 4);
  d |= static_cast<std::uint64_t>(128 >> 4) << 16;  // LBO
  d |= static_cast<std::uint64_t>(128 >> 4) << 32;  // SBO
  return d;                                         // layout type 0: no swizzle
}

// The descriptor of a tile whose swizzled rows are kRowBytes (128 or 64) long.
template <int kRowBytes>
__device__ __forceinline__ std::uint64_t smem_desc_rows(std::uint32_t addr, std::uint32_t lbo_bytes) {
  static_assert(kRowBytes == 128 || kRowBytes == 64, "128- or 64-byte swizzled rows");
  if constexpr (kRowBytes == 128) return smem_desc(addr, lbo_bytes);
  return smem_desc_sw64(addr, lbo_bytes);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving reads or writes of registers that an
// in-flight wgmma owns (accumulators, register A fragments) across the wait
// that retires it.
template <int kN>
__device__ __forceinline__ void fence_operands(float (&d)[kN][4]) {
#pragma unroll
  for (int j = 0; j < kN; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
}
template <int kN>
__device__ __forceinline__ void fence_operands(std::uint32_t (&r)[kN][4]) {
#pragma unroll
  for (int j = 0; j < kN; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(r[j][e])::"memory");
}

#define ATTNPROF_ACC8(d, j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define ATTNPROF_ACC_N8(d) ATTNPROF_ACC8(d, 0)
#define ATTNPROF_ACC_N32(d) ATTNPROF_ACC8(d, 0), ATTNPROF_ACC8(d, 1), ATTNPROF_ACC8(d, 2), ATTNPROF_ACC8(d, 3)
#define ATTNPROF_ACC_N64(d)                                                                                \
  ATTNPROF_ACC8(d, 0), ATTNPROF_ACC8(d, 1), ATTNPROF_ACC8(d, 2), ATTNPROF_ACC8(d, 3), ATTNPROF_ACC8(d, 4), \
      ATTNPROF_ACC8(d, 5), ATTNPROF_ACC8(d, 6), ATTNPROF_ACC8(d, 7)
#define ATTNPROF_ACC_N128(d)                                                                                 \
  ATTNPROF_ACC_N64(d), ATTNPROF_ACC8(d, 8), ATTNPROF_ACC8(d, 9), ATTNPROF_ACC8(d, 10), ATTNPROF_ACC8(d, 11), \
      ATTNPROF_ACC8(d, 12), ATTNPROF_ACC8(d, 13), ATTNPROF_ACC8(d, 14), ATTNPROF_ACC8(d, 15)
#define ATTNPROF_ACC_N80(d) ATTNPROF_ACC_N64(d), ATTNPROF_ACC8(d, 8), ATTNPROF_ACC8(d, 9)
#define ATTNPROF_ACC_N96(d) ATTNPROF_ACC_N80(d), ATTNPROF_ACC8(d, 10), ATTNPROF_ACC8(d, 11)
#define ATTNPROF_ACC_N192(d)                                                                                    \
  ATTNPROF_ACC_N128(d), ATTNPROF_ACC8(d, 16), ATTNPROF_ACC8(d, 17), ATTNPROF_ACC8(d, 18), ATTNPROF_ACC8(d, 19), \
      ATTNPROF_ACC8(d, 20), ATTNPROF_ACC8(d, 21), ATTNPROF_ACC8(d, 22), ATTNPROF_ACC8(d, 23)
#define ATTNPROF_REGS_40                                                                             \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39}"
#define ATTNPROF_REGS_48                                                                             \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, "  \
  "%40, %41, %42, %43, %44, %45, %46, %47}"
#define ATTNPROF_REGS_96                                                                             \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, "  \
  "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, "  \
  "%59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, "  \
  "%78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}"
#define ATTNPROF_REGS_16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define ATTNPROF_REGS_32                                                                             \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define ATTNPROF_REGS_64                                                                             \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
  "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, "  \
  "%40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, "  \
  "%59, %60, %61, %62, %63}"

// d (+)= A B, A and B from shared memory (both K-major).
#define ATTNPROF_WGMMA_SS(N, TY, REGS, ACC, A, B, P)                                                    \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #P                                                  \
               ", 0;\n"                                                                                 \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #TY "." #TY " " REGS ", %" #A ", %" #B \
               ", p, 1, 1, 0, 0;\n}\n"                                                                  \
               : ACC(d)                                                                                 \
               : "l"(a_desc), "l"(b_desc), "r"(static_cast<int>(accumulate)))
// d (+)= A B, A and B from shared memory, both read MN-major (transposed).
#define ATTNPROF_WGMMA_SS_TT(N, TY, REGS, ACC, A, B, P)                                                 \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #P                                                  \
               ", 0;\n"                                                                                 \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #TY "." #TY " " REGS ", %" #A ", %" #B \
               ", p, 1, 1, 1, 1;\n}\n"                                                                  \
               : ACC(d)                                                                                 \
               : "l"(a_desc), "l"(b_desc), "r"(static_cast<int>(accumulate)))
// d (+)= A B, A from shared memory K-major, B from shared memory read MN-major.
#define ATTNPROF_WGMMA_SS_KM(N, TY, REGS, ACC, A, B, P)                                                 \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #P                                                  \
               ", 0;\n"                                                                                 \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #TY "." #TY " " REGS ", %" #A ", %" #B \
               ", p, 1, 1, 0, 1;\n}\n"                                                                  \
               : ACC(d)                                                                                 \
               : "l"(a_desc), "l"(b_desc), "r"(static_cast<int>(accumulate)))
// d (+)= A B, A from registers, B from shared memory read MN-major (transposed).
#define ATTNPROF_WGMMA_RS(N, TY, REGS, ACC, A0, A1, A2, A3, B, P)                                                    \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #P                                                               \
               ", 0;\n"                                                                                              \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #TY "." #TY " " REGS ", {%" #A0 ", %" #A1 ", %" #A2 \
               ", %" #A3 "}, %" #B ", p, 1, 1, 1;\n}\n"                                                              \
               : ACC(d)                                                                                              \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(static_cast<int>(accumulate)))

template <Half16 Element, int kNTiles>
__device__ __forceinline__ void wgmma_ss(float (&d)[kNTiles][4], std::uint64_t a_desc, std::uint64_t b_desc,
                                         bool accumulate) {
  static_assert(kNTiles == 4 || kNTiles == 8 || kNTiles == 10 || kNTiles == 16, "N = 32, 64, 80 or 128");
  if constexpr (kNTiles == 4) {
    if constexpr (std::same_as<Element, Bf16>)
      ATTNPROF_WGMMA_SS(32, bf16, ATTNPROF_REGS_16, ATTNPROF_ACC_N32, 16, 17, 18);
    else
      ATTNPROF_WGMMA_SS(32, f16, ATTNPROF_REGS_16, ATTNPROF_ACC_N32, 16, 17, 18);
  } else if constexpr (kNTiles == 8) {
    if constexpr (std::same_as<Element, Bf16>)
      ATTNPROF_WGMMA_SS(64, bf16, ATTNPROF_REGS_32, ATTNPROF_ACC_N64, 32, 33, 34);
    else
      ATTNPROF_WGMMA_SS(64, f16, ATTNPROF_REGS_32, ATTNPROF_ACC_N64, 32, 33, 34);
  } else if constexpr (kNTiles == 10) {
    if constexpr (std::same_as<Element, Bf16>)
      ATTNPROF_WGMMA_SS(80, bf16, ATTNPROF_REGS_40, ATTNPROF_ACC_N80, 40, 41, 42);
    else
      ATTNPROF_WGMMA_SS(80, f16, ATTNPROF_REGS_40, ATTNPROF_ACC_N80, 40, 41, 42);
  } else {
    if constexpr (std::same_as<Element, Bf16>)
      ATTNPROF_WGMMA_SS(128, bf16, ATTNPROF_REGS_64, ATTNPROF_ACC_N128, 64, 65, 66);
    else
      ATTNPROF_WGMMA_SS(128, f16, ATTNPROF_REGS_64, ATTNPROF_ACC_N128, 64, 65, 66);
  }
}

// d (+)= A B with A [64 x 16] and B [16 x N] both stored MN-major (N = 32,
// 64, 96 or 128): A's rows (M) and B's columns (N) run along the swizzled rows of
// their tiles, the reduction steps down them (a tile written as the transpose
// of the operand). B may start at 64 bytes into its rows (columns 32-63 of a
// region): the swizzle applies to the address wgmma forms, as for the
// K-major k-steps that start 32 bytes in.
template <Half16 Element, int kNTiles>
__device__ __forceinline__ void wgmma_ss_tt(float (&d)[kNTiles][4], std::uint64_t a_desc, std::uint64_t b_desc,
                                            bool accumulate) {
  static_assert(kNTiles == 4 || kNTiles == 8 || kNTiles == 12 || kNTiles == 16, "N = 32, 64, 96 or 128");
  if constexpr (kNTiles == 4) {
    if constexpr (std::same_as<Element, Bf16>)
      ATTNPROF_WGMMA_SS_TT(32, bf16, ATTNPROF_REGS_16, ATTNPROF_ACC_N32, 16, 17, 18);
    else
      ATTNPROF_WGMMA_SS_TT(32, f16, ATTNPROF_REGS_16, ATTNPROF_ACC_N32, 16, 17, 18);
  } else if constexpr (kNTiles == 8) {
    if constexpr (std::same_as<Element, Bf16>)
      ATTNPROF_WGMMA_SS_TT(64, bf16, ATTNPROF_REGS_32, ATTNPROF_ACC_N64, 32, 33, 34);
    else
      ATTNPROF_WGMMA_SS_TT(64, f16, ATTNPROF_REGS_32, ATTNPROF_ACC_N64, 32, 33, 34);
  } else if constexpr (kNTiles == 12) {
    if constexpr (std::same_as<Element, Bf16>)
      ATTNPROF_WGMMA_SS_TT(96, bf16, ATTNPROF_REGS_48, ATTNPROF_ACC_N96, 48, 49, 50);
    else
      ATTNPROF_WGMMA_SS_TT(96, f16, ATTNPROF_REGS_48, ATTNPROF_ACC_N96, 48, 49, 50);
  } else {
    if constexpr (std::same_as<Element, Bf16>)
      ATTNPROF_WGMMA_SS_TT(128, bf16, ATTNPROF_REGS_64, ATTNPROF_ACC_N128, 64, 65, 66);
    else
      ATTNPROF_WGMMA_SS_TT(128, f16, ATTNPROF_REGS_64, ATTNPROF_ACC_N128, 64, 65, 66);
  }
}

// d (+)= A B with A [64 x 16] K-major (as wgmma_ss's) and B [16 x N] stored
// MN-major (as wgmma_ss_tt's B): P^T or dS^T from shared memory against dO or
// Q (N = 32, 64, 96 or 128; B may start 64 bytes into its rows, as there).
template <Half16 Element, int kNTiles>
__device__ __forceinline__ void wgmma_ss_km(float (&d)[kNTiles][4], std::uint64_t a_desc, std::uint64_t b_desc,
                                            bool accumulate) {
  static_assert(kNTiles == 4 || kNTiles == 8 || kNTiles == 12 || kNTiles == 16, "N = 32, 64, 96 or 128");
  if constexpr (kNTiles == 4) {
    if constexpr (std::same_as<Element, Bf16>)
      ATTNPROF_WGMMA_SS_KM(32, bf16, ATTNPROF_REGS_16, ATTNPROF_ACC_N32, 16, 17, 18);
    else
      ATTNPROF_WGMMA_SS_KM(32, f16, ATTNPROF_REGS_16, ATTNPROF_ACC_N32, 16, 17, 18);
  } else if constexpr (kNTiles == 8) {
    if constexpr (std::same_as<Element, Bf16>)
      ATTNPROF_WGMMA_SS_KM(64, bf16, ATTNPROF_REGS_32, ATTNPROF_ACC_N64, 32, 33, 34);
    else
      ATTNPROF_WGMMA_SS_KM(64, f16, ATTNPROF_REGS_32, ATTNPROF_ACC_N64, 32, 33, 34);
  } else if constexpr (kNTiles == 12) {
    if constexpr (std::same_as<Element, Bf16>)
      ATTNPROF_WGMMA_SS_KM(96, bf16, ATTNPROF_REGS_48, ATTNPROF_ACC_N96, 48, 49, 50);
    else
      ATTNPROF_WGMMA_SS_KM(96, f16, ATTNPROF_REGS_48, ATTNPROF_ACC_N96, 48, 49, 50);
  } else {
    if constexpr (std::same_as<Element, Bf16>)
      ATTNPROF_WGMMA_SS_KM(128, bf16, ATTNPROF_REGS_64, ATTNPROF_ACC_N128, 64, 65, 66);
    else
      ATTNPROF_WGMMA_SS_KM(128, f16, ATTNPROF_REGS_64, ATTNPROF_ACC_N128, 64, 65, 66);
  }
}

template <Half16 Element, int kNTiles>
__device__ __forceinline__ void wgmma_rs(float (&d)[kNTiles][4], const std::uint32_t (&a)[4], std::uint64_t b_desc,
                                         bool accumulate) {
  static_assert(kNTiles == 1 || kNTiles == 8 || kNTiles == 16, "N = 8, 64 or 128");
  if constexpr (kNTiles == 1) {
    if constexpr (std::same_as<Element, Bf16>)
      ATTNPROF_WGMMA_RS(8, bf16, "{%0, %1, %2, %3}", ATTNPROF_ACC_N8, 4, 5, 6, 7, 8, 9);
    else
      ATTNPROF_WGMMA_RS(8, f16, "{%0, %1, %2, %3}", ATTNPROF_ACC_N8, 4, 5, 6, 7, 8, 9);
  } else if constexpr (kNTiles == 8) {
    if constexpr (std::same_as<Element, Bf16>)
      ATTNPROF_WGMMA_RS(64, bf16, ATTNPROF_REGS_32, ATTNPROF_ACC_N64, 32, 33, 34, 35, 36, 37);
    else
      ATTNPROF_WGMMA_RS(64, f16, ATTNPROF_REGS_32, ATTNPROF_ACC_N64, 32, 33, 34, 35, 36, 37);
  } else {
    if constexpr (std::same_as<Element, Bf16>)
      ATTNPROF_WGMMA_RS(128, bf16, ATTNPROF_REGS_64, ATTNPROF_ACC_N128, 64, 65, 66, 67, 68, 69);
    else
      ATTNPROF_WGMMA_RS(128, f16, ATTNPROF_REGS_64, ATTNPROF_ACC_N128, 64, 65, 66, 67, 68, 69);
  }
}

// d (+)= A B in e4m3, m64nNk32 (N = 128 or 192): A [64 x 32] and B [32 x N]
// both K-major in shared memory (a k-step is 32 bytes, as a 16-bit k16 step's).
template <int kNTiles>
__device__ __forceinline__ void wgmma_ss_e4m3(float (&d)[kNTiles][4], std::uint64_t a_desc, std::uint64_t b_desc,
                                              bool accumulate) {
  static_assert(kNTiles == 16 || kNTiles == 24, "N = 128 or 192");
  if constexpr (kNTiles == 16) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " ATTNPROF_REGS_64 ", %64, %65, p, 1, 1;\n}\n"
        : ATTNPROF_ACC_N128(d)
        : "l"(a_desc), "l"(b_desc), "r"(static_cast<int>(accumulate)));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n192k32.f32.e4m3.e4m3 " ATTNPROF_REGS_96 ", %96, %97, p, 1, 1;\n}\n"
        : ATTNPROF_ACC_N192(d)
        : "l"(a_desc), "l"(b_desc), "r"(static_cast<int>(accumulate)));
  }
}

// d (+)= A B in e4m3, m64nNk32 (N = 8 or 128), A from registers: four
// registers of four bytes, mma.m16n8k32's 8-bit A fragment (a[0]: row g,
// columns 4t..4t+3; a[1]: row g + 8; a[2], a[3]: the same rows, columns
// 16 + 4t..), B K-major.
template <int kNTiles>
__device__ __forceinline__ void wgmma_rs_e4m3(float (&d)[kNTiles][4], const std::uint32_t (&a)[4], std::uint64_t b_desc,
                                              bool accumulate) {
  static_assert(kNTiles == 1 || kNTiles == 16, "N = 8 or 128");
  if constexpr (kNTiles == 1) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;\n}\n"
        : ATTNPROF_ACC_N8(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(static_cast<int>(accumulate)));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " ATTNPROF_REGS_64
        ", {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
        : ATTNPROF_ACC_N128(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(static_cast<int>(accumulate)));
  }
}

// Registers a warpgroup holds from here on (setmaxnreg: every warp of the
// warpgroup executes it; counts are multiples of 8 in [24, 256]).
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// Pingpong between two consumer warpgroups: named barrier 1 + wg is
// warpgroup wg's turn to issue its matrix products. take_turn waits for it
// (its 128 threads and the other warpgroup's 128 arrivals); pass_turn hands
// the turn to the other. Warpgroup 1 passes once before its first turn, so
// warpgroup 0 goes first. (Barrier 0 is __syncthreads'.)
__device__ __forceinline__ void take_turn(int wg) { asm volatile("bar.sync %0, 256;\n" ::"r"(1 + wg) : "memory"); }
__device__ __forceinline__ void pass_turn(int wg) { asm volatile("bar.arrive %0, 256;\n" ::"r"(2 - wg) : "memory"); }

// f(chunk's first n-tile, its n-tiles) over an accumulator's column chunks of
// 16 n-tiles (128 columns; the last may be 8): wgmma's N of 128 or 64.
template <int kFirst, int kNTiles, class F>
__device__ __forceinline__ void for_n_chunks(F&& f) {
  if constexpr (kFirst < kNTiles) {
    constexpr int kN = kNTiles - kFirst >= 16 ? 16 : 8;
    static_assert(kNTiles - kFirst == kN || kNTiles - kFirst >= 16, "whole 64-column chunks");
    f.template operator()<kFirst, kN>();
    for_n_chunks<kFirst + kN, kNTiles>(f);
  }
}

// f(chunk's first n-tile, its n-tiles) over n-tiles [kFirst, kTiles) in
// chunks of at most kMax, each 16, 12, 8 or 4 n-tiles (wgmma's N of 128, 96,
// 64, 32).
template <int kFirst, int kTiles, int kMax, class F>
__device__ __forceinline__ void for_tile_chunks(F&& f) {
  if constexpr (kFirst < kTiles) {
    constexpr int kLeft = kTiles - kFirst < kMax ? kTiles - kFirst : kMax;
    constexpr int kN = kLeft >= 16 ? 16 : kLeft >= 12 ? 12 : kLeft >= 8 ? 8 : 4;
    static_assert(kLeft >= 4, "whole 32-column chunks");
    f.template operator()<kFirst, kN>();
    for_tile_chunks<kFirst + kN, kTiles, kMax>(f);
  }
}

// A named barrier of `threads` threads (bar.sync; id 0 is __syncthreads').
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Arrives at named barrier `id` of `threads` threads without waiting
// (bar.arrive: a producer's half of a producer-consumer handshake).
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Orders this thread's ordinary shared-memory writes before later reads by
// the asynchronous proxy (wgmma's operands from shared memory, TMA stores).
__device__ __forceinline__ void fence_view_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

#undef ATTNPROF_WGMMA_RS
#undef ATTNPROF_WGMMA_SS_KM
#undef ATTNPROF_WGMMA_SS_TT
#undef ATTNPROF_WGMMA_SS
#undef ATTNPROF_REGS_96
#undef ATTNPROF_REGS_64
#undef ATTNPROF_REGS_40
#undef ATTNPROF_REGS_32
#undef ATTNPROF_REGS_16
#undef ATTNPROF_ACC_N192
#undef ATTNPROF_ACC_N128
#undef ATTNPROF_ACC_N80
#undef ATTNPROF_ACC_N64
#undef ATTNPROF_ACC_N32
#undef ATTNPROF_ACC_N8
#undef ATTNPROF_ACC8

}  // namespace attnprof::cuda::kernels::sm90
