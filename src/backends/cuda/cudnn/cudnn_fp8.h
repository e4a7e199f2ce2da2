// The cudnn backend's FP8 forward (issue 24): cuDNN's FP8 SDPA graph (the
// frontend's sdpa_fp8) on e4m3 Q, K and V [B, H, S, D], any strides, with
// O in bf16. cudnn.cpp builds, caches and runs it like its other graphs (one
// cache keyed by problem and layout, the direct path with a cached variant
// pack); this file gives it what differs: which problems it takes
// (refusal()), the graph (build()), and the per-backend state a call binds
// (Fp8State: the scalars, the e4m3 O, the amaxes read back).
//
// The scalars, as cuDNN's FP8 samples and tests choose them:
//  descale_q, descale_k, descale_v: the inputs' own (Inputs::q_descale ...);
//    a score is (q . k) descale_q descale_k times the softmax scale, in FP32.
//  scale_s = 448, descale_s = 1/448: P (each probability in [0, 1]) enters
//    the P V product as the e4m3 of 448 P, the top of e4m3's range, and the
//    product is descaled by 1/448 and descale_v.
//  scale_o: 1 where the graph writes O in bf16 (Blackwell, cuDNN 9.13 and
//    newer: the frontend takes a bf16 O from an FP8 graph nowhere else). On
//    Hopper O is written in e4m3 at scale_o = 1 / (2 descale_v) and turned
//    into the bf16 output on the device by one more kernel (fp8_output.h,
//    times 2 descale_v). Each row of O is a convex combination of V's rows,
//    |O| <= max |V| <= 448 descale_v, but P's rounding may carry a row's
//    probabilities past a sum of 1 (by 2^-4 at most), so O lands at 224 and
//    below, never near e4m3's 448 (where an overflow is NaN unless the
//    conversion saturates). O costs one more e4m3 rounding (2^-4 of |O| at
//    most; e4m3's relative precision is the same in every binade above
//    2^-6).
// They live in one device buffer (FP32, 16 bytes apart: the frontend's
// default alignment), bound as [1, 1, 1, 1] views. The descales are copied
// only when a call's differ from those last written (one 96-byte copy), so a
// repeated call copies nothing.
//
// The amaxes: the graph also writes amax_s, the largest softmax probability,
// and amax_o, the largest |O| in real units (before scale_o). cuDNN 9.19's
// Hopper engine overwrites them each call (the H200, 2026-12-02: two calls
// read back the second's amax_o, 1.20 after 4.84), so read_amax() gives the
// last FP8 forward's amaxes; the buffer starts at zero and is zeroed after a
// read all the same (the frontend's own tests zero it first).
// Never on the timed path: the runner asks after the run
// (Backend::read_fp8_amax()).
//
// Masks: none and causal (top-left). The bottom-right diagonal (causal
// bottom-right and the window) only where seq == kv_seq, where it is the
// top-left one, except on Blackwell: the frontend takes a bottom-right FP8
// diagonal on sm100 and newer only. The window from cuDNN 9.21 on (where
// Transformer Engine starts setting an FP8 graph's left bound). Grouped-query
// heads and kv_seq != seq as cuDNN takes them (eligibility asks it). Packed
// batches, soft caps, paged caches, bias and boolean masks and the backward
// are refused by name.
#pragma once

#include <array>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "attnprof/backend.h"
#include "attnprof/problem.h"
#include "attnprof/tensor.h"
#include "backends/cuda/cudnn/cudnn_graph.h"

namespace attnprof::cuda::cudnn_fp8 {

// P's scale for the P V product: e4m3's largest finite value (P <= 1).
constexpr float kPScale = 448.0f;
// O's headroom on Hopper: O is written in e4m3 at 1 / (kOHeadroom descale_v).
constexpr float kOHeadroom = 2.0f;

// The refusal of a backward or training pass in fp8.
constexpr const char* kForwardOnly =
    "cudnn's fp8 path is forward only (cuDNN's FP8 SDPA backward, with e4m3 dO and gradients, is not built here): use "
    "pass=forward, or dtype=bf16";

// Why the FP8 graph does not take p on a GPU of compute capability `sm`
// (one line, saying what to change), before cuDNN is asked; empty when it
// may (cuDNN's own checks follow).
std::string refusal(const Problem& p, int sm);

// Whether the graph writes O in bf16 itself on a GPU of compute capability
// `sm`; else in e4m3, converted into the bf16 output by one more kernel.
bool writes_bf16_output(int sm);

// The FP8 graph for p and layout l, built up to check_support(): empty when
// cuDNN takes it, else its refusal in its own words, on one line.
std::string build(cudnnHandle_t handle, const Problem& p, const cudnn_graph::Layout& l, bool bf16_out,
                  std::shared_ptr<cudnn_graph::PlanGraph>& out);

// What eligibility says the forward does.
std::string how(const Problem& p, bool bf16_out);

// Activities per forward: the generated kernel, and the conversion kernel
// where O is written in e4m3.
Expectation expectation(const Problem& p, bool bf16_out);

// Device bytes a forward of p keeps beyond cuDNN's workspace: the e4m3 O
// (where the graph writes one) and the scalars.
std::size_t extra_bytes(const Problem& p, bool bf16_out);

// The per-backend state of the FP8 forward. Calls hold mutex() from bind()
// to finish().
class Fp8State {
 public:
  std::mutex& mutex() { return mutex_; }

  // Binds p's tensors by uid into `t`: Q, K, V, O (`out` itself where the
  // graph writes bf16, else the e4m3 O) and the scalars, after checking the
  // descales (finite and positive) and writing those that changed.
  void bind(const Problem& p, const Inputs& in, const Tensor& out, bool bf16_out, cudnn_graph::Bound& t,
            RunContext& ctx);
  // After the graph ran: the e4m3 O into `out`, where the graph wrote one.
  void finish(const Inputs& in, Tensor& out, bool bf16_out, RunContext& ctx);
  // The last FP8 forward's amaxes, then zeroed (a copy and a wait on
  // `stream`); nullopt when none ran since the last read.
  std::optional<Fp8Amax> read_amax(void* stream);

 private:
  void allocate(RunContext& ctx);

  std::mutex mutex_;
  // kSlots FP32 scalars, each kStride floats apart: the six the graph reads
  // (descale q, k, v, s; scale s, o), then amax_s and amax_o.
  static constexpr std::size_t kSlots = 8, kStride = 4, kInputs = 6;
  Tensor scalars_;
  std::array<Tensor, kSlots> views_;
  std::array<float, kInputs> written_{};  // the inputs last copied; valid once copied_
  bool copied_ = false;
  bool ran_ = false;  // an FP8 forward since the last read_amax()
  Tensor o8_;         // the e4m3 O, [B, H, S, D] contiguous
};

}  // namespace attnprof::cuda::cudnn_fp8
