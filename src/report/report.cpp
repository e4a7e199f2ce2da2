#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "analysis/format.h"
#include "attnprof/error.h"
#include "attnprof/trace_io.h"
#include "report/json.h"
#include "report/text_table.h"

namespace attnprof {
using analysis::bytes_str;
using analysis::format;

using report_text::time_str;

std::string compare_table(const std::vector<RunResult>& results) {
  const bool gpu = !results.empty() && results.front().problem.device == Device::Cuda;
  // Per call of the pass: "fwd", "bwd" or "step" (a training step).
  const Pass pass = results.empty() ? Pass::Forward : results.front().problem.pass;
  const std::string per = pass == Pass::Forward ? "/fwd" : pass == Pass::Backward ? "/bwd" : "/step";
  struct Row {
    std::vector<std::string> cells;
    std::vector<std::string> findings;
  };
  std::vector<std::string> header = {"backend",      (gpu ? "kernels" : "ops") + per,
                                     "copies" + per, gpu ? "GPU time" : "time",
                                     "CPU/call",     "peak mem",
                                     "TFLOP/s",      "% ceiling",
                                     "rel error",    "occupancy"};
  // FP8: each backend's error on the same real inputs in bf16, beside its FP8 one.
  const bool fp8 = !results.empty() && is_fp8(results.front().problem.dtype);
  if (fp8) header.insert(header.begin() + 9, "bf16 error");
  // --gpus: each GPU's busy time, a column only when a run was sharded.
  const bool per_rank = std::any_of(results.begin(), results.end(),
                                    [](const RunResult& r) { return !r.metrics.device_time_per_rank_us.empty(); });
  if (per_rank) header.push_back("GPU time per rank");
  std::vector<Row> rows;
  for (const auto& r : results) {
    Row row;
    if (!r.eligibility.eligible || r.failure) {
      row.cells = {r.backend, "-", "-", "-", "-", "-", "-", "-", "-", "-"};
      if (fp8) row.cells.push_back("-");
      if (per_rank) row.cells.push_back("-");
      row.findings = {r.failure ? "failed: " + *r.failure : r.eligibility.reason};
      rows.push_back(row);
      continue;
    }
    const Metrics& m = r.metrics;
    std::string err = r.error ? format("%.2e", r.error->rel) : "-";
    if (r.error && r.error->nan_rows) err += " NaN";
    if (r.acceptance) err += r.acceptance->pass ? " ok" : " FAIL";
    row.cells = {r.backend,
                 gpu ? report_text::opt("%.0f", m.kernels_per_forward) : format("%.0f", m.ops_per_forward),
                 format("%.0f", m.copies_per_forward),
                 m.device_time_us ? time_str(*m.device_time_us) : "-",
                 time_str(m.host_time_unprofiled_us.value_or(m.host_time_us)),
                 bytes_str(static_cast<double>(m.peak_bytes)),
                 report_text::opt(m.tflops && *m.tflops < 1 ? "%.3f" : "%.1f", m.tflops),
                 report_text::opt("%.1f%%", m.ceiling_pct),
                 err,
                 report_text::opt("%.0f%%", m.occupancy_pct)};
    if (fp8) {
      const auto& bf16 = r.fp8 ? r.fp8->bf16_error : std::nullopt;
      row.cells.insert(row.cells.begin() + 9, bf16 ? format("%.2e", bf16->rel) + (bf16->nan_rows ? " NaN" : "") : "-");
    }
    if (per_rank) {
      std::string ranks;
      for (double us : m.device_time_per_rank_us) ranks += (ranks.empty() ? "" : " / ") + time_str(us);
      row.cells.push_back(ranks.empty() ? "-" : ranks);
    }
    if (m.world_size > 1) row.cells.front() += " x" + std::to_string(m.world_size) + " GPUs";
    for (const auto& f : r.findings) row.findings.push_back(f.text);
    rows.push_back(row);
  }
  std::vector<std::size_t> w(header.size());
  for (std::size_t i = 0; i < header.size(); ++i) w[i] = header[i].size();
  for (const auto& row : rows) {
    for (std::size_t i = 0; i < row.cells.size(); ++i) w[i] = std::max(w[i], row.cells[i].size());
  }
  std::ostringstream os;
  auto line = [&](const std::vector<std::string>& cells, const std::string& tail) {
    for (std::size_t i = 0; i < cells.size(); ++i) {
      os << cells[i] << std::string(w[i] - cells[i].size() + 2, ' ');
    }
    os << tail << "\n";
  };
  line(header, "what the trace shows");
  std::size_t total = 0;
  for (auto x : w) total += x + 2;
  os << std::string(total + 20, '-') << "\n";
  for (const auto& row : rows) {
    line(row.cells, row.findings.empty() ? "" : row.findings.front());
    for (std::size_t k = 1; k < row.findings.size(); ++k) os << std::string(total, ' ') << row.findings[k] << "\n";
  }
  if (std::any_of(results.begin(), results.end(),
                  [](const RunResult& r) { return r.metrics.host_time_unprofiled_us; })) {
    os << "CPU/call: median host time of calls made back to back with no profiler attached; the trace's forward "
          "ranges,\n"
          "taken under CUPTI's API tracing, are longer (host_time_us against host_time_unprofiled_us in the JSON).\n";
  }
  return os.str();
}

std::string profile_summary(const RunResult& r) {
  const Problem& p = r.problem;
  const Metrics& m = r.metrics;
  std::string unprofiled;
  if (m.host_time_unprofiled_us) {
    unprofiled = format(" (%.1f us with no profiler attached", *m.host_time_unprofiled_us);
    if (m.host_time_unprofiled_p10_us && m.host_time_unprofiled_p90_us) {
      unprofiled +=
          format(", p10-p90 %.1f", *m.host_time_unprofiled_p10_us) + format("-%.1f", *m.host_time_unprofiled_p90_us);
    }
    unprofiled += ")";
  }
  const bool gpu = p.device == Device::Cuda;
  const std::string count = !gpu                    ? format("%.1f", m.ops_per_forward)
                            : m.kernels_per_forward ? format("%.1f", *m.kernels_per_forward)
                                                    : std::string("not counted");
  const std::string per = p.pass == Pass::Train ? "training step" : std::string(pass_name(p.pass));
  std::string out = "per " + per + ": " + (gpu ? "GPU activities " : "ops ") + count +
                    format(", copies %.0f", m.copies_per_forward) +
                    format(", time %.1f us", m.device_time_us.value_or(0)) + format(", host %.1f us", m.host_time_us) +
                    unprofiled + format(", peak %.1f MiB", static_cast<double>(m.peak_bytes) / (1024.0 * 1024.0)) +
                    (m.tflops ? format(", %.3g TFLOP/s", *m.tflops) : std::string()) + "\n";
  if (r.error && r.acceptance) {
    out += std::string("error vs float64") + (r.gradient_errors ? " (the worst of dQ, dK and dV)" : "") + ": " +
           (r.acceptance->pass ? "ok" : "OVER TOLERANCE") + " (" + r.acceptance->why + ")";
    if (r.fp8 && r.fp8->bf16_error) out += format(" (bf16 on the same real inputs: %.2e)", r.fp8->bf16_error->rel);
    out += "\n";
  }
  for (const auto& f : r.findings) out += "- " + f.text + "\n";
  return out;
}

std::string ExplainReport::table() const {
  std::ostringstream os;
  std::size_t w = 7;
  for (const auto& r : rows) w = std::max(w, r.backend.size());
  for (const auto& r : rows) {
    os << r.backend << std::string(w - r.backend.size() + 2, ' ') << (r.eligible ? "eligible      " : "not eligible  ")
       << r.reason << "\n";
  }
  if (chosen) os << "auto" << std::string(w - 2, ' ') << "picks " << chosen->backend << ": " << chosen->reason << "\n";
  if (!cuda_build.empty()) os << "\nbuild: " << cuda_build << "\n";
  return os.str();
}

std::string ExplainReport::json() const { return report::explain_json(*this).dump(2) + "\n"; }

std::string problem_json(const Problem& p) { return report::problem_json(p).dump(2) + "\n"; }

namespace report {

nlohmann::json problem_json(const Problem& p) {
  nlohmann::json j = {{"batch", p.batch},
                      {"heads", p.heads},
                      {"kv_heads", p.kv_heads},
                      {"seq", p.seq},
                      {"kv_seq", p.kv_seq},
                      {"head_dim", p.head_dim},
                      {"dtype", dtype_name(p.dtype)},
                      {"mask", mask_name(p.mask)},
                      {"scale", p.softmax_scale()},
                      {"device", device_name(p.device)},
                      {"flops", p.flops()},
                      {"io_bytes", p.io_bytes()},
                      {"pass", pass_name(p.pass)},
                      {"deterministic", p.deterministic}};
  j["window"] = p.mask == MaskKind::SlidingWindow ? nlohmann::json(p.window) : nlohmann::json(nullptr);
  j["softcap"] = p.softcap > 0 ? nlohmann::json(p.softcap) : nlohmann::json(nullptr);
  j["kv_cache"] = kv_cache_name(p.kv_cache);
  j["page_size"] = p.kv_cache == KvCache::Paged ? nlohmann::json(p.page_size) : nlohmann::json(nullptr);
  // A packed batch: its lengths, and the padded batch's FLOPs beside its own.
  j["seq_lens"] = p.varlen() ? nlohmann::json(p.seq_lens) : nlohmann::json(nullptr);
  j["kv_seq_lens"] =
      p.varlen() ? nlohmann::json(p.kv_seq_lens.empty() ? p.seq_lens : p.kv_seq_lens) : nlohmann::json(nullptr);
  j["padded_flops"] = p.varlen() ? nlohmann::json(p.padded().flops()) : nlohmann::json(nullptr);
  return j;
}

nlohmann::json finding_json(const Finding& f) {
  using nlohmann::json;
  json evidence = json::array();
  for (const auto& e : f.evidence) {
    evidence.push_back({{"index", e.index},
                        {"name", e.name},
                        {"cat", e.category},
                        {"ts", e.ts_us},
                        {"dur", e.dur_us},
                        {"correlation", e.correlation ? json(e.correlation) : json(nullptr)}});
  }
  json figures = json::object();
  for (const auto& [k, v] : f.figures) figures[k] = v;
  return {{"rule", f.rule},
          {"severity", severity_name(f.severity)},
          {"text", f.text},
          {"evidence", std::move(evidence)},
          {"figures", std::move(figures)}};
}

nlohmann::json result_json(const RunResult& r) {
  using nlohmann::json;
  const bool ran = r.eligibility.eligible && !r.failure && r.metrics.steps > 0;
  json j;
  j["backend"] = r.backend;
  j["eligible"] = r.eligibility.eligible;
  j["reason"] = r.failure ? *r.failure : r.eligibility.reason;
  j["failed"] = r.failure.has_value();
  j["kernels_per_forward"] = ran ? optional_json(r.metrics.kernels_per_forward) : json(nullptr);
  j["ops_per_forward"] = ran ? json(r.metrics.ops_per_forward) : json(nullptr);
  j["copies_per_forward"] = ran ? json(r.metrics.copies_per_forward) : json(nullptr);
  j["memsets_per_forward"] =
      ran && r.problem.device == Device::Cuda ? json(r.metrics.memsets_per_forward) : json(nullptr);
  j["device_time_us"] = ran ? optional_json(r.metrics.device_time_us) : json(nullptr);
  j["host_time_us"] = ran ? json(r.metrics.host_time_us) : json(nullptr);
  j["host_time_unprofiled_us"] = ran ? optional_json(r.metrics.host_time_unprofiled_us) : json(nullptr);
  j["host_time_unprofiled_p10_us"] = ran ? optional_json(r.metrics.host_time_unprofiled_p10_us) : json(nullptr);
  j["host_time_unprofiled_p90_us"] = ran ? optional_json(r.metrics.host_time_unprofiled_p90_us) : json(nullptr);
  j["peak_bytes"] = ran ? json(r.metrics.peak_bytes) : json(nullptr);
  j["allocated_bytes_per_forward"] = ran ? json(r.metrics.allocated_bytes_per_forward) : json(nullptr);
  j["tflops"] = ran ? optional_json(r.metrics.tflops) : json(nullptr);
  j["ceiling_pct"] = ran ? optional_json(r.metrics.ceiling_pct) : json(nullptr);
  // The memory side: the problem's minimum bytes (problem.io_bytes) over the
  // device time, against the measured copy ceiling; and the two ceilings read against.
  j["gbs"] = ran ? optional_json(r.metrics.gbs) : json(nullptr);
  j["copy_ceiling_pct"] = ran ? optional_json(r.metrics.copy_ceiling_pct) : json(nullptr);
  j["ceiling_tflops"] = ran ? optional_json(r.metrics.ceiling_tflops) : json(nullptr);
  j["copy_ceiling_gbs"] = ran ? optional_json(r.metrics.copy_ceiling_gbs) : json(nullptr);
  j["max_abs_error"] = r.error ? json(r.error->max_abs) : json(nullptr);
  j["rel_error"] = r.error ? json(r.error->rel) : json(nullptr);
  j["nan_count"] = r.error ? json(r.error->nan_count) : json(nullptr);
  j["accepted"] = r.acceptance ? json(r.acceptance->pass) : json(nullptr);
  j["tolerance"] = r.acceptance ? json(r.acceptance->tolerance) : json(nullptr);
  j["occupancy_pct"] = ran ? optional_json(r.metrics.occupancy_pct) : json(nullptr);
  j["saved_bytes"] = ran ? optional_json(r.metrics.saved_bytes) : json(nullptr);
  j["forward_device_time_us"] = ran ? optional_json(r.metrics.forward_device_time_us) : json(nullptr);
  // --gpus: the GPUs the run was sharded over and each one's busy time.
  j["world_size"] = r.metrics.world_size;
  j["device_time_per_rank_us"] =
      ran && !r.metrics.device_time_per_rank_us.empty() ? json(r.metrics.device_time_per_rank_us) : json(nullptr);
  if (r.gradient_errors) {
    const auto grad = [](const ErrorStats& e) {
      return json{{"rel_error", e.rel}, {"max_abs_error", e.max_abs}, {"nan_count", e.nan_count}};
    };
    j["gradient_errors"] = {
        {"dq", grad(r.gradient_errors->dq)}, {"dk", grad(r.gradient_errors->dk)}, {"dv", grad(r.gradient_errors->dv)}};
  } else {
    j["gradient_errors"] = nullptr;
  }
  // FP8: the inputs' quantization, and the same backend's error on the real (bf16) inputs.
  if (r.fp8) {
    json tensors = json::array();
    for (const auto& t : r.fp8->tensors) {
      tensors.push_back({{"name", t.name},
                         {"descale", t.descale},
                         {"amax", t.amax},
                         {"saturated", t.saturated},
                         {"elements", t.elements}});
    }
    const auto& b = r.fp8->bf16_error;
    j["fp8"] = {{"auto_descale", r.fp8->auto_descale},
                {"tensors", std::move(tensors)},
                {"bf16_rel_error", b ? json(b->rel) : json(nullptr)},
                {"bf16_max_abs_error", b ? json(b->max_abs) : json(nullptr)},
                {"bf16_note", r.fp8->bf16_note.empty() ? json(nullptr) : json(r.fp8->bf16_note)},
                {"amax_s", r.fp8->measured_amax ? json(r.fp8->measured_amax->s) : json(nullptr)},
                {"amax_o", r.fp8->measured_amax ? json(r.fp8->measured_amax->o) : json(nullptr)}};
  } else {
    j["fp8"] = nullptr;
  }
  j["findings"] = json::array();
  for (const auto& f : r.findings) j["findings"].push_back(finding_json(f));
  j["expected_ops"] = r.expectation.cpu_ops;
  j["expected_device_activities"] =
      r.expectation.device_activities >= 0 ? json(r.expectation.device_activities) : json(nullptr);
  return j;
}

nlohmann::json explain_json(const ExplainReport& e) {
  nlohmann::json j;
  j["device"] = device_json(e.device_description, e.device, e.problem.device);
  j["problem"] = report::problem_json(e.problem);
  j["cuda_build"] = e.cuda_build;
  j["results"] = nlohmann::json::array();
  for (const auto& r : e.rows) {
    j["results"].push_back({{"backend", r.backend}, {"eligible", r.eligible}, {"reason", r.reason}});
  }
  j["auto"] =
      e.chosen ? nlohmann::json{{"backend", e.chosen->backend}, {"reason", e.chosen->reason}} : nlohmann::json();
  return j;
}

nlohmann::json device_json(const std::string& description, const std::optional<DeviceProperties>& props, Device d) {
  nlohmann::json j = {{"type", device_name(d)}, {"description", description}};
  if (props) {
    j["name"] = props->name;
    j["compute_capability"] = std::to_string(props->compute_major) + "." + std::to_string(props->compute_minor);
    j["sms"] = props->num_sms;
    j["total_memory_bytes"] = props->total_global_mem;
    // The peak from the memory clock and bus width, and what a large copy measured.
    const auto known = [](double v) { return v > 0 ? nlohmann::json(v) : nlohmann::json(nullptr); };
    j["memory_bandwidth_gbs"] = known(props->memory_bandwidth_gbs);
    j["copy_bandwidth_gbs"] = known(props->copy_bandwidth_gbs);
  }
  return j;
}

void write_json_file(const nlohmann::json& j, const std::string& path) {
  // Replace, not throw, on invalid UTF-8: a kernel's name must not lose the report.
  write_file_atomically(path, j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n", "JSON");
}

}  // namespace report
}  // namespace attnprof
