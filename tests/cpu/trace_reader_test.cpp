// The trace reader: our own traces read back as written, torch.profiler's
// shape (hand-built) read with its args, gzip, and every malformed input
// refused with one "cannot read ...: why" line, never a crash. And the
// occupancy calculator against the CUDA occupancy calculator's figures.
#include "attnprof/trace_reader.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "attnprof/error.h"
#include "attnprof/occupancy.h"
#include "attnprof/trace_io.h"
#include "common/kineto_trace.h"
#include "cpu/synthetic_trace.h"

namespace attnprof {
namespace {

namespace fs = std::filesystem;
using testing::kineto_trace;
using testing::KinetoTraceSpec;

class TempFile {
 public:
  explicit TempFile(const std::string& suffix) {
    std::string tmpl = (fs::temp_directory_path() / ("attnprof_reader_XXXXXX" + suffix)).string();
    const int fd = ::mkstemps(tmpl.data(), static_cast<int>(suffix.size()));
    if (fd < 0) throw std::runtime_error("mkstemps failed");
    ::close(fd);
    path_ = tmpl;
  }
  ~TempFile() {
    std::error_code ec;
    fs::remove(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

void write_plain(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary);
  f << text;
}

void write_gzip(const fs::path& p, const std::string& text) {
  gzFile f = gzopen(p.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, text.data(), static_cast<unsigned>(text.size())), static_cast<int>(text.size()));
  gzclose(f);
}

DeviceProperties device_of(int major, int minor) {
  DeviceProperties d;
  d.compute_major = major;
  d.compute_minor = minor;
  return d;  // the limits come from the architecture table
}

KernelInfo launch(int threads, int regs, int shared) {
  KernelInfo k;
  k.block = {threads, 1, 1};
  k.registers_per_thread = regs;
  k.dynamic_shared_bytes = shared;
  return k;
}

// Figures as CUDA's occupancy calculator (cuda_occupancy.h) gives them.
TEST(Occupancy, MatchesTheCudaCalculatorPerArchitecture) {
  struct Case {
    int major, minor, threads, regs, shared, blocks;
    double pct;
    OccupancyLimit limit;
  };
  const Case cases[] = {
      // sm80 (A100): 64 warps, 32 blocks, 164 KiB shared.
      {8, 0, 256, 32, 0, 8, 100.0, OccupancyLimit::Warps},
      {8, 0, 128, 64, 0, 8, 50.0, OccupancyLimit::Registers},
      {8, 0, 128, 32, 49152, 3, 18.75, OccupancyLimit::SharedMemory},
      {8, 0, 32, 16, 0, 32, 50.0, OccupancyLimit::Blocks},
      {8, 0, 128, 255, 0, 2, 12.5, OccupancyLimit::Registers},
      // sm86 (RTX 30): 48 warps, 16 blocks, 100 KiB.
      {8, 6, 64, 32, 0, 16, 66.67, OccupancyLimit::Blocks},
      {8, 6, 256, 32, 0, 6, 100.0, OccupancyLimit::Warps},
      {8, 6, 128, 32, 32768, 3, 25.0, OccupancyLimit::SharedMemory},
      // sm89 (L4, RTX 40): 48 warps, 24 blocks, 100 KiB.
      {8, 9, 64, 32, 0, 24, 100.0, OccupancyLimit::Blocks},
      {8, 9, 96, 40, 0, 16, 100.0, OccupancyLimit::Warps},
      // sm90 (H100/H200): 64 warps, 32 blocks, 228 KiB. 168 registers: 5376 per
      // warp, 3 warps per sub-partition, 12 warps; 208 KiB shared: one block.
      {9, 0, 384, 168, 213248, 1, 18.75, OccupancyLimit::Registers},
      {9, 0, 128, 128, 27648, 4, 25.0, OccupancyLimit::Registers},
      {9, 0, 128, 0, 232576, 0, 0.0, OccupancyLimit::SharedMemory},  // with the 1 KiB reserved, past 228 KiB
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "sm" << c.major << c.minor << " threads " << c.threads << " regs " << c.regs
                                      << " shared " << c.shared);
    const auto o = theoretical_occupancy(launch(c.threads, c.regs, c.shared), device_of(c.major, c.minor));
    ASSERT_TRUE(o.has_value());
    EXPECT_EQ(o->blocks_per_sm, c.blocks);
    EXPECT_NEAR(o->pct, c.pct, 0.01);
    if (c.blocks > 0) EXPECT_EQ(o->limited_by, c.limit) << occupancy_limit_name(o->limited_by);
  }
}

TEST(Occupancy, UnknownDeviceOrImpossibleLaunch) {
  EXPECT_FALSE(theoretical_occupancy(launch(128, 32, 0), device_of(5, 2)).has_value());
  const auto too_many_threads = theoretical_occupancy(launch(2048, 32, 0), device_of(9, 0));
  ASSERT_TRUE(too_many_threads.has_value());
  EXPECT_EQ(too_many_threads->blocks_per_sm, 0);
  // A trace's own limits win over the table: an sm90 with a 1536-thread SM.
  DeviceProperties d = device_of(9, 0);
  d.max_threads_per_sm = 1536;
  EXPECT_NEAR(theoretical_occupancy(launch(256, 32, 0), d)->pct, 100.0, 1e-9);
  EXPECT_EQ(theoretical_occupancy(launch(256, 32, 0), d)->warps_per_sm, 48);
}

// ---- Reading our own traces back ----------------------------------------------------

TEST(TraceReader, ReadsBackWhatTheWriterWrites) {
  const Trace t = testing::attention_trace();
  const std::string text = chrome_trace_json(t);
  const Trace r = parse_chrome_trace(text);
  ASSERT_EQ(r.activities.size(), t.activities.size());
  EXPECT_EQ(r.name, t.name);
  ASSERT_TRUE(r.device.has_value());
  EXPECT_EQ(r.device->num_sms, 132);
  EXPECT_EQ(r.device->compute_major, 9);
  for (std::size_t i = 0; i < t.activities.size(); ++i) {
    const Activity& a = t.activities[i];
    const Activity& b = r.activities[i];
    SCOPED_TRACE(a.name);
    EXPECT_EQ(b.type, a.type);
    EXPECT_EQ(b.name, a.name);
    EXPECT_EQ(b.start_ns, a.start_ns);
    EXPECT_EQ(b.dur_ns, a.dur_ns);
    EXPECT_EQ(b.correlation, a.correlation);
    if (a.type == ActivityType::CpuOp) {
      EXPECT_EQ(b.input_dtypes, a.input_dtypes);
      EXPECT_EQ(b.input_dims, a.input_dims);
    }
    if (a.on_device()) {
      EXPECT_EQ(b.stream, a.stream);
      EXPECT_EQ(b.device, a.device);
    }
    if (a.kernel) {
      ASSERT_TRUE(b.kernel.has_value());
      EXPECT_EQ(b.kernel->grid, a.kernel->grid);
      EXPECT_EQ(b.kernel->block, a.kernel->block);
      EXPECT_EQ(b.kernel->registers_per_thread, a.kernel->registers_per_thread);
      EXPECT_EQ(b.kernel->static_shared_bytes + b.kernel->dynamic_shared_bytes,
                a.kernel->static_shared_bytes + a.kernel->dynamic_shared_bytes);
    }
    if (a.transfer) {
      ASSERT_TRUE(b.transfer.has_value());
      EXPECT_EQ(b.transfer->bytes, a.transfer->bytes);
      EXPECT_EQ(b.transfer->kind, "DtoD");
    }
    if (a.allocation) {
      ASSERT_TRUE(b.allocation.has_value());
      EXPECT_EQ(b.allocation->bytes, a.allocation->bytes);
      EXPECT_EQ(b.allocation->total_allocated, a.allocation->total_allocated);
    }
  }
  // Occupancy recomputed from the record: the gemm's 128 registers x 128
  // threads (4 blocks by registers) and 48 KiB + 1 KiB shared (4 blocks) on sm90: 16 warps.
  const auto gemm = std::find_if(r.activities.begin(), r.activities.end(),
                                 [](const Activity& a) { return a.name.find("s16816gemm") != std::string::npos; });
  ASSERT_NE(gemm, r.activities.end());
  ASSERT_TRUE(gemm->kernel->occupancy_pct.has_value());
  EXPECT_NEAR(*gemm->kernel->occupancy_pct, 25.0, 1e-9);
}

TEST(TraceReader, ReadsTorchProfilerShape) {
  const Trace t = parse_chrome_trace(kineto_trace({.steps = 2}));
  EXPECT_EQ(t.base_ns, 1'700'000'000'000'000'000);
  EXPECT_EQ(t.name, "hand_built.pt.trace.json");
  ASSERT_TRUE(t.device.has_value());
  EXPECT_EQ(t.device->name, "NVIDIA H100 80GB HBM3");
  std::map<ActivityType, int> by_type;
  for (const auto& a : t.activities) ++by_type[a.type];
  EXPECT_EQ(by_type[ActivityType::UserAnnotation], 2);  // the steps; python_function and flows skipped
  EXPECT_EQ(by_type[ActivityType::Memcpy], 2);
  EXPECT_EQ(by_type[ActivityType::CudaDriver], 2);
  EXPECT_EQ(by_type[ActivityType::Kernel], 10);
  const Activity& step = t.activities.front();
  EXPECT_EQ(step.name, "ProfilerStep#1");
  EXPECT_EQ(step.start_ns, t.base_ns + 100'000);  // ts 100.000 us after the base
  const auto mm =
      std::find_if(t.activities.begin(), t.activities.end(), [](const Activity& a) { return a.name == "aten::bmm"; });
  ASSERT_NE(mm, t.activities.end());
  EXPECT_EQ(mm->input_dtypes, "c10::BFloat16, c10::BFloat16");
  EXPECT_EQ(mm->input_dims, "[8, 16, 1024, 64], [8, 16, 64, 1024]");
  for (const auto& a : t.activities) {
    if (a.type != ActivityType::Kernel || a.name.find("nvjet") == std::string::npos) continue;
    EXPECT_EQ(a.stream, testing::kKinetoStream);
    ASSERT_TRUE(a.kernel && a.kernel->occupancy_pct);  // Kineto wrote 0; ours is computed
    EXPECT_NEAR(*a.kernel->occupancy_pct, 18.75, 1e-9);
  }
}

TEST(TraceReader, ReadsGzippedAndPlainFilesAlike) {
  const std::string text = kineto_trace({.steps = 3, .layers_per_step = 4});
  TempFile plain(".json"), gz(".json.gz");
  write_plain(plain.path(), text);
  write_gzip(gz.path(), text);
  const Trace a = read_chrome_trace(plain.path());
  const Trace b = read_chrome_trace(gz.path());
  ASSERT_EQ(a.activities.size(), b.activities.size());
  ASSERT_GT(a.activities.size(), 100u);
  for (std::size_t i = 0; i < a.activities.size(); ++i) {
    EXPECT_EQ(a.activities[i].name, b.activities[i].name);
    EXPECT_EQ(a.activities[i].start_ns, b.activities[i].start_ns);
  }
}

TEST(TraceReader, TimesAreExactNanoseconds) {
  const Trace t = parse_chrome_trace(
      R"({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 5520373548123.4567,
      "dur": 0.5}, {"ph": "X", "cat": "cpu_op", "name": "b", "pid": 1, "tid": "thread 9", "ts": 1e3, "dur": 2}]})");
  ASSERT_EQ(t.activities.size(), 2u);
  EXPECT_EQ(t.activities[0].start_ns, 5'520'373'548'123'457);  // rounded at the fourth decimal
  EXPECT_EQ(t.activities[0].dur_ns, 500);
  EXPECT_EQ(t.activities[1].start_ns, 1'000'000);
  EXPECT_EQ(t.activities[1].tid, 9);
}

// ---- Refusals ------------------------------------------------------------------------

// Each bad input: Error(BadInput), one line "cannot read <source>: ..." naming `needle`.
void expect_unreadable(const std::string& text, const std::string& needle, TraceReadOptions o = {}) {
  SCOPED_TRACE(text.substr(0, 80));
  try {
    (void)parse_chrome_trace(text, "bad.json", o);
    ADD_FAILURE() << "read without complaint";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::BadInput);
    EXPECT_EQ(m.rfind("cannot read bad.json: ", 0), 0u) << m;
    EXPECT_NE(m.find(needle), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
}

std::string one_event(const std::string& fields) { return R"({"traceEvents": [{)" + fields + "}]}"; }

TEST(TraceReader, RefusesMalformedInputWithOneLine) {
  const std::string ok = R"("ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1)";
  expect_unreadable("", "empty file");
  expect_unreadable("   \n", "empty file");
  expect_unreadable("hello", "not JSON");
  expect_unreadable("\x1f\x8b garbage", "not JSON");
  expect_unreadable(R"({"traceEvents": [)", "truncated");
  expect_unreadable(R"({"traceEvents": [{"ph": "X", "na)", "truncated");
  expect_unreadable(R"({"schemaVersion": 1, "traceEv)", "truncated");
  expect_unreadable(R"({"schemaVersion": 1})", "no \"traceEvents\"");
  expect_unreadable(R"([])", "no events");
  expect_unreadable(R"({"traceEvents": []})", "no events");
  expect_unreadable(R"({"traceEvents": 5})", "not an array");
  expect_unreadable(R"({"traceEvents": [1]})", "not a JSON object");
  expect_unreadable(R"({"traceEvents": [],})", "a key");
  expect_unreadable(R"({"traceEvents": [,]})", "a value");
  expect_unreadable(R"({"traceEvents": [{"ph": "X",}]})", "event 0");
  expect_unreadable(one_event(ok + R"(, "ts": 1, "dur": 1}, {"ph": "X")") + " trailing", "nothing after");
  expect_unreadable("{\"traceEvents\": [" + std::string(100000, '['), "nested deeper than 64");
  expect_unreadable("{\"traceEvents\": [{\"a\": " + std::string(70, '[') + std::string(70, ']') + "}]}",
                    "nested deeper than 64");
  expect_unreadable(one_event(ok + R"(, "ts": 1e400, "dur": 1)"), "\"ts\"");
  expect_unreadable(one_event(ok + R"(, "ts": 123456789012345678901234567890, "dur": 1)"), "\"ts\"");
  expect_unreadable(one_event(ok + R"(, "ts": "12", "dur": 1)"), "\"ts\" is not a number");
  expect_unreadable(one_event(ok + R"(, "ts": 1, "dur": [1])"), "\"dur\" is not a number");
  expect_unreadable(one_event(ok + R"(, "ts": 1, "dur": -5)"), "\"dur\" is negative");
  expect_unreadable(one_event(ok + R"(, "dur": 1)"), "\"ts\" is missing");
  expect_unreadable(one_event(ok + R"(, "ts": 1)"), "\"dur\" is missing");
  expect_unreadable(one_event(R"("cat": "cpu_op", "name": "x", "ts": 1, "dur": 1)"), "\"ph\" is missing");
  expect_unreadable(one_event(R"("ph": 7, "ts": 1, "dur": 1)"), "\"ph\" is not a string");
  expect_unreadable(one_event(R"("ph": "X", "cat": "cpu_op", "name": "bad )"
                              "\xff\xfe"
                              R"(", "ts": 1, "dur": 1)"),
                    "UTF-8");
  expect_unreadable(R"({"traceEvents": [{"ph": "X"}], "baseTimeNanoseconds": -4})", "baseTimeNanoseconds");
  expect_unreadable(R"({"traceEvents": [{"ph": "M", "name": "process_name"}]})", "no events attnprof reads");
  TraceReadOptions small;
  small.max_bytes = 1000;
  expect_unreadable(kineto_trace({.steps = 1}), "gzip bomb", small);
  small = {};
  small.max_event_bytes = 64;
  expect_unreadable(one_event(ok + R"(, "ts": 1, "dur": 1, "args": {"pad": ")" + std::string(200, 'x') + "\"}"),
                    "larger than", small);
}

TEST(TraceReader, WrongTypesInArgsAreIgnoredNotFatal) {
  const Trace t = parse_chrome_trace(one_event(
      R"("ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 2,
         "args": {"grid": "big", "block": [1, 2], "registers per thread": "many", "correlation": {}, "stream": 1e300})"));
  ASSERT_EQ(t.activities.size(), 1u);
  EXPECT_FALSE(t.activities[0].kernel.has_value());  // no usable block: no launch record
  EXPECT_EQ(t.activities[0].correlation, 0u);
  EXPECT_EQ(t.activities[0].stream, 7);  // from tid
}

// issue 49 item 15: every integer read from a trace is type- and
// range-checked. "Input Dims" hold tensor sizes: a fraction or a size past
// 2^50 (2^63 once read as -2^63) is refused with the event's index; an arg of
// the wrong type or out of range is no value (as other args' are), never a
// wrapped or clamped one.
TEST(TraceReader, InputDimsAndIntegerArgsAreTypeAndRangeChecked) {
  const auto op = [](const std::string& dims) {
    return one_event(R"("ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 1,
                        "args": {"Input Dims": )" +
                     dims + "}");
  };
  expect_unreadable(op("[[9223372036854775808, 2]]"), R"(event 0: "Input Dims" has 9223372036854775808, out of range)");
  expect_unreadable(op("[[1.5, 2]]"), R"(event 0: "Input Dims" has 1.5 where a whole number)");
  expect_unreadable(op("[[2], [[8, 1e300]]]"), R"("Input Dims" has 1e300)");
  expect_unreadable(op("[[-1, 2]]"), "out of range");
  EXPECT_EQ(parse_chrome_trace(op("[[8, 16], [], [[1, 2], [3]], [2.0]]")).activities.at(0).input_dims,
            "[8, 16], [], [[1, 2], [3]], [2]");

  const Trace t = parse_chrome_trace(one_event(
      R"("ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 2,
         "args": {"stream": 9223372036854775808, "device": 1099511627776, "correlation": 18446744073709551615,
                  "block": [4294967296, 1, 1], "context": 1.5})"));
  ASSERT_EQ(t.activities.size(), 1u);
  EXPECT_EQ(t.activities[0].stream, 7);                           // from tid: 2^63 is no stream id
  EXPECT_EQ(t.activities[0].device, 0);                           // from pid: 2^40 is no device
  EXPECT_EQ(t.activities[0].correlation, 18446744073709551615u);  // ids keep all 64 bits
  EXPECT_FALSE(t.activities[0].kernel.has_value());               // a block past 2^30 is no block
  EXPECT_EQ(t.activities[0].context, -1);
  const Trace runtime = parse_chrome_trace(one_event(
      R"("ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1, "dur": 2,
         "args": {"cbid": 4294967507})"));
  EXPECT_EQ(runtime.activities.at(0).cbid, 0u);  // not 211, the low 32 bits
  expect_unreadable(one_event(R"("ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 2,
                                 "args": {"block": [128, 1, 1], "registers per thread": 2147483648})"),
                    R"("registers per thread" is out of range (more than 2^30))");
}

TEST(TraceReader, RefusesBadFiles) {
  const auto expect_file = [](const fs::path& p, const std::string& needle, TraceReadOptions o = {}) {
    try {
      (void)read_chrome_trace(p, o);
      ADD_FAILURE() << p << " read without complaint";
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_EQ(e.kind(), ErrorKind::BadInput);
      EXPECT_EQ(m.rfind("cannot read " + p.string() + ": ", 0), 0u) << m;
      EXPECT_NE(m.find(needle), std::string::npos) << m;
    }
  };
  expect_file("/nonexistent/trace.json", "no such file");
  expect_file(fs::temp_directory_path(), "directory");

  // A gzip bomb: 64 MiB of whitespace in a few KiB, refused at the limit.
  TempFile bomb(".json.gz");
  {
    gzFile f = gzopen(bomb.path().c_str(), "wb9");
    const std::string spaces(1 << 20, ' ');
    for (int i = 0; i < 64; ++i) gzwrite(f, spaces.data(), static_cast<unsigned>(spaces.size()));
    gzclose(f);
  }
  EXPECT_LT(fs::file_size(bomb.path()), 1u << 20);
  TraceReadOptions o;
  o.max_bytes = 16u << 20;
  expect_file(bomb.path(), "gzip bomb", o);

  // A gzip stream cut in half, and one with its body overwritten.
  const std::string text = kineto_trace({.steps = 4, .layers_per_step = 8});
  TempFile gz(".json.gz"), cut(".json.gz"), corrupt(".json.gz");
  write_gzip(gz.path(), text);
  std::ifstream in(gz.path(), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  write_plain(cut.path(), bytes.substr(0, bytes.size() / 2));
  expect_file(cut.path(), "truncated");
  std::string bad = bytes;
  for (std::size_t i = 20; i < bad.size() - 8; i += 7) bad[i] = static_cast<char>(bad[i] ^ 0x5a);
  write_plain(corrupt.path(), bad);
  expect_file(corrupt.path(), "gzip");

  // Junk after the stream is refused (zlib's gzread dropped it unread); a second member is read, as gzip -d does.
  TempFile junk(".json.gz"), two(".json.gz");
  write_plain(junk.path(), bytes + "junkjunk");
  expect_file(junk.path(), "junk after its gzip stream (bytes that are not another gzip member)");
  write_plain(junk.path(), bytes + "j");
  expect_file(junk.path(), "junk after its gzip stream");
  const std::size_t half = text.size() / 2;
  TempFile first(".gz"), second(".gz");
  write_gzip(first.path(), text.substr(0, half));
  write_gzip(second.path(), text.substr(half));
  std::ifstream a(first.path(), std::ios::binary), b(second.path(), std::ios::binary);
  write_plain(two.path(), std::string((std::istreambuf_iterator<char>(a)), std::istreambuf_iterator<char>()) +
                              std::string((std::istreambuf_iterator<char>(b)), std::istreambuf_iterator<char>()));
  EXPECT_EQ(read_chrome_trace(two.path()).activities.size(), parse_chrome_trace(text).activities.size());
}

// Random damage to a good trace: every result is a trace or one BadInput
// error, never a crash or another exception.
TEST(TraceReader, SurvivesRandomDamage) {
  const std::string good = kineto_trace({.steps = 1, .layers_per_step = 2});
  std::mt19937 rng(1234);
  int read = 0, refused = 0;
  for (int trial = 0; trial < 1500; ++trial) {
    std::string s = good;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const std::size_t at = rng() % s.size();
      switch (rng() % 4) {
        case 0:
          s[at] = static_cast<char>(rng() % 256);
          break;
        case 1:
          s.erase(at, 1 + rng() % 16);
          break;
        case 2:
          s.insert(at, 1, "{}[]\",:0\\e-"[rng() % 11]);
          break;
        default:
          s.resize(at);
          break;
      }
    }
    try {
      (void)parse_chrome_trace(s);
      ++read;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::BadInput) << e.what();
      ++refused;
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_EQ(read + refused, 1500);
}

}  // namespace
}  // namespace attnprof
