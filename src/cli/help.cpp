// The CLI's --help text: the top-level usage and each command's help, with
// the problem and run flags they share (args.h declares usage() and
// command_help(); args.cpp parses what these describe).
#include <string>

#include "attnprof/problem_spec.h"
#include "cli/args.h"

namespace attnprof::cli {
namespace {

std::string backend_list() { return backend_choices(/*with_auto=*/true); }

// `text` wrapped at 79 columns, each line after the first indented to the
// help's second column (23).
std::string wrapped(std::string_view text) {
  constexpr std::size_t kIndent = 23, kWidth = 79;
  std::string out, line;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find(' ', at);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view word = text.substr(at, end - at);
    if (!line.empty() && kIndent + line.size() + 1 + word.size() > kWidth) {
      out += line + "\n" + std::string(kIndent, ' ');
      line.clear();
    }
    if (!line.empty()) line += ' ';
    line += word;
    at = end + 1;
  }
  return out + line + "\n";
}

// --mask's entry, from the mask table (mask_help()): its names and glosses.
std::string mask_entry() {
  return "  --mask M             " + wrapped(mask_help()) + std::string(58, ' ') + "(default causal)\n";
}

const char* kProblemHelpHead = R"(Problem (shared by profile, compare, explain):
  --batch N            batch size                        (GPU default 8, CPU default 2)
  --heads N            query heads                       (GPU 16, CPU 8)
  --kv-heads N         key/value heads; fewer than --heads is grouped-query
                       attention, 1 is multi-query        (default: --heads)
  --seq N              query sequence length             (default 1024)
  --kv-seq N           key/value sequence length         (default: --seq)
  --head-dim N         head dimension, up to 256          (default 64)
  --dtype T            fp32, fp16, bf16 or fp8            (default bf16)
                       fp8: q, k and v stored in e4m3 (OCP's e4m3fn, largest
                       448) with a per-tensor descale each, real = e4m3 x
                       descale (FlashAttention-3's q_descale ..., cuDNN's
                       descale_q ...); the output is bf16; forward only. The
                       real inputs are the bf16 run's of the same shape and
                       seed, quantized per tensor (--fp8-descale); the float64
                       reference reads the real values, so the error includes
                       quantization's, and each backend's error on the bf16
                       inputs is shown beside it. Tolerance: 2 x math's error
                       (math in FP8 semantics: dequantized, computed in FP32)
                       + 3.6e-2, one e4m3 rounding's largest RMS (2^-4 / sqrt 3).
                       naive, naive_inplace and math take it (FP8 semantics),
                       flash on the CPU (the stored values in its bf16
                       products, the descales as scales, P in bf16), and on
                       CUDA flash (sm90, head dim 128) and cudnn; efficient
                       says it does not
)";

// After --mask (whose entry mask_entry() writes from the mask table).
const char* kProblemHelpTail = R"(  --window N           keys each query sees with --mask sliding-window
  --kv-cache C         contiguous, or paged: K and V in pages of --page-size
                       keys, read through a (shuffled) block table, as a
                       decode server keeps them; forward only. flash reads
                       the pages in place (CPU and CUDA), cudnn through its
                       paged graph, naive, naive_inplace and math gather
                       them; efficient refuses it by name
                                                      (default contiguous)
  --page-size N        keys per page with --kv-cache paged, a power of two
                       (16, 64 ...); a sequence's last page is padded
  --mask-file PATH     a .npy mask instead of --mask: bool (True attends) or
                       float (an additive bias), shape broadcastable to
                       [batch, heads, seq, kv-seq] (numpy.save writes one)
  --seq-lens L,L,...   a packed (variable-length) batch, as FlashAttention's
                       varlen functions take one: one query length per
                       sequence (0 allowed), the sequences laid end to end as
                       [total, heads, head_dim]; --batch becomes their count and
                       --seq their maximum. The mask applies per sequence (causal
                       and the window at each one's own diagonal). The table and
                       the findings say what share of the padded batch's FLOPs
                       it needs. flash (CPU and CUDA), cudnn (its ragged
                       layout) and naive, naive_inplace, math (a sequence at
                       a time) take it; efficient refuses it by name;
                       structural masks only
  --kv-seq-lens L,...  each sequence's key/value length with --seq-lens
                       (default: the same as --seq-lens); with
                       --mask causal-bottom-right each sequence's diagonal
                       ends at its last key
  --scale X            softmax scale                      (default 1/sqrt(head_dim))
  --softcap C          soft-cap the scaled scores before the mask, as
                       Gemma-2 does: s -> tanh(s / C) * C, so no score
                       passes +-C; C > 0 (30 and 50 are Gemma-2's). flash
                       (the CPU's kernels, CUDA's sm90 ones), cudnn (its
                       score modifier, not on a packed batch) and naive,
                       naive_inplace, math take it; others refuse it by name
                                                      (default: no cap)
  --device D           cpu or cuda                        (default: cuda when a GPU is present)
  --layout L           bhsd or bshd: lay Q, K, V out as [batch, seq, heads, dim]
                       and pass strided views             (default bhsd)
  --pass P             forward, backward (dQ, dK, dV for a random dO, timed
                       with the forward's saved tensors in place) or train
                       (one step: the forward, then the backward)
                                                          (default forward)
  --deterministic      backward: accumulate dQ in a fixed order instead of
                       with atomics (fused backwards)
  --fp8-descale X      with --dtype fp8: auto (each tensor's amax / 448, its
                       largest value stored as e4m3's 448) or one descale X > 0
                       for q, k and v; values past 448 x X saturate to +-448,
                       and a warning says which tensor, its amax and the share
                       saturated                          (default auto)
)";

std::string problem_help() { return kProblemHelpHead + mask_entry() + kProblemHelpTail; }

const char* kRunHelp = R"(Run (profile and compare):
  --wait N --warmup N --active N --repeat N
                       the profiler schedule, as torch.profiler.schedule
                                                          (default 0, 1, 3, 1)
  --trace-dir DIR      where traces and tables go         (default ./traces)
  --sort KEY           table order: cpu_time_total, self_cpu_time_total,
                       cuda_time_total, self_cuda_time_total, count
  --row-limit N        table rows                         (default: all)
  --threads N          CPU threads                        (default: all cores)
  --seed N             input seed (inputs are random, never zeros)
  --check-rows N       query rows checked against the float64 reference
                       (all rows when the problem has fewer)  (default 2048)
  --unprofiled-calls N on a GPU, calls made back to back after the profiled
                       steps with no profiler attached (CUPTI detached); their
                       median is the CPU/call figure (API tracing makes the
                       profiled calls slower), p10 and p90 go to the summary;
                       a quarter as many untimed calls go first; 0 skips
                                                          (default 32)
  --gpus N             context parallelism: flash only, Q, K and V sharded
                       along the sequence over N GPUs of this machine (ring
                       attention over NCCL, zigzag chunks so causal work is
                       balanced; --seq a multiple of 2N; --mask none or
                       causal; 1 runs the same path on one GPU). The trace
                       has a lane per GPU and NCCL's kernels; the findings
                       say how much communication compute hid, each rank's
                       wait and the load imbalance
  --expect B=N         your guess before you look: backend B makes N GPU
                       activities (N CPU ops on the CPU) per forward; repeatable.
                       The report says whether the trace agrees.
  --quiet              no progress lines on stderr

Environment (GPU runs):
  ATTNPROF_NO_CUPTI=1  time with CUDA events instead of CUPTI (under
                       compute-sanitizer, or beside another profiler)
  ATTNPROF_CUPTI_STAY_ATTACHED=1
                       keep CUPTI loaded after the profiled steps; by default
                       it detaches, so later calls pay nothing for it
  ATTNPROF_CEILING_TFLOPS=X
                       the 16-bit (fp16, bf16) matrix-product ceiling in
                       TFLOP/s, instead of measuring it; --dtype fp8 on CUDA is
                       held to twice it (e4m3's tensor-core rate), every other
                       dtype (and fp8 on the CPU, which has no e4m3 product)
                       to X
  ATTNPROF_COPY_GBS=X  the copy ceiling in GB/s (bytes read plus bytes
                       written), instead of timing a large device-to-device
                       copy. Both ceilings are measured once per process, on
                       the CPU too; these two skip that (under a sanitizer).
                       A value that is not a number above 0 is refused
)";

}  // namespace

std::string usage() {
  return R"(attnprof: scaled-dot-product attention, computed every way the field does, each profiled.

Usage:
  attnprof compare [options]            every eligible backend, then the at-a-glance table
  attnprof profile --backend B [options]  one backend: the key-averages table, trace written
  attnprof explain [options]            which backends can run this problem, why, and what auto picks
  attnprof analyze TRACE [TRACE...]     the same findings on any torch.profiler or attnprof trace
  attnprof diff A B                     what changed between two traces (or two steps)
  attnprof COMMAND --help               the options of one command

Backends: )" +
         backend_list() +
         R"(
Outputs go to --trace-dir as <batch>_<heads>_<seq>_<head_dim>_<backend>.json (a Chrome
trace: open it in Perfetto or chrome://tracing), .txt (the table) and .summary.json.

Examples:
  attnprof compare --device cpu --seq 2048 --mask causal
  attnprof compare --device cpu --seq-lens 512,1024,64,2048 --backends flash,math
  attnprof analyze run.pt.trace.json.gz
  attnprof diff before.json after.json
)";
}

std::string command_help(const std::string& command) {
  std::string h;
  if (command == "profile") {
    h = "attnprof profile --backend B [options]\n\n"
        "Profiles one backend: runs the schedule's steps, prints the key-averages table\n"
        "(PyTorch's layout) and writes <stem>.json (Chrome trace), <stem>.txt (table) and\n"
        "<stem>.summary.json under --trace-dir, where <stem> is batch_heads_seq_headdim_backend.\n\n"
        "  --backend B          one of " +
        backend_list() +
        "\n"
        "  --json PATH          also write the result as JSON\n"
        "  --html FILE          also write the HTML report (timeline, roofline, findings)\n\n" +
        problem_help() + "\n" + kRunHelp;
  } else if (command == "compare") {
    h = std::string(
            "attnprof compare [options]\n\n"
            "Profiles every eligible backend on one problem and prints the at-a-glance table:\n"
            "kernels (or ops) and copies per forward, device time, host time per call, peak\n"
            "memory, TFLOP/s and %% of the measured ceiling, error against a float64 reference,\n"
            "occupancy, and what the trace shows (rules that read the recorded events).\n"
            "A trace, table and summary per backend go to --trace-dir.\n\n"
            "  --backends A,B,...   only these backends (named: auto is for profile)\n"
            "  --json PATH          also write the results as JSON\n"
            "  --html FILE          also write the HTML report: one self-contained page with each\n"
            "                       backend's timeline, bars, a roofline, the findings and tables\n\n") +
        problem_help() + "\n" + kRunHelp;
  } else if (command == "explain") {
    h = std::string(
            "attnprof explain [options]\n\n"
            "Says, for every backend, whether it can run this problem on this device and why,\n"
            "and what auto picks: the first eligible backend in a fixed order (cuda: flash,\n"
            "cudnn, efficient, math, naive_inplace, naive; cpu: flash, math, naive_inplace,\n"
            "naive), never a timing, so every run picks the same.\n\n"
            "  --json PATH          also write the answer as JSON\n\n") +
        problem_help();
  } else if (command == "analyze") {
    h = R"(attnprof analyze TRACE [TRACE...] [--step N] [--top N] [--json PATH] [--html FILE] [--replay]

Reads Chrome traces as torch.profiler writes them (prof.export_chrome_trace(...),
the TensorBoard handler's *.pt.trace.json, gzipped or not) or as attnprof writes
them, and for each profiler step (ProfilerStep#N; the whole trace when it has
none) prints the at-a-glance table and what the trace shows, through the same
rule table as compare: hidden copies (a copy_ or a device-to-device memcpy inside
an op that is not itself a copy), FP32 GEMMs on 16-bit inputs and whether tensor
cores ran them, masks rebuilt every step, NaN-safe softmax, heavy kernels at low
occupancy (computed for every kernel from its grid, block, registers and shared
memory and the trace's deviceProperties, cuLaunchKernelEx launches included),
launch-bound and CPU-bound steps. Then, per step, the kernels, memcpys and
memsets of each top-level op and the top kernels by time.

  --step N             only ProfilerStep#N
  --top N              rows of the per-op and per-kernel tables   (default 10)
  --json PATH          also write the results as JSON (findings as records)
  --html FILE          also write the HTML report: per step, its CPU and GPU
                       timeline, the findings with the events they cite, the
                       key-averages table, and bars across steps and traces
  --max-gib N          refuse a trace whose JSON (after decompression) passes
                       N GiB: a gzip bomb, or more than this machine holds (default 4)
  --ceiling-tflops X   the trace's device's dense matmul ceiling (TFLOP/s): each
                       attention call's "ceiling" column is its TFLOP/s over X
                       (default: ATTNPROF_CEILING_TFLOPS; "attnprof profile" on
                       that device prints the one it measures)
  --replay             run each distinct attention problem of the trace (forward,
                       and backward where the trace has one) through attnprof's
                       eligible backends here; per problem what ran in the trace,
                       its time there, each backend's time and ratio, the fastest.
                       A trace from a device this machine lacks (a CUDA trace on a
                       CPU-only machine) is replayed only with --device
  --device D           with --replay: cpu or cuda (default: the trace's device)
  --backends A,B,...   with --replay: only these backends
  --replay-max-gflop N with --replay on the CPU: skip problems above N GFLOP a
                       call, with a line saying so                  (default 2)

A trace that cannot be read (not JSON, truncated, not a trace, too deep, not
UTF-8, a field of the wrong type) stops with one line, "attnprof: cannot read
TRACE: why", exit status 4, and nothing written.

Examples:
  # in PyTorch: with torch.profiler.profile(..., schedule=torch.profiler.schedule(
  #   wait=1, warmup=1, active=3), record_shapes=True) as prof: ... prof.step()
  #   prof.export_chrome_trace("run.json")
  attnprof analyze run.json
  attnprof analyze log/host_1234.1700000000000.pt.trace.json.gz --step 3
  attnprof analyze traces/8_16_1024_64_naive.json --json naive.analysis.json
)";
  } else if (command == "diff") {
    h = R"(attnprof diff A [--step N] B [--step M] [--top N] [--json PATH] [--html FILE]

Says what changed from trace A to trace B, the way Holistic Trace Analysis's
TraceDiff does: kernels that appeared or vanished; time per kernel and per
top-level op (A, B, delta, ratio, calls), largest changes first; kernels,
memcpys, memsets, bytes copied and peak memory; findings present in only one.
Figures are per step, averaged over each side's steps, so traces with different
step counts compare. A --step after a trace picks one of its steps; one trace
with two --step flags compares two steps of it.

  --step N             the step of the trace named before it
  --top N              rows per table                              (default 15)
  --json PATH          also write the comparison as JSON
  --html FILE          also write the HTML report: the rows that changed, and
                       both sides' steps as analyze shows them
  --max-gib N          as for analyze                             (default 4)
  --ceiling-tflops X   as for analyze: the ceiling attention calls are held to

Examples:
  attnprof diff naive.json naive_inplace.json
  attnprof diff run.json --step 2 run.json --step 5
  attnprof diff run.json --step 2 --step 5
  attnprof diff before.pt.trace.json.gz after.pt.trace.json.gz --json diff.json
)";
  } else {
    h = usage();
  }
  // The literal %% above is for readers of printf-style text; show one.
  for (std::size_t p = h.find("%%"); p != std::string::npos; p = h.find("%%")) h.erase(p, 1);
  return h;
}

}  // namespace attnprof::cli
