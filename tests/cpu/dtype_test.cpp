// 16-bit conversions: bf16 and fp16 against independent nearest-even encoders.
#include "attnprof/dtype.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "attnprof/backend.h"
#include "attnprof/error.h"
#include "attnprof/problem.h"
#include "attnprof/profiler.h"
#include "attnprof/reference.h"
#include "attnprof/tensor.h"

namespace attnprof {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
float from_bits(std::uint32_t u) { return std::bit_cast<float>(u); }
std::uint32_t bits(float f) { return std::bit_cast<std::uint32_t>(f); }

// ---------------------------------------------------------------- bf16 / fp16

// Independent nearest-even reference for bf16: the two neighbours by truncation,
// compared in double.
std::uint16_t bf16_reference(float f) {
  const std::uint32_t u = bits(f);
  const auto lo = static_cast<std::uint16_t>(u >> 16);
  const auto hi = static_cast<std::uint16_t>(lo + 1);
  const double x = f;
  const double dlo = std::abs(x - static_cast<double>(from_bits(static_cast<std::uint32_t>(lo) << 16)));
  const double dhi = std::abs(x - static_cast<double>(from_bits(static_cast<std::uint32_t>(hi) << 16)));
  if (dlo < dhi) return lo;
  if (dhi < dlo) return hi;
  return (lo & 1u) ? hi : lo;
}

// Independent fp16 decoder (value of a finite half) and nearest-even encoder.
double half_value(std::uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  const double mag = e == 0 ? std::ldexp(m, -24) : std::ldexp(1.0 + m / 1024.0, e - 15);
  return s ? -mag : mag;
}

std::uint16_t f16_reference(float f) {
  const double x = std::abs(static_cast<double>(f));
  const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  // Past the midpoint of 65504 and 65536 (and at it: 0x7bff is odd) it is infinity.
  if (x >= 65520.0) return sign | 0x7c00;
  // Binary search over the positive finite halves 0x0000 .. 0x7bff (monotone in bits).
  int lo = 0, hi = 0x7bff;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (half_value(static_cast<std::uint16_t>(mid)) <= x) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  const double dlo = x - half_value(static_cast<std::uint16_t>(lo));
  const double dhi = half_value(static_cast<std::uint16_t>(hi)) - x;
  int pick = dlo < dhi ? lo : (dhi < dlo ? hi : ((lo & 1) ? hi : lo));
  if (half_value(static_cast<std::uint16_t>(hi)) == x) pick = hi;
  return static_cast<std::uint16_t>(sign | pick);
}

TEST(Bf16, ExactValuesRoundTripForEveryNonNanPattern) {
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    const float f = bf16_to_float(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_bf16(f), h) << std::hex << h;
  }
}

TEST(Bf16, KnownEncodings) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_float(0x4049), 3.140625f);
}

TEST(Bf16, RoundsToNearestEven) {
  // 1 + 2^-8 is halfway between 1 (0x3f80, even) and 1 + 2^-7 (0x3f81): even wins.
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f), 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 0x3f81 (odd) and 0x3f82 (even).
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
  // Just above a halfway point rounds up, just below rounds down.
  EXPECT_EQ(float_to_bf16(from_bits(bits(1.0f + 0x1p-8f) + 1)), 0x3f81);
  EXPECT_EQ(float_to_bf16(from_bits(bits(1.0f + 0x1p-8f) - 1)), 0x3f80);
  // Negative values mirror.
  EXPECT_EQ(float_to_bf16(-(1.0f + 0x1p-8f)), 0xbf80);
  EXPECT_EQ(float_to_bf16(-(1.0f + 3 * 0x1p-8f)), 0xbf82);
  // Rounding may carry into the exponent; the largest float rounds to infinity.
  EXPECT_EQ(float_to_bf16(from_bits(0x3fffffff)), 0x4000);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
}

TEST(Bf16, MatchesIndependentNearestEvenOnRandomFloats) {
  std::mt19937 rng(7);
  for (int n = 0; n < 200000; ++n) {
    const float f = from_bits(rng());
    if (!std::isfinite(f)) continue;
    const float max_bf16 = from_bits(0x7f7f0000);
    if (std::abs(f) > max_bf16) continue;  // overflow is covered above
    ASSERT_EQ(float_to_bf16(f), bf16_reference(f)) << std::hexfloat << f;
  }
}

TEST(Bf16, InfinityAndNanPreserved) {
  EXPECT_EQ(float_to_bf16(kInf), 0x7f80);
  EXPECT_EQ(float_to_bf16(-kInf), 0xff80);
  EXPECT_TRUE(std::isinf(bf16_to_float(float_to_bf16(kInf))));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(kNaN))));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(-kNaN))));
  // A NaN whose payload lives only in the low 16 bits must not become infinity.
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(from_bits(0x7f800001)))));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(from_bits(0xff800001)))));
  // Nor may rounding of a NaN carry it into a different sign.
  EXPECT_EQ(float_to_bf16(from_bits(0x7fffffff)) & 0x8000, 0);
}

TEST(Fp16, ExactValuesRoundTripForEveryNonNanPattern) {
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    const float f = f16_to_float(static_cast<std::uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_f16(f), h) << std::hex << h;
    if (!std::isinf(f)) ASSERT_EQ(static_cast<double>(f), half_value(static_cast<std::uint16_t>(h))) << std::hex << h;
  }
}

TEST(Fp16, KnownEncodings) {
  EXPECT_EQ(float_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_f16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_f16(0x1p-14f), 0x0400);  // smallest normal
  EXPECT_EQ(float_to_f16(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f16_to_float(0x3555), 0x1.554p-2f);
}

TEST(Fp16, RoundsToNearestEven) {
  EXPECT_EQ(float_to_f16(1.0f + 0x1p-11f), 0x3c00);      // halfway, even below
  EXPECT_EQ(float_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);  // halfway, even above
  EXPECT_EQ(float_to_f16(from_bits(bits(1.0f + 0x1p-11f) + 1)), 0x3c01);
  // Overflow: 65519 rounds down to the largest half, 65520 (halfway, odd below) to infinity.
  EXPECT_EQ(float_to_f16(65519.0f), 0x7bff);
  EXPECT_EQ(float_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(float_to_f16(-65520.0f), 0xfc00);
  EXPECT_EQ(float_to_f16(1e10f), 0x7c00);
  // Subnormals: 2^-25 is halfway between 0 and 2^-24 (even: 0); 3 * 2^-25 between 1 and 2 (even: 2).
  EXPECT_EQ(float_to_f16(0x1p-25f), 0x0000);
  EXPECT_EQ(float_to_f16(from_bits(bits(0x1p-25f) + 1)), 0x0001);
  EXPECT_EQ(float_to_f16(3 * 0x1p-25f), 0x0002);
  EXPECT_EQ(float_to_f16(0x1p-26f), 0x0000);
  EXPECT_EQ(float_to_f16(-0x1p-30f), 0x8000);
  // The largest subnormal rounding up carries into the smallest normal.
  EXPECT_EQ(float_to_f16(0x1p-14f - 0x1p-26f), 0x0400);
}

TEST(Fp16, MatchesIndependentNearestEvenOnRandomFloats) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> mag(-30.0f, 17.0f);
  for (int n = 0; n < 100000; ++n) {
    // Magnitudes spread over the whole fp16 range, subnormals and overflow included.
    const float f = std::exp2(mag(rng)) * ((rng() & 1) ? -1.0f : 1.0f) * (1.0f + (rng() % 1000) / 1000.0f);
    ASSERT_EQ(float_to_f16(f), f16_reference(f)) << std::hexfloat << f;
  }
  for (int n = 0; n < 100000; ++n) {  // and exact halfway points between neighbouring halves
    const auto h = static_cast<std::uint16_t>(rng() % 0x7bff);
    const double mid = (half_value(h) + half_value(static_cast<std::uint16_t>(h + 1))) / 2;
    const float f = static_cast<float>(mid);
    if (static_cast<double>(f) != mid) continue;
    const std::uint16_t want = (h & 1) ? static_cast<std::uint16_t>(h + 1) : h;
    ASSERT_EQ(float_to_f16(f), want) << std::hex << h;
  }
}

TEST(Fp16, InfinityAndNanPreserved) {
  EXPECT_EQ(float_to_f16(kInf), 0x7c00);
  EXPECT_EQ(float_to_f16(-kInf), 0xfc00);
  EXPECT_TRUE(std::isinf(f16_to_float(0x7c00)));
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(kNaN))));
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(from_bits(0x7f800001)))));  // payload below fp16's bits
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(from_bits(0xffc00000)))));
}

TEST(DType, LoadAndStoreThroughFloat) {
  std::uint16_t h[2] = {};
  store_from_float(h, DType::BF16, 1, 1.0f + 0x1p-8f);
  EXPECT_EQ(h[1], 0x3f80);
  EXPECT_EQ(load_as_float(h, DType::BF16, 1), 1.0f);
  store_from_float(h, DType::F16, 0, 0.5f);
  EXPECT_EQ(load_as_float(h, DType::F16, 0), 0.5f);
  EXPECT_EQ(parse_dtype("bf16"), DType::BF16);
  EXPECT_EQ(parse_dtype("float16"), DType::F16);
  EXPECT_EQ(parse_dtype("fp32"), DType::F32);
  for (const char* fp8 : {"fp8", "e4m3", "float8_e4m3fn"}) EXPECT_EQ(parse_dtype(fp8), DType::F8E4M3) << fp8;
  EXPECT_FALSE(parse_dtype("fp4").has_value());
  EXPECT_FALSE(parse_dtype("float8_e5m2").has_value());
  EXPECT_FALSE(parse_dtype("bool").has_value());
  std::uint8_t b[2] = {};
  store_from_float(b, DType::F8E4M3, 1, 1.0f + 0x1p-4f);  // a tie: to the even 1.0
  EXPECT_EQ(b[1], 0x38);
  EXPECT_EQ(load_as_float(b, DType::F8E4M3, 1), 1.0f);
}

// ---- e4m3 (OCP e4m3fn) -------------------------------------------------------

// Every finite e4m3 value and its bits, from the format's definition written
// out plainly: 1 sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0
// subnormal (m x 2^-9); S.1111.111 the NaNs; no infinities.
struct E4m3Value {
  std::uint8_t bits;
  double value;
};

std::vector<E4m3Value> finite_e4m3() {
  std::vector<E4m3Value> out;
  for (int b = 0; b < 256; ++b) {
    const int e = (b >> 3) & 0xf, m = b & 7;
    if (e == 15 && m == 7) continue;
    const double mag = e == 0 ? m * std::ldexp(1.0, -9) : (1.0 + m / 8.0) * std::ldexp(1.0, e - 7);
    out.push_back({static_cast<std::uint8_t>(b), (b & 0x80) ? -mag : mag});
  }
  return out;
}

// The nearest finite e4m3 value by search over the magnitudes, ties to the
// even mantissa, past 448 the largest (saturation), then x's sign: what
// float_to_e4m3 must give.
std::uint8_t nearest_e4m3(const std::vector<E4m3Value>& all, double x) {
  const std::uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  const double a = std::abs(x);
  if (a > 448.0) return sign | 0x7e;
  const E4m3Value* best = nullptr;
  for (const E4m3Value& v : all) {
    if (v.bits & 0x80) continue;
    const double d = std::abs(a - v.value);
    if (best == nullptr || d < std::abs(a - best->value) || (d == std::abs(a - best->value) && (v.bits & 1) == 0)) {
      best = &v;
    }
  }
  return sign | best->bits;
}

TEST(E4m3, EveryValueRoundTripsAndTheNaNsStayNaN) {
  for (int b = 0; b < 256; ++b) {
    const auto bits = static_cast<std::uint8_t>(b);
    const float f = e4m3_to_float(bits);
    if ((b & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(f)) << b;
      EXPECT_EQ(float_to_e4m3(f) & 0x7f, 0x7f) << b;
      continue;
    }
    EXPECT_EQ(float_to_e4m3(f), bits) << b << " = " << f;
  }
  for (const E4m3Value& v : finite_e4m3()) EXPECT_EQ(double{e4m3_to_float(v.bits)}, v.value) << int{v.bits};
  EXPECT_EQ(e4m3_to_float(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), 0x1p-9f);
  EXPECT_EQ(max_finite(DType::F8E4M3), 448.0);
  EXPECT_EQ(element_size(DType::F8E4M3), 1u);
  EXPECT_EQ(output_dtype(DType::F8E4M3), DType::BF16);
  EXPECT_EQ(output_dtype(DType::F16), DType::F16);
}

// Round to nearest even against the search, at every value, every midpoint
// between neighbours and the floats either side of it, and points between;
// past 448 saturating (as cvt.rn.satfinite does), infinities included.
TEST(E4m3, RoundsToNearestEvenAndSaturatesAsTheSearchSays) {
  const std::vector<E4m3Value> all = finite_e4m3();
  std::vector<double> mags;
  for (const E4m3Value& v : all) {
    if (!(v.bits & 0x80)) mags.push_back(v.value);
  }
  std::sort(mags.begin(), mags.end());
  mags.push_back(480.0);  // where the next value would be: everything up to it and past
  std::vector<float> xs;
  for (std::size_t i = 0; i + 1 < mags.size(); ++i) {
    const float lo = static_cast<float>(mags[i]), hi = static_cast<float>(mags[i + 1]);
    const float mid = static_cast<float>((mags[i] + mags[i + 1]) / 2);  // exact in FP32
    for (const float x : {lo, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f), std::nextafter(lo, 1e9f)})
      xs.push_back(x);
    for (int k = 1; k < 16; ++k) xs.push_back(lo + (hi - lo) * static_cast<float>(k) / 16.0f);
  }
  for (const float x : {0x1p-12f, 0x1p-10f, std::nextafter(0x1p-10f, 1.0f), 1e-30f, 500.0f, 1e6f, 3e38f}) {
    xs.push_back(x);
  }
  std::size_t checked = 0;
  for (const float m : xs) {
    for (const float x : {m, -m}) {
      ASSERT_EQ(float_to_e4m3(x), nearest_e4m3(all, x)) << x;
      ++checked;
    }
  }
  EXPECT_GT(checked, 5000u);
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(float_to_e4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(float_to_e4m3(464.0f), 0x7e) << "the midpoint past 448 saturates too";
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(float_to_e4m3(0x1p-10f), 0x00) << "half the smallest subnormal: a tie, to even zero";
  EXPECT_EQ(float_to_e4m3(0x1p-10f * 3), 0x02) << "1.5 x 2^-9: a tie, to the even 2 x 2^-9";
}

// The row conversions (load_run_as_float, store_run_from_float) give what the
// element functions give, for every dtype, unit and strided, on values that
// round (ties), saturate, overflow, and NaN.
TEST(DtypeRuns, MatchTheElementConversionsForEveryDtypeAndStride) {
  std::vector<float> values = {0.0f,    -0.0f, 1.0f,  -2.5f, 1.00390625f, 1.01171875f, 65504.0f, 70000.0f,
                               3.0e38f, kInf,  -kInf, kNaN,  1e-8f,       -1e-40f,     448.0f,   500.0f};
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 100.0f);
  while (values.size() < 67) values.push_back(normal(rng));  // an odd count: the vector loops' tails
  const auto n = static_cast<std::int64_t>(values.size());
  for (const DType t : {DType::F32, DType::BF16, DType::F16, DType::F8E4M3}) {
    for (const std::int64_t inc : {std::int64_t{1}, std::int64_t{3}}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " inc " + std::to_string(inc));
      const std::size_t bytes = static_cast<std::size_t>(n * inc + 5) * element_size(t);
      std::vector<unsigned char> run(bytes, 0xa5), each(bytes, 0xa5);
      store_run_from_float(run.data(), t, 5, n, inc, values.data());
      for (std::int64_t c = 0; c < n; ++c)
        store_from_float(each.data(), t, 5 + c * inc, values[static_cast<std::size_t>(c)]);
      EXPECT_EQ(run, each) << "the stored bytes (and the untouched ones between strided elements)";
      std::vector<float> loaded(static_cast<std::size_t>(n), -7.0f);
      load_run_as_float(run.data(), t, 5, n, inc, loaded.data());
      for (std::int64_t c = 0; c < n; ++c) {
        const float want = load_as_float(each.data(), t, 5 + c * inc);
        const float got = loaded[static_cast<std::size_t>(c)];
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(got)) << c;
        } else {
          EXPECT_EQ(bits(got), bits(want)) << c;
        }
      }
    }
  }
}

}  // namespace
}  // namespace attnprof
