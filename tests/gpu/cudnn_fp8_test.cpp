// cudnn in FP8 (issue 24): cuDNN's FP8 SDPA graph on e4m3 Q, K and V made on
// the host from random reals with per-tensor descales (amax / 448), the bf16
// output poisoned with NaN before the call and checked against a float64
// reference computed from the dequantized values; amax_s and amax_o, read
// back after the run (Backend::read_fp8_amax()), against the host's amax of
// the real probabilities and O; descales that change between calls; the
// refusals, each in one line.
//
// The tolerance. On the dequantized inputs the FP8 graph adds two roundings
// to e4m3 (3 mantissa bits: a relative error of at most 2^-4 each) to the
// float64 result: P, which enters the P V product as the e4m3 of 448 P, and,
// where the graph writes O in e4m3 (Hopper), O itself, at 1 / (2 descale_v).
// The worst case they give, 2^-4 max|V| + 2^-4 |O| per element, would pass an
// output of zeros wherever |O| is small (a long non-causal row averages V
// towards 0), so the test holds cuDNN to what those roundings cost on these
// inputs: a float64 simulation of the graph (P rounded to e4m3 at scale 448,
// O rounded to e4m3 at 1 / (2 descale_v) where the graph writes e4m3, then to
// bf16) has an error against the reference per element, and cuDNN's largest
// and mean errors must be within twice the simulation's, plus 2^-8 of the
// largest and of the mean |O| respectively (bf16's rounding, twice over).
// Twice, because cuDNN rounds the P of its online softmax against a running
// row maximum, not the final one: roundings of the same size, at other
// places. (A float64 model of that online rounding, 128 keys a block, the row
// sums from P before or after its rounding, gives 0.6 to 1.0 times the
// simulation's largest and mean errors on this file's shapes.)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/device_runtime.h"
#include "attnprof/error.h"
#include "backends/cuda/cuda_backends.h"
#include "common/test_problem.h"
#include "gpu_test.h"

namespace attnprof {
namespace {

int sm_of_device() {
  int dev = 0, major = 0, minor = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  return major * 10 + minor;
}

bool one_line(const std::string& s) { return s.find('\n') == std::string::npos; }

Problem fp8_problem(std::int64_t batch, std::int64_t heads, std::int64_t kv_heads, std::int64_t seq,
                    std::int64_t kv_seq, std::int64_t head_dim, MaskKind mask, std::int64_t window = 0) {
  Problem p = testing::to_problem(testing::Shape{.batch = batch,
                                                 .heads = heads,
                                                 .kv_heads = kv_heads,
                                                 .seq = seq,
                                                 .kv_seq = kv_seq,
                                                 .head_dim = head_dim,
                                                 .window = window},
                                  DType::F8E4M3, mask, Device::Cuda);
  p.validate();
  return p;
}

// A host e4m3 tensor of uniform reals in [-range, range], quantized at its
// per-tensor descale amax / 448; [B, S, H, D] in memory when `bshd`.
Tensor quantized(const Dims& sizes, bool bshd, float range, std::mt19937& rng, float& descale) {
  Tensor t =
      bshd ? Tensor::empty({sizes[0], sizes[2], sizes[1], sizes[3]}, DType::F8E4M3, cpu_allocator()).transpose(1, 2)
           : Tensor::empty(sizes, DType::F8E4M3, cpu_allocator());
  std::uniform_real_distribution<float> u(-range, range);
  std::vector<float> real(static_cast<std::size_t>(t.numel()));
  float amax = 0;
  for (float& x : real) amax = std::max(amax, std::abs(x = u(rng)));
  descale = amax / 448.0f;
  std::size_t n = 0;
  testing::for_each_index(t, [&](auto a, auto b, auto c, auto d) { t.set(a, b, c, d, real[n++] / descale); });
  return t;
}

Inputs fp8_inputs(const Problem& p, bool bshd, std::uint32_t seed) {
  std::mt19937 rng(seed);
  Inputs in;
  in.q = quantized({p.batch, p.heads, p.seq, p.head_dim}, bshd, 2.0f, rng, in.q_descale);
  in.k = quantized({p.batch, p.kv_heads, p.kv_seq, p.head_dim}, bshd, 1.5f, rng, in.k_descale);
  in.v = quantized({p.batch, p.kv_heads, p.kv_seq, p.head_dim}, bshd, 3.0f, rng, in.v_descale);
  return in;
}

float round_e4m3(double x) { return e4m3_to_float(float_to_e4m3(static_cast<float>(x))); }
double round_bf16(double x) { return bf16_to_float(float_to_bf16(static_cast<float>(x))); }

// The float64 reference on the dequantized inputs, the simulation of the FP8
// graph's roundings (the file's comment), and the host's amaxes.
struct Reference {
  Tensor o, sim;  // host F32 [B, H, S, D]
  double amax_p = 0, amax_o = 0;
};

// t's real values (stored e4m3 times `descale`), [B, H, S, D] row-major.
std::vector<double> dequantized(const Tensor& t, float descale) {
  std::vector<double> x;
  x.reserve(static_cast<std::size_t>(t.numel()));
  testing::for_each_index(t, [&](auto a, auto b, auto c, auto d) {
    x.push_back(static_cast<double>(t.get(a, b, c, d)) * static_cast<double>(descale));
  });
  return x;
}

Reference reference(const Problem& p, const Inputs& in, bool o_e4m3) {
  Reference r;
  const std::vector<double> q = dequantized(in.q, in.q_descale), k = dequantized(in.k, in.k_descale),
                            v = dequantized(in.v, in.v_descale);
  // Row (b, h, i)'s first element in q (or in k and v, with the key head).
  const auto row = [&](std::int64_t b, std::int64_t h, std::int64_t heads, std::int64_t seq, std::int64_t i) {
    return static_cast<std::size_t>(((b * heads + h) * seq + i) * p.head_dim);
  };
  const Dims sizes{p.batch, p.heads, p.seq, p.head_dim};
  r.o = Tensor::empty(sizes, DType::F32, cpu_allocator());
  r.sim = Tensor::empty(sizes, DType::F32, cpu_allocator());
  const double scale = p.softmax_scale();
  const std::int64_t d = p.head_dim;
  std::vector<double> s(static_cast<std::size_t>(p.kv_seq)), o(static_cast<std::size_t>(d)),
      sim(static_cast<std::size_t>(d));
  for (std::int64_t b = 0; b < p.batch; ++b) {
    for (std::int64_t h = 0; h < p.heads; ++h) {
      const std::int64_t hk = h / p.group();
      for (std::int64_t i = 0; i < p.seq; ++i) {
        double m = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j < p.kv_seq; ++j) {
          auto& sj = s[static_cast<std::size_t>(j)];
          sj = -std::numeric_limits<double>::infinity();
          if (!p.visible(i, j)) continue;
          const double* qi = &q[row(b, h, p.heads, p.seq, i)];
          const double* kj = &k[row(b, hk, p.kv_heads, p.kv_seq, j)];
          double dot = 0;
          for (std::int64_t e = 0; e < d; ++e) dot += qi[e] * kj[e];
          sj = dot * scale;
          m = std::max(m, sj);
        }
        double l = 0;
        for (double& sj : s) l += sj == -std::numeric_limits<double>::infinity() ? 0.0 : std::exp(sj - m);
        std::fill(o.begin(), o.end(), 0.0);
        std::fill(sim.begin(), sim.end(), 0.0);
        for (std::int64_t j = 0; j < p.kv_seq; ++j) {
          const double sj = s[static_cast<std::size_t>(j)];
          if (sj == -std::numeric_limits<double>::infinity()) continue;
          const double pj = std::exp(sj - m) / l;
          const double pq = round_e4m3(448.0 * pj) / 448.0;
          r.amax_p = std::max(r.amax_p, pj);
          const double* vj = &v[row(b, hk, p.kv_heads, p.kv_seq, j)];
          for (std::int64_t e = 0; e < d; ++e) {
            o[static_cast<std::size_t>(e)] += pj * vj[e];
            sim[static_cast<std::size_t>(e)] += pq * vj[e];
          }
        }
        for (std::int64_t e = 0; e < d; ++e) {
          const double oe = o[static_cast<std::size_t>(e)];
          double se = sim[static_cast<std::size_t>(e)];
          if (o_e4m3) se = round_e4m3(se / (2.0 * in.v_descale)) * (2.0 * in.v_descale);
          r.amax_o = std::max(r.amax_o, std::abs(oe));
          r.o.set(b, h, i, e, static_cast<float>(oe));
          r.sim.set(b, h, i, e, static_cast<float>(round_bf16(se)));
        }
      }
    }
  }
  return r;
}

// One forward on the device: the inputs uploaded (their descales with them),
// the bf16 output poisoned, then brought back; `pad` lays the output out
// with rows of D + pad elements.
Tensor run_forward(Backend& b, const Problem& p, const Inputs& host, std::int64_t pad = 0) {
  DeviceRuntime& rt = cuda::runtime();
  const Inputs in = rt.upload(host);
  EXPECT_EQ(in.q_descale, host.q_descale);
  Tensor out = Tensor::empty({p.batch, p.heads, p.seq, p.head_dim + pad}, DType::BF16, rt.allocator());
  if (pad > 0) {
    const Dims s = out.strides();
    out = out.as_strided({p.batch, p.heads, p.seq, p.head_dim}, s, 0);
  }
  rt.poison(out);
  RunContext ctx{rt.allocator(), rt.stream(), 0};
  b.forward(p, in, out, ctx);
  rt.synchronize();
  return rt.download(out);
}

struct Errors {
  double max = 0, mean = 0;
  double mean_ref = 0;  // the mean |reference|
  std::int64_t nan = 0;
};

Errors errors(const Tensor& out, const Tensor& ref) {
  Errors e;
  double sum = 0, sum_ref = 0;
  testing::for_each_index(ref, [&](auto a, auto b, auto c, auto d) {
    const double x = out.get(a, b, c, d), r = ref.get(a, b, c, d);
    sum_ref += std::abs(r);
    if (!std::isfinite(x)) {
      ++e.nan;
      return;
    }
    e.max = std::max(e.max, std::abs(x - r));
    sum += std::abs(x - r);
  });
  e.mean = sum / static_cast<double>(ref.numel());
  e.mean_ref = sum_ref / static_cast<double>(ref.numel());
  return e;
}

// The output and the amaxes against the reference (the file's tolerance).
void expect_matches(const Tensor& out, const Reference& r, const std::optional<Fp8Amax>& amax,
                    const std::string& what) {
  // The floors: bf16's rounding (2^-9 relative) of the largest output, and
  // of the mean one, with a factor 2 to spare.
  const Errors got = errors(out, r.o), sim = errors(r.sim, r.o);
  const double floor = std::ldexp(r.amax_o, -8), mean_floor = std::ldexp(sim.mean_ref, -8);
  EXPECT_EQ(got.nan, 0) << what << ": non-finite outputs (unwritten, or NaN)";
  EXPECT_LE(got.max, 2 * sim.max + floor) << what << ": mean error " << got.mean << ", simulated " << sim.mean;
  EXPECT_LE(got.mean, 2 * sim.mean + mean_floor) << what << ": max error " << got.max << ", simulated " << sim.max;
  std::cout << "cudnn fp8 " << what << ": max error " << got.max << " (simulated " << sim.max << "), mean " << got.mean
            << " (simulated " << sim.mean << "), max |O| " << r.amax_o << "\n";
  ASSERT_TRUE(amax.has_value()) << what << ": no amaxes after an FP8 forward";
  // amax_s is the largest probability, computed in FP32 from the same
  // inputs: the reference's, within e4m3's rounding (2^-4) in case cuDNN
  // takes it after P's quantization. (A 1 where the reference's is below it
  // would be the unnormalized exp(s - running max) of the online softmax.)
  EXPECT_NEAR(amax->s, r.amax_p, std::ldexp(r.amax_p, -4)) << what << ": amax_s";
  // amax_o is |O| before O's own rounding: off by P's rounding at most.
  EXPECT_NEAR(amax->o, r.amax_o, 2 * sim.max + floor) << what << ": amax_o";
  std::cout << "  amax_s " << amax->s << " (host " << r.amax_p << "), amax_o " << amax->o << " (host " << r.amax_o
            << ")\n";
}

struct Case {
  const char* name;
  std::int64_t batch, heads, kv_heads, seq, kv_seq, head_dim;
  MaskKind mask;
  std::int64_t window;
  bool bshd;         // Q, K and V [B, S, H, D] in memory
  std::int64_t pad;  // O's rows padded by this many elements
  bool required;     // else "if cuDNN takes it": a refusal in its words is accepted
};

const Case kCases[] = {
    {"causal_2x4x256x128", 2, 4, 4, 256, 256, 128, MaskKind::Causal, 0, false, 0, true},
    {"none_2x4x256x128_bshd", 2, 4, 4, 256, 256, 128, MaskKind::None, 0, true, 0, true},
    {"none_1x2x200x128_kv333", 1, 2, 2, 200, 333, 128, MaskKind::None, 0, true, 1, true},
    {"causal_1x2x200x128_kv333", 1, 2, 2, 200, 333, 128, MaskKind::Causal, 0, false, 0, true},
    {"bottom_right_square_1x4x256x128", 1, 4, 4, 256, 256, 128, MaskKind::CausalBottomRight, 0, false, 0, true},
    {"causal_gqa_2x8x256x128_kv_heads2", 2, 8, 2, 256, 256, 128, MaskKind::Causal, 0, false, 0, false},
    {"none_head_dim64_2x4x256x64", 2, 4, 4, 256, 256, 64, MaskKind::None, 0, false, 0, false},
    {"window64_square_1x4x256x128", 1, 4, 4, 256, 256, 128, MaskKind::SlidingWindow, 64, false, 0, false},
};

class CudnnFp8 : public ::testing::TestWithParam<Case> {};

TEST_P(CudnnFp8, MatchesFloat64OnTheDequantizedInputs) {
  REQUIRE_GPU();
  if (sm_of_device() < 90) GTEST_SKIP() << "FP8 needs sm90; this GPU is sm" << sm_of_device();
  const Case& c = GetParam();
  auto cudnn = cuda::make_cudnn();
  const Problem p = fp8_problem(c.batch, c.heads, c.kv_heads, c.seq, c.kv_seq, c.head_dim, c.mask, c.window);
  const Eligibility el = eligibility_of(*cudnn, p);
  EXPECT_TRUE(one_line(el.reason)) << el.reason;
  if (!el.eligible && !c.required) {
    // In cuDNN's words, naming the graph; or the window, by name, below 9.21.
    const bool named =
        c.mask == MaskKind::SlidingWindow && el.reason.find("takes no sliding window") != std::string::npos;
    EXPECT_TRUE(named || el.reason.rfind("cuDNN FP8 SDPA", 0) == 0) << el.reason;
    GTEST_SKIP() << "cuDNN does not take it: " << el.reason;
  }
  ASSERT_TRUE(el.eligible) << p.describe() << ": " << el.reason;
  const bool o_e4m3 = el.reason.find("O written in e4m3") != std::string::npos;
  EXPECT_TRUE(o_e4m3 || el.reason.find("O written in bf16") != std::string::npos) << el.reason;
  EXPECT_EQ(cudnn->expectation(p).device_activities, o_e4m3 ? 2 : 1);
  EXPECT_FALSE(cudnn->read_fp8_amax().has_value()) << "amaxes before any forward";
  const Inputs host = fp8_inputs(p, c.bshd, 24);
  // The scalar path of the conversion kernel where O's rows are padded to an
  // odd length (the graph writes O itself where it writes bf16: 16-byte rows).
  const std::int64_t pad = o_e4m3 ? c.pad : 8 * c.pad;
  const Tensor out = run_forward(*cudnn, p, host, pad);
  expect_matches(out, reference(p, host, o_e4m3), cudnn->read_fp8_amax(), c.name);
  EXPECT_FALSE(cudnn->read_fp8_amax().has_value()) << "the read resets the amaxes";
}

INSTANTIATE_TEST_SUITE_P(Cuda, CudnnFp8, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

// The descales are data: a call with other descales on the same tensors (a
// cached graph and variant pack) reads them, and so does a call back on the
// first ones; a repeated call gives the same output, bit for bit.
TEST(CudnnFp8Calls, DescalesThatChangeBetweenCallsAreRead) {
  REQUIRE_GPU();
  if (sm_of_device() < 90) GTEST_SKIP() << "FP8 needs sm90; this GPU is sm" << sm_of_device();
  auto cudnn = cuda::make_cudnn();
  const Problem p = fp8_problem(1, 2, 2, 128, 128, 128, MaskKind::Causal);
  const Eligibility el = eligibility_of(*cudnn, p);
  ASSERT_TRUE(el.eligible) << el.reason;
  const bool o_e4m3 = el.reason.find("O written in e4m3") != std::string::npos;
  DeviceRuntime& rt = cuda::runtime();
  RunContext ctx{rt.allocator(), rt.stream(), 0};
  const Inputs host = fp8_inputs(p, false, 7);
  Inputs in = rt.upload(host);
  Tensor out = Tensor::empty({p.batch, p.heads, p.seq, p.head_dim}, DType::BF16, rt.allocator());
  Tensor first;
  for (const float q_factor : {1.0f, 0.5f, 1.0f, 1.0f}) {
    Inputs h = host;
    h.q_descale = host.q_descale * q_factor;
    h.v_descale = host.v_descale * q_factor;
    in.q_descale = h.q_descale;
    in.v_descale = h.v_descale;
    rt.poison(out);
    cudnn->forward(p, in, out, ctx);
    rt.synchronize();
    const Tensor got = rt.download(out);
    expect_matches(got, reference(p, h, o_e4m3), cudnn->read_fp8_amax(), "descales x" + std::to_string(q_factor));
    if (!first.defined()) {
      first = got;
    } else if (q_factor == 1.0f) {
      std::int64_t differ = 0;
      testing::for_each_index(
          got, [&](auto a, auto b, auto c, auto d) { differ += got.get(a, b, c, d) != first.get(a, b, c, d); });
      EXPECT_EQ(differ, 0) << "the same descales again give another output";
    }
  }
}

// Amaxes fold over the calls since the last read: two forwards, one read.
// Two calls, the first with four times the real V: the amaxes read back are
// the last call's (cuDNN 9.19 overwrites them each call), and a read with no
// call since gives none.
TEST(CudnnFp8Calls, AmaxesAreTheLastCallsSinceTheLastRead) {
  REQUIRE_GPU();
  if (sm_of_device() < 90) GTEST_SKIP() << "FP8 needs sm90; this GPU is sm" << sm_of_device();
  auto cudnn = cuda::make_cudnn();
  const Problem p = fp8_problem(1, 2, 2, 128, 128, 128, MaskKind::None);
  ASSERT_TRUE(eligibility_of(*cudnn, p).eligible) << eligibility_of(*cudnn, p).reason;
  const Inputs small = fp8_inputs(p, false, 3);
  Inputs large = small;
  large.v_descale = small.v_descale * 4;  // the same e4m3 V, four times the real values
  const bool o_e4m3 = eligibility_of(*cudnn, p).reason.find("O written in e4m3") != std::string::npos;
  run_forward(*cudnn, p, large);
  const Tensor out = run_forward(*cudnn, p, small);
  const Reference r_small = reference(p, small, o_e4m3), r_large = reference(p, large, o_e4m3);
  const std::optional<Fp8Amax> a = cudnn->read_fp8_amax();
  ASSERT_TRUE(a.has_value());
  const double tolerance = 2 * errors(r_small.sim, r_small.o).max + std::ldexp(r_small.amax_o, -8);
  EXPECT_NEAR(a->o, r_small.amax_o, tolerance) << "the last call's amax_o";
  EXPECT_LT(a->o, 0.5 * r_large.amax_o) << "not the first call's (four times larger)";
  EXPECT_FALSE(cudnn->read_fp8_amax().has_value()) << "no forward since the last read";
  const Errors e = errors(out, r_small.o);
  EXPECT_EQ(e.nan, 0);
}

TEST(CudnnFp8Refusals, EachInOneLine) {
  REQUIRE_GPU();
  auto cudnn = cuda::make_cudnn();
  const int sm = sm_of_device();
  const auto refused = [&](const Problem& p, const std::string& words) {
    const Eligibility el = eligibility_of(*cudnn, p);
    EXPECT_FALSE(el.eligible) << p.describe();
    EXPECT_NE(el.reason.find(words), std::string::npos) << p.describe() << ": " << el.reason;
    EXPECT_TRUE(one_line(el.reason)) << el.reason;
  };
  const Problem base = fp8_problem(1, 2, 2, 128, 128, 128, MaskKind::Causal);
  if (sm < 90) {
    refused(base, "needs sm90 (Hopper) or newer");
    return;
  }
  for (Pass pass : {Pass::Backward, Pass::Train}) {
    Problem p = base;
    p.pass = pass;
    refused(p, "cudnn's fp8 path is forward only");
  }
  refused(varlen_problem(base, {30, 50}), "packed (variable-length) batches are not built for cudnn in fp8");
  Problem capped = base;
  capped.softcap = 30;
  refused(capped, "a soft cap is not built for cudnn in fp8");
  Problem paged = base;
  paged.kv_cache = KvCache::Paged;
  paged.page_size = 16;
  refused(paged, "a paged KV cache is not built for cudnn in fp8");
  for (MaskKind m : {MaskKind::Bias, MaskKind::Boolean}) {
    Problem p = base;
    p.mask = m;
    refused(p, "cuDNN's FP8 SDPA takes no bias");
  }
  if (sm < 100) {
    refused(fp8_problem(1, 2, 2, 128, 256, 128, MaskKind::CausalBottomRight),
            "takes the bottom-right diagonal (mask=causal-bottom-right with kv_seq != seq) on sm100 and newer only");
  }
  // cuDNN's own words, naming the graph: a head_dim that is no multiple of 16.
  refused(fp8_problem(1, 2, 2, 128, 128, 72, MaskKind::None), "cuDNN FP8 SDPA: ");

  // A descale of zero or not finite, and 16-bit inputs in an fp8 problem, at the call.
  DeviceRuntime& rt = cuda::runtime();
  RunContext ctx{rt.allocator(), rt.stream(), 0};
  ASSERT_TRUE(eligibility_of(*cudnn, base).eligible) << eligibility_of(*cudnn, base).reason;
  const Inputs good = rt.upload(fp8_inputs(base, false, 1));
  Tensor out = Tensor::empty({1, 2, 128, 128}, DType::BF16, rt.allocator());
  const auto fails = [&](const Inputs& in, const std::string& words) {
    try {
      cudnn->forward(base, in, out, ctx);
      ADD_FAILURE() << "taken: " << words;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
      EXPECT_TRUE(one_line(e.what())) << e.what();
    }
  };
  for (float bad : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    Inputs in = good;
    in.k_descale = bad;
    fails(in, "cudnn: k_descale must be finite and positive");
  }
  Inputs wide = good;
  wide.q = Tensor::empty({1, 2, 128, 128}, DType::BF16, rt.allocator());
  fails(wide, "cudnn: dtype=fp8 reads an e4m3 CUDA q");
}

}  // namespace
}  // namespace attnprof
