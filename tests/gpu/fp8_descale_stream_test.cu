// FP8 descales as device tensors (issue 56 item 2; Inputs::q_descale_tensor
// ...): read only by flash's FP8 kernel and cuDNN's FP8 graph, on the
// caller's stream. A descale the stream writes behind a long kernel, the
// call made at once, is the one used: the output is bit for bit the output
// of the same call with the descales as numbers. The composites take numbers
// and refuse tensors by name; a descale tensor of the wrong dtype is one line
// naming it.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <iostream>
#include <optional>
#include <random>
#include <string>

#include "attnprof/backend.h"
#include "attnprof/error.h"
#include "attnprof/reference.h"
#include "attnprof/runner.h"
#include "backends/cuda/cuda_backends.h"
#include "common/test_problem.h"
#include "gpu_test.h"

namespace attnprof {
namespace {

// A long kernel: the caller's stream is busy for about `cycles` clocks.
__global__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

// dst = value, written by the stream (not the host).
__global__ void write_float(float* dst, float value) { *dst = value; }

Problem fp8_problem(MaskKind mask) {
  Problem p = testing::to_problem(
      testing::Shape{.batch = 2, .heads = 4, .kv_heads = 2, .seq = 200, .kv_seq = 300, .head_dim = 128}, DType::F8E4M3,
      mask, Device::Cuda);
  p.validate();
  return p;
}

// Host inputs quantized per tensor (amax / 448), as the runner's FP8 runs.
Inputs host_fp8_inputs(const Problem& p) {
  Problem host_p = p;
  host_p.device = Device::Cpu;
  const Inputs real = make_inputs(fp8_real_problem(host_p), 56, cpu_allocator());
  return quantize_inputs(host_p, real, std::nullopt, cpu_allocator()).in;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

TEST(Fp8DescaleTensors, WrittenBehindABusyStreamTheyGiveTheNumbersOutputBitForBit) {
  REQUIRE_GPU();
  DeviceRuntime& rt = cuda::runtime();
  const auto stream = static_cast<cudaStream_t>(rt.stream());
  int ran = 0;
  for (const char* name : {"flash", "cudnn"}) {
    Backend* b = find_backend(name, Device::Cuda);
    ASSERT_NE(b, nullptr) << name;
    for (const MaskKind mask : {MaskKind::None, MaskKind::Causal}) {
      const Problem p = fp8_problem(mask);
      const Eligibility e = eligibility_of(*b, p);
      if (!e.eligible) {
        std::cout << "[ SKIPPED  ] " << name << " " << mask_name(mask) << ": " << e.reason << "\n";
        continue;
      }
      ++ran;
      const std::string label = std::string(name) + " " + std::string(mask_name(mask));
      const Inputs host = host_fp8_inputs(p);
      const Inputs numbers = rt.upload(host);
      Tensor want = Tensor::empty(p.q_dims(), DType::BF16, rt.allocator());
      RunContext ctx{rt.allocator(), rt.stream(), 0};
      b->forward(p, numbers, want, ctx);

      // The descales in device memory holding 1000 (a stale value), written
      // by the stream after a long kernel; the call made at once.
      Inputs tensors = numbers;
      Tensor slots = Tensor::empty({1, 1, 1, 3}, DType::F32, rt.allocator());
      Tensor* fields[] = {&tensors.q_descale_tensor, &tensors.k_descale_tensor, &tensors.v_descale_tensor};
      const float values[] = {host.q_descale, host.k_descale, host.v_descale};
      ASSERT_EQ(cudaMemsetAsync(slots.data(), 0, slots.nbytes(), stream), cudaSuccess);
      for (int i = 0; i < 3; ++i) {
        *fields[i] = slots.as_strided({1, 1, 1, 1}, {1, 1, 1, 1}, i);
        write_float<<<1, 1, 0, stream>>>(fields[i]->data_as<float>(), 1000.f);
      }
      tensors.q_descale = tensors.k_descale = tensors.v_descale = 1.0f;
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      spin<<<1, 1, 0, stream>>>(200'000'000);  // about 0.1 s
      for (int i = 0; i < 3; ++i) write_float<<<1, 1, 0, stream>>>(fields[i]->data_as<float>(), values[i]);
      Tensor got = Tensor::empty(p.q_dims(), DType::BF16, rt.allocator());
      b->forward(p, tensors, got, ctx);
      // Still spinning when the call returned: nothing in it waited.
      EXPECT_EQ(cudaStreamQuery(stream), cudaErrorNotReady) << label << ": the call waited for the stream";
      rt.synchronize();
      EXPECT_TRUE(same_bits(rt.download(want), rt.download(got))) << label;

      // One descale doubled on the device: V's doubles O (before bf16's rounding), Q's the scores.
      write_float<<<1, 1, 0, stream>>>(fields[2]->data_as<float>(), 2 * values[2]);
      Inputs twice = numbers;
      twice.v_descale = 2 * host.v_descale;
      b->forward(p, tensors, got, ctx);
      b->forward(p, twice, want, ctx);
      rt.synchronize();
      EXPECT_TRUE(same_bits(rt.download(want), rt.download(got))) << label << ": v's descale doubled";
    }
  }
  if (ran == 0) GTEST_SKIP() << "no FP8 backend runs here (SKIPPED)";
}

TEST(Fp8DescaleTensors, OthersAndBadTensorsAreRefusedInOneLine) {
  REQUIRE_GPU();
  DeviceRuntime& rt = cuda::runtime();
  const Problem p = fp8_problem(MaskKind::Causal);
  Inputs in = rt.upload(host_fp8_inputs(p));
  Tensor out = Tensor::empty(p.q_dims(), DType::BF16, rt.allocator());
  RunContext ctx{rt.allocator(), rt.stream(), 0};
  in.q_descale_tensor = Tensor::empty({1, 1, 1, 1}, DType::F32, rt.allocator());
  Backend* math = find_backend("math", Device::Cuda);
  ASSERT_NE(math, nullptr);
  try {
    math->forward(p, in, out, ctx);
    ADD_FAILURE() << "math took a descale tensor";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("takes fp8 descales as numbers, not device tensors"), std::string::npos)
        << e.what();
  }
  in.q_descale_tensor = Tensor::empty({1, 1, 1, 2}, DType::F32, rt.allocator());
  for (const char* name : {"flash", "cudnn"}) {
    Backend* b = find_backend(name, Device::Cuda);
    ASSERT_NE(b, nullptr);
    if (!eligibility_of(*b, p).eligible) continue;
    try {
      b->forward(p, in, out, ctx);
      ADD_FAILURE() << name << " took a descale tensor of two elements";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;
      EXPECT_NE(what.find("q_descale must be a float32 tensor of one element"), std::string::npos) << what;
    }
  }
  rt.synchronize();
}

}  // namespace
}  // namespace attnprof
