// cudnn on what real models feed it (issue 22): packed (variable-length)
// batches on cuDNN's ragged layout, forward and one training step, on the
// length sets of tests/cpu/varlen_test.cpp (tests/common/varlen_cases.h: empty,
// one-row and unequal sequences), masks none, causal, bottom-right and the
// window, grouped-query heads, bf16 and fp16, every output poisoned with NaN
// before the call and checked against the float64 reference; boolean masks (a
// key-padding one and an arbitrary one, each the bias it becomes on the
// device), forward and backward, a fully masked row held to the
// reference's zeros; soft caps; the refusals, each in one line; and the
// runner's train pass on a packed batch (the layouts it allocates).
#include <gtest/gtest.h>

#include <cstdint>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/error.h"
#include "attnprof/mask_tensor.h"
#include "attnprof/reference.h"
#include "attnprof/runner.h"
#include "backends/cuda/cuda_backends.h"
#include "common/test_problem.h"
#include "common/varlen_cases.h"
#include "gpu_test.h"

namespace attnprof {
namespace {

using testing::expect_accurate;
// The CPU's length sets (tests/common/varlen_cases.h): an empty and a one-row
// sequence, more keys than queries and fewer, keys without queries and
// queries without keys, one sequence alone, and two random sets.
using testing::length_sets;
using testing::Lens;

Problem packed(const Lens& q, const Lens& kv, MaskKind mask, DType dtype, std::int64_t heads, std::int64_t kv_heads,
               std::int64_t head_dim, std::int64_t window = 0) {
  Problem base{.heads = heads, .kv_heads = kv_heads, .head_dim = head_dim, .dtype = dtype, .device = Device::Cuda};
  base.mask = mask;
  base.window = window;
  Problem p = varlen_problem(base, q, kv);
  p.normalize();
  p.validate();
  return p;
}

bool has_empty_sequence(const Problem& p) {
  for (std::int64_t b = 0; b < p.batch; ++b) {
    if (p.seq_len(b) == 0 || p.kv_seq_len(b) == 0) return true;
  }
  return false;
}

// A device tensor of `dims` poisoned with NaN: [1, H, total, D] laid out as
// [total, H, D] (rows_major, FlashAttention's packed layout) or contiguous.
Tensor poisoned(const Dims& dims, DType dtype, bool rows_major) {
  DeviceRuntime& rt = cuda::runtime();
  Tensor t = rows_major ? Tensor::empty({dims[0], dims[2], dims[1], dims[3]}, dtype, rt.allocator()).transpose(1, 2)
                        : Tensor::empty(dims, dtype, rt.allocator());
  rt.poison(t);
  return t;
}

// The forward into `rows_major` outputs, then a training step (forward_train
// and backward) into outputs of the other layout, all checked against float64.
void check_forward_and_step(Backend& b, const Problem& p, const Inputs& host, bool rows_major,
                            const std::string& what) {
  DeviceRuntime& rt = cuda::runtime();
  const Inputs in = rt.upload(host);
  RunContext ctx{rt.allocator(), rt.stream(), 0};
  Problem fwd = p;
  fwd.pass = Pass::Forward;
  Tensor out = poisoned(p.q_dims(), p.dtype, rows_major);
  b.forward(fwd, in, out, ctx);
  rt.synchronize();
  expect_accurate(fwd, check_against_reference(fwd, host, rt.download(out), sample_rows(fwd, 1 << 20)),
                  what + " forward");

  Problem train = p;
  train.pass = Pass::Train;
  const Tensor dout_host = make_dout(train, 7, cpu_allocator());
  const Tensor dout = rt.upload(dout_host);
  Tensor o = poisoned(p.q_dims(), p.dtype, !rows_major);
  Gradients g{poisoned(p.q_dims(), p.dtype, !rows_major), poisoned(p.kv_dims(), p.dtype, !rows_major),
              poisoned(p.kv_dims(), p.dtype, !rows_major)};
  Saved saved;
  b.forward_train(train, in, o, saved, ctx);
  b.backward(train, in, o, dout, saved, g, ctx);
  rt.synchronize();
  const Dims lse{p.varlen() ? 1 : p.batch, p.heads, p.varlen() ? p.total_q() : p.seq, 1};
  EXPECT_EQ(saved.lse.sizes(), lse) << what;
  expect_accurate(train, check_against_reference(train, host, rt.download(o), sample_rows(train, 1 << 20)),
                  what + " training forward");
  const Gradients hg{rt.download(g.dq), rt.download(g.dk), rt.download(g.dv)};
  const GradientErrors e = check_gradients_against_reference(train, host, dout_host, hg, sample_rows(train, 1 << 20),
                                                             sample_kv_rows(train, 1 << 20));
  expect_accurate(train, e.dq, what + " dQ");
  expect_accurate(train, e.dk, what + " dK");
  expect_accurate(train, e.dv, what + " dV");
}

using Config = testing::PackedConfig;

const Config kConfigs[] = {
    {"none_bf16", MaskKind::None, 2, 2, 128, 0, DType::BF16},
    {"causal_gqa_bf16", MaskKind::Causal, 4, 2, 64, 0, DType::BF16},
    {"bottom_right_mqa_f16", MaskKind::CausalBottomRight, 4, 1, 64, 0, DType::F16},
    {"causal_f16", MaskKind::Causal, 2, 2, 64, 0, DType::F16},
    {"window_gqa_bf16", MaskKind::SlidingWindow, 4, 2, 64, 24, DType::BF16},
};

class CudnnRagged : public ::testing::TestWithParam<Config> {};

TEST_P(CudnnRagged, MatchesFloat64ForwardAndBackward) {
  REQUIRE_GPU();
  const Config& c = GetParam();
  auto cudnn = cuda::make_cudnn();
  int ran = 0;
  for (const auto& [q, kv] : length_sets()) {
    Problem p = packed(q, kv, c.mask, c.dtype, c.heads, c.kv_heads, c.head_dim, c.window);
    p.pass = Pass::Train;
    const std::string what = p.describe();
    const Eligibility el = eligibility_of(*cudnn, p);
    EXPECT_EQ(el.reason.find('\n'), std::string::npos) << el.reason;
    if (!el.eligible && has_empty_sequence(p) && el.reason.find("zero-length sequences") != std::string::npos) {
      continue;  // cuDNN before 9.25, refused by name
    }
    if (!el.eligible && c.mask == MaskKind::SlidingWindow) {
      // The window on the ragged layout where the frontend takes it; else
      // refused in cuDNN's words, naming the graph.
      EXPECT_EQ(el.reason.rfind("cuDNN SDPA", 0), 0u) << el.reason;
      continue;
    }
    ASSERT_TRUE(el.eligible) << what << ": " << el.reason;
    EXPECT_NE(el.reason.find("ragged layout"), std::string::npos) << el.reason;
    const Inputs host = make_inputs(p, 3 + static_cast<std::uint64_t>(ran), cpu_allocator());
    check_forward_and_step(*cudnn, p, host, /*rows_major=*/ran % 2 == 0, what);
    ++ran;
  }
  if (c.mask != MaskKind::SlidingWindow) EXPECT_GE(ran, 3) << "too few length sets ran";
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudnnRagged, ::testing::ValuesIn(kConfigs),
                         [](const auto& info) { return std::string(info.param.name); });

// Queries without keys and keys without queries: zeros, never NaN (what the
// float64 reference says), where cuDNN takes zero-length sequences.
TEST(CudnnRagged, EmptySequencesGiveZerosNotNan) {
  REQUIRE_GPU();
  auto cudnn = cuda::make_cudnn();
  Problem p = packed({4, 0, 3}, {0, 6, 3}, MaskKind::None, DType::BF16, 2, 2, 64);
  p.pass = Pass::Train;
  const Eligibility el = eligibility_of(*cudnn, p);
  if (!el.eligible) {
    EXPECT_NE(el.reason.find("zero-length sequences (sequence 0 has 4 queries and 0 keys"), std::string::npos)
        << el.reason;
    GTEST_SKIP() << el.reason;
  }
  const Inputs host = make_inputs(p, 2, cpu_allocator());
  check_forward_and_step(*cudnn, p, host, true, p.describe());
}

// A repeated call binds the same offset buffers: the second call of a packed
// problem writes what the first did, bit for bit, and another length set of
// the same maxima (the same graph) is not served the first one's offsets.
TEST(CudnnRagged, RepeatedCallsAndAnotherLengthSetOfOneGraph) {
  REQUIRE_GPU();
  auto cudnn = cuda::make_cudnn();
  DeviceRuntime& rt = cuda::runtime();
  RunContext ctx{rt.allocator(), rt.stream(), 0};
  for (const Lens& q : {Lens{100, 7, 128}, Lens{128, 100, 7}}) {
    const Problem p = packed(q, q, MaskKind::Causal, DType::BF16, 4, 2, 64);
    ASSERT_TRUE(eligibility_of(*cudnn, p).eligible);
    const Inputs host = make_inputs(p, 5, cpu_allocator());
    const Inputs in = rt.upload(host);
    Tensor a = poisoned(p.q_dims(), p.dtype, true), b = poisoned(p.q_dims(), p.dtype, true);
    cudnn->forward(p, in, a, ctx);
    cudnn->forward(p, in, b, ctx);
    const Tensor ha = rt.download(a), hb = rt.download(b);
    expect_accurate(p, check_against_reference(p, host, ha, sample_rows(p, 1 << 20)), p.describe());
    std::int64_t differ = 0;
    testing::for_each_index(
        ha, [&](auto i0, auto i1, auto i2, auto i3) { differ += ha.get(i0, i1, i2, i3) != hb.get(i0, i1, i2, i3); });
    EXPECT_EQ(differ, 0) << p.describe();
  }
}

// Dense boolean masks. `mask` [1|B, 1|H, S|1, Skv] on the host, attached to
// inputs made for p (mask boolean).
Inputs with_mask(const Problem& p, const Tensor& mask) {
  Inputs in = make_inputs(p, 11, cpu_allocator());
  attach_mask(p, mask, in, "the test's mask");
  return in;
}

Problem dense(MaskKind mask, std::int64_t batch, std::int64_t heads, std::int64_t kv_heads, std::int64_t seq,
              std::int64_t kv_seq, DType dtype = DType::BF16) {
  Problem p = testing::to_problem(
      testing::Shape{
          .batch = batch, .heads = heads, .kv_heads = kv_heads, .seq = seq, .kv_seq = kv_seq, .head_dim = 64},
      dtype, mask, Device::Cuda);
  p.validate();
  return p;
}

// A key-padding mask runs as the bias every boolean mask becomes on the
// device (it used to be read back to run as cuDNN's padding mask: a host
// read out of the caller's stream order, issue 56).
TEST(CudnnBooleanMask, KeyPaddingMaskRunsAsItsBiasUnread) {
  REQUIRE_GPU();
  auto cudnn = cuda::make_cudnn();
  for (DType dtype : {DType::BF16, DType::F16}) {
    Problem p = dense(MaskKind::Boolean, 3, 4, 2, 128, 160, dtype);
    p.pass = Pass::Train;
    const Eligibility el = eligibility_of(*cudnn, p);
    ASSERT_TRUE(el.eligible) << el.reason;
    EXPECT_NE(el.reason.find("never read on the host"), std::string::npos) << el.reason;
    // Sequence b keeps its first 160, 77 and 1 keys: [B, 1, 1, Skv].
    Tensor m = Tensor::empty({p.batch, 1, 1, p.kv_seq}, DType::Bool, cpu_allocator());
    const std::int64_t lens[] = {160, 77, 1};
    for (std::int64_t b = 0; b < p.batch; ++b)
      for (std::int64_t j = 0; j < p.kv_seq; ++j) m.data_as<std::uint8_t>()[b * p.kv_seq + j] = j < lens[b];
    check_forward_and_step(*cudnn, p, with_mask(p, m), false, p.describe() + " key padding");
  }
}

TEST(CudnnBooleanMask, ArbitraryMaskRunsAsItsBias) {
  REQUIRE_GPU();
  auto cudnn = cuda::make_cudnn();
  for (DType dtype : {DType::BF16, DType::F16}) {
    Problem p = dense(MaskKind::Boolean, 2, 4, 4, 192, 256, dtype);
    p.pass = Pass::Train;
    ASSERT_TRUE(eligibility_of(*cudnn, p).eligible) << eligibility_of(*cudnn, p).reason;
    // make_inputs' mask: [S, Skv] broadcast over batch and heads, 90% kept.
    check_forward_and_step(*cudnn, p, make_inputs(p, 13, cpu_allocator()), false, p.describe() + " random");
    // A mask of its own per batch and head, written through a transposed
    // view (read back through the device copy if upload keeps that layout).
    Tensor m = Tensor::empty({p.batch, p.heads, p.kv_seq, p.seq}, DType::Bool, cpu_allocator()).transpose(2, 3);
    std::mt19937 rng(4);
    testing::for_each_index(m, [&](auto b, auto h, auto i, auto j) {
      m.data_as<std::uint8_t>()[m.index(b, h, i, j)] = (rng() % 4 != 0) || j == i;
    });
    check_forward_and_step(*cudnn, p, with_mask(p, m), true, p.describe() + " per head, strided");
  }
}

// A row whose every key is masked: the float64 reference's zeros (and zero
// gradients), which is what the backend must give, whatever cuDNN's kernel
// writes for a row of -inf.
TEST(CudnnBooleanMask, FullyMaskedRowsAreTheReferences) {
  REQUIRE_GPU();
  auto cudnn = cuda::make_cudnn();
  Problem p = dense(MaskKind::Boolean, 1, 2, 2, 128, 128);
  p.pass = Pass::Train;
  Tensor m = Tensor::empty({1, 1, p.seq, p.kv_seq}, DType::Bool, cpu_allocator());
  for (std::int64_t i = 0; i < p.seq; ++i)
    for (std::int64_t j = 0; j < p.kv_seq; ++j) m.data_as<std::uint8_t>()[i * p.kv_seq + j] = j <= i && i != 5;
  check_forward_and_step(*cudnn, p, with_mask(p, m), false, "row 5 fully masked");
}

// Soft caps (Gemma-2's) on dense batches, through cuDNN's score modifier,
// with the structural masks inside it; refused in cuDNN's words where this
// cuDNN builds no such graph.
TEST(CudnnSoftcap, MatchesFloat64ForwardAndBackward) {
  REQUIRE_GPU();
  auto cudnn = cuda::make_cudnn();
  for (MaskKind mask : {MaskKind::None, MaskKind::Causal, MaskKind::Boolean}) {
    Problem p = dense(mask, 2, 4, 2, 128, 128);
    p.softcap = 5;  // the scores reach head_dim x scale = 8: the cap bites
    p.scale = 1.0;  // and harder
    p.pass = Pass::Train;
    p.validate();
    const Eligibility el = eligibility_of(*cudnn, p);
    if (!el.eligible) {
      EXPECT_EQ(el.reason.rfind("cuDNN SDPA", 0), 0u) << el.reason;
      std::cout << "cudnn soft cap, " << mask_name(mask) << ": refused: " << el.reason << "\n";
      continue;
    }
    EXPECT_NE(el.reason.find("soft cap"), std::string::npos) << el.reason;
    check_forward_and_step(*cudnn, p, make_inputs(p, 17, cpu_allocator()), false, p.describe());
  }
}

TEST(CudnnRefusals, EachInOneLine) {
  REQUIRE_GPU();
  auto cudnn = cuda::make_cudnn();
  const auto one_line = [](const std::string& s) { return s.find('\n') == std::string::npos; };
  // A soft cap on a packed batch: the frontend has no score modifier beside a padding mask.
  Problem capped = packed({30, 50}, {30, 50}, MaskKind::Causal, DType::BF16, 2, 2, 64);
  capped.softcap = 30;
  const Eligibility el = eligibility_of(*cudnn, capped);
  EXPECT_FALSE(el.eligible);
  EXPECT_NE(el.reason.find("a soft cap on a packed batch is not built for cudnn: the cuDNN frontend 1."),
            std::string::npos)
      << el.reason;
  EXPECT_TRUE(one_line(el.reason));

  DeviceRuntime& rt = cuda::runtime();
  RunContext ctx{rt.allocator(), rt.stream(), 0};
  // Q of a packed batch that holds fewer rows than the lengths say.
  const Problem p = packed({30, 50}, {30, 50}, MaskKind::Causal, DType::BF16, 2, 2, 64);
  Inputs in = rt.upload(make_inputs(p, 1, cpu_allocator()));
  in.q = in.q.as_strided({1, 2, 70, 64}, in.q.strides(), in.q.offset());
  Tensor out = poisoned(p.q_dims(), p.dtype, true);
  try {
    cudnn->forward(p, in, out, ctx);
    ADD_FAILURE() << "a short q was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("cudnn: a packed batch's q must be [1, 2, 80, 64]"), std::string::npos)
        << e.what();
    EXPECT_TRUE(one_line(e.what())) << e.what();
  }
  // mask=boolean without a mask tensor.
  const Problem b = dense(MaskKind::Boolean, 1, 2, 2, 64, 64);
  Inputs no_mask = rt.upload(make_inputs(b, 1, cpu_allocator()));
  no_mask.mask = Tensor();
  Tensor o = poisoned(b.q_dims(), b.dtype, false);
  try {
    cudnn->forward(b, no_mask, o, ctx);
    ADD_FAILURE() << "a boolean problem without its mask was taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("without a bool CUDA mask tensor"), std::string::npos) << e.what();
    EXPECT_TRUE(one_line(e.what())) << e.what();
  }
}

// Through the runner, as compare runs it: the layouts the runner allocates
// (contiguous [1, H, total, D] outputs and gradients), checked against float64.
TEST(CudnnRagged, RunnerTrainOnAPackedBatch) {
  REQUIRE_GPU();
  auto cudnn = cuda::make_cudnn();
  for (Pass pass : {Pass::Forward, Pass::Train}) {
    Problem p = packed({300, 17, 1024, 90}, {300, 40, 1024, 128}, MaskKind::CausalBottomRight, DType::BF16, 8, 2, 128);
    p.pass = pass;
    RunOptions o;
    o.schedule = {.wait = 0, .warmup = 1, .active = 3, .repeat = 1};
    o.check_rows = 512;
    const RunResult r = run_backend(*cudnn, p, o);
    const std::string what(pass_name(pass));
    ASSERT_TRUE(r.eligibility.eligible) << what << ": " << r.eligibility.reason;
    ASSERT_FALSE(r.failure) << what << ": " << *r.failure;
    ASSERT_TRUE(r.acceptance && r.acceptance->pass) << what << ": " << (r.acceptance ? r.acceptance->why : "none");
    std::cout << "cudnn packed " << what << ": host " << r.metrics.host_time_unprofiled_us.value_or(0)
              << " us per call, TFLOP/s " << r.metrics.tflops.value_or(0) << "\n";
  }
}

}  // namespace
}  // namespace attnprof
