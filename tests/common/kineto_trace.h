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
#include <vector>

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

// A decode loop under CUDA graphs, in the format Kineto writes from CUDA 12:
// each graph's layers captured once (cudaStreamBeginCapture .. EndCapture on
// the host, the captured ops with record_shapes and their launch calls, no
// device record), then replayed: one cudaGraphLaunch per replay, whose
// correlation id every replayed kernel, memset and memcpy carries with its
// "graph id" and "graph node id" (nodes numbered in capture order). A layer
// is a QKV product, a memset, decode attention (a split-KV kernel and its
// combine) and an output product. Graph g (from 1) decodes a batch of g, so
// each graph's shapes say which capture it was tied to.
struct KinetoGraphSpec {
  int graphs = 1;
  int layers = 2;
  int replays = 3;               // per graph, in turn
  bool capture = true;           // false: the profiler was off during capture (no capture records)
  bool attention = true;         // false: graphs that hold no attention
  bool attnprof = false;         // attnprof's op and kernels, else SDPA's flash
  bool steps = true;             // each replay inside a ProfilerStep, beside an eager argmax
  bool compiled = false;         // the capture's ops inside torch.compile's CompiledFunction op
  bool eager = false;            // no graph: each step launches the layers itself (what the graph replaces)
  bool repeat_node_ids = false;  // every graph numbers its nodes from the same id
  bool no_graph_ids = false;     // no "graph id" or "graph node id" (PyTorch 2.11's Kineto with CUDA 13)
  int unreplayed_captures = 0;   // more captures of graph 1's sequence, never replayed
  int heads = 8, kv_seq = 4096, head_dim = 128;
  double attention_us = 20;  // the split kernel's time
};

inline std::string kineto_graph_trace(const KinetoGraphSpec& spec) {
  std::string out =
      "{\n  \"schemaVersion\": 1,\n  \"deviceProperties\": [\n    {\"id\": 0, \"name\": \"NVIDIA H100 80GB HBM3\", "
      "\"totalGlobalMem\": 85031714816, \"computeMajor\": 9, \"computeMinor\": 0, \"maxThreadsPerBlock\": 1024, "
      "\"maxThreadsPerMultiprocessor\": 2048, \"regsPerBlock\": 65536, \"warpSize\": 32, \"sharedMemPerBlock\": 49152, "
      "\"numSms\": 132, \"regsPerMultiprocessor\": 65536, \"sharedMemPerBlockOptin\": 232448, "
      "\"sharedMemPerMultiprocessor\": 233472}\n  ],\n  \"record_shapes\": 1,\n  \"cuda_runtime_version\": 13000,\n"
      "  \"traceEvents\": [";
  kineto_detail::Writer w(out);
  const int pid = kKinetoPid, tid = kKinetoTid, stream = kKinetoStream;
  std::uint64_t ext = 1, corr = 1;
  double t = 100.0, gpu = 0;
  const auto dims = [&](int b, int q_rows) {
    const std::string h = std::to_string(spec.heads), d = std::to_string(spec.head_dim),
                      kv = std::to_string(spec.kv_seq), bs = std::to_string(b);
    return "[[" + bs + ", " + h + ", " + std::to_string(q_rows) + ", " + d + "], [" + bs + ", " + h + ", " + kv + ", " +
           d + "], [" + bs + ", " + h + ", " + kv + ", " + d + "]";
  };
  // One node of a layer: what the capture launches, and what a replay runs.
  struct Node {
    std::string op, call, cat, kind, name, args;
  };
  const std::string kernel_args =
      ", \"registers per thread\": 128, \"shared memory\": 16384, \"blocks per SM\": 0, "
      "\"warps per SM\": 0, \"block\": [128, 1, 1], \"est. achieved occupancy %\": 0";
  const std::string gemm = "nvjet_tst_64x8_64x16_2x1_v_bz_TNN";
  const std::string split = spec.attnprof
                                ? "void attnprof::cuda::kernels::flash_decode_splitkv_kernel<attnprof::cuda::"
                                  "kernels::DecodeCfg<128>, (attnprof::cuda::kernels::MaskMode)0, "
                                  "__nv_bfloat16>(attnprof::cuda::kernels::DecodeArgs)"
                                : "void pytorch_flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, "
                                  "128, 4, false, false, cutlass::bfloat16_t>, false, false, false, false, "
                                  "true, false, true, false>(pytorch_flash::Flash_fwd_params)";
  const std::string combine = spec.attnprof
                                  ? "void attnprof::cuda::kernels::flash_decode_combine_kernel<128>(attnprof::"
                                    "cuda::kernels::DecodeArgs)"
                                  : "void pytorch_flash::flash_fwd_splitkv_combine_kernel<Flash_fwd_kernel_"
                                    "traits<128, 64, 128, 4, false, false, cutlass::bfloat16_t>, 4, 3, "
                                    "false>(pytorch_flash::Flash_fwd_params)";
  const auto layer_nodes = [&](int b) {
    std::vector<Node> n;
    const std::string grid = ", \"grid\": [1, " + std::to_string(spec.heads) + ", " + std::to_string(b) + "]";
    n.push_back(
        {"aten::mm", "cudaLaunchKernel", "cuda_runtime", "kernel", gemm, kernel_args + ", \"grid\": [16, 1, 1]"});
    n.push_back(
        {"aten::fill_", "cudaMemsetAsync", "cuda_runtime", "gpu_memset", "Memset (Device)", ", \"bytes\": 4096"});
    if (spec.attention) {
      n.push_back({"attention", spec.attnprof ? "cudaLaunchKernelExC" : "cudaLaunchKernel", "cuda_runtime", "kernel",
                   split, kernel_args + grid});
      n.push_back({"attention", "cudaLaunchKernel", "cuda_runtime", "kernel", combine, kernel_args + grid});
    }
    n.push_back(
        {"aten::mm", "cudaLaunchKernel", "cuda_runtime", "kernel", gemm, kernel_args + ", \"grid\": [8, 1, 1]"});
    return n;
  };
  const auto op = [&](const std::string& name, double ts, double dur, const std::string& args) {
    w.event("X", "cpu_op", name, pid, tid, ts, dur, args + "\"External id\": " + std::to_string(ext++));
  };
  const auto runtime = [&](const std::string& call, const std::string& cat, double ts, double dur, int cbid) {
    const std::uint64_t c = corr++;
    w.event("X", cat.c_str(), call, pid, tid, ts, dur,
            "\"External id\": " + std::to_string(ext - 1) + ", \"cbid\": " + std::to_string(cbid) +
                ", \"correlation\": " + std::to_string(c));
    return c;
  };
  // A node's device record: after its launch at `ts`, on the stream's clock.
  const auto record = [&](const Node& n, std::uint64_t c, double ts, const std::string& graph) {
    const double dur = n.name == split ? spec.attention_us : n.name == combine ? 2.0 : 5.0;
    gpu = std::max(gpu, ts + 2);
    w.event("X", n.kind.c_str(), n.name, 0, stream, gpu, dur,
            "\"External id\": " + std::to_string(ext - 1) +
                ", \"queued\": 0, \"device\": 0, \"context\": 1, "
                "\"stream\": " +
                std::to_string(stream) + ", \"correlation\": " + std::to_string(c) + n.args + graph);
    w.flow(false, c, pid, tid, ts);
    gpu += dur + 0.5;
  };
  // The layers' ops and launches on the host: captured (no device record),
  // or run eagerly (`run`: each launch's record, no graph).
  const auto layers_on_host = [&](int b, bool run) {
    const std::string eager = ", \"graph id\": 0, \"graph node id\": 0";
    for (int l = 0; l < spec.layers; ++l) {
      const auto nodes = layer_nodes(b);
      for (std::size_t k = 0; k < nodes.size(); ++k) {
        const Node& n = nodes[k];
        if (n.op == "attention") {
          const std::string shapes =
              "\"Input type\": [\"c10::BFloat16\", \"c10::BFloat16\", \"c10::BFloat16\"], "
              "\"Input Dims\": " +
              dims(b, 1);
          if (spec.attnprof) {
            w.event("X", "user_annotation", "attnprof.attention backend=flash mask=none", pid, tid, t, 30,
                    "\"External id\": " + std::to_string(ext++));
            op("attnprof::attention", t + 1, 28,
               shapes + ", [], [], [], []], \"Concrete Inputs\": [\"\", \"\", \"\", \"\", \"\", \"\", \"\"], ");
          } else {
            op("aten::scaled_dot_product_attention", t, 30,
               shapes +
                   ", [], [], [], [], []], \"Concrete Inputs\": [\"\", \"\", \"\", \"\", \"0.\", \"False\", "
                   "\"\", \"False\"], ");
            op("aten::_scaled_dot_product_flash_attention", t + 1, 28,
               shapes +
                   ", [], [], [], []], \"Concrete Inputs\": [\"\", \"\", \"\", \"0.\", \"False\", \"False\", "
                   "\"\"], ");
          }
          const std::uint64_t c1 = runtime(n.call, n.cat, t + 3, 4, n.call == "cudaLaunchKernel" ? 211 : 430);
          if (run) record(n, c1, t + 3, eager);
          const std::uint64_t c2 = runtime("cudaLaunchKernel", "cuda_runtime", t + 10, 4, 211);
          if (run) record(nodes[k + 1], c2, t + 10, eager);
          ++k;  // the combine: launched inside the attention op above
          t += 32;
          continue;
        }
        op(n.op, t, 8, "");
        const std::uint64_t c = runtime(n.call, n.cat, t + 1, 4, n.call == "cudaMemsetAsync" ? 51 : 211);
        if (run) record(n, c, t + 1, eager);
        t += 10;
      }
    }
  };
  const auto capture = [&](int b) {
    runtime("cudaStreamBeginCapture", "cuda_runtime", t, 3, 315);
    t += 5;
    if (spec.compiled) op("CompiledFunction", t - 1, spec.layers * 62.0 + 1, "");
    layers_on_host(b, false);
    runtime("cudaStreamEndCapture", "cuda_runtime", t, 3, 319);
    runtime("cudaGraphInstantiate", "cuda_runtime", t + 4, 20, 310);
    t += 30;
  };
  if (spec.capture && !spec.eager) {
    for (int g = 1; g <= spec.graphs; ++g) capture(g);
    for (int k = 0; k < spec.unreplayed_captures; ++k) capture(1);
  }
  // The replays, each graph's node ids in capture order (or, eagerly, the layers launched one by one).
  int step = 0;
  for (int r = 0; r < spec.replays; ++r) {
    for (int g = 1; g <= spec.graphs; ++g) {
      const double start = t;
      const double span = spec.eager ? 20 + spec.layers * 62.0 : 60;
      if (spec.steps) {
        w.event("X", "user_annotation", "ProfilerStep#" + std::to_string(++step), pid, tid, t, span,
                "\"External id\": " + std::to_string(ext++));
        op("aten::argmax", t + 2, 8, "");
        const std::uint64_t c = runtime("cudaLaunchKernel", "cuda_runtime", t + 3, 4, 211);
        gpu = std::max(gpu, t + 6);
        w.event("X", "kernel", "void at::native::reduce_kernel<512, 1, argmax>", 0, stream, gpu, 3,
                "\"External id\": " + std::to_string(ext - 1) +
                    ", \"queued\": 0, \"device\": 0, \"context\": 1, "
                    "\"stream\": " +
                    std::to_string(stream) + ", \"correlation\": " + std::to_string(c) + kernel_args +
                    ", \"grid\": [1, 1, 1], \"graph id\": 0, \"graph node id\": 0");
        gpu += 3;
        t += 12;
      }
      if (spec.eager) {
        layers_on_host(g, true);
      } else {
        const std::uint64_t c = runtime("cudaGraphLaunch", "cuda_runtime", t, 8, 311);
        std::uint64_t node = spec.repeat_node_ids ? 1 : static_cast<std::uint64_t>(g) * 1000;
        for (int l = 0; l < spec.layers; ++l) {
          for (const Node& n : layer_nodes(g)) {
            record(n, c, t,
                   spec.no_graph_ids
                       ? std::string()
                       : ", \"graph id\": " + std::to_string(g) + ", \"graph node id\": " + std::to_string(node++));
          }
        }
      }
      t = std::max(start + span + 2, t + 12);
    }
  }
  out += "\n  ],\n  \"traceName\": \"graph_built.pt.trace.json\",\n  \"baseTimeNanoseconds\": 1700000000000000000\n}\n";
  return out;
}

}  // namespace attnprof::testing
