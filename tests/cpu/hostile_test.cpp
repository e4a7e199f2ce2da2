// attnprof under hostile conditions (issue 20): resource limits, special
// files and links as outputs, colliding outputs, signals. The CLI runs in a
// child with the limit set, under a timeout (common/cli_child.h); special
// files live in a temporary directory (FIFOs, and links to /dev/null and
// /dev/full, the only real devices written). Hostile inputs:
// hostile_inputs_test.cpp.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "attnprof/trace_io.h"
#include "common/cli_child.h"
#include "common/temp_dir.h"

namespace attnprof {
namespace {

namespace fs = std::filesystem;
using testing::slurp;
using namespace testing::hostile;

// ---- Limits ------------------------------------------------------------------------

// Whether the executable starts at all under an address-space limit: a build
// that loads the CUDA libraries at start-up needs more than these tests allow.
bool starts_under(rlim_t as, const fs::path& io) {
  const Child c = run_cli({"--help"}, io, {.as = as, .timeout_s = 30});
  return c.code == 0;
}

TEST(Hostile, AddressSpaceLimitIsRefusedNotHung) {
  TempDir d;
  if (!starts_under(rlim_t{400} << 20, d.path())) GTEST_SKIP() << "the executable cannot load under 400 MiB";
  // Below what OpenBLAS's buffers need: refused up front (before, OpenBLAS
  // retried its failed map forever at 100% CPU).
  for (const rlim_t as : {rlim_t{400} << 20, rlim_t{700} << 20}) {
    const Child c = run_cli(small({"compare"}, d.path()), d.path(), {.as = as, .timeout_s = 60});
    EXPECT_FALSE(c.hung) << "hung at RLIMIT_AS " << (as >> 20) << " MiB";
    EXPECT_EQ(c.signal, 0) << c.err;
    if (c.code != 0) expect_one_line(c, "memory limit");
  }
  // More threads than the limit leaves room for: one line, no hang.
  std::vector<std::string> args = small({"profile", "--backend", "naive"}, d.path());
  args.back() = (d / "traces").string();
  args.push_back("--threads");
  args.push_back("16");
  const Child c = run_cli(args, d.path(), {.as = rlim_t{1000} << 20, .timeout_s = 60});
  expect_one_line(c, "memory limit");
}

// A long schedule on the CPU neither grows nor is refused (issue 57 item 2):
// under a small machine's limit it runs, its trace holding the last steps
// and saying how many older ones it folded. (Before, the run was refused
// after its first step, the whole schedule's trace estimated over the limit.)
TEST(Hostile, LongScheduleRunsFlatUnderALimit) {
  TempDir d;
  if (!starts_under(rlim_t{1500} << 20, d.path())) GTEST_SKIP() << "the executable cannot load under 1500 MiB";
  std::vector<std::string> args = small({"profile", "--backend", "naive"}, d.path());
  for (const char* a : {"--active", "1000", "--repeat", "3"}) args.emplace_back(a);
  const Child c = run_cli(args, d.path(), {.as = rlim_t{1500} << 20, .timeout_s = 60});
  ASSERT_EQ(c.code, 0) << c.err;
  const fs::path trace = d / "traces" / "1_2_128_64_naive.json";
  ASSERT_TRUE(fs::exists(trace)) << c.out;
  const nlohmann::json doc = nlohmann::json::parse(std::ifstream(trace));
  ASSERT_TRUE(doc.contains("stepsFolded")) << trace;
  const int folded = doc["stepsFolded"].get<int>();
  int kept = 0;
  for (const auto& e : doc["traceEvents"]) {
    kept += e.value("name", std::string()).starts_with("ProfilerStep#");
  }
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, 1000);
  EXPECT_EQ(folded + kept, 3000);
}

TEST(Hostile, FileSizeLimitIsOneLineAndNoTemporary) {
  TempDir d;
  const Child c = run_cli(small({"compare", "--backends", "flash", "--json", (d / "o.json").string()}, d.path()),
                          d.path(), {.fsize = 2048, .timeout_s = 60});
  expect_one_line(c, "file too large");
  EXPECT_TRUE(temporaries(d.path()).empty()) << temporaries(d.path()).front();
}

// ---- Special files and links as outputs ----------------------------------------------

TEST(Hostile, OutputsGoThroughDevicesAndLinks) {
  TempDir d;
  const fs::path null_link = d / "null", full_link = d / "full", chain = d / "chain";
  fs::create_symlink("/dev/null", null_link);
  fs::create_symlink("/dev/full", full_link);
  fs::create_symlink(null_link, chain);  // a link to a link to /dev/null
  for (const fs::path& p : {null_link, chain}) {
    const Child c = run_cli(small({"explain", "--json", p.string()}, d.path()), d.path());
    EXPECT_EQ(c.code, 0) << c.err;
    EXPECT_TRUE(fs::is_symlink(p)) << p << " was replaced";
  }
  EXPECT_TRUE(fs::is_character_file("/dev/null"));

  // /dev/full: its error, in one line; the link stays.
  Child c = run_cli(small({"explain", "--json", full_link.string()}, d.path()), d.path());
  expect_one_line(c, "No space left on device");
  EXPECT_TRUE(fs::is_symlink(full_link));
  spit(d / "t.json", kTrace);
  c = run_cli({"analyze", (d / "t.json").string(), "--json", full_link.string()}, d.path());
  expect_one_line(c, "No space left on device");

  // A link to a regular file: the file is written, the link stays a link.
  spit(d / "real.json", "old");
  fs::create_symlink(d / "real.json", d / "link.json");
  c = run_cli(small({"explain", "--json", (d / "link.json").string()}, d.path()), d.path());
  EXPECT_EQ(c.code, 0) << c.err;
  EXPECT_TRUE(fs::is_symlink(d / "link.json"));
  EXPECT_NE(slurp(d / "real.json").find("\"results\""), std::string::npos) << slurp(d / "real.json");

  // A dangling link: its target is created where the link points, but no
  // directory is made for it.
  fs::create_symlink(d / "new.json", d / "to_new.json");
  c = run_cli(small({"explain", "--json", (d / "to_new.json").string()}, d.path()), d.path());
  EXPECT_EQ(c.code, 0) << c.err;
  EXPECT_TRUE(fs::is_symlink(d / "to_new.json"));
  EXPECT_TRUE(fs::is_regular_file(d / "new.json"));
  fs::create_symlink(d / "no_dir" / "x.json", d / "to_nowhere.json");
  c = run_cli(small({"explain", "--json", (d / "to_nowhere.json").string()}, d.path()), d.path());
  expect_one_line(c, "whose directory does not exist");
  EXPECT_FALSE(fs::exists(d / "no_dir"));

  // /dev/stdout is the command's standard output (here a file the child holds).
  c = run_cli(small({"explain", "--json", "/dev/stdout"}, d.path()), d.path());
  EXPECT_EQ(c.code, 0) << c.err;
  EXPECT_NE(c.out.find("\"results\""), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("explain: "), std::string::npos) << c.out;  // the table too, not overwritten

  // A directory, a loop of links: one line each.
  fs::create_symlink(d / "loop_b", d / "loop_a");
  fs::create_symlink(d / "loop_a", d / "loop_b");
  c = run_cli(small({"explain", "--json", (d / "loop_a").string()}, d.path()), d.path());
  expect_one_line(c, "loop of symbolic links");
  EXPECT_TRUE(temporaries(d.path()).empty());
}

TEST(Hostile, FifoOutputIsWrittenToItsReaderOrRefused) {
  TempDir d;
  const fs::path fifo = d / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // No reader: refused now, not blocked on.
  Child c = run_cli(small({"explain", "--json", fifo.string()}, d.path()), d.path(), {.timeout_s = 30});
  expect_one_line(c, "no process is reading it");
  // A reader: it gets the document, and the FIFO stays a FIFO.
  std::string got;
  std::thread reader([&] {
    const int fd = ::open(fifo.c_str(), O_RDONLY);
    char buf[4096];
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) got.append(buf, static_cast<std::size_t>(n));
    ::close(fd);
  });
  // The reader must be there first: wait until a write end would open.
  for (int i = 0; i < 2000; ++i) {
    const int w = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (w >= 0) {
      // Opening a write end and closing it would end the reader's input: keep it open until the CLI is done.
      c = run_cli(small({"explain", "--json", fifo.string()}, d.path()), d.path(), {.timeout_s = 30});
      ::close(w);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  reader.join();
  EXPECT_EQ(c.code, 0) << c.err;
  EXPECT_NE(got.find("\"results\""), std::string::npos) << got;
  struct stat st;
  ASSERT_EQ(::stat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

TEST(Hostile, CollidingOutputsAreRefusedBeforeAnyWork) {
  TempDir d;
  const std::string p = (d / "o.out").string();
  Child c = run_cli(small({"compare", "--json", p, "--html", p}, d.path()), d.path(), {.timeout_s = 30});
  expect_one_line(c, "same file");
  EXPECT_FALSE(fs::exists(p));
  // --json onto a trace the run itself writes (through another spelling of the path).
  const std::string trace = (d / "traces" / "." / "1_2_128_64_naive.json").string();
  c = run_cli(small({"compare", "--backends", "naive", "--json", trace}, d.path()), d.path(), {.timeout_s = 30});
  expect_one_line(c, "the naive trace");
  EXPECT_FALSE(fs::exists(d / "traces" / "1_2_128_64_naive.txt")) << "work was done";
  // analyze --json onto the trace it reads.
  spit(d / "t.json", kTrace);
  c = run_cli({"analyze", (d / "t.json").string(), "--json", (d / "t.json").string()}, d.path());
  expect_one_line(c, "same file");
  EXPECT_EQ(slurp(d / "t.json"), kTrace);
  fs::create_symlink(d / "t.json", d / "alias.json");
  c = run_cli({"diff", (d / "t.json").string(), (d / "t.json").string(), "--json", (d / "alias.json").string()},
              d.path());
  expect_one_line(c, "same file");
  EXPECT_EQ(slurp(d / "t.json"), kTrace);
  // Two outputs to /dev/null lose nothing: allowed.
  c = run_cli({"analyze", (d / "t.json").string(), "--json", "/dev/null"}, d.path());
  EXPECT_EQ(c.code, 0) << c.err;
}

TEST(Hostile, ReadOnlyFileIsNotReplaced) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes anything";
  TempDir d;
  spit(d / "ro.json", "mine");
  fs::permissions(d / "ro.json", fs::perms::owner_read);
  const Child c = run_cli(small({"explain", "--json", (d / "ro.json").string()}, d.path()), d.path());
  expect_one_line(c, "read-only");
  EXPECT_EQ(slurp(d / "ro.json"), "mine");
}

// ---- Signals --------------------------------------------------------------------

// A write in progress, interrupted: its temporary goes, the final file is old or new.
TEST(Hostile, SignalDuringAWriteLeavesNoTemporary) {
  TempDir d;
  for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
    const fs::path target = d / ("big" + std::to_string(sig) + ".json");
    const pid_t pid = ::fork();
    if (pid == 0) {
      remove_temporaries_on_signals();
      const int n = ::open("/dev/null", O_WRONLY);
      ::dup2(n, 2);
      const std::string contents(std::size_t{256} << 20, 'x');
      write_file_atomically(target, contents, "test");
      ::_exit(0);
    }
    const auto t0 = std::chrono::steady_clock::now();
    bool sent = false;
    int status = 0;
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (!sent &&
          (!temporaries(d.path()).empty() || std::chrono::steady_clock::now() - t0 > std::chrono::seconds(20))) {
        ::kill(pid, sig);
        sent = true;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    EXPECT_TRUE(temporaries(d.path()).empty()) << "signal " << sig << " left " << temporaries(d.path()).front();
    EXPECT_TRUE(WIFSIGNALED(status) || WIFEXITED(status));
    if (WIFSIGNALED(status)) EXPECT_EQ(WTERMSIG(status), sig);  // it dies of the signal, as shells expect
    if (fs::exists(target)) EXPECT_EQ(fs::file_size(target), std::size_t{256} << 20);
  }
}

TEST(Hostile, InterruptedRunsLeaveNoTemporaries) {
  TempDir d;
  // Signals at several points of a run that writes traces, --json and tables.
  for (int i = 0; i < 4; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const double at_s = 0.15 + 0.2 * i;
    const Child c =
        run_cli(small({"compare", "--backends", "naive,flash", "--json", (d / "o.json").string()}, d.path()), d.path(),
                {.timeout_s = 60, .signal = i % 2 ? SIGTERM : SIGINT, .when = [&] {
                   return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > at_s;
                 }});
    EXPECT_FALSE(c.hung);
    EXPECT_TRUE(temporaries(d.path()).empty()) << temporaries(d.path()).front();
    if (c.signal != 0) EXPECT_NE(c.err.find("attnprof: "), std::string::npos) << c.err;
  }
}

}  // namespace
}  // namespace attnprof
