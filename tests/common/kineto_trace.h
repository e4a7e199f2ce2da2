// A trace in the shape torch.profiler (Kineto) writes, built by hand: the
// naive attention forward as PyTorch runs it on a GPU (aten::matmul over
// aten::bmm, aten::mul, an out-of-place aten::masked_fill whose aten::clone
// copies through a device-to-device memcpy, aten::softmax, and a last product
// launched through cuLaunchKernelEx), with python_function events, flow
// arrows and metadata that the reader must skip. Times are microseconds
// relative to baseTimeNanoseconds, which comes last, as Kineto writes it.
// Shared by the reader and analyze tests and the scale benchmark.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>

namespace attnprof::testing {

struct KinetoTraceSpec {
  int steps = 2;
  int layers_per_step = 1;  // attention forwards per step
  bool in_place = false;    // aten::masked_fill_ at the top level: no clone, no copy
  bool fp32_math = false;   // the math path: aten::to upcasts and FP32 (sgemm) products
  bool record_shapes = true;
  double kernel_scale = 1.0;  // device durations times this: 0.05 makes the steps launch-bound
};

namespace kineto_detail {

class Writer {
 public:
  explicit Writer(std::string& out) : out_(out) {}
  void event(const char* ph, const char* cat, const std::string& name, int pid, int tid, double ts, double dur,
             const std::string& args) {
    out_ += first_ ? "\n  " : ",\n  ";
    first_ = false;
    char buf[256];
    std::snprintf(buf, sizeof buf, "{\"ph\": \"%s\", \"cat\": \"%s\", \"name\": \"", ph, cat);
    out_ += buf;
    out_ += name;
    std::snprintf(buf, sizeof buf, "\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f", pid, tid, ts);
    out_ += buf;
    if (dur >= 0) {
      std::snprintf(buf, sizeof buf, ", \"dur\": %.3f", dur);
      out_ += buf;
    }
    if (!args.empty()) out_ += ", \"args\": {" + args + "}";
    out_ += "}";
  }
  void flow(bool finish, std::uint64_t id, int pid, int tid, double ts) {
    out_ += ",\n  ";
    char buf[200];
    std::snprintf(buf, sizeof buf,
                  "{\"ph\": \"%s\", \"id\": %llu, \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"cat\": \"ac2g\", "
                  "\"name\": \"ac2g\"%s}",
                  finish ? "f" : "s", static_cast<unsigned long long>(id), pid, tid, ts,
                  finish ? ", \"bp\": \"e\"" : "");
    out_ += buf;
  }

 private:
  std::string& out_;
  bool first_ = true;
};

}  // namespace kineto_detail

inline constexpr int kKinetoPid = 2345;
inline constexpr int kKinetoTid = 2345;
inline constexpr int kKinetoStream = 7;

inline std::string kineto_trace(const KinetoTraceSpec& spec) {
  std::string out;
  out.reserve(static_cast<std::size_t>(spec.steps) * spec.layers_per_step * 6000 + 4096);
  out +=
      "{\n  \"schemaVersion\": 1,\n  \"deviceProperties\": [\n    {\n      \"id\": 0, \"name\": \"NVIDIA H100 80GB "
      "HBM3\", \"totalGlobalMem\": 85031714816,\n      \"computeMajor\": 9, \"computeMinor\": 0,\n      "
      "\"maxThreadsPerBlock\": 1024, \"maxThreadsPerMultiprocessor\": 2048,\n      \"regsPerBlock\": 65536, "
      "\"warpSize\": 32,\n      \"sharedMemPerBlock\": 49152, \"numSms\": 132,\n      \"regsPerMultiprocessor\": "
      "65536, \"sharedMemPerBlockOptin\": 232448,\n      \"sharedMemPerMultiprocessor\": 233472\n    }\n  ],\n  "
      "\"distributedInfo\": {\"backend\": \"nccl\", \"rank\": 0, \"world_size\": 1},\n  \"record_shapes\": 1,\n  "
      "\"with_stack\": 0,\n  \"cuda_runtime_version\": 12080,\n  \"traceEvents\": [";
  kineto_detail::Writer w(out);
  const int pid = kKinetoPid, tid = kKinetoTid, stream = kKinetoStream;
  w.event("M", "", "process_name", pid, 0, 0, -1, "\"name\": \"python3\"");
  std::uint64_t ext = 1, corr = 1;
  double t = 100.0;  // host clock, us
  double gpu = 0;    // the stream's clock
  const std::string bf16 = spec.record_shapes ? "\"Input type\": [\"c10::BFloat16\", \"c10::BFloat16\"], "
                                                "\"Input Dims\": [[8, 16, 1024, 64], [8, 16, 64, 1024]], "
                                              : "";
  const std::string fp32 = spec.record_shapes ? "\"Input type\": [\"float\", \"float\"], "
                                                "\"Input Dims\": [[8, 16, 1024, 64], [8, 16, 64, 1024]], "
                                              : "";
  const auto op = [&](const std::string& name, double ts, double dur, const std::string& shapes) {
    w.event("X", "cpu_op", name, pid, tid, ts, dur, shapes + "\"External id\": " + std::to_string(ext++));
  };
  // A launch at `ts` of device work lasting `dur`: the runtime (or driver)
  // call, the device record, the flow arrows.
  const auto launch = [&](const char* call, const char* cat, const std::string& kind, const std::string& name,
                          double ts, double dur, const std::string& extra) {
    const std::uint64_t c = corr++;
    dur *= spec.kernel_scale;
    w.event("X", cat, call, pid, tid, ts, 4.0,
            "\"External id\": " + std::to_string(ext - 1) + ", \"cbid\": 211, \"correlation\": " + std::to_string(c));
    gpu = std::max(gpu, ts + 6.0);
    std::string args = "\"External id\": " + std::to_string(ext - 1) +
                       ", \"queued\": 0, \"device\": 0, \"context\": 1, \"stream\": " + std::to_string(stream) +
                       ", \"correlation\": " + std::to_string(c) + extra;
    w.event("X", kind.c_str(), name, 0, stream, gpu, dur, args);
    w.flow(false, c, pid, tid, ts);
    w.flow(true, c, 0, stream, gpu);
    gpu += dur;
  };
  const auto kernel = [&](const char* call, const char* cat, const std::string& name, double ts, double dur, int grid,
                          int block, int regs, int shared) {
    launch(call, cat, "kernel", name, ts, dur,
           ", \"registers per thread\": " + std::to_string(regs) + ", \"shared memory\": " + std::to_string(shared) +
               ", \"blocks per SM\": 0, \"warps per SM\": 0, \"grid\": [" + std::to_string(grid) +
               ", 1, 1], \"block\": [" + std::to_string(block) + ", 1, 1], \"est. achieved occupancy %\": 0");
  };
  const std::string gemm = spec.fp32_math ? "sm90_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8_stage3"
                                          : "nvjet_tst_128x64_64x4_1x2_h_bz_TNT";
  for (int s = 0; s < spec.steps; ++s) {
    const double step_start = t;
    const double step_dur = spec.layers_per_step * 100.0 + 20.0;
    w.event("X", "user_annotation", "ProfilerStep#" + std::to_string(s + 1), pid, tid, step_start, step_dur,
            "\"External id\": " + std::to_string(ext++));
    t += 5;
    for (int l = 0; l < spec.layers_per_step; ++l) {
      const double l0 = t;
      w.event("X", "python_function", "nn.Module: Attention_0", pid, tid, l0, 95, "\"Python id\": 1");
      double k = l0 + 1;
      if (spec.fp32_math) {
        op("aten::to", k, 3, spec.record_shapes ? "\"Input type\": [\"c10::BFloat16\", \"\", \"Scalar\"], " : "");
        op("aten::_to_copy", k + 0.5, 2, "");
        op("aten::copy_", k + 1, 1.5, spec.record_shapes ? "\"Input type\": [\"float\", \"c10::BFloat16\"], " : "");
        kernel("cudaLaunchKernel", "cuda_runtime", "void at::native::unrolled_elementwise_kernel<copy>", k + 1.1, 3,
               1024, 128, 16, 0);
        k += 4;
        op("aten::ones", k, 2, "");
        op("aten::tril", k + 2, 2, "");
        op("aten::where", k + 4, 2, "");
        k += 6;
      }
      // q @ k^T
      op("aten::matmul", k, 10, spec.fp32_math ? fp32 : bf16);
      op("aten::bmm", k + 1, 8, spec.fp32_math ? fp32 : bf16);
      kernel("cudaLaunchKernel", "cuda_runtime", gemm, k + 2, 20, 132, 384, 168, 213248);
      k += 11;
      op("aten::mul", k, 6, "");
      kernel("cudaLaunchKernel", "cuda_runtime", "void at::native::vectorized_elementwise_kernel<4, mul>", k + 1, 8,
             4096, 128, 20, 0);
      k += 7;
      if (spec.in_place) {
        op("aten::masked_fill_", k, 6, "");
        kernel("cudaLaunchKernel", "cuda_runtime", "void at::native::vectorized_elementwise_kernel<4, masked_fill>",
               k + 1, 8, 4096, 128, 20, 0);
        k += 7;
      } else {
        op("aten::masked_fill", k, 20, "");
        op("aten::clone", k + 1, 10, "");
        op("aten::empty_like", k + 1.5, 1, "");
        op("aten::copy_", k + 3, 7, "");
        launch("cudaMemcpyAsync", "cuda_runtime", "gpu_memcpy", "Memcpy DtoD (Device -> Device)", k + 4, 12,
               ", \"bytes\": 33554432, \"memory bandwidth (GB/s)\": 2796.2");
        op("aten::masked_fill_", k + 12, 6, "");
        kernel("cudaLaunchKernel", "cuda_runtime", "void at::native::vectorized_elementwise_kernel<4, masked_fill>",
               k + 13, 8, 4096, 128, 20, 0);
        k += 21;
      }
      if (spec.fp32_math) {
        op("aten::_safe_softmax", k, 8, "");
      } else {
        op("aten::softmax", k, 8, "");
        op("aten::_softmax", k + 1, 6, "");
      }
      kernel("cudaLaunchKernel", "cuda_runtime", "void at::native::cunn_SoftMaxForward<8, float>", k + 2, 10, 16384,
             256, 32, 2048);
      k += 9;
      // p @ v through the driver's extended launch (Kineto wrote 0% occupancy for these).
      op("aten::matmul", k, 10, spec.fp32_math ? fp32 : bf16);
      op("aten::bmm", k + 1, 8, spec.fp32_math ? fp32 : bf16);
      kernel("cuLaunchKernelEx", "cuda_driver", gemm, k + 2, 24, 132, 384, 168, 213248);
      t = l0 + 100;
    }
    t = step_start + step_dur + 10;
  }
  out += "\n  ],\n  \"traceName\": \"hand_built.pt.trace.json\",\n  \"baseTimeNanoseconds\": ";
  out += "1700000000000000000";
  out += "\n}\n";
  return out;
}

}  // namespace attnprof::testing
