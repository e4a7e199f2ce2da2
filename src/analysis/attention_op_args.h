// What one attention op's record says (attention_calls.cpp groups the ops into
// calls): the schema its arguments follow, the backend its name commits to,
// its shapes, dtype, mask and scale, and attnprof's label in or around it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "analysis/trace_index.h"
#include "attnprof/analyze.h"

namespace attnprof::analysis::op_args {

// Whether `part` occurs in `s` (op and kernel names are matched by their parts).
bool has(std::string_view s, std::string_view part);

// Where an op's arguments sit in "Input Dims" and "Concrete Inputs" (the
// schemas of PyTorch 2.x, of flash_attn 2.x and of attnprof's custom ops).
struct Signature {
  std::string_view name;
  int q = 0, k = 1, v = 2;
  int mask = -1;    // attn_mask / attn_bias: a tensor, or absent
  int causal = -1;  // is_causal, a bool
  int scale = -1;
  int window_left = -1, window_right = -1;  // flash_attn's window_size
  int mask_name = -1;                       // attnprof's mask, a string
  int window = -1;                          // attnprof's window
  bool bshd = false;                        // [B, S, H, D] (flash_attn) rather than [B, H, S, D]
  int bshd_flag = -1;                       // attnprof's bshd, a bool: [B, S, H, D] where true
  bool bottom_right = false;                // causal aligned bottom-right (flash_attn)
  bool backward = false;
};

// The schema of the op named `name`; null for an op whose arguments are not read.
const Signature* signature_of(std::string_view name);

// The backend an op's name commits to; empty when it names none (the SDPA
// entry point, which dispatches).
std::string backend_of_op(std::string_view n);

bool is_backward_op(std::string_view n);

// The number a trace's string starts with; none for an empty string or one
// that does not start with a number.
std::optional<double> number(std::string_view s);

// v[i], or empty where i is past v's end or negative (an absent argument).
std::string_view at(const std::vector<std::string>& v, int i);

// Shapes, dtype, mask and scale of one call from its op's record; false
// when the op recorded no shapes.
bool read_shapes(const Activity& a, const Signature& sig, AttentionCall& call);

// What attnprof's op says of a call under torch.profiler, where torch keeps
// none of the op's string arguments: a range its implementation opens inside
// it (older traces: the Python front end's, around it),
// "attnprof.attention backend=B mask=M window=W" (python/attnprof/_torch.py).
struct AttnprofLabel {
  std::string backend, mask;
  std::optional<std::int64_t> window;
};

// The label inside `op`, else that of the innermost such range around it, if any.
std::optional<AttnprofLabel> attnprof_label(const TraceIndex& ix, EventIndex op);

// The label's mask where the op's own arguments left it unknown: the
// structural masks, whose FLOPs are then counted as for any call (a tensor
// mask's visible pairs are not in the trace, nor a window without its size).
void apply_label_mask(const AttnprofLabel& l, AttentionCall& call);

}  // namespace attnprof::analysis::op_args
