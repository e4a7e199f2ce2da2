// The acceptance rule of DESIGN.md (attnprof/reference.h): a backend's error against the float64 reference passes
// at 2 x math's error plus the dtype's floor (FP32: the floor alone), never with an unexplained NaN or inf.
#include <cmath>
#include <cstdio>
#include <optional>

#include "attnprof/reference.h"

namespace attnprof {

double tolerance_floor(DType dtype) {
  switch (dtype) {
    case DType::F32:
      return 2e-5;  // "far under 1e-4"
    case DType::F16:
      return 1e-3;
    case DType::BF16:
      return 5e-3;
    case DType::F8E4M3:
      // e4m3 keeps 3 mantissa bits: its unit roundoff (half the relative
      // step at the top of a binade) is 2^-4. Rounding errors spread
      // uniformly over +-u have an RMS of u / sqrt(3), the most one rounding
      // of every element can add to a relative (RMS) error: 3.6e-2. The
      // floor allows a backend one such rounding beyond what math pays for
      // the inputs (P quantized to e4m3 for P V, as FlashAttention-3
      // and cuDNN's FP8 graphs do), and the bf16 output's 2^-8 is inside it.
      return 0x1p-4 / std::sqrt(3.0);
    default:
      return 0;
  }
}

Acceptance accept(DType dtype, const ErrorStats& e, std::optional<double> math_rel, bool nan_allowed_on_masked_rows) {
  Acceptance a;
  char buf[160];
  if (e.nonfinite_hidden > 0) {
    std::snprintf(buf, sizeof buf, "finite output in %lld checked elements where the reference is NaN or inf",
                  static_cast<long long>(e.nonfinite_hidden));
    a.why = buf;
    return a;
  }
  if (e.nan_rows > 0) {
    const bool documented = nan_allowed_on_masked_rows && e.nan_rows == e.nan_rows_fully_masked;
    if (!documented) {
      std::snprintf(buf, sizeof buf, "NaN in %lld checked rows", static_cast<long long>(e.nan_rows));
      a.why = buf;
      return a;
    }
  }
  const double floor = tolerance_floor(dtype);
  a.tolerance = (dtype == DType::F32 || !math_rel) ? (dtype == DType::F32 ? floor : 2 * floor) : 2 * *math_rel + floor;
  a.pass = e.rel <= a.tolerance;
  if (dtype != DType::F32 && math_rel) {
    std::snprintf(buf, sizeof buf,
                  is_fp8(dtype) ? "rel %.2e %s 2 x %.2e (math) + %.1e" : "rel %.2e %s 2 x %.2e (math) + %.0e", e.rel,
                  a.pass ? "<=" : ">", *math_rel, floor);
  } else {
    std::snprintf(buf, sizeof buf, "rel %.2e %s %.1e", e.rel, a.pass ? "<=" : ">", a.tolerance);
  }
  a.why = buf;
  if (e.nan_rows > 0) a.why += " (NaN on fully masked rows, as documented)";
  return a;
}

}  // namespace attnprof
