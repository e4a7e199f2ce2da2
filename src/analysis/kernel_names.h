// Kernel names as people read them. A CUDA kernel's recorded name is its
// whole demangled signature ("void at::native::vectorized_elementwise_kernel<4,
// at::native::CUDAFunctor_add<float>, ...>(int, T1, T2)"), six lines of
// templates and lambdas for some; the report and the findings show the short
// form, the whole name stays on hover and in the JSON.
#pragma once

#include <string>
#include <string_view>

namespace attnprof::analysis {

// The name without return type, argument list or namespaces, its template
// arguments each shortened the same way (lambdas to "lambda", nested
// templates to their names) and dropped when they still run long:
// "vectorized_elementwise_kernel<4, CUDAFunctor_add, Array>",
// "flash_bwd_sm90_kernel<...>". A name that is no C++ signature comes back as
// it is, cut to `max` characters.
std::string short_kernel_name(std::string_view name, std::size_t max = 72);

// Only the kernel's own name: "flash_bwd_sm90_kernel".
std::string kernel_base_name(std::string_view name);

// The attention backend a kernel's name commits to: "flash", "efficient",
// "cudnn", "flex" (PyTorch's and the libraries' kernels), "attnprof:flash",
// "attnprof:efficient" (attnprof's own, in namespace attnprof::cuda::kernels);
// empty where the name names none. `strict` leaves out Inductor's template
// kernels (triton_tem_fused_*), which FlexAttention compiles to but so do
// matrix products: only an op beside them says which they are.
std::string attention_backend_of_kernel(std::string_view name, bool strict = false);

}  // namespace attnprof::analysis
