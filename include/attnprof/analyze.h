// analyze and diff as library calls: traces read from files (torch.profiler's
// or attnprof's), split into profiler steps, each step measured and put
// through the same findings rule table as compare, and two traces (or two
// steps) set side by side. The attnprof command only parses, prints and
// writes what the report layer (attnprof/report.h) renders of them: each
// step is a run record (attnprof/record.h) whose trace holds the step's events.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "attnprof/record.h"
#include "attnprof/trace_reader.h"

namespace attnprof {

// One top-level op name of a step (ops inside no other op), with what it
// launched: kernels, memcpys and memsets, and their summed GPU time.
struct OpRow {
  std::string name;  // as recorded ("aten::masked_fill")
  int calls = 0;
  int kernels = 0, memcpys = 0, memsets = 0;
  double host_us = 0;    // the calls' wall time on the host
  double device_us = 0;  // summed durations of the device activities they launched
};

// One kernel name of a step.
struct KernelRow {
  std::string name;
  int count = 0;
  double total_us = 0;
  double pct = 0;                       // of the step's summed kernel time
  std::optional<double> occupancy_pct;  // theoretical, from the launch record
  std::string gemm;                     // "tensor cores", "TF32 tensor cores", "CUDA cores"; empty: no GEMM
  bool driver_launch = false;           // launched through the driver API (cuLaunchKernel, cuLaunchKernelEx)
};

// One attention call in a trace from elsewhere (torch.profiler's): the
// outermost op of an SDPA call, its backward, FlexAttention, FlashAttention's
// package or attnprof's own custom ops, with what ran inside it.
struct AttentionCall {
  std::string op;        // the outermost op, as recorded ("aten::scaled_dot_product_attention")
  std::string dispatch;  // the op that named the backend ("aten::_scaled_dot_product_flash_attention"); may be empty
  // "flash", "efficient", "cudnn", "math", "flex", "flash_attn", "attnprof" (or
  // "attnprof:BACKEND"), "overrideable"; "unknown" where neither op nor kernel names one.
  std::string backend;
  bool backward = false;
  std::int64_t event = -1;  // the outermost op's index in the step's trace
  // From record_shapes: Q's and K's dims, the dtype and the mask, in a
  // Problem (pass Backward for a backward) whose flops() is the call's count.
  std::optional<Problem> problem;
  std::string shape;  // "2x4x256x64" (B x H x S x D), "2x4x256x64, kv 2x2x512x64" when K differs; empty unknown
  std::string dtype;  // "bf16"; empty unknown
  // mask_name's spelling ("none", "causal", "causal-bottom-right", "sliding-window", "boolean", "bias"),
  // "block_mask" (FlexAttention's), "unknown" (a mask the trace does not say); empty: no shapes.
  std::string mask;
  std::optional<double> scale;
  std::vector<std::string> kernels;   // the kernels it launched, in launch order
  double gpu_us = 0;                  // their summed durations
  double cpu_us = 0;                  // the outermost op's host time
  std::optional<double> flops;        // 4*B*H*visible pairs*D, 2.5x for a backward
  std::optional<double> tflops;       // flops over gpu_us (cpu_us on a CPU trace)
  std::optional<double> ceiling_pct;  // of AnalyzeOptions::ceiling_tflops, when given
  std::optional<double> share_pct;    // of the step's kernel time (host time on a CPU trace)
  // The least bytes the call moves (Problem::io_bytes: Q, K, V read, O
  // written once) and that over gpu_us: the memory side of the roofline.
  std::optional<double> bytes;
  std::optional<double> gbs;
  std::optional<double> bandwidth_pct;  // of AnalyzeOptions::memory_gbs, when given
  // A call replayed from a CUDA graph (a replay step's): the graph's id
  // (Kineto's "graph id"; 0 for a call the host launched), the nodes of its
  // device work (ascending), its layer (the k-th attention call of the
  // replay, from 1), and how it was found: "capture" (tied to the op
  // captured into the graph, whose shapes it carries) or "kernel names" (the
  // capture is not in the trace, or the tie was refused: no shapes).
  std::uint64_t graph_id = 0;
  std::vector<std::uint64_t> graph_nodes;
  int layer = 0;
  std::string found_by;
  // Why the recorded shapes are no problem attnprof can run (Problem::validate's
  // reason: a hostile or corrupt trace's seq = 10^12, a negative dim, head_dim
  // 512): FLOPs are then counted only where the count is cheap and exact, and
  // replay skips the call with this line. Empty: the shapes are runnable.
  std::string refused;
};

// The step's attention: its calls and their share of the step.
struct AttentionSummary {
  std::vector<AttentionCall> calls;
  double forward_us = 0, backward_us = 0;  // GPU time (host time on a CPU trace)
  double total_us = 0;                     // what the shares divide: the step's kernel time (or step time)
  std::optional<double> forward_pct, backward_pct;
  // One line when the calls' shapes were not recorded (how to record them).
  std::string missing_shapes;
};

struct StepAnalysis {
  std::string label;  // "ProfilerStep#3", or "whole trace" when the trace has no steps
  // The step as a run: result.trace holds the step's events (device
  // activities by the step of their launch), result.metrics its per-call
  // figures, result.findings the rule table's records; result.backend is
  // the label and result.source the file.
  RunResult result;
  int kernels = 0, memcpys = 0, memsets = 0;
  double memcpy_bytes = 0;
  double step_us = 0;                        // the step's span on the host
  double device_busy_us = 0;                 // the union of its device activities
  std::optional<double> gpu_idle_pct;        // idle share between its first and last device activity
  std::optional<double> host_us_per_launch;  // step_us / device activities launched
  int tensor_core_gemms = 0, cuda_core_gemms = 0;
  std::vector<OpRow> ops;  // by device time, then host time
  std::vector<KernelRow> kernels_by_time;
  AttentionSummary attention;
  // A CUDA graph's replay (one cudaGraphLaunch and the device work it ran,
  // labelled "graph G replay R"): the graph's id, and the label of the step
  // its launch fell in ("whole trace" where there are no steps). 0 and empty
  // for a profiler step.
  std::uint64_t graph_id = 0;
  std::string launched_in;
};

// ---- replay (attnprof/replay.h runs it) ----------------------------------------------

// One backend's run of a replayed problem.
struct ReplayRun {
  std::string backend;
  bool ran = false;
  std::optional<double> us;      // measured per call: device time on a GPU, wall time on the CPU
  std::optional<double> ratio;   // us over the trace's time per call (below 1: faster than what ran)
  std::optional<double> tflops;  // the problem's FLOPs over us
  std::string note;              // why it did not run, how it failed, or "error over tolerance: ..."
};

// One distinct attention problem of the trace (pass, shapes, mask, dtype, scale).
struct ReplayProblem {
  std::string label;               // "forward 2x4x256x64 causal bf16"
  std::optional<Problem> problem;  // as replayed (on the replay's device); unset: no shapes, or shapes refused
  std::string ran;                 // the backends that ran it in the trace ("flash", "math, flash")
  int calls = 0;                   // its calls in the trace, every step
  double trace_us = 0;             // the trace's time per call: GPU time (host time on a CPU trace)
  std::optional<double> flops;     // per call
  std::vector<ReplayRun> runs;     // attnprof's backends, in explain()'s order
  std::string fastest;             // the backend with the least time; empty when none ran
  std::string skipped;             // one line: why it was not replayed; empty when it was
};

struct TraceReplay {
  std::string trace_device;        // "cuda" or "cpu": where the trace ran
  std::string device;              // where it was replayed; empty when it was not
  std::string device_description;  // of the replay's device
  // One line when the replay did not run where the trace did: this machine
  // lacks the trace's device (and --device was not given), or --device names
  // one that is not here, or it replays on another device than the trace's.
  std::string note;
  std::vector<ReplayProblem> problems;
};

struct TraceAnalysis {
  std::string path;
  std::string trace_name;
  std::optional<DeviceProperties> device;
  bool gpu = false;  // the trace has device activities
  std::vector<StepAnalysis> steps;
  std::size_t events = 0;                // activities read
  std::size_t events_outside_steps = 0;  // before the first step or between steps: not analysed
  std::optional<TraceReplay> replay;     // analyze --replay (attnprof/replay.h)
  // One line per CUDA graph replayed in the trace: how its replayed kernels
  // were tied to the ops captured into it, or why they were not (no capture
  // in the trace, captures that cannot be told apart, node ids repeated
  // across graphs, a node that does not match its captured launch), and
  // whether it holds attention.
  std::vector<std::string> graph_notes;
};

struct AnalyzeOptions {
  TraceReadOptions read;
  std::optional<int> step;  // only ProfilerStep#N; refused when the trace has no such step
  // The device's dense TFLOP/s ceiling, for attention calls' percent of it;
  // unset: ATTNPROF_CEILING_TFLOPS when set (as the runner takes it), else not known.
  std::optional<double> ceiling_tflops;
  // The device's memory bandwidth in GB/s, for attention calls' percent of it;
  // unset: ATTNPROF_COPY_GBS when set (as the runner takes it), else not known.
  std::optional<double> memory_gbs;
};

// Splits `trace` (read from `source`) into its steps and analyses each.
// Throws Error(InvalidArgument) when options.step names no step.
TraceAnalysis analyze_trace(Trace trace, std::string source, const AnalyzeOptions& options = {});
// Reads and analyses each file. Throws Error(BadInput) naming the first
// file that cannot be read.
std::vector<TraceAnalysis> analyze_traces(const std::vector<std::filesystem::path>& paths,
                                          const AnalyzeOptions& options = {});

// ---- diff ------------------------------------------------------------------------

// One side: a file and, optionally, one of its steps (else every step,
// figures averaged per step).
struct DiffSide {
  std::filesystem::path path;
  std::optional<int> step;
};

// A kernel or op name on both sides, per step: Holistic Trace Analysis's
// TraceDiff columns (counts and durations of control and test, their
// difference) with a ratio.
struct DiffRow {
  std::string name;
  double count_a = 0, count_b = 0;
  double time_a_us = 0, time_b_us = 0;
  double delta_us() const { return time_b_us - time_a_us; }
  std::optional<double> ratio() const {
    return time_a_us > 0 ? std::optional<double>(time_b_us / time_a_us) : std::nullopt;
  }
  // HTA's ops_diff categories, by calls per step: "added" (only in B),
  // "deleted" (only in A), "increased", "decreased", "unchanged".
  std::string change;
};

// Per-step figures of one side.
struct DiffTotals {
  double steps = 0;
  double step_us = 0, device_busy_us = 0;
  double kernels = 0, memcpys = 0, memsets = 0, memcpy_bytes = 0;
  double peak_bytes = 0;  // the largest step's
};

struct TraceDiff {
  std::string a_label, b_label;                // "a.json" or "a.json ProfilerStep#3"
  std::vector<StepAnalysis> a_steps, b_steps;  // what each side averages
  DiffTotals a, b;
  std::vector<DiffRow> kernels;         // every kernel name on either side, by |delta|
  std::vector<DiffRow> ops;             // every top-level op name, by |delta| of device time, then host time
  std::vector<DiffRow> op_host;         // the same ops' host time
  std::vector<Finding> only_a, only_b;  // findings (by rule and text without figures) on one side only
};

// Reads each side (a file named twice is read once) and compares them.
TraceDiff diff_traces(const DiffSide& a, const DiffSide& b, const AnalyzeOptions& options = {});
// The same over analyses already made; `a_step`, `b_step` pick one step each.
TraceDiff diff_analyses(const TraceAnalysis& a, std::optional<int> a_step, const TraceAnalysis& b,
                        std::optional<int> b_step);

}  // namespace attnprof
