#include "cli/args.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>

#include "attnprof/backend.h"
#include "attnprof/environment.h"
#include "attnprof/error.h"
#include "attnprof/key_averages.h"
#include "attnprof/mask_tensor.h"
#include "attnprof/problem_spec.h"
#include "attnprof/report.h"

namespace attnprof::cli {
namespace {

[[noreturn]] void bad(const std::string& msg) { fail(ErrorKind::InvalidArgument, msg); }

// The CLI's own integer flags, read by the library's one number parser.
int to_small_int(const std::string& flag, const std::string& v, int lo, int hi) {
  return static_cast<int>(parse_integer(flag, v, lo, hi));
}

std::string format_bound(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

// The CLI's own real flags: the library's number parser, then a bound the
// refusal states, so a positive number past it is not told it must be positive.
double to_real_within(const std::string& flag, const std::string& v, double hi, const char* unit) {
  const double x = parse_real(flag, v);
  if (!(x > 0) || x > hi) bad(flag + " must be above 0 and at most " + format_bound(hi) + " " + unit + ", got " + v);
  return x;
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
  bool replay_bound_given = false;
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
      o.top = to_small_int(arg, value, 1, kMaxTop);
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
      // The trace's device's dense matmul rate.
      o.ceiling_tflops = to_real_within(arg, value, kMaxCeilingTflops, "TFLOP/s");
    } else if (!diff && arg == "--replay-max-gflop") {
      o.replay_max_gflop = to_real_within(arg, value, 1e9, "GFLOP");
      replay_bound_given = true;
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
    if (!o.replay && (o.device_given || !o.backends.empty() || replay_bound_given)) {
      bad("--device, --backends and --replay-max-gflop go with --replay");
    }
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

void load_mask_file(Options& o) {
  if (!o.mask_file) return;
  Tensor m = read_mask_file(*o.mask_file);
  Problem& p = o.problem;
  p.mask = mask_kind_of("--mask-file " + *o.mask_file, m.dtype());
  p.validate();
  o.run.mask = convert_mask(p, m);
  // Read on the CPU; the runner uploads it with the inputs.
  (void)broadcast_mask(p, o.run.mask, "--mask-file " + *o.mask_file, Device::Cpu);
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
  // --seq and --kv-seq as given (lengths given after them set the maxima from themselves): held against the
  // lengths after the loop, whatever the flags' order.
  std::map<std::string_view, std::string> maxima;
  for (const FieldFlag& f : kFieldFlags) {
    if (!f.problem) continue;
    flags[std::string(f.flag)] = [&p, &o, &maxima, field = f.field](const std::string&, const std::string& v) {
      set_problem_field(p, field, v);
      o.device_given |= field == "device";
      if (field == "seq" || field == "kv_seq") maxima[field] = v;
    };
  }
  const std::map<std::string, Setter> run_flags = {
      {"--layout", [&](auto&, auto& v) { o.run.bshd_inputs = layout_from_text(v) == Layout::Bshd; }},
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
      {"--wait", [&](auto& f, auto& v) { o.run.schedule.wait = to_small_int(f, v, 0, 1000); }},
      {"--warmup", [&](auto& f, auto& v) { o.run.schedule.warmup = to_small_int(f, v, 0, 1000); }},
      {"--active", [&](auto& f, auto& v) { o.run.schedule.active = to_small_int(f, v, 1, 1000); }},
      {"--repeat", [&](auto& f, auto& v) { o.run.schedule.repeat = to_small_int(f, v, 1, 100); }},
      {"--trace-dir",
       [&](auto&, auto& v) {
         if (v.empty()) bad("--trace-dir needs a directory");
         o.trace_dir = v;
       }},
      {"--sort",
       [&](auto&, auto& v) {
         o.table.sort_by = v;
         (void)key_averages_table(std::vector<KeyAverage>{}, o.table);  // refuses an unknown key, for every command
       }},
      {"--row-limit", [&](auto& f, auto& v) { o.table.row_limit = to_small_int(f, v, 1, 100000); }},
      {"--threads", [&](auto& f, auto& v) { o.run.threads = to_small_int(f, v, 1, 4096); }},
      {"--seed", [&](auto& f, auto& v) { o.run.seed = static_cast<std::uint64_t>(parse_integer(f, v, 0)); }},
      {"--check-rows", [&](auto& f, auto& v) { o.run.check_rows = to_small_int(f, v, 1, 1 << 24); }},
      {"--unprofiled-calls", [&](auto& f, auto& v) { o.run.unprofiled_calls = to_small_int(f, v, 0, 10000); }},
      {"--gpus", [&](auto& f, auto& v) { o.gpus = to_small_int(f, v, 1, 64); }},
      {"--fp8-descale",
       [&](auto&, auto& v) {
         o.run.fp8_descale = fp8_descale_from_text(v);
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
    // Taken by one command, refused by the others rather than read by none.
    if (o.command == "profile" && arg == "--backends") bad("--backends is for compare; profile takes --backend B");
    if (o.command != "profile" && arg == "--backend") bad("--backend is for profile; compare takes --backends A,B");
    if (!has_value) {
      if (i + 1 >= argc) bad(arg + " needs a value");
      value = argv[++i];
    }
    it->second(arg, value);
    for (const char* s : kShapeFlags) o.shape_given |= arg == s;
  }
  // A packed batch's maxima are its lengths' (a later --seq-lens sets --seq from itself): a --seq or --kv-seq
  // given above them, in either order, would size the padded batch its FLOP share is told against.
  for (const auto& [field, v] : maxima) {
    const std::vector<std::int64_t>& lens = field == "seq" || p.kv_seq_lens.empty() ? p.seq_lens : p.kv_seq_lens;
    if (lens.empty()) continue;
    const std::int64_t longest = *std::max_element(lens.begin(), lens.end());
    const std::string lens_flag = field == "seq" || p.kv_seq_lens.empty() ? "--seq-lens" : "--kv-seq-lens";
    const std::string flag = field == "seq" ? "--seq" : "--kv-seq";
    if (longest > 0 && parse_integer(flag, v) > longest) {  // lengths all 0 are validate()'s to refuse
      bad(flag + " (the maximum length) is " + v + ", but the longest of " + lens_flag + " is " +
          std::to_string(longest) + ": leave " + flag + " out, it is their maximum");
    }
  }
  if (o.mask_file && mask_given) {
    bad("--mask-file and --mask are exclusive: the file is the whole mask (fold a causal part into it)");
  }
  if (o.mask_file && o.gpus) bad("--mask-file is for one device (--gpus shards structural masks only)");
  if (o.fp8_descale_given && !is_fp8(p.dtype)) bad("--fp8-descale applies to --dtype fp8 only");
  if (o.command == "profile" && o.backend.empty())
    bad("profile needs --backend B (one of " + backend_choices(/*with_auto=*/true) + ")");
  // explain takes the run's flags (one command line serves the three commands) and checks them as the runs
  // would; those that would change what it says are refused.
  if (o.command == "explain" && o.html_path) bad("--html is for compare and profile");
  if (o.command == "explain" && o.gpus) bad("--gpus is for compare and profile");
  if (o.command == "explain" && !o.guesses.empty()) bad("--expect is for compare and profile (explain runs nothing)");
  // A guess about a backend the command will not run would be dropped unread.
  for (const auto& [b, n] : o.guesses) {
    if (o.command == "profile" && o.backend != "auto" && b != o.backend) {
      bad("--expect " + b + "=" + std::to_string(n) + " guesses about " + b + ", which profile --backend " + o.backend +
          " does not run");
    }
    if (o.command == "compare" && !o.backends.empty() &&
        std::find(o.backends.begin(), o.backends.end(), b) == o.backends.end()) {
      bad("--expect " + b + "=" + std::to_string(n) + " guesses about " + b + ", which --backends leaves out");
    }
  }
  return o;
}

}  // namespace attnprof::cli
