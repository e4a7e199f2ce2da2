// analyze --replay (attnprof/replay.h): the trace's attention problems run
// through attnprof's backends on this machine.
#include "attnprof/replay.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "analysis/format.h"
#include "attnprof/error.h"

namespace attnprof {
namespace {

using analysis::format;

// Empty when `d` is usable here; else why not, in one line.
std::string device_missing(Device d, int threads) {
  if (d == Device::Cpu) return {};
  if (!cuda_built()) return "this build has no CUDA (configure with a CUDA toolkit, preset 'cuda')";
  try {
    (void)device_runtime(d, threads);
  } catch (const Error& e) {
    return e.what();
  }
  return {};
}

std::string label_of(const AttentionCall& c) {
  // Each part appended on its own: GCC 12 warns (-Wrestrict, a false positive) on " " + string.
  std::string s = c.backward ? "backward " : "forward ";
  s += c.shape.empty() ? "(no shapes)" : c.shape;
  const auto part = [&s](const std::string& x) {
    s += ' ';
    s += x;
  };
  if (!c.mask.empty()) part(c.mask);
  if (c.problem && c.problem->mask == MaskKind::SlidingWindow) part(std::to_string(c.problem->window));
  if (!c.dtype.empty()) part(c.dtype);
  if (c.scale && c.problem && c.problem->head_dim > 0 && c.problem->head_dim <= (1 << 16)) {
    const double standard = 1.0 / std::sqrt(static_cast<double>(c.problem->head_dim));
    if (std::abs(*c.scale - standard) > 1e-6 * standard) s += format(" scale %g", *c.scale);
  }
  return s;
}

// Why a call's problem cannot be replayed as recorded; empty when it can.
std::string unreplayable(const AttentionCall& c) {
  if (!c.problem) return "shapes not recorded: record them with torch.profiler.profile(record_shapes=True)";
  if (c.mask == "block_mask") return "FlexAttention's block mask is not in the trace: not replayed";
  if (c.mask == "unknown") return "the trace does not say which mask it used: not replayed";
  if (!c.refused.empty()) return "not replayed: " + c.refused;
  return {};
}

void add_backend(std::string& list, const std::string& b) {
  if (list == b || list.starts_with(b + ", ") || list.ends_with(", " + b) || list.find(", " + b + ", ") != list.npos) {
    return;
  }
  if (!list.empty()) list += ", ";  // appended: GCC 12 warns (-Wrestrict, a false positive) on "" + string
  list += b;
}

// The distinct problems of every step, in order of first appearance.
std::vector<ReplayProblem> problems_of(const TraceAnalysis& a) {
  std::vector<ReplayProblem> out;
  std::map<std::string, std::size_t> at;
  std::vector<double> total_us;
  for (const StepAnalysis& s : a.steps) {
    for (const AttentionCall& c : s.attention.calls) {
      const std::string label = label_of(c);
      auto [it, added] = at.emplace(label, out.size());
      if (added) {
        ReplayProblem p;
        p.label = label;
        // Only shapes that validate: a hostile one's problem is never sized again (its FLOPs walk
        // every query row; the JSON's problem counts them).
        if (c.refused.empty()) p.problem = c.problem;
        p.flops = c.flops;
        p.skipped = unreplayable(c);
        out.push_back(std::move(p));
        total_us.push_back(0);
      }
      ReplayProblem& p = out[it->second];
      ++p.calls;
      total_us[it->second] += a.gpu ? c.gpu_us : c.cpu_us;
      add_backend(p.ran, c.backend);
    }
  }
  for (std::size_t i = 0; i < out.size(); ++i) out[i].trace_us = total_us[i] / out[i].calls;
  return out;
}

}  // namespace

void replay_attention(TraceAnalysis& a, const ReplayOptions& o) {
  TraceReplay rep;
  const Device trace_device = a.gpu ? Device::Cuda : Device::Cpu;
  rep.trace_device = std::string(device_name(trace_device));
  rep.problems = problems_of(a);
  const int threads = o.run.threads;

  // Where to replay: asked with --device, or the trace's own when it is here.
  Device device = o.device.value_or(trace_device);
  bool here = true;
  if (o.device) {
    if (const std::string why = device_missing(device, threads); !why.empty()) {
      rep.note = "replay on " + std::string(device_name(device)) + " asked, but it is not here: " + why;
      here = false;
    } else if (device != trace_device) {
      rep.note = "replayed on " + std::string(device_name(device)) + "; the trace ran on " + rep.trace_device +
                 ": the ratios set one device against another";
    }
  } else if (const std::string why = device_missing(trace_device, threads); !why.empty()) {
    rep.note = "the trace ran on " + rep.trace_device + ", which this machine lacks (" + why +
               "): not replayed; device=cpu replays it on the CPU";
    here = false;
  }
  if (rep.problems.empty() && rep.note.empty()) rep.note = "no attention calls in the trace: nothing to replay";
  if (!here) {
    for (auto& p : rep.problems) {
      if (p.skipped.empty()) p.skipped = "not replayed (no device)";
    }
    a.replay = std::move(rep);
    return;
  }
  rep.device = std::string(device_name(device));
  try {
    rep.device_description = device_runtime(device, threads).description();
  } catch (const Error& e) {
    rep.device_description = e.what();
  }

  int index = 0;
  const int todo = static_cast<int>(std::count_if(rep.problems.begin(), rep.problems.end(),
                                                  [](const ReplayProblem& p) { return p.skipped.empty(); }));
  for (ReplayProblem& rp : rep.problems) {
    if (!rp.skipped.empty()) continue;
    if (index >= o.max_problems) {
      rp.skipped = "not replayed: past the first " + std::to_string(o.max_problems) + " distinct problems";
      continue;
    }
    ++index;
    Problem p = *rp.problem;
    p.device = device;
    p.deterministic = false;
    try {
      p.normalize().validate();
    } catch (const Error& e) {
      rp.skipped = std::string("not replayed: ") + e.what();
      continue;
    }
    rp.problem = p;
    const double gflop = p.flops() / 1e9;
    if (device == Device::Cpu && gflop > o.cpu_max_gflop) {
      rp.skipped = format("not replayed: %.3g GFLOP a call", gflop) +
                   format(", above the CPU replay's cap of %g GFLOP (cpu_max_gflop)", o.cpu_max_gflop);
      continue;
    }
    const std::string prefix = "replay " + std::to_string(index) + "/" + std::to_string(todo) + " (" + rp.label + ")";
    RunOptions run = o.run;
    if (o.run.progress) run.progress = [&](std::string_view m) { o.run.progress(prefix + " " + std::string(m)); };
    double best = 0;
    for (const Explanation& e : explain(p)) {
      if (!o.backends.empty() && std::find(o.backends.begin(), o.backends.end(), e.backend) == o.backends.end()) {
        continue;
      }
      ReplayRun r;
      r.backend = e.backend;
      Backend* b = e.eligible ? find_backend(e.backend, p.device) : nullptr;
      if (!b) {
        r.note = e.reason;
        rp.runs.push_back(std::move(r));
        continue;
      }
      if (o.run.progress) o.run.progress(prefix + " " + e.backend);
      const RunResult res = run_backend(*b, p, run);
      if (res.failure) {
        r.note = "failed: " + *res.failure;
      } else if (!res.metrics.device_time_us) {
        r.note = "no time measured";
      } else {
        r.ran = true;
        r.us = *res.metrics.device_time_us;
        if (rp.trace_us > 0) r.ratio = *r.us / rp.trace_us;
        if (*r.us > 0) r.tflops = p.flops() / (*r.us * 1e-6) / 1e12;
        const bool accepted = !res.acceptance || res.acceptance->pass;
        if (!accepted) r.note = "error over tolerance: " + res.acceptance->why;
        if (accepted && (rp.fastest.empty() || *r.us < best)) {
          rp.fastest = r.backend;
          best = *r.us;
        }
      }
      rp.runs.push_back(std::move(r));
    }
    if (rp.runs.empty()) rp.skipped = "no backend named in backends";
  }
  a.replay = std::move(rep);
}

}  // namespace attnprof
