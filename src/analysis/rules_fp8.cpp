// FP8 runs (dtype fp8): the descales the inputs were stored with, the error
// FP8 adds over the same backend's bf16 error on the same real inputs, the
// inputs' range past e4m3's (saturation), and the composites' dequantize.
#include <string>

#include "analysis/format.h"
#include "analysis/normalize.h"
#include "analysis/rule_support.h"

namespace attnprof::analysis {

using namespace rule_support;

namespace {

const Fp8Record* fp8_record(const RuleInput& in) {
  const RunResult& r = in.run;
  return r.source.empty() && r.fp8 ? &*r.fp8 : nullptr;
}

}  // namespace

// What the inputs were stored with, and the error FP8 costs this backend:
// its FP8 run's error against float64 on the real values, beside its bf16
// run's on the same real values (or why there is none).
std::vector<Finding> fp8_quantization(const RuleInput& in) {
  const Fp8Record* rec = fp8_record(in);
  if (rec == nullptr) return {};
  std::string descales;
  Finding f;
  for (const Fp8TensorQuantization& t : rec->tensors) {
    descales += (descales.empty() ? "" : ", ") + t.name + format(" %.3g", t.descale);
    f.figures[t.name + "_descale"] = t.descale;
    f.figures[t.name + "_amax"] = t.amax;
  }
  f.text = "fp8 (e4m3) inputs, descales " + descales + (rec->auto_descale ? " (amax / 448 per tensor)" : " (fixed)");
  const auto& e = in.run.error;
  if (e && rec->bf16_error) {
    const double bf16 = rec->bf16_error->rel;
    f.text += format(": error %.2e", e->rel) + format(" against bf16's %.2e on the same real inputs", bf16);
    if (bf16 > 0) f.text += format(" (%.0fx)", e->rel / bf16);
    f.figures["rel_error"] = e->rel;
    f.figures["bf16_rel_error"] = bf16;
    f.figures["added_rel_error"] = e->rel - bf16;
  } else if (!rec->bf16_note.empty()) {
    f.text += "; no bf16 error beside it: " + rec->bf16_note;
  }
  if (rec->measured_amax) {
    f.text += format("; its FP8 graph measured amax(P) %.3g", rec->measured_amax->s) +
              format(", amax(O) %.3g", rec->measured_amax->o);
    f.figures["amax_s"] = rec->measured_amax->s;
    f.figures["amax_o"] = rec->measured_amax->o;
  }
  return {f};
}

// A tensor whose real values pass 448 x its descale: e4m3 holds none of
// them, and each is stored as +-448 (saturated), whatever it was.
std::vector<Finding> fp8_saturation(const RuleInput& in) {
  const Fp8Record* rec = fp8_record(in);
  if (rec == nullptr) return {};
  std::vector<Finding> out;
  for (const Fp8TensorQuantization& t : rec->tensors) {
    if (t.saturated == 0) continue;
    const double share =
        t.elements > 0 ? 100.0 * static_cast<double>(t.saturated) / static_cast<double>(t.elements) : 0;
    Finding f = found("fp8 overflow: " + t.name + "'s values reach " + format("%.3g", t.amax) +
                      format(", past e4m3's 448 x its descale %.3g", t.descale) + format(" = %.3g", 448.0 * t.descale) +
                      ": " + std::to_string(t.saturated) + " of " + std::to_string(t.elements) +
                      format(" values (%.2g%%) saturated to +-448 x descale", share) +
                      "; the automatic descale (amax / 448) keeps them in range");
    f.figures = {{"amax", t.amax},
                 {"descale", t.descale},
                 {"saturated", static_cast<double>(t.saturated)},
                 {"elements", static_cast<double>(t.elements)},
                 {"saturated_pct", share}};
    out.push_back(std::move(f));
  }
  return out;
}

// The composites' FP8 semantics in the trace: e4m3 tensors widened to FP32
// (dequantize) before FP32 products. Only dequantizes of fp8 inputs count
// (aten::dequantize of an int8 model's tensors is another story).
std::vector<Finding> fp8_dequantize(const RuleInput& in) {
  const TraceIndex& ix = in.index;
  std::vector<EventIndex> fp8;
  for (const EventIndex i : ix.ops_named("dequantize")) {
    if (first_dtype(ix.dtypes(i)) == "fp8") fp8.push_back(i);
  }
  const int n = static_cast<int>(fp8.size()) / in.steps;
  if (n == 0) return {};
  Finding f = found("dequantizes " + std::to_string(n) + " fp8 tensors to FP32 " + per_call(ix) +
                    " (e4m3 x descale), then computes in FP32");
  cite(f, ix, fp8.front());
  f.figures = {{"dequantizes_per_forward", n}};
  return {f};
}

}  // namespace attnprof::analysis
