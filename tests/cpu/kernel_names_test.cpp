// Kernel names shortened the way people read them (analysis/kernel_names.h):
// one implementation for the findings, the text report and the HTML page.
#include "analysis/kernel_names.h"

#include <gtest/gtest.h>

namespace attnprof::analysis {
namespace {

TEST(KernelNames, TemplatesAndLambdasCollapse) {
  EXPECT_EQ(short_kernel_name("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
                              "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, "
                              "at::detail::Array<char*, 3>)"),
            "vectorized_elementwise_kernel<4, CUDAFunctor_add, Array>");
  EXPECT_EQ(short_kernel_name("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<"
                              "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()"
                              "() const::{lambda()#7}::operator()() const::{lambda(float)#1}>(at::TensorIteratorBase&, "
                              "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()"
                              "() const::{lambda()#7}::operator()() const::{lambda(float)#1} const&)::{lambda(int)#1}>"
                              "(int, at::native::gpu_kernel_impl_nocast<...>)"),
            "elementwise_kernel<128, 2, lambda>");
  EXPECT_EQ(kernel_base_name("void pytorch_flash::flash_bwd_dot_do_o_kernel<true, Flash_bwd_kernel_traits<64, 128, "
                             "128, 8, 4, 2, 2, false, false, cutlass::bfloat16_t> >(Flash_bwd_params)"),
            "flash_bwd_dot_do_o_kernel");
  // Long argument lists give way to "<...>"; the cut never passes `max`.
  const std::string s = short_kernel_name(
      "void ns::k<AVeryLongTypeNameNumberOne, AVeryLongTypeNameNumberTwo, AVeryLongTypeNameNumberThree>(int)", 40);
  EXPECT_EQ(s, "k<...>");
  // Not a signature: as it is, within `max`.
  EXPECT_EQ(short_kernel_name("Memcpy DtoD (Device -> Device)"), "Memcpy DtoD (Device -> Device)");
  const std::string gemm = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1";
  EXPECT_EQ(short_kernel_name(gemm), gemm.substr(0, 69) + "...");
  EXPECT_LE(short_kernel_name(std::string(500, 'x')).size(), 72u);
  EXPECT_EQ(short_kernel_name(""), "");
  EXPECT_EQ(short_kernel_name("<<<>"), "<<<>");
}

}  // namespace
}  // namespace attnprof::analysis
