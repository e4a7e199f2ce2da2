// The body of each kernel translation unit (src/backends/cpu/isa/flash_*.cpp):
// the forward and backward work items over this level's vectors, and the
// level's table (flash_kernels.h). A unit defines ATTNPROF_ISA_NS (its
// namespace), ATTNPROF_ISA_TABLE (the table's name), ATTNPROF_ISA_LEVEL (a
// CpuIsa) and ATTNPROF_ISA_BF16 (1: the bf16 products of
// flash_bf16_kernels.h and flash_backward_bf16_kernels.h, where the flags
// allow), then includes this once.
#pragma once

#include <algorithm>

#include "backends/cpu/flash_backward_kernels.h"
#include "backends/cpu/flash_decode_kernels.h"
#include "backends/cpu/flash_forward_kernels.h"
// The bf16 products need the level's flags (a build without them, or off
// x86-64, compiles this unit as plain arrays and without them).
#if ATTNPROF_ISA_BF16 && (defined(__AVX512BF16__) || defined(ATTNPROF_FLASH_EMULATE))
#define ATTNPROF_FLASH_BF16 1
#include "backends/cpu/flash_backward_bf16_kernels.h"
#include "backends/cpu/flash_bf16_kernels.h"
#endif

namespace attnprof::cpu::flash::ATTNPROF_ISA_NS {

inline const char* forward_products_fp32(const Problem&) {
#if ATTNPROF_FLASH_AVX512
  return "FP32 FMA products on 16 lanes (AVX-512), 16-bit and e4m3 inputs widened";
#elif ATTNPROF_FLASH_AVX2
  return "FP32 FMA products on 8 lanes (AVX2), 16-bit and e4m3 inputs widened";
#else
  return "FP32 products on 8-float arrays (baseline x86-64, SSE2), 16-bit and e4m3 inputs widened";
#endif
}

inline const char* backward_products_fp32() {
#if ATTNPROF_FLASH_AVX512
  return "FP32 FMA products on 16 lanes (AVX-512)";
#elif ATTNPROF_FLASH_AVX2
  return "FP32 FMA products on 8 lanes (AVX2)";
#else
  return "FP32 products on 8-float arrays (baseline x86-64, SSE2)";
#endif
}

// A thread's forward scratch: the decode item's where every sequence decodes,
// the tiled items' (`tiled` floats) where none may, else room for either
// (flash.cpp picks per sequence).
inline std::int64_t scratch_for_either(const Problem& p, std::int64_t tiled) {
  if (decodes(p)) return decode_scratch_floats(p);
  return may_decode(p) ? std::max(tiled, decode_scratch_floats(p)) : tiled;
}

inline void vector_tanh(const float* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; i += kLanes) store(y + i, tanh(load(x + i)));
}
inline void vector_exp2(const float* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; i += kLanes) store(y + i, exp2(load(x + i)));
}

#if ATTNPROF_FLASH_BF16
inline std::int64_t forward_scratch(const Problem& p) {
  return scratch_for_either(p, bf16_path(p) ? forward_scratch_bf16(p) : forward_scratch_fp32(p));
}
inline std::int64_t forward_block_rows(const Problem& p) { return bf16_path(p) ? kBlockQ : forward_rows_fp32(p); }
inline void attend_block(const ForwardJob& job, std::int64_t b, std::int64_t h, std::int64_t i0, float* scratch) {
  if (bf16_path(job.p)) {
    attend_block_bf16(job, b, h, i0, scratch);
  } else {
    attend_block_fp32(job, b, h, i0, scratch);
  }
}
// At the amx level, bf16 inputs the tiles do not take run the FP32 products
// (flash_bf16_kernels.h's bf16_path says why). Static sentences: a kernel
// unit defines nothing outside its namespace (no std::string code compiled
// with its flags; tests/linkage/isa_symbols.cmake).
inline const char* forward_products(const Problem& p) {
  if (decodes(p)) return decode_products();
  if (bf16_path(p)) return forward_products_bf16(p);
#if ATTNPROF_FLASH_AMX
  if (bf16_inputs(p)) {
    return "FP32 FMA products on 16 lanes (AVX-512), 16-bit and e4m3 inputs widened (AMX tiles take head_dim a "
           "multiple of 32)";
  }
#endif
  return forward_products_fp32(p);
}
inline bool forward_repacks_heads(const Problem& p) { return bf16_path(p); }
inline std::int64_t backward_scratch(std::int64_t head_dim) { return backward_scratch_bf16(head_dim); }
inline void key_block(const BackwardJob& job, std::int64_t b, std::int64_t hk, std::int64_t kb, float* scratch) {
  if (bf16_backward(job)) {
    key_block_bf16(job, b, hk, kb, scratch);
  } else {
    key_block_fp32(job, b, hk, kb, scratch);
  }
}
inline const char* backward_products(const Problem& p) {
  if (bf16_path(p)) return backward_products_bf16(p);
#if ATTNPROF_FLASH_AMX
  if (p.dtype == DType::BF16)
    return "FP32 FMA products on 16 lanes (AVX-512; AMX tiles take head_dim a multiple of 32)";
#endif
  return backward_products_fp32();
}
#else
inline std::int64_t forward_scratch(const Problem& p) { return scratch_for_either(p, forward_scratch_fp32(p)); }
inline std::int64_t forward_block_rows(const Problem& p) { return forward_rows_fp32(p); }
inline void attend_block(const ForwardJob& job, std::int64_t b, std::int64_t h, std::int64_t i0, float* scratch) {
  attend_block_fp32(job, b, h, i0, scratch);
}
inline const char* forward_products(const Problem& p) {
  return decodes(p) ? decode_products() : forward_products_fp32(p);
}
inline bool forward_repacks_heads(const Problem&) { return false; }
inline std::int64_t backward_scratch(std::int64_t head_dim) { return backward_scratch_floats(head_dim); }
inline void key_block(const BackwardJob& job, std::int64_t b, std::int64_t hk, std::int64_t kb, float* scratch) {
  key_block_fp32(job, b, hk, kb, scratch);
}
inline const char* backward_products(const Problem&) { return backward_products_fp32(); }
#endif

}  // namespace attnprof::cpu::flash::ATTNPROF_ISA_NS

namespace attnprof::cpu::flash {

const Kernels ATTNPROF_ISA_TABLE {
  .isa = ATTNPROF_ISA_LEVEL, .lanes = ATTNPROF_ISA_NS::kLanes,
  .forward_scratch_floats = &ATTNPROF_ISA_NS::forward_scratch,
  .forward_block_rows = &ATTNPROF_ISA_NS::forward_block_rows, .attend_block = &ATTNPROF_ISA_NS::attend_block,
  .attend_decode = &ATTNPROF_ISA_NS::attend_decode, .merge_decode = &ATTNPROF_ISA_NS::merge_decode,
  .forward_products = &ATTNPROF_ISA_NS::forward_products,
  .forward_repacks_heads = &ATTNPROF_ISA_NS::forward_repacks_heads,
  .backward_key_rows = &ATTNPROF_ISA_NS::key_block_rows, .backward_scratch_floats = &ATTNPROF_ISA_NS::backward_scratch,
  .key_block = &ATTNPROF_ISA_NS::key_block, .backward_products = &ATTNPROF_ISA_NS::backward_products,
  .vector_tanh = &ATTNPROF_ISA_NS::vector_tanh, .vector_exp2 = &ATTNPROF_ISA_NS::vector_exp2,
#if ATTNPROF_FLASH_BF16
  .bf16_gemm = &ATTNPROF_ISA_NS::bf16_gemm,
#else
  .bf16_gemm = nullptr,
#endif
};

}  // namespace attnprof::cpu::flash
