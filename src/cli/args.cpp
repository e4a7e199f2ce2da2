#include "cli/args.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>

#include "attnprof/backend.h"
#include "attnprof/error.h"

namespace attnprof::cli {
namespace {

[[noreturn]] void bad(const std::string& msg) { fail(ErrorKind::InvalidArgument, msg); }

std::int64_t to_int(const std::string& flag, const std::string& v) {
  std::int64_t x = 0;
  const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec == std::errc::result_out_of_range) bad(flag + " " + v + " is out of range");
  if (ec != std::errc() || ptr != v.data() + v.size()) bad(flag + " expects a whole number, got '" + v + "'");
  return x;
}

int to_small_int(const std::string& flag, const std::string& v, int lo, int hi) {
  const std::int64_t x = to_int(flag, v);
  if (x < lo || x > hi) bad(flag + " must be between " + std::to_string(lo) + " and " + std::to_string(hi));
  return static_cast<int>(x);
}

double to_double(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || end != v.c_str() + v.size() || !std::isfinite(x)) bad(flag + " expects a number, got '" + v + "'");
  return x;
}

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

std::string backend_list() {
  std::string s;
  for (auto n : backend_names()) s += (s.empty() ? "" : ", ") + std::string(n);
  return s + ", auto";
}

const char* kProblemHelp = R"(Problem (shared by profile, compare, explain):
  --batch N            batch size                        (GPU default 8, CPU default 2)
  --heads N            query heads                       (GPU 16, CPU 8)
  --kv-heads N         key/value heads; fewer than --heads is grouped-query
                       attention, 1 is multi-query        (default: --heads)
  --seq N              query sequence length             (default 1024)
  --kv-seq N           key/value sequence length         (default: --seq)
  --head-dim N         head dimension, up to 256          (default 64)
  --dtype T            fp32, fp16 or bf16                 (default bf16)
  --mask M             none, causal (top-left, PyTorch's is_causal),
                       causal-bottom-right (FlashAttention's), sliding-window,
                       boolean (a random 90%-kept mask), bias (random additive)
                                                          (default causal)
  --window N           keys each query sees with --mask sliding-window
  --scale X            softmax scale                      (default 1/sqrt(head_dim))
  --device D           cpu or cuda                        (default: cuda when a GPU is present)
  --layout L           bhsd or bshd: lay Q, K, V out as [batch, seq, heads, dim]
                       and pass strided views             (default bhsd)
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
                       the matrix-product ceiling, instead of measuring it
)";

}  // namespace

std::string usage() {
  return R"(attnprof: scaled-dot-product attention, computed every way the field does, each profiled.

Usage:
  attnprof compare [options]            every eligible backend, then the at-a-glance table
  attnprof profile --backend B [options]  one backend: the key-averages table, trace written
  attnprof explain [options]            which backends can run this problem, why, and what auto picks
  attnprof COMMAND --help               the options of one command

Backends: )" +
         backend_list() +
         R"(
Outputs go to --trace-dir as <batch>_<heads>_<seq>_<head_dim>_<backend>.json (a Chrome
trace: open it in Perfetto or chrome://tracing), .txt (the table) and .summary.json.

Example:
  attnprof compare --device cpu --seq 2048 --mask causal
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
            "  --backends A,B,...   only these backends\n"
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
  } else {
    h = usage();
  }
  // The literal %% above is for readers of printf-style text; show one.
  for (std::size_t p = h.find("%%"); p != std::string::npos; p = h.find("%%")) h.erase(p, 1);
  return h;
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
  if (o.command != "profile" && o.command != "compare" && o.command != "explain") {
    bad("unknown command '" + o.command + "': use profile, compare or explain (attnprof --help)");
  }
  Problem& p = o.problem;
  p.batch = 0;  // 0 = the device default, filled once the device is known
  p.heads = 0;
  using Setter = std::function<void(const std::string&, const std::string&)>;
  // A size flag. 0 stands for "the default" in some (batch and heads: the
  // device's; kv-heads and kv-seq: the query's), so a typed 0 is refused here;
  // negative values reach Problem::validate, which names them.
  const auto size = [](std::int64_t& field) -> Setter {
    return [&field](const std::string& f, const std::string& v) {
      field = to_int(f, v);
      if (field == 0) bad(f + " must be positive, got 0");
    };
  };
  const std::map<std::string, Setter> flags = {
      {"--batch", size(p.batch)},
      {"--heads", size(p.heads)},
      {"--kv-heads", size(p.kv_heads)},
      {"--seq", size(p.seq)},
      {"--kv-seq", size(p.kv_seq)},
      {"--head-dim", [&](auto& f, auto& v) { p.head_dim = to_int(f, v); }},
      {"--window",
       [&](auto& f, auto& v) {
         p.window = to_int(f, v);
         if (p.window <= 0) bad("--window must be positive");
       }},
      {"--scale", [&](auto& f, auto& v) { p.scale = to_double(f, v); }},
      {"--dtype",
       [&](auto&, auto& v) {
         auto t = parse_dtype(v);
         if (!t) bad("unknown --dtype '" + v + "': use fp32, fp16 or bf16");
         p.dtype = *t;
       }},
      {"--mask",
       [&](auto&, auto& v) {
         auto m = parse_mask(v);
         if (!m) bad("unknown --mask '" + v + "': use one of " + std::string(mask_choices()));
         p.mask = *m;
       }},
      {"--device",
       [&](auto&, auto& v) {
         if (v == "cpu")
           p.device = Device::Cpu;
         else if (v == "cuda" || v == "gpu")
           p.device = Device::Cuda;
         else
           bad("unknown --device '" + v + "': use cpu or cuda");
         o.device_given = true;
       }},
      {"--layout",
       [&](auto&, auto& v) {
         if (v != "bhsd" && v != "bshd") bad("unknown --layout '" + v + "': use bhsd or bshd");
         o.bshd = v == "bshd";
       }},
      {"--backend",
       [&](auto&, auto& v) {
         if (!is_backend_name(v) && v != "auto") bad("unknown --backend '" + v + "': use one of " + backend_list());
         o.backend = v;
       }},
      {"--backends",
       [&](auto&, auto& v) {
         for (const auto& b : split(v, ',')) {
           if (!is_backend_name(b)) bad("unknown backend '" + b + "' in --backends: use " + backend_list());
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
      {"--seed", [&](auto& f, auto& v) { o.seed = static_cast<std::uint64_t>(to_int(f, v)); }},
      {"--check-rows", [&](auto& f, auto& v) { o.check_rows = to_small_int(f, v, 1, 1 << 24); }},
      {"--unprofiled-calls", [&](auto& f, auto& v) { o.unprofiled_calls = to_small_int(f, v, 0, 10000); }},
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
         if (kv.size() != 2 || !is_backend_name(kv[0])) bad("--expect wants BACKEND=N, e.g. --expect naive=6");
         o.guesses[kv[0]] = to_small_int(f, kv[1], 0, 100000);
       }},
  };
  static const char* kShapeFlags[] = {"--batch", "--heads", "--seq",    "--head-dim",
                                      "--dtype", "--mask",  "--kv-seq", "--kv-heads"};
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      o.help = true;
      return o;
    }
    if (arg == "--quiet" || arg == "-q") {
      o.quiet = true;
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
  if (o.command == "profile" && o.backend.empty()) bad("profile needs --backend B (one of " + backend_list() + ")");
  if (o.command != "profile" && !o.backend.empty()) bad("--backend is for profile; compare takes --backends A,B");
  if (o.command == "explain" && o.html_path) bad("--html is for compare and profile");
  return o;
}

}  // namespace attnprof::cli
