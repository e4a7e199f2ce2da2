// key_averages(): PyTorch's grouping of profiler events by name, and its table
// layout (torch.autograd.profiler_util._build_table), from Trace records only.
#include "attnprof/key_averages.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <numeric>
#include <unordered_map>
#include <utility>

#include "attnprof/error.h"

namespace attnprof {
namespace {

constexpr std::size_t kNone = static_cast<std::size_t>(-1);

// Host-side spans: they nest, and their time is CPU time.
bool is_host_range(ActivityType t) {
  return t == ActivityType::CpuOp || t == ActivityType::UserAnnotation || t == ActivityType::CudaRuntime ||
         t == ActivityType::CudaDriver || t == ActivityType::CudaSync;
}

// The host spans that own the device work launched inside them (PyTorch
// charges a kernel to the op, never to the cudaLaunchKernel call itself).
bool is_op(ActivityType t) { return t == ActivityType::CpuOp || t == ActivityType::UserAnnotation; }

bool is_launch(ActivityType t) { return t == ActivityType::CudaRuntime || t == ActivityType::CudaDriver; }

// GPU user annotations are left out: they span kernels already counted.
bool is_device_op(ActivityType t) {
  return t == ActivityType::Kernel || t == ActivityType::Memcpy || t == ActivityType::Memset;
}

// p contains c: c lies within p's span; identical spans (zero-length ones
// included) nest only when the recorded depth says so.
bool contains(const Activity& p, const Activity& c) {
  if (c.start_ns < p.start_ns || c.end_ns() > p.end_ns()) return false;
  if (c.start_ns == p.start_ns && c.end_ns() == p.end_ns()) return c.depth > p.depth;
  return c.start_ns < p.end_ns();
}

// For each host span, the index of its innermost enclosing host span on the
// same (pid, tid), or kNone.
std::vector<std::size_t> host_parents(const std::vector<Activity>& acts) {
  std::map<std::pair<std::int64_t, std::int64_t>, std::vector<std::size_t>> threads;
  for (std::size_t i = 0; i < acts.size(); ++i) {
    if (is_host_range(acts[i].type)) threads[{acts[i].pid, acts[i].tid}].push_back(i);
  }
  std::vector<std::size_t> parent(acts.size(), kNone);
  for (auto& [lane, idx] : threads) {
    // Parents before children: earlier start, then longer span, then shallower.
    std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) {
      const Activity& x = acts[a];
      const Activity& y = acts[b];
      if (x.start_ns != y.start_ns) return x.start_ns < y.start_ns;
      if (x.end_ns() != y.end_ns()) return x.end_ns() > y.end_ns();
      return x.depth < y.depth;
    });
    std::vector<std::size_t> open;
    for (std::size_t i : idx) {
      while (!open.empty() && !contains(acts[open.back()], acts[i])) open.pop_back();
      if (!open.empty()) parent[i] = open.back();
      open.push_back(i);
    }
  }
  return parent;
}

// PyTorch rewrites numbered step markers so that the table has one row for them.
std::string row_name(const Activity& a) {
  static constexpr std::string_view kStep = "ProfilerStep#";
  if (!a.on_device() && a.name.starts_with(kStep)) return "ProfilerStep*";
  return a.name;
}

using SortKey = std::function<double(const KeyAverage&)>;

const std::vector<std::pair<std::string, SortKey>>& sort_keys() {
  static const std::vector<std::pair<std::string, SortKey>> keys = {
      {"cpu_time_total", [](const KeyAverage& r) { return static_cast<double>(r.cpu_total_ns); }},
      {"self_cpu_time_total", [](const KeyAverage& r) { return static_cast<double>(r.self_cpu_ns); }},
      {"cuda_time_total", [](const KeyAverage& r) { return static_cast<double>(r.cuda_total_ns); }},
      {"self_cuda_time_total", [](const KeyAverage& r) { return static_cast<double>(r.self_cuda_ns); }},
      {"count", [](const KeyAverage& r) { return static_cast<double>(r.count); }},
      // PyTorch 2.4 renamed the CUDA keys; its users type either.
      {"device_time_total", [](const KeyAverage& r) { return static_cast<double>(r.cuda_total_ns); }},
      {"self_device_time_total", [](const KeyAverage& r) { return static_cast<double>(r.self_cuda_ns); }},
  };
  return keys;
}

const SortKey& find_sort_key(const std::string& name) {
  for (const auto& [key, fn] : sort_keys()) {
    if (key == name) return fn;
  }
  fail(ErrorKind::InvalidArgument,
       "unknown sort_by '" + name +
           "': use one of cpu_time_total, self_cpu_time_total, cuda_time_total, self_cuda_time_total, count",
       {"sort_by"});
}

double us(std::int64_t ns) { return static_cast<double>(ns) / 1000.0; }

std::string format_share(double part, double total) {
  if (total == 0.0) return "0.00%";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f%%", part * 100.0 / total);
  return buf;
}

// Python's "{: >N}": right-aligned, never truncated.
std::string right(const std::string& s, std::size_t width) {
  return s.size() >= width ? s : std::string(width - s.size(), ' ') + s;
}

}  // namespace

std::string format_time_us(double time_us) {
  char buf[48];
  if (time_us >= 1e6) {
    std::snprintf(buf, sizeof buf, "%.3fs", time_us / 1e6);
  } else if (time_us >= 1e3) {
    std::snprintf(buf, sizeof buf, "%.3fms", time_us / 1e3);
  } else {
    std::snprintf(buf, sizeof buf, "%.3fus", time_us);
  }
  return buf;
}

std::vector<KeyAverage> key_averages(const Trace& trace) {
  const std::vector<Activity>& acts = trace.activities;
  const std::vector<std::size_t> parent = host_parents(acts);

  std::vector<std::int64_t> self_cpu(acts.size(), 0);
  for (std::size_t i = 0; i < acts.size(); ++i) {
    if (!is_host_range(acts[i].type)) continue;
    self_cpu[i] += acts[i].dur_ns;
    if (parent[i] != kNone) self_cpu[parent[i]] -= acts[i].dur_ns;
  }

  std::unordered_map<std::uint64_t, std::size_t> launch_of;
  std::unordered_map<std::uint64_t, std::size_t> op_of_external;
  for (std::size_t i = 0; i < acts.size(); ++i) {
    if (is_launch(acts[i].type) && acts[i].correlation != 0) launch_of.emplace(acts[i].correlation, i);
    if (is_op(acts[i].type) && acts[i].external_id != 0) op_of_external.emplace(acts[i].external_id, i);
  }
  // The innermost op around a launch; when none encloses it on its thread (a
  // thread id the collector could not map), the op its External id names.
  const auto owner = [&](std::size_t launch) {
    for (std::size_t p = parent[launch]; p != kNone; p = parent[p]) {
      if (is_op(acts[p].type)) return p;
    }
    const auto it = op_of_external.find(acts[launch].external_id);
    return acts[launch].external_id != 0 && it != op_of_external.end() ? it->second : kNone;
  };
  std::vector<std::int64_t> self_cuda(acts.size(), 0);
  std::vector<std::int64_t> cuda_total(acts.size(), 0);
  for (const Activity& d : acts) {
    if (!is_device_op(d.type) || d.correlation == 0) continue;
    const auto it = launch_of.find(d.correlation);
    if (it == launch_of.end()) continue;
    const std::size_t op = owner(it->second);
    if (op != kNone) self_cuda[op] += d.dur_ns;
    for (std::size_t p = op; p != kNone; p = parent[p]) {
      if (is_op(acts[p].type)) cuda_total[p] += d.dur_ns;
    }
  }

  // Rows appear in the order of each name's first event, as PyTorch's do.
  std::vector<std::size_t> order(acts.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return acts[a].start_ns < acts[b].start_ns; });

  std::vector<KeyAverage> rows;
  std::map<std::pair<std::string, bool>, std::size_t> row_of;
  for (std::size_t i : order) {
    const Activity& a = acts[i];
    const bool device = is_device_op(a.type);
    if (!device && !is_host_range(a.type)) continue;
    const std::string name = row_name(a);
    auto [it, fresh] = row_of.emplace(std::make_pair(name, device), rows.size());
    if (fresh) rows.push_back(KeyAverage{.name = name, .type = a.type, .on_device = device});
    KeyAverage& row = rows[it->second];
    row.count += 1;
    if (device) {
      row.self_cuda_ns += a.dur_ns;
      row.cuda_total_ns += a.dur_ns;
    } else {
      row.self_cpu_ns += std::max<std::int64_t>(self_cpu[i], 0);
      row.cpu_total_ns += a.dur_ns;
      row.self_cuda_ns += self_cuda[i];
      row.cuda_total_ns += cuda_total[i];
    }
  }
  return rows;
}

void merge_key_averages(std::vector<KeyAverage>& into, const std::vector<KeyAverage>& more) {
  for (const KeyAverage& m : more) {
    const auto it = std::find_if(into.begin(), into.end(),
                                 [&](const KeyAverage& r) { return r.on_device == m.on_device && r.name == m.name; });
    if (it == into.end()) {
      into.push_back(m);
      continue;
    }
    it->count += m.count;
    it->self_cpu_ns += m.self_cpu_ns;
    it->cpu_total_ns += m.cpu_total_ns;
    it->self_cuda_ns += m.self_cuda_ns;
    it->cuda_total_ns += m.cuda_total_ns;
  }
}

std::string key_averages_table(const std::vector<KeyAverage>& input, const TableOptions& options) {
  const SortKey& key = find_sort_key(options.sort_by);
  if (input.empty()) return {};

  std::vector<KeyAverage> rows = input;
  std::stable_sort(rows.begin(), rows.end(), [&](const KeyAverage& a, const KeyAverage& b) { return key(a) > key(b); });

  const bool has_cuda =
      std::any_of(rows.begin(), rows.end(), [](const KeyAverage& r) { return r.on_device || r.cuda_total_ns > 0; });
  double self_cpu_total = 0.0;
  double self_cuda_total = 0.0;
  for (const KeyAverage& r : rows) {
    self_cpu_total += us(r.self_cpu_ns);
    // Device rows hold every device activity once; host rows repeat them.
    if (r.on_device) self_cuda_total += us(r.self_cuda_ns);
  }

  // PyTorch's widths: names up to 55 characters, every other column 12.
  constexpr std::size_t kMaxName = 55;
  constexpr std::size_t kColumn = 12;
  constexpr const char* kSpacing = "  ";
  std::size_t longest = 0;
  for (const KeyAverage& r : rows) longest = std::max(longest, r.name.size());
  const std::size_t name_width = std::min(longest + 4, kMaxName);

  std::vector<std::string> headers = {"Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg"};
  if (has_cuda) headers.insert(headers.end(), {"Self CUDA", "Self CUDA %", "CUDA total", "CUDA time avg"});
  headers.push_back("# of Calls");

  const auto line = [&](const std::vector<std::string>& cells) {
    std::string out;
    for (std::size_t c = 0; c < cells.size(); ++c) out += right(cells[c], c == 0 ? name_width : kColumn) + kSpacing;
    return out + "\n";
  };
  std::string sep = std::string(name_width, '-') + kSpacing;
  for (std::size_t c = 1; c < headers.size(); ++c) sep += std::string(kColumn, '-') + kSpacing;
  sep += "\n";

  std::string out = sep + line(headers) + sep;
  const std::size_t shown =
      options.row_limit > 0 ? std::min(rows.size(), static_cast<std::size_t>(options.row_limit)) : rows.size();
  for (std::size_t i = 0; i < shown; ++i) {
    const KeyAverage& r = rows[i];
    std::string name = r.name;
    if (name.size() >= kMaxName - 3) name = name.substr(0, kMaxName - 3) + "...";
    std::vector<std::string> cells = {
        name,
        format_share(us(r.self_cpu_ns), self_cpu_total),
        format_time_us(us(r.self_cpu_ns)),
        format_share(us(r.cpu_total_ns), self_cpu_total),
        format_time_us(us(r.cpu_total_ns)),
        format_time_us(r.cpu_avg_ns() / 1000.0),
    };
    if (has_cuda) {
      cells.insert(cells.end(), {format_time_us(us(r.self_cuda_ns)), format_share(us(r.self_cuda_ns), self_cuda_total),
                                 format_time_us(us(r.cuda_total_ns)), format_time_us(r.cuda_avg_ns() / 1000.0)});
    }
    cells.push_back(std::to_string(r.count));
    out += line(cells);
  }
  out += sep;
  out += "Self CPU time total: " + format_time_us(self_cpu_total) + "\n";
  if (has_cuda) out += "Self CUDA time total: " + format_time_us(self_cuda_total) + "\n";
  return out;
}

std::string key_averages_table(const Trace& trace, const TableOptions& options) {
  return key_averages_table(key_averages(trace), options);
}

}  // namespace attnprof
