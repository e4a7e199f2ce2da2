// The backend interface: one object per strategy per device.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnprof/batch_layout.h"
#include "attnprof/problem.h"
#include "attnprof/tensor.h"

namespace attnprof {

struct Inputs {
  Tensor q, k, v;  // [B, H, S, D], [B, Hkv, Skv, D], [B, Hkv, Skv, D]; any strides
  Tensor mask;     // Boolean masks: bool [B|1, H|1, S, Skv] (expanded views allowed)
  Tensor bias;     // Bias masks: same shape, any floating dtype
  // A paged KV cache (Problem::kv_cache == Paged), the same K and V stored
  // as pages [num_pages, Hkv, page_size, D] in the problem's dtype, and the
  // int32 block table [B, pages_per_seq] (held as [1, 1, B, pages_per_seq],
  // tensors being 4-d): sequence b's keys page * l ..
  // page * (l + 1) - 1 live in physical page block_table[b][l]. k and v stay
  // the logical [B, Hkv, Skv, D] tensors (what the float64 reference reads);
  // a paged backend reads only these. Undefined for a contiguous cache.
  Tensor k_pages, v_pages, block_table;
  // Per-sequence key rows, int32 [1, 1, B, 2] on the problem's device, or
  // undefined (every row): sequence b's keys are rows kv_rows[b][0] ..
  // kv_rows[b][1] - 1 of K and V (of kv_seq, the longest), as a key-padding
  // mask would say (right padding (0, len), left padding (pad, kv_seq)); the
  // structural masks' band is then each sequence's own, in its own key
  // coordinates (j - kv_rows[b][0]). kv_rows may also be [1, 1, B, 1], key
  // ends alone (begin 0): a paged call's seq_lens on a GPU, passed through
  // unread. A paged call on the CPU with unequal seq_lens sets (0,
  // seq_lens[b]) pairs; only a backend whose Traits::rows is true reads
  // it, and the others are refused by name. (A Boolean key-padding mask is
  // lowered to the same rows by flash itself, CPU and CUDA:
  // core/mask_lowering.h.)
  Tensor kv_rows;
  // Per-sequence query rows, int32 [1, 1, B, 2] as kv_rows, or undefined
  // (every row): sequence b's queries are rows q_rows[b][0] .. q_rows[b][1] -
  // 1 of Q (of seq); its output and dQ rows outside them are zero, as a
  // padded batch's are after FlashAttention's unpad -> varlen -> pad. A
  // sequence is then the problem of its own rows (geometry::SequenceRows).
  Tensor q_rows;
  // A packed batch whose lengths are on the device (Problem::lengths_on_device):
  // the caller's cumulative lengths, int32 [1, 1, 1, batch + 1] each, read only
  // by the kernels (which clamp them into the packed rows); else undefined.
  Tensor cu_seqlens_q, cu_seqlens_k;
  // FP8 problems (dtype F8E4M3): each of q, k and v's per-tensor descale,
  // the factor its stored e4m3 values are multiplied by to give the real
  // ones (FlashAttention-3's q_descale ..., cuDNN's descale_q ...); finite
  // and positive. Ignored for every other dtype.
  float q_descale = 1.0f, k_descale = 1.0f, v_descale = 1.0f;
  // The same descales as device tensors (issue 56 item 2): FP32, one element
  // each, viewed [1, 1, 1, 1], on the problem's GPU, or undefined (the float
  // above). A defined one is the descale, its float left at 1: only the
  // kernels read it, on the caller's stream, so a descale that stream writes
  // just before the call is the one used, with no host read and no
  // synchronisation (flash's FP8 kernel and cuDNN's FP8 graph take them; the
  // others refuse them by name). Nothing checks the value in the default path
  // (a zero, negative or non-finite descale gives what its arithmetic gives);
  // the checking mode (attnprof/check_inputs.h) reads it first and names it.
  Tensor q_descale_tensor, k_descale_tensor, v_descale_tensor;
  bool device_descales() const {
    return q_descale_tensor.defined() || k_descale_tensor.defined() || v_descale_tensor.defined();
  }
};

// What a forward keeps for its backward (autograd's saved tensors, beyond
// the inputs and O): the composites keep the probabilities, the fused
// backends only each row's log-sum-exp.
struct Saved {
  Tensor probs;  // softmax probabilities [B, H, S, Skv], in the dtype the backend computes in
  Tensor lse;    // log-sum-exp of each query row's scaled scores, FP32 [B, H, S, 1] (+-inf on a fully masked row)
  // Soft-capped composites: tanh(s / c) of the scaled scores, [B, H, S, Skv]
  // (what autograd keeps for tanh's backward).
  Tensor tanh;
  // A packed batch on the composites: what each sequence's forward saved, in
  // order (the fused backends save one packed lse instead).
  std::vector<Saved> sequences;
  std::size_t bytes() const {
    std::size_t n = probs.nbytes() + lse.nbytes() + tanh.nbytes();
    for (const Saved& s : sequences) n += s.bytes();
    return n;
  }
};

// dQ [B, H, S, D]; dK and dV [B, Hkv, Skv, D] (summed over the query heads of
// each grouped-query group); the problem's dtype.
struct Gradients {
  Tensor dq, dk, dv;
};

struct Eligibility {
  bool eligible = false;
  std::string reason;  // why not, or what it will do ("FP32 GEMMs on CUDA cores")
};

// What a backend should produce per forward ("guess first, then look"); the
// report compares these with what the trace shows.
struct Expectation {
  std::vector<std::string> cpu_ops;  // top-level ops in order
  int device_activities = -1;        // kernels + memcpys + memsets per forward; -1 unknown
  int copies = 0;                    // memcpys (GPU) or copy ops (CPU) per forward
};

// What a backend is, declared for the rules that read its runs (they never
// read backend names).
struct Traits {
  // A fully masked query row gives NaN (plain softmax over a row of -inf), as
  // the textbook decomposition does; the float64 check accepts NaN there.
  bool nan_on_fully_masked = false;
  // Computes in FP32 whatever the inputs: its error is the yardstick of the
  // 16-bit tolerance rule (at most twice its error, plus a floor).
  bool reference_precision = false;
  // Materialises the full [S, Skv] scores: the others' memory is read against it.
  bool memory_baseline = false;
  // The backward recomputes the probabilities from the saved log-sum-exp
  // (fused backwards) instead of reading saved probabilities.
  bool backward_recomputes = false;
  // The backward sums dQ in the order its blocks finish (FP32 atomics on a
  // GPU, per-block locks on the CPU) unless p.deterministic fixes the order.
  bool backward_dq_unordered = false;
  // Split-KV decode (the split-kv rule): the most splits the combine merges
  // and the keys of one split's smallest range (a key tile), so a run whose
  // splits leave SMs idle is told whether more splits were possible. 0: the
  // backend does not split the keys.
  int max_kv_splits = 0;
  int kv_split_keys = 0;
  // Takes a soft cap (Problem::softcap): the others are refused by name in
  // eligibility_of(), before their own eligibility is asked.
  bool softcap = false;
  // Reads a padded batch's rows (BatchLayout::Form::Padded: Inputs::q_rows
  // and kv_rows, each sequence's query and key rows); the others are refused
  // by name in eligibility_of().
  bool rows = false;
  // Takes a packed (variable-length) batch (Problem::seq_lens); the others are
  // refused by name in eligibility_of(), as for the soft cap.
  bool varlen = false;
  // Takes a packed batch whose lengths only its kernels read
  // (Problem::lengths_on_device, Inputs::cu_seqlens_q and _k); the call reads
  // the lengths on the host, in the caller's stream order, for the others.
  bool device_lengths = false;
  // Takes FP8 inputs (dtype F8E4M3, with Inputs' descales); the others are
  // refused by name in eligibility_of(), as for the soft cap.
  bool fp8 = false;
  // Reads a paged KV cache (BatchLayout::Form::Paged: Inputs::k_pages,
  // v_pages, block_table); the others are refused by name in eligibility_of().
  bool paged = false;
  // Reads a paged cache's per-sequence key counts (BatchLayout::Form::Paged
  // with kv_rows: a serving engine's seq_lens); the others take one key count
  // for every sequence and are refused by name in eligibility_of().
  bool paged_lengths = false;
};

// What an FP8 forward measured beside O (cuDNN's FP8 graph writes it), for
// the last FP8 forward since the last read: the largest softmax probability
// and the largest |O|, in real (descaled) units.
struct Fp8Amax {
  float s = 0;
  float o = 0;
};

// What Backend::prepare() makes for one problem: the backend's own type,
// opaque to the rest. A plan (attnprof/plan.h) holds it and hands it back to
// every forward of that problem through RunContext::state.
struct BackendState {
  virtual ~BackendState() = default;
  // Device (or host) bytes it holds for the forwards: a plan's explain().
  virtual std::size_t bytes() const { return 0; }
};

// Per-call context handed to forward().
struct RunContext {
  Allocator& allocator;
  void* stream = nullptr;  // cudaStream_t for CUDA backends
  int threads = 0;         // CPU threads; 0 = all cores
  // prepare()'s state for this very problem, made by this backend (a plan's
  // runs), or null: the forward then sizes and allocates what it needs itself.
  BackendState* state = nullptr;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual Device device() const = 0;
  virtual Eligibility eligibility(const Problem& p) const = 0;
  // Bytes this backend will allocate beyond inputs and output, for the
  // refuse-before-allocating check.
  virtual std::size_t workspace_bytes(const Problem& p) const = 0;
  virtual Expectation expectation(const Problem& p) const = 0;
  virtual Traits traits() const { return {}; }
  // Writes softmax(scale * Q K^T + mask) V into `out` ([B, H, S, D], problem dtype).
  virtual void forward(const Problem& p, const Inputs& in, Tensor& out, RunContext& ctx) = 0;
  // The forward's per-problem host work done once, for a plan of the eligible
  // problem `p` (attnprof/plan.h): what every forward of `p` would size and
  // allocate (from ctx.allocator) on its own, held by the state returned,
  // which forward() then reads from ctx.state. Null (the default): the
  // backend has nothing to hoist. Never reads a tensor.
  virtual std::unique_ptr<BackendState> prepare(const Problem& p, RunContext& ctx) {
    (void)p;
    (void)ctx;
    return nullptr;
  }

  // The backward pass. A backend that has one says so here; eligibility(p)
  // then answers for p.pass (the registry refuses Backward and Train for the
  // others), expectation(p) and workspace_bytes(p) count the pass's work
  // (saved tensors included).
  virtual bool has_backward() const { return false; }
  // The forward of a training step: `out` as forward() writes it, and what
  // the backward needs in `saved` (allocated here from ctx.allocator).
  virtual void forward_train(const Problem& p, const Inputs& in, Tensor& out, Saved& saved, RunContext& ctx);
  // dQ, dK and dV of O = attention(in) for the upstream gradient `dout`
  // ([B, H, S, D], problem dtype), into `grads` (allocated by the caller,
  // any strides with a contiguous head_dim). A fully masked query row, and a
  // key no query sees, get zero gradients.
  virtual void backward(const Problem& p, const Inputs& in, const Tensor& out, const Tensor& dout, const Saved& saved,
                        Gradients& grads, RunContext& ctx);

  // The amaxes of the FP8 forwards since the last call, then reset; nullopt
  // from a backend that measures none, or when no FP8 forward ran since. It
  // reads the device (a copy and a wait): call it after a timed run, never
  // inside one.
  virtual std::optional<Fp8Amax> read_fp8_amax() { return std::nullopt; }
};

// The reason a backend without a backward gives for Backward and Train.
Eligibility no_backward(std::string_view backend);
// The reason a backend without soft-capping gives for p.softcap > 0.
Eligibility no_softcap(std::string_view backend, Device device);
// The reason a backend without packed batches gives for p.varlen().
Eligibility no_varlen(std::string_view backend, Device device);
// The reason a backend without FP8 gives for dtype fp8.
Eligibility no_fp8(std::string_view backend, Device device);
// Whether `b` takes `p` in layout `l`, and why not: the one place that
// answers it. check_layout(p, l) first (a layout the problem contradicts is
// Error(InvalidArgument)); then, from b's traits, no_backward() for a backward
// or training pass of a backend that has none, no_softcap() for a soft cap on
// a backend whose traits do not take one, no_varlen() and no_fp8() likewise,
// a packed batch's lengths on the device, deterministic, a paged cache and
// per-sequence rows (l.reads_rows()); then b.eligibility(p). What explain(),
// the runner and plans ask. A reason says why the backend cannot take `p`,
// never which backends can: explain() appends those.
Eligibility eligibility_of(const Backend& b, const Problem& p, const BatchLayout& l);
// The same in the layout the problem alone says (Problem::layout(): dense,
// packed or paged, no per-sequence rows).
Eligibility eligibility_of(const Backend& b, const Problem& p);

// Every backend name in display order: naive, naive_inplace, math, efficient, flash, cudnn.
const std::vector<std::string_view>& backend_names();
bool is_backend_name(std::string_view name);

}  // namespace attnprof
