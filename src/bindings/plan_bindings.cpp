// attnprof.plan (python/attnprof/_plan.py): a call planned once on example
// arrays (attnprof/plan.h) and run many times on arrays of the same shapes.
// The plan is made from the very preparation attention() makes (prepare(),
// prepare_varlen(): every check and message of a call), so a plan refuses
// what attention() refuses; each run only views the new arrays, checks them
// against the plan's in the caller's terms, and launches.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attnprof/check_inputs.h"
#include "attnprof/device_runtime.h"
#include "attnprof/error.h"
#include "attnprof/plan.h"
#include "attnprof/problem_spec.h"
#include "bindings/bindings.h"
#include "bindings/def_call.h"

namespace attnprof::python {
namespace {

using Form = BatchLayout::Form;

// An example array as the plan keeps it: its shape and dtype, for the runs'
// check and their messages in the caller's terms.
struct Shape {
  std::vector<std::int64_t> dims;
  nb::dlpack::dtype dtype{};
  int device_type = 0;
  int device_id = 0;
  std::string text;  // "bfloat16[2, 16, 64] on cuda:0"

  static Shape of(const Array& a) {
    Shape s{{}, a.dtype, a.device_type, a.device_id, dtype_text(a) + dims_of(a) + " on " + where_name(a)};
    for (std::size_t i = 0; i < a.ndim; ++i) s.dims.push_back(static_cast<std::int64_t>(a.size(i)));
    return s;
  }
  // The run's array against the example; a paged cache's page count is the pool's (any).
  void expect(const char* name, const Array& a, bool skip_first = false) const {
    bool same = a.ndim == dims.size() && a.dtype == dtype && a.device_type == device_type && a.device_id == device_id;
    for (std::size_t i = skip_first ? 1 : 0; same && i < dims.size(); ++i) {
      same = static_cast<std::int64_t>(a.size(i)) == dims[i];
    }
    if (same) return;
    fail(ErrorKind::InvalidArgument,
         std::string(name) + " is " + dtype_text(a) + dims_of(a) + " on " + where_name(a) +
             " but the plan was made for " + text + (skip_first ? " (any number of pages)" : ""),
         {name});
  }
};

// The arrays a run takes beyond q, k, v and out (each as the call takes it).
struct RunExtras {
  std::optional<Array> block_table, seq_lens, q_rows, kv_rows, cu_q, cu_k;
};

class PyPlan {
 public:
  PyPlan(Plan plan, bool bshd, int threads, std::vector<Shape> shapes, std::vector<std::int64_t> cu_q,
         std::vector<std::int64_t> cu_k)
      : plan_(std::move(plan)),
        bshd_(bshd),
        threads_(threads),
        shapes_(std::move(shapes)),
        cu_q_(std::move(cu_q)),
        cu_k_(std::move(cu_k)) {}

  std::string backend() const { return std::string(plan_.backend().name()); }
  std::string explain() const { return plan_.explain(); }
  std::string layout() const { return std::string(layout_name(plan_.layout().form)); }
  std::size_t workspace_bytes() const { return plan_.workspace_bytes(); }
  void release() { plan_.release(); }

  void run(const Array& q, const Array& k, const Array& v, const Array& out, std::uintptr_t stream,
           const RunExtras& x) {
    Inputs in;
    Tensor o;
    views(q, k, v, out, stream, x, in, o);
    if (plan_.problem().device == Device::Cpu) {
      // The thread counts as attention() sets them, put back when the run ends.
      const ThreadCountsKept kept;
      runtime_for(Device::Cpu, threads_);
      nb::gil_scoped_release unlocked;
      plan_.run(in, o, nullptr);
    } else {
      plan_.run(in, o, reinterpret_cast<void*>(stream));
    }
  }

  // bench/python_overhead.py: the host time (us) of each of `calls` C++
  // Plan::run calls back to back on one set of views (a quarter as many
  // untimed first; the device synchronised before and after, not between).
  std::vector<double> time_runs(const Array& q, const Array& k, const Array& v, const Array& out, std::uintptr_t stream,
                                int calls) {
    Inputs in;
    Tensor o;
    views(q, k, v, out, stream, {}, in, o);
    const ThreadCountsKept kept;
    DeviceRuntime& rt = runtime_for(plan_.problem().device, threads_);
    std::vector<double> us(static_cast<std::size_t>(std::max(calls, 0)));
    nb::gil_scoped_release unlocked;
    void* const s = reinterpret_cast<void*>(stream);
    rt.synchronize();
    for (int i = 0; i < std::max(2, calls / 4); ++i) plan_.run(in, o, s);
    for (double& t : us) {
      const auto t0 = std::chrono::steady_clock::now();
      plan_.run(in, o, s);
      t = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    }
    rt.synchronize();
    return us;
  }

 private:
  // The run's arrays as the plan's views (in, o), each checked against the
  // example the plan was made with, in the caller's terms.
  void views(const Array& q, const Array& k, const Array& v, const Array& out, std::uintptr_t stream,
             const RunExtras& x, Inputs& in, Tensor& o) const {
    const Problem& p = plan_.problem();  // a released plan's one-line refusal
    const BatchLayout& l = plan_.layout();
    const DType dtype = p.dtype;
    shapes_[0].expect("q", q);
    shapes_[3].expect("out", out);
    const bool paged = l.form == Form::Paged, packed = l.form == Form::Packed;
    shapes_[1].expect(paged ? "k_cache" : "k", k, paged);
    shapes_[2].expect(paged ? "v_cache" : "v", v, paged);
    if (packed) {
      in.q = packed_view_of("q", q, p.device, dtype);
      in.k = packed_view_of("k", k, p.device, dtype);
      in.v = packed_view_of("v", v, p.device, dtype);
      o = packed_view_of("out", out, p.device, output_dtype(dtype));
      check_lengths("cu_seqlens_q", x.cu_q, cu_q_, stream, in.cu_seqlens_q);
      check_lengths("cu_seqlens_k", x.cu_k, cu_k_, stream, in.cu_seqlens_k);
    } else {
      in.q = view_of("q", q, bshd_, p.device, dtype);
      o = view_of("out", out, bshd_, p.device, output_dtype(dtype));
      if (paged) {
        in.k_pages = cache_view_of("k_cache", k, p.device, dtype);
        in.v_pages = cache_view_of("v_cache", v, p.device, dtype);
      } else {
        in.k = view_of("k", k, bshd_, p.device, dtype);
        in.v = view_of("v", v, bshd_, p.device, dtype);
      }
    }
    require_writable_layout("out", o);
    refuse_unplanned("block_table", x.block_table, paged);
    refuse_unplanned("seq_lens", x.seq_lens, paged);
    refuse_unplanned("q_rows", x.q_rows, l.q_rows);
    refuse_unplanned("kv_rows", x.kv_rows, l.kv_rows);
    refuse_unplanned("cu_seqlens_q", x.cu_q, packed);
    refuse_unplanned("cu_seqlens_k", x.cu_k, packed);
    if (paged) {
      in.block_table = index_view("block_table", *x.block_table, 2, p.device);
      const Tensor lens = index_view("seq_lens", *x.seq_lens, 1, p.device);
      if (lens.size(3) > 1 && lens.stride(3) != 1) {
        fail(ErrorKind::InvalidArgument, "seq_lens must be contiguous (the kernel reads entry b at b)", {"seq_lens"});
      }
      // Each sequence's key count, as the kernels (and CPU flash) read it: [1, 1, B, 1].
      in.kv_rows =
          lens.as_strided({1, 1, lens.size(3), 1}, {lens.size(3), lens.size(3), lens.stride(3), 1}, lens.offset());
    }
    // As attention() reads them (arrays.cpp), key ends alone ([B, 1]) too; Plan::run checks the batch.
    if (x.q_rows) in.q_rows = rows_view("q_rows", *x.q_rows, p.batch, p.device, /*ends_ok=*/false);
    if (x.kv_rows) in.kv_rows = rows_view("kv_rows", *x.kv_rows, p.batch, p.device, /*ends_ok=*/true);
  }

  // An index array a run gives must be one the plan was made with, and the
  // other way round: one line naming it either way.
  void refuse_unplanned(const char* name, const std::optional<Array>& a, bool planned) const {
    if (a.has_value() == planned) return;
    fail(ErrorKind::InvalidArgument,
         std::string(name) + (planned ? " is missing: the plan was made for the " : " given, but the plan's layout (") +
             std::string(layout_name(plan_.layout().form)) +
             (planned ? " layout, which takes it on every run" : ") takes none: make a plan with it"),
         {name});
  }

  // A packed run's cumulative lengths. Where the plan's problem keeps them on
  // the device (flash on a GPU: Problem::lengths_on_device) they are the
  // run's own, read only by the kernels: `into` takes the view, nothing is
  // read here, and they may be rewritten between runs. Elsewhere the plan
  // runs the host lengths it was made with, and the run's must say the same:
  // compared on the CPU, and on a GPU in the checking mode (read in the
  // caller's stream order), never on its default path.
  void check_lengths(const char* name, const std::optional<Array>& a, const std::vector<std::int64_t>& planned,
                     std::uintptr_t stream, Tensor& into) const {
    if (!a) return;  // refuse_unplanned names it
    const Problem& p = plan_.problem();
    const Device device = p.device;
    const Tensor view = index_view(name, *a, 1, device);
    if (p.lengths_on_device) {
      if (view.size(3) != p.batch + 1 || (view.size(3) > 1 && view.stride(3) != 1)) {
        fail(ErrorKind::InvalidArgument,
             std::string(name) + " has " + std::to_string(view.size(3)) + " entries (stride " +
                 std::to_string(view.stride(3)) + ") but the plan was made for " + std::to_string(p.batch + 1) +
                 ", contiguous",
             {name});
      }
      into = view;
      return;
    }
    if (view.size(3) != static_cast<std::int64_t>(planned.size())) {
      fail(ErrorKind::InvalidArgument,
           std::string(name) + " has " + std::to_string(view.size(3)) + " entries but the plan was made for " +
               std::to_string(planned.size()),
           {name});
    }
    if (device != Device::Cpu && !checking_inputs()) return;
    const Tensor host =
        device == Device::Cpu ? view : device_runtime(device).download(view, reinterpret_cast<void*>(stream));
    for (std::size_t i = 0; i < planned.size(); ++i) {
      const std::int64_t got = host.data_as<const std::int32_t>()[static_cast<std::int64_t>(i) * host.stride(3)];
      if (got != planned[i]) {
        fail(ErrorKind::InvalidArgument,
             std::string(name) + "[" + std::to_string(i) + "] is " + std::to_string(got) +
                 " but the plan was made for " + std::to_string(planned[i]) +
                 ": a packed plan runs the lengths it was made with; make another plan",
             {name});
      }
    }
  }

  Plan plan_;
  bool bshd_;
  int threads_;
  std::vector<Shape> shapes_;  // q, k (or k_cache), v (or v_cache), out
  std::vector<std::int64_t> cu_q_, cu_k_;
};

std::optional<Array> optional_array(const std::optional<In>& a) {
  return a ? std::optional<Array>(array_of(*a)) : std::nullopt;
}

// Plan.run for the torch extension's fast path (bindings/forward_entry.h): the
// same run on arrays the extension read from the tensors themselves.
int plan_run_entry(void* plan, const AttnprofArray* q, const AttnprofArray* k, const AttnprofArray* v,
                   const AttnprofArray* out, const AttnprofArray* const* extras, std::uintptr_t stream, char* error,
                   std::size_t error_len) {
  return entry_call(error, error_len, [&] {
    const auto extra = [&](int i) {
      return extras[i] != nullptr ? std::optional<Array>(entry_array(*extras[i])) : std::nullopt;
    };
    static_cast<PyPlan*>(plan)->run(entry_array(*q), entry_array(*k), entry_array(*v), entry_array(*out), stream,
                                    RunExtras{extra(0), extra(1), extra(2), extra(3), extra(4), extra(5)});
  });
}

// A plan from example arrays: the call attention() would prepare for them,
// then attnprof::plan on its problem and layout.
PyPlan* make_plan(const CallOptions& o, const In& q, const In& k, const In& v, const Out& out, std::uintptr_t stream,
                  int threads, const std::optional<In>& block_table, const std::optional<In>& seq_lens,
                  const std::optional<In>& q_rows, const std::optional<In>& kv_rows, const std::optional<In>& cu_q,
                  const std::optional<In>& cu_k, std::optional<std::int64_t> max_q, std::optional<std::int64_t> max_k) {
  const ThreadCountsKept kept;
  const std::string& backend = o.backend;
  check_backend_name("backend", backend, /*auto_ok=*/true);
  const CallArgs args{o, stream, threads, Pass::Forward};
  const bool packed = cu_q || cu_k;
  if (packed && (!cu_q || !cu_k)) {
    fail(ErrorKind::InvalidArgument, "a packed plan needs both cu_seqlens_q and cu_seqlens_k");
  }
  if (packed && (block_table || seq_lens || q_rows || kv_rows)) {
    fail(ErrorKind::InvalidArgument,
         "a packed plan (cu_seqlens) takes no block_table, seq_lens, q_rows or kv_rows: its sequences have their "
         "own rows");
  }
  if (!packed && (max_q || max_k)) {
    fail(ErrorKind::InvalidArgument, "max_seqlen_q and max_seqlen_k go with cu_seqlens_q and cu_seqlens_k");
  }
  Call c = packed ? prepare_varlen(q, k, v, out, Packed{*cu_q, *cu_k, max_q, max_k}, args)
                  : prepare(array_of(q), array_of(k), array_of(v), array_of(out), args,
                            Extras{{},
                                   optional_array(block_table),
                                   optional_array(seq_lens),
                                   optional_array(q_rows),
                                   optional_array(kv_rows)});
  Problem p = c.p;
  BatchLayout layout;
  if (packed) {
    layout.form = Form::Packed;
  } else if (p.kv_cache == KvCache::Paged) {
    layout.form = Form::Paged;
    // The table's capacity, not the example's longest length (what the CPU
    // call reads): the runs' lengths are each run's, read by the backend.
    p.kv_seq = c.in.block_table.size(3) * p.page_size;
  } else if (q_rows || kv_rows) {
    layout = {.form = Form::Padded, .q_rows = q_rows.has_value(), .kv_rows = kv_rows.has_value()};
  }
  // Lengths on the device: the backend prepare_varlen picked, the one that
  // reads them there (auto measures no such problem).
  const std::string name = p.lengths_on_device ? std::string(c.backend->name()) : backend;
  Plan made = after_runtime_use([&] { return attnprof::plan(p, layout, name, threads); });
  std::vector<Shape> shapes{Shape::of(array_of(q)), Shape::of(array_of(k)), Shape::of(array_of(v)),
                            Shape::of(array_of(out))};
  std::vector<std::int64_t> lens_q, lens_k;
  if (packed && !p.lengths_on_device) {  // the host lengths the plan runs
    lens_q = p.cu_seqlens_q();
    lens_k = p.cu_seqlens_k();
  }
  return new PyPlan(std::move(made), o.bshd, threads, std::move(shapes), std::move(lens_q), std::move(lens_k));
}

}  // namespace

void bind_plan(nb::module_& m) {
  nb::class_<PyPlan>(m, "Plan", "a call planned once (attnprof.plan), run many times")
      .def_prop_ro("backend", &PyPlan::backend, "the backend every run uses (auto's pick, kept)")
      .def_prop_ro("layout", &PyPlan::layout, "dense, padded, packed or paged")
      .def_prop_ro("workspace_bytes", &PyPlan::workspace_bytes, "device bytes the plan holds for its runs")
      .def("explain", &PyPlan::explain, "the backend, why it was picked, what it runs, the layout and the workspace")
      .def("release", &PyPlan::release, "gives the plan's state and workspace back now; runs are refused after")
      .def(
          "_handle", [](PyPlan& self) { return reinterpret_cast<std::uintptr_t>(&self); },
          "the plan as attnprof._torch_call's plan_run takes it (valid while this object lives)")
      .def(
          "_time_runs",
          [](PyPlan& self, const In& q, const In& k, const In& v, const Out& out, std::uintptr_t stream, int calls) {
            return self.time_runs(array_of(q), array_of(k), array_of(v), array_of(out), stream, calls);
          },
          nb::arg("q").noconvert(), nb::arg("k").noconvert(), nb::arg("v").noconvert(), nb::arg("out").noconvert(),
          nb::arg("stream"), nb::arg("calls"),
          "the host time (us) of each of `calls` back-to-back C++ runs (dense plans; bench/python_overhead.py)")
      .def(
          "run",
          [](PyPlan& self, const In& q, const In& k, const In& v, const Out& out, std::uintptr_t stream,
             const std::optional<In>& block_table, const std::optional<In>& seq_lens, const std::optional<In>& q_rows,
             const std::optional<In>& kv_rows, const std::optional<In>& cu_q, const std::optional<In>& cu_k) {
            self.run(array_of(q), array_of(k), array_of(v), array_of(out), stream,
                     RunExtras{optional_array(block_table), optional_array(seq_lens), optional_array(q_rows),
                               optional_array(kv_rows), optional_array(cu_q), optional_array(cu_k)});
          },
          nb::arg("q").noconvert(), nb::arg("k").noconvert(), nb::arg("v").noconvert(), nb::arg("out").noconvert(),
          nb::arg("stream") = 0, nb::arg("block_table").noconvert().none() = nb::none(),
          nb::arg("seq_lens").noconvert().none() = nb::none(), nb::arg("q_rows").noconvert().none() = nb::none(),
          nb::arg("kv_rows").noconvert().none() = nb::none(), nb::arg("cu_seqlens_q").noconvert().none() = nb::none(),
          nb::arg("cu_seqlens_k").noconvert().none() = nb::none(),
          "the planned call on these arrays (the plan's shapes, dtypes and device) into `out`, on `stream`");

  // The plain options (call_options.h) follow, attention()'s: a plan is made for a forward.
  def_call<kForwardTakes>(
      m, "plan", &make_plan, nb::arg("q").noconvert(), nb::arg("k").noconvert(), nb::arg("v").noconvert(),
      nb::arg("out").noconvert(), nb::kw_only(), nb::arg("stream") = 0, nb::arg("threads") = 0,
      nb::arg("block_table").noconvert().none() = nb::none(), nb::arg("seq_lens").noconvert().none() = nb::none(),
      nb::arg("q_rows").noconvert().none() = nb::none(), nb::arg("kv_rows").noconvert().none() = nb::none(),
      nb::arg("cu_seqlens_q").noconvert().none() = nb::none(), nb::arg("cu_seqlens_k").noconvert().none() = nb::none(),
      nb::arg("max_seqlen_q").none() = nb::none(), nb::arg("max_seqlen_k").none() = nb::none(),
      nb::rv_policy::take_ownership, "a plan of the call attention() would make on these example arrays");
  // The torch extension's way into Plan.run (bindings/forward_entry.h; attnprof._torch_call.plan_run).
  m.def(
      "_plan_run_entry",
      [] {
        const AttnprofPlanRun f = &plan_run_entry;
        return nb::capsule(reinterpret_cast<void*>(f), kAttnprofPlanRunCapsule);
      },
      "a capsule holding the C entry of Plan.run, for attnprof._torch_call");
  m.def("_backend_resolutions", &backend_resolutions,
        "how many times a backend name has been resolved in this process (the tests: a plan's runs resolve none)");
}

}  // namespace attnprof::python
