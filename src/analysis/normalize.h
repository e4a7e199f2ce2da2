// Op and dtype names as the rules read them. attnprof's backends record
// PyTorch's op names without the namespace ("masked_fill", "to") and short
// dtypes ("bf16"); PyTorch's own traces spell them "aten::masked_fill" and
// "c10::BFloat16". Both are mapped to one spelling before any rule reads them,
// so the same rule table reads either trace.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "attnprof/activity.h"

namespace attnprof::analysis {

// "aten::masked_fill" -> "masked_fill"; "aten::bmm", "aten::mm", "aten::matmul"
// -> "matmul"; "aten::_to_copy" -> "to"; "aten::_softmax" -> "softmax". An
// in-place op keeps its trailing underscore ("masked_fill_", "copy_"), and
// "_safe_softmax" stays itself: the rules tell them apart.
std::string normalize_op(std::string_view name);

// One dtype: "c10::BFloat16", "BFloat16", "bfloat16", "bf16" -> "bf16";
// "c10::Half", "Half", "float16" -> "fp16"; "float", "Float" -> "fp32";
// "double" -> "fp64"; "long int", "int64_t" -> "int64"; "bool" -> "bool".
// Unknown spellings are returned lower-cased, blanks as they are.
std::string normalize_dtype(std::string_view name);

// A comma-separated list as PyTorch's "Input type" column writes it.
std::string normalize_dtypes(std::string_view list);

// The first entry of a normalised list ("bf16, fp32" -> "bf16").
std::string_view first_dtype(std::string_view normalized_list);

struct NormalizedNames {
  std::string op;      // CPU ops: normalize_op(name); other events: the name as recorded
  std::string dtypes;  // CPU ops: normalize_dtypes(input_dtypes); other events: empty
};

// What the rules read of one activity's names.
NormalizedNames normalize(const Activity& a);

// GEMM kernels by what ran them, read from the kernel's name: cuBLAS's
// FP32 SIMT kernels (sgemm, gemmSN, xmma f32f32) on CUDA cores; TF32 on
// tensor cores; 16-bit on tensor cores (hmma, wgmma, s16816, bf16/f16
// xmma, Hopper's nvjet, cutlass tensor-op kernels).
enum class GemmClass : std::uint8_t { NotGemm, Fp32CudaCores, Tf32TensorCores, TensorCores };

GemmClass gemm_class(std::string_view name);

// "tensor cores", "TF32 tensor cores", "CUDA cores", or empty for a kernel that is no GEMM.
std::string_view gemm_class_name(GemmClass g);

}  // namespace attnprof::analysis
