// The C interface between attnprof._core and attnprof._torch_call, the torch
// extension that gives torch tensors a fast path into attention(): the
// extension reads each tensor's pointer, shape, strides, device and dtype
// straight from the at::Tensor (no DLPack capsule, no Python attribute) and
// calls _core's forward through a function pointer that _core hands out in a
// capsule (_core._forward_entry(): an AttnprofForwardEntry). Plain C structs only: the two modules
// are built apart (the extension against the torch it will run with).
#pragma once

#include <cstddef>
#include <cstdint>

// A plain option's kind (AttnprofOption), and how many attention() may take.
enum : std::uint8_t { kAttnprofText = 0, kAttnprofInt = 1, kAttnprofReal = 2, kAttnprofFlag = 3 };
inline constexpr int kAttnprofMaxOptions = 16;

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

// A plain option's value as the extension read it from Python, by the kind
// _core gives for it (AttnprofForwardEntry's kinds): a string (its UTF-8,
// borrowed for the call), an optional int or float (`given` 0 for None), or a flag
// (`given`).
struct AttnprofOption {
  const char* text;
  std::int64_t integer;
  double real;
  std::uint8_t given;
};
// attention()'s other arguments: its plain options in the order
// AttnprofForwardEntry names them (bindings/call_options.h's table, those
// attention() takes), each one given.
struct AttnprofForwardArgs {
  AttnprofOption options[kAttnprofMaxOptions];
  std::uintptr_t stream;  // a cudaStream_t as an integer; 0 on the CPU
  std::int32_t threads;
};

// The forward of q, k, v into out, as _core.attention runs it (the call cache
// included). `indices`: attention()'s index arrays in kAttnprofForwardIndices'
// order (block_table, seq_lens, q_rows, kv_rows), each null where not given.
// Returns 0 when it ran; 1 for attnprof's own refusal (an attnprof.Error), 2
// for any other failure, with the message in `error` (NUL-terminated, cut to
// error_len). Called with the GIL held.
typedef int (*AttnprofForward)(const AttnprofArray* q, const AttnprofArray* k, const AttnprofArray* v,
                               const AttnprofArray* out, const AttnprofArray* const* indices,
                               const AttnprofForwardArgs* args, char* error, std::size_t error_len);

// A plan's run (attnprof.plan's Plan.run) on q, k, v into out: `plan` is the
// plan's handle (Plan._handle(), valid while the Python plan lives), `extras`
// its six index arrays in Plan.run's order (block_table, seq_lens, q_rows,
// kv_rows, cu_seqlens_q, cu_seqlens_k), each null where not given. Returns
// and reports as AttnprofForward. Called with the GIL held.
typedef int (*AttnprofPlanRun)(void* plan, const AttnprofArray* q, const AttnprofArray* k, const AttnprofArray* v,
                               const AttnprofArray* out, const AttnprofArray* const* extras, std::uintptr_t stream,
                               char* error, std::size_t error_len);

// What _core hands the extension for attention(): the forward, and the
// plain options it takes, by name and kind, in AttnprofForwardArgs' order
// (made from bindings/call_options.h's table: the extension keeps no list of
// its own, so an option added there reaches it unchanged).
struct AttnprofForwardEntry {
  AttnprofForward forward;
  std::int32_t options;
  const char* names[kAttnprofMaxOptions];
  std::uint8_t kinds[kAttnprofMaxOptions];
};
}

// The capsules' names; a change to the structs above takes new ones.
inline constexpr const char kAttnprofForwardCapsule[] = "attnprof._core.forward_v3";
inline constexpr int kAttnprofForwardIndices = 4;
inline constexpr const char kAttnprofPlanRunCapsule[] = "attnprof._core.plan_run_v1";
inline constexpr int kAttnprofPlanRunExtras = 6;
