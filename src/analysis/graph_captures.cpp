// graph_captures.h: what a trace says about CUDA graph captures and nodes.
#include "analysis/graph_captures.h"

#include <algorithm>
#include <string_view>
#include <utility>

#include "analysis/kernel_names.h"

namespace attnprof::analysis {

bool is_device_work(ActivityType t) {
  return t == ActivityType::Kernel || t == ActivityType::Memcpy || t == ActivityType::Memset;
}

// A node's kind, and a captured launch's: 'K' kernel, 'C' memcpy, 'S' memset.
char node_kind(ActivityType t) { return t == ActivityType::Kernel ? 'K' : t == ActivityType::Memcpy ? 'C' : 'S'; }

// The node a captured host call makes, by its name ("cudaLaunchKernel",
// "cuLaunchKernelEx", "cudaMemcpyAsync", "cudaMemsetD32Async"...); 0 for a call
// that makes no node with device work (a host function, an event, a query).
char launch_kind(const Activity& a) {
  if (a.type != ActivityType::CudaRuntime && a.type != ActivityType::CudaDriver) return 0;
  const std::string_view n = a.name;
  const auto has = [&n](std::string_view part) { return n.find(part) != std::string_view::npos; };
  if (has("HostFunc") || has("GraphLaunch")) return 0;
  if (n.starts_with("cudaLaunch") || n.starts_with("cuLaunch")) return 'K';
  if (has("Memcpy") && has("Async")) return 'C';
  if (has("Memset") && has("Async")) return 'S';
  return 0;
}

bool is_graph_launch(const Activity& a) {
  return (a.type == ActivityType::CudaRuntime || a.type == ActivityType::CudaDriver) && a.correlation != 0 &&
         a.name.find("GraphLaunch") != std::string::npos;
}

// CUPTI's runtime callback ids of the capture calls, for a trace whose
// runtime names are "INVALID" (Kineto named only the ids it knew before the
// refactor of its cbid names): cudaStreamBeginCapture(_ptsz) 315, 316,
// cudaStreamBeginCaptureToGraph(_ptsz) 452, 453; cudaStreamEndCapture(_ptsz) 319, 320.
bool begins_capture(const Activity& a) {
  if (a.type == ActivityType::CudaRuntime && (a.cbid == 315 || a.cbid == 316 || a.cbid == 452 || a.cbid == 453)) {
    return true;
  }
  return a.name.starts_with("cudaStreamBeginCapture") || a.name.starts_with("cuStreamBeginCapture");
}

bool ends_capture(const Activity& a) {
  if (a.type == ActivityType::CudaRuntime && (a.cbid == 319 || a.cbid == 320)) return true;
  return a.name.starts_with("cudaStreamEndCapture") || a.name.starts_with("cuStreamEndCapture");
}

std::vector<Window> capture_windows(const std::vector<Activity>& v, bool with_launches) {
  std::vector<std::size_t> marks;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (begins_capture(v[i]) || ends_capture(v[i])) marks.push_back(i);
  }
  std::stable_sort(marks.begin(), marks.end(), [&](std::size_t x, std::size_t y) {
    return std::pair(v[x].tid, v[x].start_ns) < std::pair(v[y].tid, v[y].start_ns);
  });
  std::vector<Window> out;
  for (std::size_t k = 0; k + 1 < marks.size(); ++k) {
    const Activity& b = v[marks[k]];
    const Activity& e = v[marks[k + 1]];
    if (!begins_capture(b) || !ends_capture(e) || b.tid != e.tid) continue;
    Window w;
    w.tid = b.tid;
    w.from_ns = b.end_ns();
    w.to_ns = e.start_ns;
    out.push_back(std::move(w));
  }
  std::sort(out.begin(), out.end(),
            [](const Window& x, const Window& y) { return std::pair(x.tid, x.from_ns) < std::pair(y.tid, y.from_ns); });
  if (!with_launches) return out;
  // Each launch call into the window of its thread that holds its start.
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (!launch_kind(v[i])) continue;
    const auto it = std::upper_bound(out.begin(), out.end(), std::pair(v[i].tid, v[i].start_ns),
                                     [](const std::pair<std::int64_t, std::int64_t>& t, const Window& w) {
                                       return t < std::pair(w.tid, w.from_ns);
                                     });
    if (it == out.begin()) continue;
    Window& w = *std::prev(it);
    if (w.tid == v[i].tid && v[i].start_ns >= w.from_ns && v[i].start_ns <= w.to_ns) w.launches.push_back(i);
  }
  for (Window& w : out) {
    // In call order; a driver launch inside a runtime launch (the runtime's
    // own call to the driver, where both were traced) makes no second node.
    std::sort(w.launches.begin(), w.launches.end(), [&](std::size_t x, std::size_t y) {
      return std::pair(v[x].start_ns, -v[x].dur_ns) < std::pair(v[y].start_ns, -v[y].dur_ns);
    });
    std::vector<std::size_t> kept;
    for (std::size_t i : w.launches) {
      if (!kept.empty() && v[i].end_ns() <= v[kept.back()].end_ns()) continue;
      kept.push_back(i);
      w.kinds += launch_kind(v[i]);
    }
    w.launches = std::move(kept);
  }
  std::erase_if(out, [](const Window& w) { return w.launches.empty(); });
  std::sort(out.begin(), out.end(), [](const Window& x, const Window& y) { return x.from_ns < y.from_ns; });
  return out;
}

// Where two device activities under one node id of a graph run different
// work (a node is one launch: its kind and kernel are fixed), the clash, in
// words; empty where they agree.
std::string node_clash(const Activity& x, const Activity& y) {
  if (x.type == y.type && x.name == y.name) return {};
  return "node " + std::to_string(x.graph_node_id) + " runs both " + short_kernel_name(x.name, 60) + " and " +
         short_kernel_name(y.name, 60);
}

}  // namespace attnprof::analysis
