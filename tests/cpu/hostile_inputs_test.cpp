// attnprof under hostile inputs (issue 20): special files and links as
// inputs, binary files, and traces that break the format's rules (the whole
// document validated, numbers read as the type they are, sizes in range);
// the format helper's refusals. Resource limits, outputs and signals:
// hostile_test.cpp.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "analysis/format.h"
#include "attnprof/error.h"
#include "attnprof/trace_io.h"
#include "attnprof/trace_reader.h"
#include "common/cli_child.h"
#include "common/temp_dir.h"

namespace attnprof {
namespace {

namespace fs = std::filesystem;
using testing::slurp;
using namespace testing::hostile;

// ---- Special files and links as inputs ------------------------------------------------

TEST(Hostile, InputsThatAreNoFileAreRefusedInOneLine) {
  TempDir d;
  const fs::path fifo = d / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  Child c = run_cli({"analyze", fifo.string()}, d.path(), {.timeout_s = 30});
  expect_one_line(c, "FIFO");
  spit(d / "ok.json", kTrace);
  c = run_cli({"diff", (d / "ok.json").string(), fifo.string()}, d.path(), {.timeout_s = 30});
  expect_one_line(c, "FIFO");

  fs::create_symlink("/dev/zero", d / "zero");
  c = run_cli({"analyze", (d / "zero").string()}, d.path(), {.timeout_s = 30});
  expect_one_line(c, "device");
  fs::create_symlink(d / "b", d / "a");
  fs::create_symlink(d / "a", d / "b");
  c = run_cli({"analyze", (d / "a").string()}, d.path());
  expect_one_line(c, "loop of symbolic links");
  c = run_cli({"analyze", d.path().string()}, d.path());
  expect_one_line(c, "directory");
}

TEST(Hostile, FifoWithAWriterIsRead) {
  TempDir d;
  const fs::path fifo = d / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::thread writer([&] {
    const int fd = ::open(fifo.c_str(), O_WRONLY);  // blocks until the CLI opens it
    const std::string t = kTrace;
    (void)!::write(fd, t.data(), t.size());
    ::close(fd);
  });
  const Child c = run_cli({"analyze", fifo.string()}, d.path(), {.timeout_s = 30});
  writer.join();
  EXPECT_EQ(c.code, 0) << c.err;
  EXPECT_NE(c.out.find("aten::mm"), std::string::npos) << c.out;
}

std::string unreadable_why(const fs::path& p) {
  try {
    (void)read_chrome_trace(p);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadInput);
    return e.what();
  }
  return "read without complaint";
}

TEST(Hostile, BinaryFilesGetASaneMessage) {
  TempDir d;
  spit(d / "nul", std::string(1, '\0'));
  const std::string first = unreadable_why(d / "nul");
  EXPECT_NE(first.find("byte 0x00"), std::string::npos) << first;
  EXPECT_NE(first.find("NUL"), std::string::npos) << first;
  EXPECT_EQ(unreadable_why(d / "nul"), first);  // the same every time (no stray argument read)

  // A sparse 2 GB file: refused at its first byte, without reading 2 GB.
  {
    const int fd = ::open((d / "sparse").c_str(), O_WRONLY | O_CREAT, 0644);
    ASSERT_EQ(::ftruncate(fd, off_t{2} << 30), 0);
    ::close(fd);
  }
  EXPECT_NE(unreadable_why(d / "sparse").find("byte 0x00"), std::string::npos);

  // A gzip of a gzip.
  std::string inner;
  {
    const fs::path once = d / "once.gz";
    gzFile f = gzopen(once.c_str(), "wb");
    gzwrite(f, kTrace, static_cast<unsigned>(std::strlen(kTrace)));
    gzclose(f);
    inner = slurp(once);
    gzFile g = gzopen((d / "twice.gz").c_str(), "wb");
    gzwrite(g, inner.data(), static_cast<unsigned>(inner.size()));
    gzclose(g);
  }
  const std::string twice = unreadable_why(d / "twice.gz");
  EXPECT_NE(twice.find("byte 0x1f"), std::string::npos) << twice;
  EXPECT_NE(twice.find("gzip stream inside"), std::string::npos) << twice;
  spit(d / "utf16", std::string("\xff\xfe{\0", 4));
  EXPECT_NE(unreadable_why(d / "utf16").find("UTF-16"), std::string::npos);
}

// ---- Trace strictness ------------------------------------------------------------------

std::string parse_why(const std::string& json) {
  try {
    (void)parse_chrome_trace(json);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::BadInput) << e.what();
    const std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    return m;
  }
  return "accepted";
}

std::string event(const std::string& cat, const std::string& extra) {
  return R"({"ph": "X", "cat": ")" + cat + R"(", "name": "e", "pid": 1, "tid": 1, "ts": 1, "dur": 2)" + extra + "}";
}

TEST(Hostile, TheWholeDocumentIsValidated) {
  const std::string events = std::string(R"("traceEvents": [)") + event("cpu_op", "") + "]";
  // Accepted: other top-level values of every JSON kind, however nested.
  EXPECT_EQ(
      parse_why("{" + events +
                R"(, "distributedInfo": {"rank": 0, "x": [1, -2.5e3, 0, 0.5E+2, true, false, null, "\u00e9\n", []]},
                      "s": "caf)"
                "\xc3\xa9"
                R"(", "e": {}})"),
      "accepted");
  EXPECT_EQ(parse_why("\xef\xbb\xbf{" + events + "}"), "accepted");  // a UTF-8 byte order mark

  for (const std::string& bad : {
           "{" + events + R"(, "junk": @@@})",
           "{" + events + R"(, "junk": [1, 2,]})",
           "{" + events + R"(, "junk": {"a" 1}})",
           "{" + events + R"(, "junk": tru})",
           "{" + events + R"(, "junk": 01})",
           "{" + events + R"(, "junk": 1.})",
           "{" + events + R"(, "junk": -})",
           "{" + events + R"(, "junk": "\q"})",
           "{" + events + R"(, "junk": "\u12"})",
           "{" + events + ", \"junk\": \"\xff\"}",
           "{" + events + ", \"junk\": \"\xc3\"}",
           "{" + events + ", \"junk\": \"\xed\xa0\x80\"}",  // a UTF-16 surrogate in UTF-8
           "{" + events + ", \"junk\": \"a\tb\"}",          // a raw control character
           "{" + events + ", \"k\xff\": 1}",                // a key that is not UTF-8
           "x{" + events + "}",
           "\xef{" + events + "}",
           "\xef\xbb{" + events + "}",
           "{" + events + ", " + events + "}",
           // Inside an event, in fields nothing reads.
           R"({"traceEvents": [)" + event("cpu_op", R"(, "junk": @@@)") + "]}",
           R"({"traceEvents": [)" + event("cpu_op", R"(, "args": {"x": [1, tru]})") + "]}",
           R"({"traceEvents": [)" + event("cpu_op", ", \"args\": {\"x\": \"\xff\"}") + "]}",
       }) {
    const std::string why = parse_why(bad);
    EXPECT_NE(why, "accepted") << bad;
    EXPECT_EQ(why.find("internal"), std::string::npos) << why;
  }
  EXPECT_NE(parse_why("{" + events + ", " + events + "}").find("second \"traceEvents\""), std::string::npos);
}

TEST(Hostile, NumbersAreReadAsTheTypeTheyAre) {
  const std::string events = std::string(R"("traceEvents": [)") + event("cpu_op", "") + "]";
  const Trace t = parse_chrome_trace("{" + events + R"(, "baseTimeNanoseconds": 1e3})");
  EXPECT_EQ(t.base_ns, 1000);
  EXPECT_EQ(t.activities.at(0).start_ns, 2000);
  EXPECT_EQ(parse_chrome_trace("{" + events + R"(, "baseTimeNanoseconds": 1000.0})").base_ns, 1000);
  for (const char* base : {"1.5", "\"1000\"", "-1", "1e30", "[1]", "true"}) {
    EXPECT_NE(parse_why("{" + events + R"(, "baseTimeNanoseconds": )" + base + "}").find("baseTimeNanoseconds"),
              std::string::npos)
        << base;
  }
  EXPECT_NE(parse_why("{" + events + R"(, "traceName": 5})").find("not a string"), std::string::npos);
}

TEST(Hostile, NegativeAndHugeSizesAreRefused) {
  const auto one = [](const std::string& ev) { return parse_why(R"({"traceEvents": [)" + ev + "]}"); };
  EXPECT_NE(one(event("gpu_memcpy", R"(, "args": {"bytes": -1e18})")).find("\"bytes\" is negative"), std::string::npos);
  EXPECT_NE(one(event("gpu_memset", R"(, "args": {"bytes": -1})")).find("\"bytes\" is negative"), std::string::npos);
  EXPECT_NE(one(event("gpu_memcpy", R"(, "args": {"bytes": 9e18})")).find("out of range"), std::string::npos);
  EXPECT_NE(one(event("kernel", R"(, "args": {"registers per thread": -4, "block": [1, 1, 1]})")).find("negative"),
            std::string::npos);
  EXPECT_NE(one(event("kernel", R"(, "args": {"shared memory": -4, "block": [1, 1, 1]})")).find("negative"),
            std::string::npos);
  EXPECT_NE(one(event("kernel", R"(, "args": {"grid": [-1, 1, 1], "block": [1, 1, 1]})")).find("\"grid\""),
            std::string::npos);
  EXPECT_NE(one(event("kernel", R"(, "args": {"block": [1, -32, 1]})")).find("\"block\""), std::string::npos);
  EXPECT_NE(one(R"({"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1,
                   "args": {"Bytes": 16, "Total Allocated": -16}})")
                .find("Total Allocated"),
            std::string::npos);
  // A free's Bytes are negative: accepted.
  EXPECT_EQ(one(R"({"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1,
                   "args": {"Bytes": -16, "Total Allocated": 0}})"),
            "accepted");
  // Times whose sums would overflow.
  EXPECT_NE(
      one(R"({"ph": "X", "cat": "cpu_op", "name": "e", "pid": 1, "tid": 1, "ts": 8e15, "dur": 1})").find("\"ts\""),
      std::string::npos);
  EXPECT_NE(
      one(R"({"ph": "X", "cat": "cpu_op", "name": "e", "pid": 1, "tid": 1, "ts": 1, "dur": 5e15})").find("\"dur\""),
      std::string::npos);
  EXPECT_NE(parse_why(R"({"baseTimeNanoseconds": 3999999999999999999, "traceEvents": [)" +
                      event("cpu_op", "").replace(event("cpu_op", "").find("\"ts\": 1"), 7, "\"ts\": 3e15") + "]}")
                .find("out of range"),
            std::string::npos);
  EXPECT_NE(
      parse_why(R"({"deviceProperties": [{"id": 0, "numSms": -132}], "traceEvents": [)" + event("cpu_op", "") + "]}")
          .find("numSms"),
      std::string::npos);
}

// ---- Formats ------------------------------------------------------------------------

TEST(Hostile, FormatTakesOnlyFormatsOfADouble) {
  static_assert(analysis::is_double_format("%.1f MiB"));
  static_assert(analysis::is_double_format("%5.1f%% of it"));
  static_assert(analysis::is_double_format("%.3g TFLOP/s"));
  static_assert(!analysis::is_double_format("byte 0x%02x"));
  static_assert(!analysis::is_double_format("%d"));
  static_assert(!analysis::is_double_format("%s"));
  static_assert(!analysis::is_double_format("%.1f %.1f"));
  static_assert(!analysis::is_double_format("%*.1f"));
  static_assert(!analysis::is_double_format("%Lf"));
  static_assert(!analysis::is_double_format("none"));
  EXPECT_THROW((void)analysis::format("byte 0x%02x", 58.0), std::logic_error);
  EXPECT_EQ(analysis::format("%.1f%%", 12.25), "12.2%");
}

}  // namespace
}  // namespace attnprof
