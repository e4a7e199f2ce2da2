#include "cli/args.h"

#include <cctype>
#include <cstdlib>
#include <functional>
#include <map>

#include "attnprof/backend.h"
#include "attnprof/error.h"
#include "attnprof/mask_tensor.h"
#include "attnprof/problem_spec.h"

namespace attnprof::cli {
namespace {

[[noreturn]] void bad(const std::string& msg) { fail(ErrorKind::InvalidArgument, msg); }

// The CLI's own integer flags, read by the library's one number parser.
int to_small_int(const std::string& flag, const std::string& v, int lo, int hi) {
  return static_cast<int>(parse_integer(flag, v, lo, hi));
}

// The flag of each field the library names in its messages: the Problem's
// fields, then the run's and the pipeline's options. One table, read one way
// by parse() (a flag sets its field) and the other by flag_message().
struct FieldFlag {
  std::string_view field, flag;
  bool problem = false;  // set through set_problem_field
};
constexpr FieldFlag kFieldFlags[] = {
    {"batch", "--batch", true},
    {"heads", "--heads", true},
    {"kv_heads", "--kv-heads", true},
    {"seq", "--seq", true},
    {"kv_seq", "--kv-seq", true},
    {"head_dim", "--head-dim", true},
    {"dtype", "--dtype", true},
    {"device", "--device", true},
    {"mask", "--mask", true},
    {"window", "--window", true},
    {"scale", "--scale", true},
    {"softcap", "--softcap", true},
    {"pass", "--pass", true},
    {"deterministic", "--deterministic"},  // a switch here: parse() sets it
    {"kv_cache", "--kv-cache", true},
    {"page_size", "--page-size", true},
    {"mask_file", "--mask-file"},
    {"seq_lens", "--seq-lens", true},
    {"kv_seq_lens", "--kv-seq-lens", true},
    {"layout", "--layout"},
    {"backend", "--backend"},
    {"backends", "--backends"},
    {"expect", "--expect"},
    {"gpus", "--gpus"},
    {"trace_dir", "--trace-dir"},
    {"json_path", "--json"},
    {"html_path", "--html"},
    {"sort_by", "--sort"},
    {"row_limit", "--row-limit"},
    {"threads", "--threads"},
    {"seed", "--seed"},
    {"check_rows", "--check-rows"},
    {"unprofiled_calls", "--unprofiled-calls"},
    {"fp8_descale", "--fp8-descale"},
    {"top", "--top"},
};

const FieldFlag* flag_of(std::string_view field) {
  for (const auto& f : kFieldFlags) {
    if (f.field == field) return &f;
  }
  return nullptr;
}

bool word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; }

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

std::string backend_list() { return backend_choices(/*with_auto=*/true); }

const char* kProblemHelp = R"(Problem (shared by profile, compare, explain):
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
                       naive, naive_inplace and math take it; others say
                       whether they do
  --mask M             none, causal (top-left, PyTorch's is_causal),
                       causal-bottom-right (FlashAttention's), sliding-window,
                       boolean (a random 90%-kept mask), bias (random additive)
                                                          (default causal)
  --window N           keys each query sees with --mask sliding-window
  --kv-cache C         contiguous, or paged: K and V in pages of --page-size
                       keys, read through a (shuffled) block table, as a
                       decode server keeps them; forward only, on the CPU
                       (naive, naive_inplace, math gather the pages, flash
                       reads them in place)           (default contiguous)
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
                       it needs. On the CPU (flash, naive, naive_inplace, math),
                       refused by name elsewhere; structural masks only
  --kv-seq-lens L,...  each sequence's key/value length with --seq-lens
                       (default: the same as --seq-lens); with
                       --mask causal-bottom-right each sequence's diagonal
                       ends at its last key
  --scale X            softmax scale                      (default 1/sqrt(head_dim))
  --softcap C          soft-cap the scaled scores before the mask, as
                       Gemma-2 does: s -> tanh(s / C) * C, so no score
                       passes +-C; C > 0 (30 and 50 are Gemma-2's); on the
                       CPU backends (naive, naive_inplace, math, flash),
                       refused by name elsewhere      (default: no cap)
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

const char* kRunHelp = R"(Run (profile and compare):
  --wait N --warmup N --active N --repeat N
                       the profiler schedule, as torch.profiler.schedule
                                                          (default 0, 1, 3, 1)
  --trace-dir DIR      where traces and tables go         (default ./traces)
  --sort KEY           table order: cpu_time_total, self_cpu_time_total,
                       cuda_time_total, self_cuda_time_total, count
  --row-limit N        table rows                         (default 20)
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
                       TFLOP/s, instead of measuring it; --dtype fp8 is held
                       to twice it (e4m3's tensor-core rate), every other
                       dtype to X
  ATTNPROF_COPY_GBS=X  the copy ceiling in GB/s (bytes read plus bytes
                       written), instead of timing a large device-to-device
                       copy. Both ceilings are measured once per process, on
                       the CPU too; these two skip that (under a sanitizer)
)";

// --help and --quiet, which every command takes: true when `arg` is one.
bool take_common_flag(const std::string& arg, Options& o) {
  if (arg == "--help" || arg == "-h") return o.help = true;
  if (arg == "--quiet" || arg == "-q") return o.quiet = true;
  return false;
}

// analyze and diff: traces as positional arguments, --step after a trace.
Options parse_trace_command(Options o, int argc, char** argv) {
  const bool diff = o.command == "diff";
  o.top = diff ? 15 : 10;
  std::optional<int> analyze_step;
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    if (take_common_flag(arg, o)) {
      if (o.help) return o;
      continue;
    }
    if (arg.rfind("--", 0) != 0 || arg == "-") {
      o.traces.push_back(arg);
      o.trace_steps.emplace_back();
      continue;
    }
    std::string value;
    if (const auto eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else {
      if (!diff && arg == "--replay") {
        o.replay = true;
        continue;
      }
      if (arg != "--step" && arg != "--top" && arg != "--json" && arg != "--html" && arg != "--max-gib" &&
          arg != "--ceiling-tflops" &&
          (diff || (arg != "--device" && arg != "--backends" && arg != "--replay-max-gflop"))) {
        bad("unknown option '" + arg + "' (attnprof " + o.command + " --help lists them)");
      }
      if (i + 1 >= argc) bad(arg + " needs a value");
      value = argv[++i];
    }
    if (arg == "--step") {
      const int step = to_small_int(arg, value, 0, 1 << 30);
      if (!diff) {
        analyze_step = step;
      } else if (o.traces.empty()) {
        bad("--step N follows the trace it picks a step of: attnprof diff A --step N B --step M");
      } else if (!o.trace_steps.back()) {
        o.trace_steps.back() = step;
      } else {
        // A second step of the same trace: the other side of the diff.
        o.traces.push_back(o.traces.back());
        o.trace_steps.emplace_back(step);
      }
    } else if (arg == "--top") {
      o.top = to_small_int(arg, value, 1, 100000);
    } else if (arg == "--json") {
      if (value.empty()) bad("--json needs a path");
      o.json_path = value;
    } else if (arg == "--html") {
      if (value.empty()) bad("--html needs a path");
      o.html_path = value;
    } else if (arg == "--max-gib") {
      o.max_gib = to_small_int(arg, value, 1, 1 << 20);
    } else if (!diff && arg == "--device") {
      if (value != "cpu" && value != "cuda") bad("--device must be cpu or cuda, got '" + value + "'");
      o.device_given = true;
      o.problem.device = value == "cpu" ? Device::Cpu : Device::Cuda;
    } else if (!diff && arg == "--backends") {
      for (const auto& b : split(value, ',')) {
        check_backend_name("backends", b, /*auto_ok=*/false);
        o.backends.push_back(b);
      }
    } else if (arg == "--ceiling-tflops") {
      char* end = nullptr;
      const double c = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != 0 || !(c > 0) || c > 1e6) {
        bad("--ceiling-tflops must be a positive number of TFLOP/s (the trace's device's dense matmul rate)");
      }
      o.ceiling_tflops = c;
    } else if (!diff && arg == "--replay-max-gflop") {
      char* end = nullptr;
      const double g = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != 0 || !(g > 0) || g > 1e9)
        bad("--replay-max-gflop must be a positive number of GFLOP");
      o.replay_max_gflop = g;
    } else {
      bad("unknown option '" + arg + "' (attnprof " + o.command + " --help lists them)");
    }
  }
  if (diff) {
    if (o.traces.size() != 2) {
      bad("diff compares two traces (or two steps of one: A --step N --step M); got " +
          std::to_string(o.traces.size()));
    }
  } else {
    if (o.traces.empty()) bad("analyze needs at least one trace file (attnprof analyze --help)");
    if (!o.replay && (o.device_given || !o.backends.empty())) bad("--device and --backends go with --replay");
    for (auto& s : o.trace_steps) s = analyze_step;
  }
  return o;
}

}  // namespace

std::string flag_message(const Error& e) {
  std::string s = e.what();
  // field=value, as the library cites a setting in any message: the flag and its value.
  for (const FieldFlag& f : kFieldFlags) {
    const std::string cite = std::string(f.field) + "=";
    for (std::size_t at = s.find(cite); at != std::string::npos; at = s.find(cite, at)) {
      if (at > 0 && word_char(s[at - 1])) {
        at += cite.size();
        continue;
      }
      std::string with = std::string(f.flag) + " ";
      std::size_t len = cite.size();
      if (f.field == "deterministic" && s.compare(at + len, 4, "true") == 0) {  // a switch here
        with.pop_back();
        len += 4;
      }
      s.replace(at, len, with);
      at += with.size();
    }
  }
  // Bare field names, only those the error says it names (prose elsewhere may
  // use the same words), and never inside a quoted value.
  for (const std::string& field : e.fields()) {
    const FieldFlag* f = flag_of(field);
    if (!f) continue;
    std::string out;
    bool quoted = false;
    for (std::size_t i = 0; i < s.size();) {
      const char c = s[i];
      if (c == '\'' && (quoted || i == 0 || !std::isalnum(static_cast<unsigned char>(s[i - 1])))) quoted = !quoted;
      const bool starts = !quoted && s.compare(i, field.size(), field) == 0 && (i == 0 || !word_char(s[i - 1])) &&
                          (i + field.size() == s.size() || !word_char(s[i + field.size()]));
      if (starts) {
        out += f->flag;
        i += field.size();
      } else {
        out += c;
        ++i;
      }
    }
    s = std::move(out);
  }
  return s;
}

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
        kProblemHelp + "\n" + kRunHelp;
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
        kProblemHelp + "\n" + kRunHelp;
  } else if (command == "explain") {
    h = std::string(
            "attnprof explain [options]\n\n"
            "Says, for every backend, whether it can run this problem on this device and why,\n"
            "and what auto picks (the fastest eligible backend, measured once and cached).\n\n"
            "  --json PATH          also write the answer as JSON\n\n") +
        kProblemHelp;
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

void load_mask_file(Options& o) {
  if (!o.mask_file) return;
  Tensor m = read_mask_file(*o.mask_file);
  Problem& p = o.problem;
  p.mask = mask_kind_of("--mask-file " + *o.mask_file, m.dtype());
  p.validate();
  o.mask = convert_mask(p, m);
  // Read on the CPU; the runner uploads it with the inputs.
  (void)broadcast_mask(p, o.mask, "--mask-file " + *o.mask_file, Device::Cpu);
}

Options parse(int argc, char** argv) {
  Options o;
  if (argc < 2) {
    o.help = true;
    return o;
  }
  o.command = argv[1];
  if (o.command == "--help" || o.command == "-h" || o.command == "help") {
    o.command.clear();
    o.help = true;
    return o;
  }
  if (o.command == "analyze" || o.command == "diff") return parse_trace_command(std::move(o), argc, argv);
  if (o.command != "profile" && o.command != "compare" && o.command != "explain") {
    bad("unknown command '" + o.command + "': use profile, compare, explain, analyze or diff (attnprof --help)");
  }
  Problem& p = o.problem;
  p.batch = 0;  // 0 = the device default, filled once the device is known
  p.heads = 0;
  using Setter = std::function<void(const std::string&, const std::string&)>;
  std::map<std::string, Setter> flags;
  // The problem's flags: their fields, parsed by the library as Python's keywords are.
  for (const FieldFlag& f : kFieldFlags) {
    if (!f.problem) continue;
    flags[std::string(f.flag)] = [&p, &o, field = f.field](const std::string&, const std::string& v) {
      set_problem_field(p, field, v);
      o.device_given |= field == "device";
    };
  }
  const std::map<std::string, Setter> run_flags = {
      {"--layout", [&](auto&, auto& v) { o.bshd = layout_from_text(v) == Layout::Bshd; }},
      {"--mask-file",
       [&](auto&, auto& v) {
         if (v.empty()) bad("--mask-file needs a path to a .npy file");
         o.mask_file = v;
       }},
      {"--backend",
       [&](auto&, auto& v) {
         check_backend_name("backend", v, /*auto_ok=*/true);
         o.backend = v;
       }},
      {"--backends",
       [&](auto&, auto& v) {
         // compare runs each backend named; auto would be one of them twice.
         for (const auto& b : split(v, ',')) {
           check_backend_name("backends", b, /*auto_ok=*/false);
           o.backends.push_back(b);
         }
       }},
      {"--wait", [&](auto& f, auto& v) { o.schedule.wait = to_small_int(f, v, 0, 1000); }},
      {"--warmup", [&](auto& f, auto& v) { o.schedule.warmup = to_small_int(f, v, 0, 1000); }},
      {"--active", [&](auto& f, auto& v) { o.schedule.active = to_small_int(f, v, 1, 1000); }},
      {"--repeat", [&](auto& f, auto& v) { o.schedule.repeat = to_small_int(f, v, 1, 100); }},
      {"--trace-dir",
       [&](auto&, auto& v) {
         if (v.empty()) bad("--trace-dir needs a directory");
         o.trace_dir = v;
       }},
      {"--sort", [&](auto&, auto& v) { o.sort = v; }},
      {"--row-limit", [&](auto& f, auto& v) { o.row_limit = to_small_int(f, v, 1, 100000); }},
      {"--threads", [&](auto& f, auto& v) { o.threads = to_small_int(f, v, 1, 4096); }},
      {"--seed", [&](auto& f, auto& v) { o.seed = static_cast<std::uint64_t>(parse_integer(f, v, 0)); }},
      {"--check-rows", [&](auto& f, auto& v) { o.check_rows = to_small_int(f, v, 1, 1 << 24); }},
      {"--unprofiled-calls", [&](auto& f, auto& v) { o.unprofiled_calls = to_small_int(f, v, 0, 10000); }},
      {"--gpus", [&](auto& f, auto& v) { o.gpus = to_small_int(f, v, 1, 64); }},
      {"--fp8-descale",
       [&](auto&, auto& v) {
         o.fp8_descale = fp8_descale_from_text(v);
         o.fp8_descale_given = true;
       }},
      {"--json",
       [&](auto&, auto& v) {
         if (v.empty()) bad("--json needs a path");
         o.json_path = v;
       }},
      {"--html",
       [&](auto&, auto& v) {
         if (v.empty()) bad("--html needs a path");
         o.html_path = v;
       }},
      {"--expect",
       [&](auto& f, auto& v) {
         const auto kv = split(v, '=');
         if (kv.size() != 2) bad("--expect wants BACKEND=N, e.g. --expect naive=6");
         check_backend_name("expect", kv[0], /*auto_ok=*/false);
         o.guesses[kv[0]] = to_small_int(f, kv[1], 0, 100000);
       }},
  };
  flags.insert(run_flags.begin(), run_flags.end());
  static const char* kShapeFlags[] = {"--batch", "--heads",  "--seq",      "--head-dim", "--dtype",
                                      "--mask",  "--kv-seq", "--kv-heads", "--seq-lens", "--kv-seq-lens"};
  bool mask_given = false;
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    if (take_common_flag(arg, o)) {
      if (o.help) return o;
      continue;
    }
    mask_given |= arg == "--mask" || arg.rfind("--mask=", 0) == 0;
    if (arg == "--deterministic") {
      set_problem_field(p, "deterministic", "true");
      continue;
    }
    std::string value;
    bool has_value = false;
    if (auto eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    auto it = flags.find(arg);
    if (it == flags.end()) bad("unknown option '" + arg + "' (attnprof " + o.command + " --help lists them)");
    if (!has_value) {
      if (i + 1 >= argc) bad(arg + " needs a value");
      value = argv[++i];
    }
    it->second(arg, value);
    for (const char* s : kShapeFlags) o.shape_given |= arg == s;
  }
  if (o.mask_file && mask_given) {
    bad("--mask-file and --mask are exclusive: the file is the whole mask (fold a causal part into it)");
  }
  if (o.mask_file && o.gpus) bad("--mask-file is for one device (--gpus shards structural masks only)");
  if (o.fp8_descale_given && !is_fp8(p.dtype)) bad("--fp8-descale applies to --dtype fp8 only");
  if (o.command == "profile" && o.backend.empty()) bad("profile needs --backend B (one of " + backend_list() + ")");
  if (o.command != "profile" && !o.backend.empty()) bad("--backend is for profile; compare takes --backends A,B");
  if (o.command == "explain" && o.html_path) bad("--html is for compare and profile");
  if (o.command == "explain" && o.gpus) bad("--gpus is for compare and profile");
  return o;
}

}  // namespace attnprof::cli
