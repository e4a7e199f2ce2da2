// attnprof under hostile conditions (issue 20): resource limits, special
// files and links as outputs and inputs, colliding outputs, signals. The CLI
// runs in a child with the limit set, under a timeout (a hang fails the test
// instead of hanging it); special files live in a temporary directory (FIFOs,
// and links to /dev/null and /dev/full, the only real devices written).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "analysis/format.h"
#include "attnprof/error.h"
#include "attnprof/trace_io.h"
#include "attnprof/trace_reader.h"
#include "common/temp_dir.h"

#ifndef ATTNPROF_CLI_PATH
#error "ATTNPROF_CLI_PATH must name the attnprof executable"
#endif

namespace attnprof {
namespace {

namespace fs = std::filesystem;
using testing::slurp;

struct TempDir : testing::TempDir {
  TempDir() : testing::TempDir("attnprof_hostile") {}
};

void spit(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

// Names in `dir` (recursively) that look like our temporaries.
std::vector<std::string> temporaries(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.find(".tmp") != std::string::npos || name.find(".attnprof-probe") != std::string::npos)
      out.push_back(name);
  }
  return out;
}

struct Child {
  int code = -1;   // exit status, or -1 when killed
  int signal = 0;  // the signal that killed it
  bool hung = false;
  std::string out, err;
  std::vector<std::string> err_lines() const {
    std::vector<std::string> lines;
    std::stringstream ss(err);
    for (std::string l; std::getline(ss, l);) {
      if (!l.empty()) lines.push_back(l);
    }
    return lines;
  }
};

struct Limits {
  std::optional<rlim_t> as, fsize;
  double timeout_s = 120;
  // Sent to the child once `when` returns true (polled every millisecond).
  int signal = 0;
  std::function<bool()> when;
};

// Runs the CLI with `args` in a child under `l`; stdout and stderr to files in `io`.
Child run_cli(const std::vector<std::string>& args, const fs::path& io, const Limits& l = {}) {
  const fs::path out = io / ".out", err = io / ".err";
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int n = ::open("/dev/null", O_RDONLY);
    ::dup2(o, 1);
    ::dup2(e, 2);
    ::dup2(n, 0);
    if (l.as) {
      const rlimit r{*l.as, *l.as};
      ::setrlimit(RLIMIT_AS, &r);
    }
    if (l.fsize) {
      const rlimit r{*l.fsize, *l.fsize};
      ::setrlimit(RLIMIT_FSIZE, &r);
    }
    ::setenv("ATTNPROF_CEILING_TFLOPS", "1", 1);
    ::setenv("ATTNPROF_COPY_GBS", "10", 1);
    std::vector<char*> argv;
    std::string exe = ATTNPROF_CLI_PATH;
    argv.push_back(exe.data());
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(exe.c_str(), argv.data());
    ::_exit(127);
  }
  Child c;
  const auto t0 = std::chrono::steady_clock::now();
  bool sent = false;
  int status = 0;
  while (true) {
    const pid_t w = ::waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (l.signal && !sent && l.when && l.when()) {
      ::kill(pid, l.signal);
      sent = true;
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > l.timeout_s) {
      c.hung = true;
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (WIFEXITED(status)) c.code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) c.signal = WTERMSIG(status);
  c.out = slurp(out);
  c.err = slurp(err);
  fs::remove(out);
  fs::remove(err);
  return c;
}

// One line "attnprof: ..." naming `needle`, a non-zero exit, no signal, no hang.
void expect_one_line(const Child& c, const std::string& needle) {
  EXPECT_FALSE(c.hung) << "the command hung";
  EXPECT_EQ(c.signal, 0) << "killed by signal " << c.signal << "; stderr: " << c.err;
  EXPECT_GT(c.code, 0) << "stderr: " << c.err;
  const auto lines = c.err_lines();
  ASSERT_EQ(lines.size(), 1u) << "stderr must be one line, got:\n" << c.err;
  EXPECT_EQ(lines[0].rfind("attnprof: ", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find(needle), std::string::npos) << "'" << lines[0] << "' does not say " << needle;
  EXPECT_EQ(lines[0].find("internal error"), std::string::npos) << lines[0];
}

// The small problem every run here uses, one recorded step.
std::vector<std::string> small(std::vector<std::string> head, const fs::path& dir) {
  for (const char* a : {"--device", "cpu", "--batch", "1", "--heads", "2", "--seq", "128", "--head-dim", "64",
                        "--warmup", "0", "--active", "1", "--quiet", "--threads", "2"}) {
    head.emplace_back(a);
  }
  head.emplace_back("--trace-dir");
  head.push_back((dir / "traces").string());
  return head;
}

// A minimal trace attnprof reads.
const char* kTrace =
    R"({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 2}]})";

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

TEST(Hostile, LongScheduleIsRefusedNotGrown) {
  TempDir d;
  if (!starts_under(rlim_t{1500} << 20, d.path())) GTEST_SKIP() << "the executable cannot load under 1500 MiB";
  std::vector<std::string> args = small({"profile", "--backend", "naive"}, d.path());
  for (const char* a : {"--active", "1000", "--repeat", "100"}) args.emplace_back(a);
  // The limit stands for a small machine: the trace's estimate is over what is left.
  const Child c = run_cli(args, d.path(), {.as = rlim_t{1500} << 20, .timeout_s = 60});
  expect_one_line(c, "active");
  EXPECT_NE(c.err.find("repeat"), std::string::npos) << c.err;
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
