// The attnprof executable run in a child under resource limits, a signal on
// cue and a timeout (a hang fails the test instead of hanging it), for the
// hostile-condition tests (hostile_test.cpp, hostile_inputs_test.cpp), with
// their shared checks and fixtures. ATTNPROF_CLI_PATH names the executable.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "common/temp_dir.h"

#ifndef ATTNPROF_CLI_PATH
#error "ATTNPROF_CLI_PATH must name the attnprof executable"
#endif

namespace attnprof::testing::hostile {

namespace fs = std::filesystem;

struct TempDir : testing::TempDir {
  TempDir() : testing::TempDir("attnprof_hostile") {}
};

inline void spit(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

// Names in `dir` (recursively) that look like our temporaries.
inline std::vector<std::string> temporaries(const fs::path& dir) {
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
inline Child run_cli(const std::vector<std::string>& args, const fs::path& io, const Limits& l = {}) {
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
inline void expect_one_line(const Child& c, const std::string& needle) {
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
inline std::vector<std::string> small(std::vector<std::string> head, const fs::path& dir) {
  for (const char* a : {"--device", "cpu", "--batch", "1", "--heads", "2", "--seq", "128", "--head-dim", "64",
                        "--warmup", "0", "--active", "1", "--quiet", "--threads", "2"}) {
    head.emplace_back(a);
  }
  head.emplace_back("--trace-dir");
  head.push_back((dir / "traces").string());
  return head;
}

// A minimal trace attnprof reads.
inline constexpr const char* kTrace =
    R"({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1, "dur": 2}]})";

}  // namespace attnprof::testing::hostile
