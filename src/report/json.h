// The JSON values behind the report's --json documents and per-backend
// summaries, inside the report layer. The public API (attnprof/report.h)
// hands out their text, so no third-party type crosses it.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "attnprof/report.h"

namespace attnprof::report {

nlohmann::json problem_json(const Problem& p);
// One finding: {"rule", "severity", "text", "evidence": [{"index", "name", "cat",
// "ts", "dur", "correlation"}], "figures": {name: number}}; ts and dur in
// microseconds as the Chrome trace writes them, correlation null where none.
nlohmann::json finding_json(const Finding& f);
// One result in the "results" schema of DESIGN.md (null where a field does not
// apply); "findings" is a list of finding_json records.
nlohmann::json result_json(const RunResult& r);
// explain's --json: device, problem, each backend's eligibility and reason, auto's pick.
nlohmann::json explain_json(const ExplainReport& e);
nlohmann::json device_json(const std::string& description, const std::optional<DeviceProperties>& props, Device d);
// analyze's and diff's --json (attnprof::analysis_json and diff_json are their text).
nlohmann::json analysis_json(const std::vector<TraceAnalysis>& analyses);
nlohmann::json diff_json(const TraceDiff& d);
// analyze's trace replay, in its --json and under its page's first step.
nlohmann::json replay_json(const TraceReplay& r);
// A figure that may be missing: the number, or null.
inline nlohmann::json optional_json(const std::optional<double>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

// Writes JSON to a temporary file beside `path`, then renames it into place.
void write_json_file(const nlohmann::json& j, const std::string& path);

}  // namespace attnprof::report
