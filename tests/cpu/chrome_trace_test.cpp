// The Chrome trace read back the way PyTorch-trace readers read it: the JSON
// parses, the keys they look up are there, flows join launch and kernel, and
// a failed write leaves nothing behind.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "attnprof/error.h"
#include "attnprof/trace_io.h"
#include "synthetic_trace.h"

namespace attnprof {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using testing::attention_trace;
using testing::kPid;
using testing::kStream;
using testing::kTid;

// Round-trips through text so the test sees what a reader of the file sees.
json reparsed(const Trace& trace) { return json::parse(chrome_trace_json(trace)); }

std::vector<json> events_with(const json& doc, const std::string& ph) {
  std::vector<json> out;
  for (const json& e : doc.at("traceEvents")) {
    if (e.at("ph") == ph) out.push_back(e);
  }
  return out;
}

const json& find_event(const std::vector<json>& events, const std::string& cat, const std::string& name) {
  for (const json& e : events) {
    if (e.at("cat") == cat && e.at("name") == name) return e;
  }
  ADD_FAILURE() << "no " << cat << " event named " << name;
  static const json none = json::object();
  return none;
}

// A scratch directory removed at the end of each test.
class TempDir {
 public:
  TempDir() {
    // Unique per run, so concurrent runs of one test never share a directory.
    path_ = fs::temp_directory_path() /
            ("attnprof_trace_test_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) +
             "_" + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }
  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(path_)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  fs::path path_;
};

TEST(ChromeTrace, TopLevelKeysAsPyTorchWritesThem) {
  const json doc = reparsed(attention_trace());
  for (const char* key :
       {"schemaVersion", "deviceProperties", "displayTimeUnit", "baseTimeNanoseconds", "traceEvents", "traceName"}) {
    EXPECT_TRUE(doc.contains(key)) << key;
  }
  EXPECT_EQ(doc["displayTimeUnit"], "ms");
  EXPECT_EQ(doc["baseTimeNanoseconds"], testing::kBase);
  EXPECT_EQ(doc["traceName"], "8_16_1024_64_naive");
  ASSERT_EQ(doc["deviceProperties"].size(), 1u);
  const json& dev = doc["deviceProperties"][0];
  EXPECT_EQ(dev["name"], "NVIDIA H200");
  EXPECT_EQ(dev["numSms"], 132);
  EXPECT_EQ(dev["computeMajor"], 9);
  for (const char* key : {"id", "totalGlobalMem", "computeMinor", "maxThreadsPerBlock", "maxThreadsPerMultiprocessor",
                          "regsPerBlock", "regsPerMultiprocessor", "warpSize", "sharedMemPerBlock",
                          "sharedMemPerMultiprocessor", "sharedMemPerBlockOptin"}) {
    EXPECT_TRUE(dev.contains(key)) << key;
  }
}

TEST(ChromeTrace, NoDevicePropertiesWithoutADevice) {
  Trace t = attention_trace();
  t.device.reset();
  const json doc = reparsed(t);
  EXPECT_TRUE(doc["deviceProperties"].is_array());
  EXPECT_TRUE(doc["deviceProperties"].empty());
}

TEST(ChromeTrace, CompleteEventsHaveEveryFieldAndRelativeTimes) {
  const Trace trace = attention_trace();
  const json doc = reparsed(trace);
  const auto complete = events_with(doc, "X");
  std::size_t expected = 0;
  for (const Activity& a : trace.activities) expected += a.type != ActivityType::Allocation;
  ASSERT_EQ(complete.size(), expected);
  for (const json& e : complete) {
    for (const char* key : {"cat", "name", "pid", "tid", "ts", "dur", "args"}) ASSERT_TRUE(e.contains(key)) << e;
    EXPECT_GE(e["ts"].get<double>(), 0.0) << e;
    EXPECT_GE(e["dur"].get<double>(), 0.0) << e;
  }
  // Microseconds from the base: 45'000 ns after it is 45 us, durations too.
  const json& gemm = find_event(complete, "kernel", "ampere_bf16_s16816gemm_bf16_128x64");
  EXPECT_DOUBLE_EQ(gemm["ts"].get<double>(), 45.0);
  EXPECT_DOUBLE_EQ(gemm["dur"].get<double>(), 30.0);
  EXPECT_EQ(gemm["pid"], 0);
  EXPECT_EQ(gemm["tid"], kStream);
  const json& mm = find_event(complete, "cpu_op", "matmul");
  EXPECT_EQ(mm["pid"], kPid);
  EXPECT_EQ(mm["tid"], kTid);
}

TEST(ChromeTrace, KeepsNanosecondsAsThreeDecimals) {
  Trace t = attention_trace();
  for (Activity& a : t.activities) {
    if (a.name != "softmax_warp_forward") continue;
    a.start_ns = testing::kBase + 1'234'567;
    a.dur_ns = 8'001;
  }
  const std::string text = chrome_trace_json(t);
  EXPECT_NE(text.find("\"ts\": 1234.567"), std::string::npos) << "as written to the file";
  EXPECT_NE(text.find("\"dur\": 8.001"), std::string::npos);
}

TEST(ChromeTrace, ArgsPerCategory) {
  const json doc = reparsed(attention_trace());
  const auto complete = events_with(doc, "X");

  const json& kernel = find_event(complete, "kernel", "ampere_bf16_s16816gemm_bf16_128x64")["args"];
  for (const char* key :
       {"External id", "queued", "device", "context", "stream", "correlation", "registers per thread", "shared memory",
        "blocks per SM", "warps per SM", "grid", "block", "est. achieved occupancy %"}) {
    EXPECT_TRUE(kernel.contains(key)) << key;
  }
  EXPECT_EQ(kernel["grid"], json::array({64, 16, 8}));
  EXPECT_EQ(kernel["block"], json::array({128, 1, 1}));
  EXPECT_EQ(kernel["shared memory"], 49152);
  EXPECT_EQ(kernel["registers per thread"], 128);
  EXPECT_DOUBLE_EQ(kernel["est. achieved occupancy %"].get<double>(), 12.5);
  EXPECT_EQ(kernel["stream"], kStream);

  for (const char* name : {"cudaLaunchKernel", "cuLaunchKernelEx"}) {
    const char* cat = std::string(name) == "cudaLaunchKernel" ? "cuda_runtime" : "cuda_driver";
    const json& launch = find_event(complete, cat, name)["args"];
    for (const char* key : {"cbid", "correlation", "External id"}) EXPECT_TRUE(launch.contains(key)) << name << key;
  }

  const json& copy = find_event(complete, "gpu_memcpy", "Memcpy DtoD (Device -> Device)")["args"];
  for (const char* key : {"device", "context", "stream", "correlation", "bytes", "memory bandwidth (GB/s)"}) {
    EXPECT_TRUE(copy.contains(key)) << key;
  }
  // 32 MiB in 40 us.
  EXPECT_NEAR(copy["memory bandwidth (GB/s)"].get<double>(), 33'554'432 / 40'000.0, 1e-9);

  const json& op = find_event(complete, "cpu_op", "matmul")["args"];
  EXPECT_TRUE(op.contains("External id"));
  EXPECT_EQ(op["Input type"], json::array({"bf16", "bf16"}));
  EXPECT_EQ(op["Input Dims"], json::parse("[[8, 16, 1024, 64], [8, 16, 64, 1024]]"));
  EXPECT_FALSE(find_event(complete, "cpu_op", "mul")["args"].contains("Input Dims"));
}

TEST(ChromeTrace, AllocationsAreMemoryInstantEvents) {
  const json doc = reparsed(attention_trace());
  const auto instants = events_with(doc, "i");
  ASSERT_EQ(instants.size(), 2u);
  for (const json& e : instants) {
    EXPECT_EQ(e["name"], "[memory]");
    EXPECT_EQ(e["s"], "t");
    EXPECT_EQ(e["pid"], kPid);
    for (const char* key : {"Device Type", "Device Id", "Addr", "Bytes", "Total Allocated", "Total Reserved"}) {
      EXPECT_TRUE(e["args"].contains(key)) << key;
    }
  }
  EXPECT_EQ(instants[0]["args"]["Bytes"], 33'554'432);
  EXPECT_EQ(instants[1]["args"]["Bytes"], -33'554'432);
  EXPECT_DOUBLE_EQ(instants[0]["ts"].get<double>(), 205.0);
}

TEST(ChromeTrace, FlowsJoinEachLaunchToItsDeviceActivity) {
  Trace trace = attention_trace();
  // A kernel whose launch was not recorded gets no arrow.
  trace.activities.push_back(testing::device(ActivityType::Kernel, "orphan", 890'000, 1'000, 99));
  const json doc = reparsed(trace);
  const auto starts = events_with(doc, "s");
  const auto finishes = events_with(doc, "f");
  ASSERT_EQ(starts.size(), 6u);
  ASSERT_EQ(finishes.size(), 6u);

  std::map<std::uint64_t, json> start_of;
  for (const json& s : starts) {
    EXPECT_EQ(s["cat"], "ac2g");
    EXPECT_EQ(s["name"], "ac2g");
    EXPECT_EQ(s["pid"], kPid);
    start_of[s["id"].get<std::uint64_t>()] = s;
  }
  std::map<std::uint64_t, json> device_of;
  std::map<std::uint64_t, json> launch_of;
  for (const json& e : events_with(doc, "X")) {
    const std::string cat = e["cat"];
    if (cat == "kernel" || cat == "gpu_memcpy") device_of[e["args"]["correlation"].get<std::uint64_t>()] = e;
    if (cat == "cuda_runtime" || cat == "cuda_driver") launch_of[e["args"]["correlation"].get<std::uint64_t>()] = e;
  }
  std::set<std::uint64_t> ids;
  for (const json& f : finishes) {
    const auto id = f["id"].get<std::uint64_t>();
    ids.insert(id);
    EXPECT_EQ(f["bp"], "e");
    EXPECT_EQ(f["cat"], "ac2g");
    ASSERT_TRUE(start_of.count(id)) << id;
    ASSERT_TRUE(device_of.count(id)) << id;
    EXPECT_EQ(f["ts"], device_of[id]["ts"]);
    EXPECT_EQ(f["pid"], device_of[id]["pid"]);
    EXPECT_EQ(f["tid"], device_of[id]["tid"]);
    EXPECT_EQ(start_of[id]["ts"], launch_of[id]["ts"]);
  }
  EXPECT_EQ(ids, (std::set<std::uint64_t>{1, 2, 3, 4, 5, 6}));  // 6: the cuLaunchKernelEx launch
}

TEST(ChromeTrace, HostEventsNestOnTheirThread) {
  const json doc = reparsed(attention_trace());
  std::vector<json> host;
  for (const json& e : events_with(doc, "X")) {
    if (e["pid"] == kPid) host.push_back(e);
  }
  ASSERT_FALSE(host.empty());
  // Any two host spans on one thread are disjoint or one holds the other.
  for (const json& a : host) {
    for (const json& b : host) {
      if (a["tid"] != b["tid"]) continue;
      const double a0 = a["ts"], a1 = a0 + a["dur"].get<double>();
      const double b0 = b["ts"], b1 = b0 + b["dur"].get<double>();
      const bool disjoint = a1 <= b0 || b1 <= a0;
      const bool nested = (a0 <= b0 && b1 <= a1) || (b0 <= a0 && a1 <= b1);
      EXPECT_TRUE(disjoint || nested) << a["name"] << " / " << b["name"];
    }
  }
  const json& fill = find_event(host, "cpu_op", "masked_fill");
  const json& copy = find_event(host, "cpu_op", "copy_");
  EXPECT_EQ(fill["tid"], copy["tid"]);
  EXPECT_GE(copy["ts"].get<double>(), fill["ts"].get<double>());
  EXPECT_LE(copy["ts"].get<double>() + copy["dur"].get<double>(), fill["ts"].get<double>() + fill["dur"].get<double>());
}

TEST(ChromeTrace, MetadataNamesProcessesAndLanes) {
  const json doc = reparsed(attention_trace());
  std::map<std::string, std::vector<json>> meta;
  for (const json& e : events_with(doc, "M")) meta[e["name"]].push_back(e);
  std::map<std::int64_t, std::string> process_names;
  for (const json& e : meta["process_name"]) process_names[e["pid"]] = e["args"]["name"];
  EXPECT_EQ(process_names[kPid], "attnprof");
  EXPECT_EQ(process_names[0], "GPU 0");
  std::set<std::string> thread_names;
  for (const json& e : meta["thread_name"]) thread_names.insert(e["args"]["name"]);
  EXPECT_TRUE(thread_names.count("stream 7"));
  EXPECT_TRUE(thread_names.count("thread 17"));
  EXPECT_EQ(meta["process_sort_index"].size(), 2u);
  EXPECT_EQ(meta["thread_sort_index"].size(), 2u);
}

TEST(ChromeTrace, WritesACompleteFileAndNoTemporary) {
  TempDir dir;
  const fs::path out = dir.path() / "nested" / "8_16_1024_64_naive.json";
  write_chrome_trace(attention_trace(), out);
  std::ifstream in(out);
  std::stringstream text;
  text << in.rdbuf();
  const json doc = json::parse(text.str());
  EXPECT_EQ(doc["traceName"], "8_16_1024_64_naive");
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(out.parent_path())) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"8_16_1024_64_naive.json"});
  // A second write replaces the first whole.
  write_chrome_trace(Trace{}, out);
  EXPECT_TRUE(json::parse(std::ifstream(out))["traceEvents"].empty());
}

// The document is written in pieces, each event dumped alone (a long
// schedule's millions of events never whole in memory as one JSON value):
// the text is exactly what dumping the document as one value writes, for a
// trace with a device, flows and metadata, one with a collector note, and an
// empty one; and the file holds the same text.
TEST(ChromeTrace, StreamedTextIsTheDumpOfTheWholeDocument) {
  Trace noted = attention_trace();
  noted.collector_note = "CUPTI unavailable: \"traceEvents\": [] in a note";
  for (const Trace& t : {attention_trace(), noted, Trace{}}) {
    const std::string text = chrome_trace_json(t);
    EXPECT_EQ(text, json::parse(text).dump(1, ' ', false, json::error_handler_t::replace));
    TempDir dir;
    write_chrome_trace(t, dir.path() / "t.json");
    std::ifstream in(dir.path() / "t.json");
    std::stringstream written;
    written << in.rdbuf();
    EXPECT_EQ(written.str(), text);
  }
}

// Holistic Trace Analysis finds the rank with the pattern "rank":\s+(\d+)
// on the raw file, line by line, stopping at the first match: the written
// file must carry distributedInfo's rank that way, before any event.
TEST(ChromeTrace, RankLineAsHolisticTraceAnalysisGrepsIt) {
  TempDir dir;
  const fs::path out = dir.path() / "t.json";
  write_chrome_trace(attention_trace(), out);
  std::ifstream in(out);
  const std::regex rank_re(R"re("rank":\s+(\d+))re");
  std::string line;
  std::smatch m;
  bool found = false;
  while (std::getline(in, line)) {
    ASSERT_EQ(line.find("traceEvents"), std::string::npos) << "rank must come before the events";
    if (std::regex_search(line, m, rank_re)) {
      EXPECT_EQ(m[1], "0");
      found = true;
      break;
    }
  }
  EXPECT_TRUE(found);
  EXPECT_EQ(json::parse(std::ifstream(out))["distributedInfo"], (json{{"rank", 0}, {"world_size", 1}}));
}

TEST(ChromeTrace, UnwritableDirectoryThrowsIoAndLeavesNothing) {
  TempDir dir;
  const fs::path blocker = dir.path() / "not_a_dir";
  std::ofstream(blocker) << "x";
  const fs::path out = blocker / "trace.json";
  try {
    write_chrome_trace(attention_trace(), out);
    FAIL() << "expected Error(Io)";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::Io);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cannot write trace to " + out.string()), std::string::npos) << msg;
    EXPECT_EQ(msg.find("--trace-dir"), std::string::npos)
        << "the writer does not know which flag named the path: " << msg;
  }
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"not_a_dir"});
  std::ifstream in(blocker);
  std::string content;
  in >> content;
  EXPECT_EQ(content, "x");
}

TEST(ChromeTrace, RenameOntoADirectoryFailsCleanly) {
  TempDir dir;
  fs::create_directories(dir.path() / "trace.json" / "inside");
  EXPECT_THROW(write_chrome_trace(attention_trace(), dir.path() / "trace.json"), Error);
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"trace.json"});
}

}  // namespace
}  // namespace attnprof
