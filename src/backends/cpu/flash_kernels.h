// The CPU flash kernels' table: what the drivers (flash.cpp, the forward;
// flash_backward.cpp, the backward), compiled for baseline x86-64, call into
// the kernels compiled once per instruction-set level (src/backends/cpu/isa/,
// one translation unit per level, each with its own flags and namespace).
// The drivers pick a table with cpu_isa.h's choice, so a level's code runs
// only where the CPU and the OS have said it can.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

#include "backends/cpu/cpu_isa.h"
#include "backends/cpu/flash_tiles.h"

namespace attnprof::cpu::flash {

// Everything a forward work item needs, fixed for one forward.
struct ForwardJob {
  const Problem& p;
  const Inputs& in;
  const Tensor& out;
  float q_scale;  // softmax scale * log2(e) (the exponentials are base 2), times q's and k's descales for fp8
  float cap2;     // soft cap * log2(e) (the logits are base 2); 0: no cap
  float o_scale;  // what O is multiplied by as it is stored: v's descale for fp8, else 1
  bool k_unit;    // K rows are unit-stride in the logical tensor (not paged)
  bool v_unit;    // likewise V
  float* lse;     // forward_train: each row's log-sum-exp, contiguous lse_dims(p); null otherwise
  const std::vector<Sequence>& seqs;
  std::int64_t lse_rows;  // rows per head of the log-sum-exp (lse_rows(p))
  bool mask_lowered;      // the Boolean mask is per-sequence key lengths (in seqs): never read per element
};

// Everything a backward item needs, fixed for one backward.
struct BackwardJob {
  const Problem& p;
  const Inputs& in;
  const Tensor& dout;
  const float* lse;                   // lse_dims(p): [B, H, S], or [1, H, total_q] packed
  const float* delta;                 // rowsum(dO * O), laid out as lse
  float* dq_acc;                      // [query blocks of all sequences, H, D, kBlockQ]: dQ^T tiles in FP32
  std::vector<std::mutex>& dq_locks;  // one per dQ^T tile
  const Gradients& grads;
  const std::vector<Sequence>& seqs;
  std::int64_t lse_rows;
  float q_scale;  // softmax scale * log2(e): the exponentials are base 2
  float scale;
  float cap2;  // soft cap * log2(e) (the logits are base 2); 0: no cap
};

// Floats at the start of each thread's forward scratch that the driver sets
// to all-ones bits before the items run: the kernels that keep a head's K and
// V repacked (the bf16 ones) tag them there with the head they hold.
constexpr std::int64_t kScratchHeaderFloats = 16;

struct Kernels {
  CpuIsa isa;
  int lanes;  // FP32 lanes per vector
  // Per-thread forward scratch for p, in floats (the header included).
  std::int64_t (*forward_scratch_floats)(const Problem& p);
  // Query rows a forward work item takes for p (kBlockQ or twice that).
  std::int64_t (*forward_block_rows)(const Problem& p);
  // One forward work item: query rows [i0, i0 + forward_block_rows(p)) of
  // (sequence b, head h).
  void (*attend_block)(const ForwardJob& job, std::int64_t b, std::int64_t h, std::int64_t i0, float* scratch);
  // For a sequence that decodes (flash_tiles.h's decodes(p, queries)): one
  // item per (sequence b, KV head hk, key range chunk), every query row of
  // its query heads (flash_decode_kernels.h); with `partial` it leaves its
  // partial result there, and merge_decode merges a sequence's ranges.
  void (*attend_decode)(const ForwardJob& job, std::int64_t b, std::int64_t hk, std::int64_t chunk, float* scratch,
                        float* partial);
  void (*merge_decode)(const ForwardJob& job, std::int64_t b, std::int64_t hk, std::int64_t chunks,
                       const float* partials, std::int64_t stride, float* scratch);
  // The products the forward uses for p: a static sentence for the story.
  const char* (*forward_products)(const Problem& p);
  // Whether the forward repacks each head's K and V into the thread's scratch
  // for p (the bf16 kernels' caches): the driver then hands a thread whole heads.
  bool (*forward_repacks_heads)(const Problem& p);
  // The backward: keys per item, per-thread scratch in floats, one item
  // (sequence b, kv head hk, key block kb).
  std::int64_t (*backward_key_rows)(std::int64_t head_dim);
  std::int64_t (*backward_scratch_floats)(std::int64_t head_dim);
  void (*key_block)(const BackwardJob& job, std::int64_t b, std::int64_t hk, std::int64_t kb, float* scratch);
  // The products the backward uses for p: a static sentence for the story.
  const char* (*backward_products)(const Problem& p);
  // C[m x n] = A[m x k] B[k x n] with bf16 A (row-major) and B (k/2 rows of
  // n pairs, VNNI order: B[2p][c], B[2p + 1][c] side by side), FP32 C; m and
  // n multiples of 16, k of 32. Null below avx512bf16. The bf16 ceiling's
  // product (runtime.cpp).
  // y = tanh(x) and y = 2^x (x <= 0) with the kernels' vector math, n a
  // multiple of lanes: what the tests compare with std::tanh and std::exp2.
  void (*vector_tanh)(const float* x, float* y, std::int64_t n);
  void (*vector_exp2)(const float* x, float* y, std::int64_t n);
  void (*bf16_gemm)(const std::uint16_t* a, const std::uint32_t* b, float* c, std::int64_t m, std::int64_t n,
                    std::int64_t k);
};

extern const Kernels kKernelsScalar;
extern const Kernels kKernelsAvx2;
extern const Kernels kKernelsAvx512;
extern const Kernels kKernelsAvx512Bf16;
extern const Kernels kKernelsAmx;

// The table of one level (only call its functions once cpu_isa.h says the
// level runs here).
const Kernels& kernels_of(CpuIsa isa);
// What the drivers run for the chosen level: kernels_of(isa), or the table a
// test put in its place (tests/cpu/flash_emulated_test.h runs the AVX-512,
// AVX512-BF16 and AMX code over stand-ins of their intrinsics); null: none.
const Kernels& kernels_for_run(CpuIsa isa);
void set_kernels_for_testing(const Kernels* kernels);

}  // namespace attnprof::cpu::flash
