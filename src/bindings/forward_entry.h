// The C interface between attnprof._core and attnprof._torch_call, the torch
// extension that gives torch tensors a fast path into attention(): the
// extension reads each tensor's pointer, shape, strides, device and dtype
// straight from the at::Tensor (no DLPack capsule, no Python attribute) and
// calls _core's forward through a function pointer that _core hands out in a
// capsule (_core._forward_entry()). Plain C structs only: the two modules
// are built apart (the extension against the torch it will run with).
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

// An array as DLPack describes one (device_type 1 CPU, 2 CUDA; dtype code
// and bits as DLPack's), borrowed for the call.
struct AttnprofArray {
  const void* data;
  const std::int64_t* shape;
  const std::int64_t* strides;  // in elements
  std::int32_t ndim;
  std::int32_t device_type;
  std::int32_t device_id;
  std::uint8_t code;
  std::uint8_t bits;
};

// attention()'s other arguments; an absent window, scale or soft cap has its has_ flag 0.
struct AttnprofForwardArgs {
  const char* backend;
  const char* mask;  // "" is attention()'s default (causal)
  std::int64_t window;
  double scale;
  double softcap;
  std::uintptr_t stream;  // a cudaStream_t as an integer; 0 on the CPU
  std::int32_t threads;
  std::uint8_t has_window;
  std::uint8_t has_scale;
  std::uint8_t has_softcap;
  std::uint8_t bshd;
};

// The forward of q, k, v into out, as _core.attention runs it (the call cache
// included). Returns 0 when it ran; 1 for attnprof's own refusal (an
// attnprof.Error), 2 for any other failure, with the message in `error`
// (NUL-terminated, cut to error_len). Called with the GIL held.
typedef int (*AttnprofForward)(const AttnprofArray* q, const AttnprofArray* k, const AttnprofArray* v,
                               const AttnprofArray* out, const AttnprofForwardArgs* args, char* error,
                               std::size_t error_len);

// A plan's run (attnprof.plan's Plan.run) on q, k, v into out: `plan` is the
// plan's handle (Plan._handle(), valid while the Python plan lives), `extras`
// its six index arrays in Plan.run's order (block_table, seq_lens, q_rows,
// kv_rows, cu_seqlens_q, cu_seqlens_k), each null where not given. Returns
// and reports as AttnprofForward. Called with the GIL held.
typedef int (*AttnprofPlanRun)(void* plan, const AttnprofArray* q, const AttnprofArray* k, const AttnprofArray* v,
                               const AttnprofArray* out, const AttnprofArray* const* extras, std::uintptr_t stream,
                               char* error, std::size_t error_len);
}

// The capsules' names; a change to the structs above takes new ones.
inline constexpr const char kAttnprofForwardCapsule[] = "attnprof._core.forward_v1";
inline constexpr const char kAttnprofPlanRunCapsule[] = "attnprof._core.plan_run_v1";
inline constexpr int kAttnprofPlanRunExtras = 6;
