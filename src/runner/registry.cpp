// The one place that knows which backends exist on which device, and the one
// place a CUDA build's backends are reached from: the CUDA plugin
// (backends/cuda/plugin.h), loaded the first time a CUDA backend or the CUDA
// runtime is asked for.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string_view>
#include <vector>

#include "attnprof/check_inputs.h"
#include "attnprof/error.h"
#include "attnprof/occupancy.h"
#include "attnprof/runner.h"
#include "backends/composite/composite.h"
#include "backends/cpu/cpu_backends.h"
#include "backends/cuda/plugin.h"
#ifdef ATTNPROF_WITH_CUDA
#include <dlfcn.h>
#include <link.h>

#include <cstdint>
#include <filesystem>
#include <vector>
#endif

namespace attnprof {

namespace cuda {
namespace {

struct Loaded {
  const Plugin* plugin = nullptr;
  std::string why{};    // when plugin is null
  std::string where{};  // the file it was loaded from
};

#ifdef ATTNPROF_WITH_CUDA
namespace fs = std::filesystem;

// The shared object this code is linked into (the Python module), or empty
// when it is in the program itself (the attnprof command, a test, a program
// built against the installed libraries).
fs::path this_shared_object() {
  struct Search {
    std::uintptr_t address;
    std::string name;
  } search{reinterpret_cast<std::uintptr_t>(&this_shared_object), {}};
  ::dl_iterate_phdr(
      [](dl_phdr_info* info, std::size_t, void* data) {
        auto* s = static_cast<Search*>(data);
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const auto& ph = info->dlpi_phdr[i];
          const std::uintptr_t start = info->dlpi_addr + ph.p_vaddr;
          if (ph.p_type == PT_LOAD && s->address >= start && s->address < start + ph.p_memsz) {
            s->name = info->dlpi_name;  // "" for the program
            return 1;
          }
        }
        return 0;
      },
      &search);
  return search.name;
}

// Where the plugin may lie, in order: beside this object and beside the
// running program (the build tree's command, a Python module's folder), then
// the install's lib dir next to their bin dir. After these, the library
// search path (see load()).
std::vector<fs::path> plugin_paths(const fs::path& object) {
  std::vector<fs::path> dirs;
  std::error_code ec;
  if (!object.empty()) {
    if (const fs::path p = fs::canonical(object, ec); !ec) dirs.push_back(p.parent_path());
  }
  if (const fs::path exe = fs::read_symlink("/proc/self/exe", ec); !ec) dirs.push_back(exe.parent_path());
  std::vector<fs::path> out;
  auto add = [&out](const fs::path& p) {
    if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  };
  for (const fs::path& d : dirs) add(d / ATTNPROF_CUDA_PLUGIN_FILE);
  for (const fs::path& d : dirs)
    add((d / ATTNPROF_CUDA_PLUGIN_BIN_TO_LIB / ATTNPROF_CUDA_PLUGIN_FILE).lexically_normal());
#ifdef ATTNPROF_WHEEL
  // A wheel's console script lies in the environment's scripts folder and
  // the plugin beside the module, in the package folder: bin/ and
  // lib/pythonX.Y/site-packages/attnprof/ in a virtual environment or a
  // --user install, lib/python3/dist-packages/attnprof/ under Debian's
  // system pip. Where these lie is the installer's choice, not the build's.
  for (const fs::path& d : dirs) {
    for (const char* lib : {"../lib", "../lib64"}) {
      const fs::path root = (d / lib).lexically_normal();
      for (const auto& entry : fs::directory_iterator(root, ec)) {
        if (!entry.path().filename().string().starts_with("python")) continue;
        for (const char* site : {"site-packages", "dist-packages"}) {
          add(entry.path() / site / "attnprof" / ATTNPROF_CUDA_PLUGIN_FILE);
        }
      }
    }
  }
#endif
  return out;
}

std::string dl_error() {
  const char* e = ::dlerror();
  return e ? e : "unknown dynamic loader error";
}

Loaded load() {
  // Host functions the plugin calls that a program may not otherwise pull in
  // from the static layers (the collector's occupancy, the checking mode of
  // FusedBackend and the decode path): taken here, so every
  // program that can load the plugin links and exports them.
  static const void* volatile needs[] = {reinterpret_cast<const void*>(&theoretical_occupancy),
                                         reinterpret_cast<const void*>(&checking_inputs)};
  (void)needs;
  const fs::path object = this_shared_object();
  // The plugin's references to the CPU layers resolve against the global
  // scope. A program exports its symbols there (dispatch links executables
  // with --export-dynamic); a Python module is loaded RTLD_LOCAL, so it is
  // made global first.
  if (!object.empty()) {
    ::dlopen(object.c_str(), RTLD_NOW | RTLD_NOLOAD | RTLD_GLOBAL);
    ::dlerror();
  }
  const std::string prefix = "no usable CUDA GPU: ";
  const std::string hint = "; use device=cpu";
  void* handle = nullptr;
  std::string where;
  std::string looked;
  for (const fs::path& p : plugin_paths(object)) {
    std::error_code ec;
    if (!fs::exists(p, ec)) {
      looked += p.parent_path().string() + ", ";
      continue;
    }
    where = p.string();
    handle = ::dlopen(where.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) return {.why = prefix + "cannot load the CUDA plugin " + where + ": " + dl_error() + hint};
    break;
  }
  if (!handle) {
    // The library search path: LD_LIBRARY_PATH, the RUNPATH of the program or
    // module (the build tree's, a find_package program's), ld.so.cache.
    where = ATTNPROF_CUDA_PLUGIN_FILE;
    handle = ::dlopen(where.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      return {.why = prefix + "cannot load the CUDA plugin (looked in " + looked +
                     "then the library search path): " + dl_error() + hint};
    }
  }
  using Entry = const Plugin* (*)();
  const auto entry = reinterpret_cast<Entry>(::dlsym(handle, kPluginEntry));
  if (!entry) return {.why = prefix + where + " is not attnprof's CUDA plugin: " + dl_error()};
  const Plugin* plugin = entry();
  if (plugin == nullptr || plugin->abi != kPluginAbi || plugin->size != sizeof(Plugin)) {
    return {.why = prefix + where + " is from another attnprof build (plugin interface " +
                   (plugin ? std::to_string(plugin->abi) : std::string("?")) + ", this program's " +
                   std::to_string(kPluginAbi) + "): reinstall attnprof"};
  }
  return {.plugin = plugin, .where = where};  // never unloaded: its objects live until exit
}
#else
Loaded load() { return {.why = "this build has no CUDA support: use device=cpu, or rebuild with a CUDA toolkit"}; }
#endif

const Loaded& loaded() {
  static const Loaded l = load();
  return l;
}

}  // namespace

const Plugin& plugin() {
  const Loaded& l = loaded();
  if (!l.plugin) fail(ErrorKind::Unsupported, l.why);
  return *l.plugin;
}

}  // namespace cuda

namespace {

using BackendMap = std::map<std::string, std::unique_ptr<Backend>, std::less<>>;

BackendMap& cpu_backends() {
  static BackendMap m = [] {
    // The composite backends are written once; each instance owns the ops of
    // its device.
    BackendMap b;
    b.emplace("naive", composite::make_naive(cpu::make_ops()));
    b.emplace("naive_inplace", composite::make_naive_inplace(cpu::make_ops()));
    b.emplace("math", composite::make_math(cpu::make_ops()));
    b.emplace("flash", cpu::make_flash());
    return b;
  }();
  return m;
}

// Empty when the plugin cannot be loaded (cuda::plugin() says why).
BackendMap& cuda_backends() {
  static BackendMap m = [] {
    BackendMap b;
    if (!cuda::loaded().plugin) return b;
    const cuda::Plugin& c = cuda::plugin();
    b.emplace("naive", composite::make_naive(c.make_ops()));
    b.emplace("naive_inplace", composite::make_naive_inplace(c.make_ops()));
    b.emplace("math", composite::make_math(c.make_ops()));
    b.emplace("efficient", c.make_efficient());
    b.emplace("flash", c.make_flash());
    if (auto cudnn = c.make_cudnn()) b.emplace("cudnn", std::move(cudnn));
    return b;
  }();
  return m;
}

}  // namespace

std::string cuda_build() {
#ifdef ATTNPROF_WITH_CUDA
  const cuda::Loaded& l = cuda::loaded();
  if (!l.plugin) return std::string("CUDA backends built for sm ") + ATTNPROF_CUDA_ARCHS + ", but " + l.why;
  return std::string("CUDA backends for sm ") + ATTNPROF_CUDA_ARCHS + ", from " + l.where;
#else
  return "CPU only (built without a CUDA toolkit: no CUDA backends)";
#endif
}

bool cuda_built() {
#ifdef ATTNPROF_WITH_CUDA
  return true;
#else
  return false;
#endif
}

Backend* find_backend(std::string_view name, Device d) {
  auto& m = d == Device::Cpu ? cpu_backends() : cuda_backends();
  auto it = m.find(name);
  return it == m.end() ? nullptr : it->second.get();
}

std::vector<Explanation> explain(const Problem& p) {
  std::vector<Explanation> out;
  for (std::string_view name : backend_names()) {
    Explanation e{std::string(name), false, {}};
    if (Backend* b = find_backend(name, p.device)) {
      const Eligibility el = eligibility_of(*b, p);
      e.eligible = el.eligible;
      e.reason = el.reason;
    } else if (p.device == Device::Cpu) {
      e.reason = std::string("not eligible on CPU: ") +
                 (name == "cudnn" ? "cuDNN runs on NVIDIA GPUs only"
                                  : "a fused CUDA kernel (sm80 and later); needs device=cuda");
    } else if (!cuda_built()) {
      e.reason = "not eligible: this build has no CUDA (configure with a CUDA toolkit, preset 'cuda')";
    } else if (!cuda::loaded().plugin) {
      e.reason = "not eligible: " + cuda::loaded().why;
    } else {
      e.reason =
          "not eligible: not built (cuDNN or its frontend headers were missing at build time; run scripts/setup.sh)";
    }
    out.push_back(std::move(e));
  }
  // A backend's reason says only why it cannot take `p`; the backends that
  // can are named here, once, from the same answers, so no refusal keeps a
  // list of its siblings that drifts from what they take.
  std::string takers;
  for (const Explanation& e : out) {
    if (e.eligible) takers += (takers.empty() ? "" : ", ") + e.backend;
  }
  for (Explanation& e : out) {
    if (!e.eligible) e.reason += "; eligible here: " + (takers.empty() ? std::string("none") : takers);
  }
  return out;
}

namespace {
std::atomic<std::uint64_t> resolutions{0};

// Whether b takes p in layout l: the problem's own layout asked as explain()
// asks it (an unvalidated problem answered, not refused), another through
// check_layout.
Eligibility eligibility_in(const Backend& b, const Problem& p, const BatchLayout& l) {
  return l == p.layout() ? eligibility_of(b, p) : eligibility_of(b, p, l);
}

bool takes(std::string_view name, const Problem& p, const BatchLayout& l, bool recompute) {
  const Backend* b = find_backend(name, p.device);
  return b && eligibility_in(*b, p, l).eligible && (!recompute || b->traits().backward_recomputes);
}

// " in layout padded (kv_rows)" and " with a backward that keeps only the
// log-sum-exp", where they narrow the question beyond the problem.
std::string asked(const Problem& p, const BatchLayout& l, bool recompute) {
  std::string s = l == p.layout() ? "" : " in layout " + layout_text(l);
  return recompute ? s + " with a backward that keeps only the log-sum-exp" : s;
}
}  // namespace

std::uint64_t backend_resolutions() { return resolutions.load(std::memory_order_relaxed); }

Backend& resolve_backend(const Problem& p, std::string_view requested) {
  return resolve_backend(p, p.layout(), requested);
}

Backend& resolve_backend(const Problem& p, const BatchLayout& l, std::string_view requested) {
  resolutions.fetch_add(1, std::memory_order_relaxed);
  const std::string name = requested == "auto" ? choose_auto(p, l).backend : std::string(requested);
  if (!is_backend_name(name)) {
    std::string names;
    for (auto n : backend_names()) names += (names.empty() ? "" : ", ") + std::string(n);
    fail(ErrorKind::InvalidArgument, "unknown backend '" + name + "': use auto, " + names);
  }
  Backend* b = find_backend(name, p.device);
  if (b) {
    const Eligibility e = eligibility_in(*b, p, l);
    if (e.eligible) return *b;
    // The backends that take the problem in this layout, as explain() names
    // them for the problem alone.
    std::string takers;
    for (const std::string_view n : backend_names()) {
      if (takes(n, p, l, false)) takers += (takers.empty() ? "" : ", ") + std::string(n);
    }
    fail(ErrorKind::Unsupported, "backend " + name + " cannot run this problem: " + e.reason +
                                     "; eligible here: " + (takers.empty() ? std::string("none") : takers));
  }
  for (const Explanation& e : explain(p)) {
    if (e.backend == name) fail(ErrorKind::Unsupported, "backend " + name + " cannot run this problem: " + e.reason);
  }
  fail(ErrorKind::Internal, "backend " + name + " is listed by no explanation");
}

const std::vector<std::string_view>& auto_order(Device d) {
  // Fused kernels first (one kernel, nothing of [S, Skv] materialised), our
  // own flash before cuDNN's (whose engines are the installed cuDNN's
  // heuristics' choice), then the careful composite (FP32, NaN-safe) before
  // the textbook ones in the input dtype. See docs/backends.md.
  static const std::vector<std::string_view> cuda = {"flash", "cudnn", "efficient", "math", "naive_inplace", "naive"};
  static const std::vector<std::string_view> cpu = {"flash", "math", "naive_inplace", "naive"};
  return d == Device::Cpu ? cpu : cuda;
}

AutoChoice choose_auto(const Problem& p) { return choose_auto(p, p.layout()); }

AutoChoice choose_auto(const Problem& p, const BatchLayout& l, bool recompute) {
  // A rule, never a timing: a pick made by measuring differed from one
  // process to the next on the same inputs (and with it the NaN rows and the
  // bits; issue 57 item 7). Eligibility is pure, so nothing needs caching.
  const auto& order = auto_order(p.device);
  std::string listed;
  for (std::string_view n : order) listed += (listed.empty() ? "" : " > ") + std::string(n);
  const std::string rule = "auto's rule for " + std::string(device_name(p.device)) + asked(p, l, recompute) +
                           ": the first eligible of " + listed;
  std::string passed;
  for (std::string_view name : order) {
    if (!takes(name, p, l, recompute)) {
      passed += (passed.empty() ? "" : ", ") + std::string(name);
      continue;
    }
    return {.backend = std::string(name),
            .reason = rule + (passed.empty() ? "" : " (" + passed + " not eligible)") +
                      "; a fixed order, not a timing, so every call and process picks the same"};
  }
  fail(ErrorKind::Unsupported,
       "no backend can run " + p.describe() + asked(p, l, recompute) + " (" + rule + "; attnprof explain says why)");
}

}  // namespace attnprof
