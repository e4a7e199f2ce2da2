// What compare, profile and explain print and write: the at-a-glance table,
// the explain table, and their JSON forms.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attnprof/dispatch.h"
#include "attnprof/runner.h"

namespace attnprof::report {

std::string compare_table(const std::vector<RunResult>& results);
std::string explain_table(const std::vector<Explanation>& rows, const AutoChoice* chosen);

nlohmann::json problem_json(const Problem& p);
// One finding: {"rule", "severity", "text", "evidence": [{"index", "name", "cat",
// "ts", "dur", "correlation"}], "figures": {name: number}}; ts and dur in
// microseconds as the Chrome trace writes them, correlation null where none.
nlohmann::json finding_json(const Finding& f);
// One result in the "results" schema of DESIGN.md (null where a field does not
// apply); "findings" is a list of finding_json records.
nlohmann::json result_json(const RunResult& r);
// explain's --json: device, problem, each backend's eligibility and reason, auto's pick.
nlohmann::json explain_json(const Problem& p, const std::vector<Explanation>& rows, const AutoChoice* chosen,
                            DeviceRuntime& rt);
nlohmann::json device_json(const std::string& description, const std::optional<DeviceProperties>& props, Device d);

// Writes JSON to a temporary file beside `path`, then renames it into place.
void write_json_file(const nlohmann::json& j, const std::string& path);
void write_text_file(const std::string& text, const std::string& path);

}  // namespace attnprof::report
