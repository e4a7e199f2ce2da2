// attnprof._torch_call: attention()'s fast path for torch tensors, a torch
// C++ extension built against the torch the build's Python imports.
//
// The general path hands q, k, v and out to attnprof._core as DLPack
// capsules (torch.utils.dlpack.to_dlpack), finds the current CUDA stream in
// Python and converts twelve arguments through nanobind: on the H200's host,
// 2.8 us of the 6.1 us a call added over the C++ call
// (docs/perf/python-call-2026-12-02.md). Here the tensors' pointers, shapes,
// strides, devices and dtypes are read from the at::Tensor itself, the stream
// from c10, and the call goes to _core's own forward through the C entry it
// hands out (bindings/forward_entry.h), so both paths prepare, cache and run
// the call alike and refuse bad input with the same message.
//
// attention(q, k, v, out, threads, block_table, seq_lens, q_rows, kv_rows,
// **options) returns out (allocated as attention() allocates it when None; an
// index array None where not given: a paged cache's or a padded batch's rows
// are read here too), or None when the call is not one this
// path takes (a tensor that needs autograd, a device, dtype or layout it does
// not read, an argument of another type): python/attnprof/_torch.py then
// takes the general path, which answers for it. The options are attention()'s
// plain options, every one by name: which they are and each one's kind come
// from _core with its entry (AttnprofForwardEntry, made from
// bindings/call_options.h's table), so this file names none of them, and a
// caller that leaves one out (an option added there) gets a TypeError.
#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty.h>
#include <Python.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>

#ifdef ATTNPROF_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include "bindings/forward_entry.h"

namespace {

const AttnprofForwardEntry* entry = nullptr;  // _core's forward and its options, from its capsule
PyObject* option_names[kAttnprofMaxOptions];  // entry's names, interned (a call's keywords are)
AttnprofPlanRun plan_entry = nullptr;         // _core's Plan.run, from its capsule
PyObject* error_type = nullptr;               // attnprof._core.Error

// A tensor's description for _core, or false where this path does not read
// it (the general path then answers for it). `index`: an int32 index array
// (a plan's block table, lengths, rows, cumulative lengths), else q, k, v or
// out, of a floating dtype.
bool describe(const at::Tensor& t, AttnprofArray& a, bool index = false) {
  if (t.layout() != at::kStrided || t.is_conj() || t.is_neg()) return false;
  if (index != (t.scalar_type() == at::kInt)) return false;
  switch (t.scalar_type()) {
    case at::kInt:
      a.code = 0, a.bits = 32;  // kDLInt
      break;
    case at::kFloat:
      a.code = 2, a.bits = 32;  // DLPack's kDLFloat
      break;
    case at::kHalf:
      a.code = 2, a.bits = 16;
      break;
    case at::kBFloat16:
      a.code = 4, a.bits = 16;  // kDLBfloat
      break;
    case at::kFloat8_e4m3fn:
      a.code = 10, a.bits = 8;  // kDLFloat8_e4m3fn
      break;
    default:
      return false;
  }
  const c10::Device d = t.device();
  if (d.is_cpu()) {
    a.device_type = 1, a.device_id = 0;
  } else if (d.is_cuda()) {
    a.device_type = 2, a.device_id = d.index();
  } else {
    return false;
  }
  a.data = t.data_ptr();
  a.ndim = static_cast<std::int32_t>(t.dim());
  a.shape = t.sizes().data();
  a.strides = t.strides().data();
  return true;
}

// Index arrays (each None where not given, else an exact torch.Tensor) into
// `arrays`, `given` pointing at those described; false where one is not an
// int32 tensor this path reads.
template <std::size_t N>
bool describe_indices(PyObject* const* objs, std::array<AttnprofArray, N>& arrays,
                      std::array<const AttnprofArray*, N>& given) {
  for (std::size_t i = 0; i < N; ++i) {
    if (objs[i] == Py_None) continue;
    if (!describe(THPVariable_Unpack(objs[i]), arrays[i], /*index=*/true)) return false;
    given[i] = &arrays[i];
  }
  return true;
}

// An optional int or float argument (None: absent); false for another type.
bool optional_long(PyObject* o, std::int64_t& v, std::uint8_t& has) {
  has = o != Py_None;
  if (!has) return true;
  if (!PyLong_CheckExact(o)) return false;
  v = PyLong_AsLongLong(o);
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  return true;
}

bool optional_double(PyObject* o, double& v, std::uint8_t& has) {
  has = o != Py_None;
  if (!has) return true;
  if (!PyFloat_CheckExact(o)) return false;
  v = PyFloat_AS_DOUBLE(o);
  return true;
}

const char* utf8(PyObject* o) { return PyUnicode_CheckExact(o) ? PyUnicode_AsUTF8(o) : nullptr; }

// A plain option of `kind` (forward_entry.h) into its slot; false for a value
// of another type (the general path then answers for it).
bool read_option(PyObject* o, std::uint8_t kind, AttnprofOption& slot) {
  switch (kind) {
    case kAttnprofText:
      slot.text = utf8(o);
      return slot.text != nullptr;
    case kAttnprofInt:
      return optional_long(o, slot.integer, slot.given);
    case kAttnprofReal:
      return optional_double(o, slot.real, slot.given);
    case kAttnprofFlag:
      slot.given = o == Py_True;
      return PyBool_Check(o);
    default:
      return false;
  }
}

// Entry's index of a keyword (its interned name mostly), -1 for none.
int option_index(PyObject* name) {
  for (int i = 0; i < entry->options; ++i) {
    if (option_names[i] == name) return i;
  }
  for (int i = 0; i < entry->options; ++i) {
    if (PyUnicode_Compare(option_names[i], name) == 0) return i;
  }
  PyErr_Clear();
  return -1;
}

// The out attention() and Plan.run allocate when none is given: q's shape,
// contiguous, bf16 for fp8 inputs.
at::Tensor out_like(const at::Tensor& q) {
  return at::empty(q.sizes(),
                   q.options().dtype(q.scalar_type() == at::kFloat8_e4m3fn ? at::kBFloat16 : q.scalar_type()));
}

// A C entry's answer as Python's: its refusal raised (attnprof.Error for
// attnprof's own), else the caller's out (`given`) or the one made here.
PyObject* result(int rc, const char* error, PyObject* given, at::Tensor made) {
  if (rc != 0) {
    PyErr_SetString(rc == 1 ? error_type : PyExc_RuntimeError, error);
    return nullptr;
  }
  if (given != nullptr) return Py_NewRef(given);
  return THPVariable_Wrap(std::move(made));
}

std::uintptr_t stream_of(const at::Tensor& q) {
#ifdef ATTNPROF_TORCH_CUDA
  if (q.is_cuda())
    return reinterpret_cast<std::uintptr_t>(c10::cuda::getCurrentCUDAStream(q.device().index()).stream());
#endif
  return 0;
}

// attention()'s positional arguments: q, k, v, out, threads, then its index arrays (kAttnprofForwardIndices).
constexpr Py_ssize_t kIndicesAt = 5;
constexpr Py_ssize_t kPositional = kIndicesAt + kAttnprofForwardIndices;

// The call itself, once q, k, v (and out, and the index arrays given) are plain tensors and the options named; C++
// exceptions are attention()'s to catch. args: the positional ones above, then the options' values, option j
// entry's slot[j].
PyObject* run(PyObject* const (&objs)[4], bool given_out, PyObject* const* args, const int* slot) {
  const at::Tensor& q = THPVariable_Unpack(objs[0]);
  const at::Tensor& k = THPVariable_Unpack(objs[1]);
  const at::Tensor& v = THPVariable_Unpack(objs[2]);
  // Autograd, and an out that needs grad (which the general path refuses), are the general path's.
  if (at::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad())) Py_RETURN_NONE;
  if (given_out && THPVariable_Unpack(objs[3]).requires_grad()) Py_RETURN_NONE;

  AttnprofForwardArgs a;  // every slot the entry names is written below (attention() checked the names)
  const int threads = PyLong_CheckExact(args[4]) ? static_cast<int>(PyLong_AsLong(args[4])) : -1;
  bool read = threads >= 0;
  for (int j = 0; read && j < entry->options; ++j) {
    read = read_option(args[kPositional + j], entry->kinds[slot[j]], a.options[slot[j]]);
  }
  if (!read || PyErr_Occurred()) {
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  a.threads = threads;

  std::array<AttnprofArray, 4> arrays{};
  for (int i = 0; i < 3; ++i) {
    if (!describe(THPVariable_Unpack(objs[i]), arrays[static_cast<std::size_t>(i)])) Py_RETURN_NONE;
  }
  std::array<AttnprofArray, kAttnprofForwardIndices> index_arrays{};
  std::array<const AttnprofArray*, kAttnprofForwardIndices> indices{};
  if (!describe_indices(args + kIndicesAt, index_arrays, indices)) Py_RETURN_NONE;
  at::Tensor made;
  if (!given_out) made = out_like(q);
  const at::Tensor& out = given_out ? THPVariable_Unpack(objs[3]) : made;
  if (!describe(out, arrays[3])) Py_RETURN_NONE;
  a.stream = stream_of(q);
  char error[2048];
  const int rc =
      entry->forward(&arrays[0], &arrays[1], &arrays[2], &arrays[3], indices.data(), &a, error, sizeof error);
  return result(rc, error, given_out ? objs[3] : nullptr, std::move(made));
}

// Plan.run's call on plain tensors: plan_run(handle, q, k, v, out, block_table, seq_lens, q_rows, kv_rows,
// cu_seqlens_q, cu_seqlens_k), each index array None where not given; out returned (allocated when None), or None
// where the call is the general path's (a tensor subclass, one that needs autograd, a dtype or layout this path
// does not read): python/attnprof/_plan.py then takes the DLPack path, which answers for it.
PyObject* plan_run(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  constexpr Py_ssize_t kArgs = 5 + kAttnprofPlanRunExtras;
  if (nargs != kArgs || !PyLong_CheckExact(args[0])) {
    PyErr_SetString(PyExc_TypeError, "attnprof._torch_call.plan_run takes a plan's handle and 10 arrays or None");
    return nullptr;
  }
  void* const plan = PyLong_AsVoidPtr(args[0]);
  if (plan == nullptr) return nullptr;
  const bool given_out = args[4] != Py_None;
  for (Py_ssize_t i = 1; i < kArgs; ++i) {
    if (i >= 4 && args[i] == Py_None) continue;  // out and the index arrays may be None
    if (!THPVariable_CheckExact(args[i])) Py_RETURN_NONE;
  }
  try {
    const at::Tensor& q = THPVariable_Unpack(args[1]);
    const bool grad = at::GradMode::is_enabled();
    std::array<AttnprofArray, 4> arrays{};
    for (int i = 0; i < 3; ++i) {
      const at::Tensor& t = THPVariable_Unpack(args[1 + i]);
      if ((grad && t.requires_grad()) || !describe(t, arrays[static_cast<std::size_t>(i)])) Py_RETURN_NONE;
    }
    if (given_out && THPVariable_Unpack(args[4]).requires_grad()) Py_RETURN_NONE;
    std::array<AttnprofArray, kAttnprofPlanRunExtras> extra_arrays{};
    std::array<const AttnprofArray*, kAttnprofPlanRunExtras> extras{};
    if (!describe_indices(args + 5, extra_arrays, extras)) Py_RETURN_NONE;
    at::Tensor made;
    if (!given_out) made = out_like(q);
    const at::Tensor& out = given_out ? THPVariable_Unpack(args[4]) : made;
    if (!describe(out, arrays[3])) Py_RETURN_NONE;
    char error[2048];
    const int rc = plan_entry(plan, &arrays[0], &arrays[1], &arrays[2], &arrays[3], extras.data(), stream_of(q), error,
                              sizeof error);
    return result(rc, error, given_out ? args[4] : nullptr, std::move(made));
  } catch (const std::exception&) {
    PyErr_Clear();  // as attention() below: the general path raises torch's own error
    Py_RETURN_NONE;
  }
}

// The keywords' check: attention()'s every option, each once, none other;
// keyword j is the entry's option slot[j].
bool named_options(PyObject* kwnames, int* slot) {
  // A call site's keywords are one constant tuple: the last one checked is
  // held with its slots, and a call with the same tuple is checked by its pointer.
  static PyObject* known = nullptr;
  static int known_slot[kAttnprofMaxOptions];
  if (kwnames != nullptr && kwnames == known) {
    std::copy(known_slot, known_slot + entry->options, slot);
    return true;
  }
  const Py_ssize_t n = kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0;
  if (n != entry->options) return false;
  std::uint32_t seen = 0;
  for (Py_ssize_t j = 0; j < n; ++j) {
    const int i = option_index(PyTuple_GET_ITEM(kwnames, j));
    if (i < 0 || (seen >> i & 1) != 0) return false;
    seen |= std::uint32_t{1} << i;
    slot[j] = i;
  }
  Py_XSETREF(known, Py_NewRef(kwnames));
  std::copy(slot, slot + n, known_slot);
  return true;
}

PyObject* attention(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  int slot[kAttnprofMaxOptions];
  if (nargs != kPositional || !named_options(kwnames, slot)) {
    std::string names;
    for (int i = 0; i < entry->options; ++i) names += std::string(i ? ", " : "") + entry->names[i];
    PyErr_SetString(PyExc_TypeError, ("attnprof._torch_call.attention takes q, k, v, out, threads, block_table, "
                                      "seq_lens, q_rows, kv_rows and by name every option of attention() that "
                                      "_core lists: " +
                                      names)
                                         .c_str());
    return nullptr;
  }
  PyObject* const objs[4] = {args[0], args[1], args[2], args[3]};  // q, k, v, out (or None)
  const bool given_out = objs[3] != Py_None;
  // torch.Tensor or Parameter exactly: a subclass (FakeTensor, DTensor, one
  // with __torch_function__) may mean something else by its data.
  for (int i = 0; i < (given_out ? 4 : 3); ++i) {
    if (!THPVariable_CheckExact(objs[i])) Py_RETURN_NONE;
  }
  for (Py_ssize_t i = kIndicesAt; i < kPositional; ++i) {
    if (args[i] != Py_None && !THPVariable_CheckExact(args[i])) Py_RETURN_NONE;
  }
  try {
    return run(objs, given_out, args, slot);
  } catch (const std::exception&) {
    // A tensor whose data cannot be read here (no storage), or an
    // allocation that failed: the general path raises torch's own error.
    PyErr_Clear();
    Py_RETURN_NONE;
  }
}
PyMethodDef methods[] = {
    {"attention", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&attention)),
     METH_FASTCALL | METH_KEYWORDS,
     "attention(q, k, v, out, threads, block_table, seq_lens, q_rows, kv_rows, **options), every plain option of "
     "attention() by name: attnprof.attention's forward on torch tensors, out returned; None when the call is the "
     "general path's"},
    {"plan_run", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&plan_run)), METH_FASTCALL,
     "plan_run(handle, q, k, v, out, block_table, seq_lens, q_rows, kv_rows, cu_seqlens_q, cu_seqlens_k): Plan.run "
     "on torch tensors, out returned; None when the call is the general path's"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT,
                          "_torch_call",
                          "attnprof.attention's fast path for torch tensors (a torch C++ extension)",
                          -1,
                          methods,
                          nullptr,
                          nullptr,
                          nullptr,
                          nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__torch_call() {
  PyObject* core = PyImport_ImportModule("attnprof._core");
  if (core == nullptr) return nullptr;
  error_type = PyObject_GetAttrString(core, "Error");
  PyObject* capsule = error_type ? PyObject_CallMethod(core, "_forward_entry", nullptr) : nullptr;
  if (capsule == nullptr) {
    Py_DECREF(core);
    return nullptr;
  }
  entry = static_cast<const AttnprofForwardEntry*>(PyCapsule_GetPointer(capsule, kAttnprofForwardCapsule));
  Py_DECREF(capsule);
  if (entry == nullptr || entry->options > kAttnprofMaxOptions) {
    if (entry != nullptr) PyErr_SetString(PyExc_ImportError, "attnprof._core lists more options than this build takes");
    Py_DECREF(core);
    return nullptr;
  }
  for (int i = 0; i < entry->options; ++i) {
    option_names[i] = PyUnicode_InternFromString(entry->names[i]);  // held for the process
    if (option_names[i] == nullptr) {
      Py_DECREF(core);
      return nullptr;
    }
  }
  PyObject* plan_capsule = PyObject_CallMethod(core, "_plan_run_entry", nullptr);
  Py_DECREF(core);
  if (plan_capsule == nullptr) return nullptr;
  plan_entry = reinterpret_cast<AttnprofPlanRun>(PyCapsule_GetPointer(plan_capsule, kAttnprofPlanRunCapsule));
  Py_DECREF(plan_capsule);
  if (plan_entry == nullptr) return nullptr;
  PyObject* m = PyModule_Create(&module_def);
  if (m == nullptr) return nullptr;
  if (PyModule_AddStringConstant(m, "TORCH_VERSION", ATTNPROF_TORCH_VERSION) != 0) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
