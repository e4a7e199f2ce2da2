// The attnprof executable run as a user runs it, for the CLI tests: its exit
// code, stdout and stderr captured, and the checks every refusal must pass
// (one stderr line "attnprof: ..." naming the problem, no crash).
// ATTNPROF_CLI_PATH names the executable (tests/CMakeLists.txt).
#pragma once

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "common/temp_dir.h"

#ifndef ATTNPROF_CLI_PATH
#error "ATTNPROF_CLI_PATH must name the attnprof executable"
#endif

namespace attnprof::testing {

struct CliRun {
  int code = -1;
  std::string out, err;
  double seconds = 0;
  std::vector<std::string> err_lines() const {
    std::vector<std::string> lines;
    std::istringstream is(err);
    for (std::string l; std::getline(is, l);) lines.push_back(l);
    return lines;
  }
};

// s as one word for /bin/sh.
inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) {
    if (c == '\'') {
      q += "'\\''";
    } else {
      q += c;
    }
  }
  return q + "'";
}

// Runs attnprof with `args` in `cwd` (the test's own when empty), stdin
// empty, stdout and stderr captured through two files in `io` (removed
// again).
inline CliRun run_cli(const std::vector<std::string>& args, const std::filesystem::path& io,
                      const std::filesystem::path& cwd = {}) {
  std::string cmd;
  if (!cwd.empty()) cmd += "cd " + shell_quote(cwd.string()) + " && ";
  cmd += shell_quote(ATTNPROF_CLI_PATH);
  for (const auto& a : args) cmd += " " + shell_quote(a);
  const std::filesystem::path out = io / ".stdout", err = io / ".stderr";
  cmd += " >" + shell_quote(out.string()) + " 2>" + shell_quote(err.string()) + " </dev/null";
  CliRun r;
  const auto t0 = std::chrono::steady_clock::now();
  const int status = std::system(cmd.c_str());
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(out);
  r.err = slurp(err);
  std::filesystem::remove(out);
  std::filesystem::remove(err);
  return r;
}

// run_cli capturing through the test's temporary directory.
inline CliRun attnprof(const std::vector<std::string>& args, const TempDir& io, const std::filesystem::path& cwd = {}) {
  return run_cli(args, io.path(), cwd);
}

// A one-line refusal: non-zero exit (`code` when given), one stderr line
// "attnprof: ..." naming `needle`, no crash and no internal error.
inline void expect_refused(const CliRun& r, const std::string& needle, int code = -1) {
  EXPECT_NE(r.code, 0) << "stderr: " << r.err;
  if (code >= 0) EXPECT_EQ(r.code, code) << "stderr: " << r.err;
  EXPECT_NE(r.code, 128 + SIGSEGV);
  EXPECT_NE(r.code, 128 + SIGABRT);
  const auto lines = r.err_lines();
  ASSERT_EQ(lines.size(), 1u) << "stderr must be exactly one line, got:\n" << r.err;
  EXPECT_EQ(lines[0].rfind("attnprof: ", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find(needle), std::string::npos) << "'" << lines[0] << "' does not name " << needle;
  EXPECT_EQ(lines[0].find("internal error"), std::string::npos) << lines[0];
  EXPECT_EQ(r.err.back(), '\n');
}

// base followed by more.
inline std::vector<std::string> with(std::vector<std::string> base, const std::vector<std::string>& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

// Files in a directory (hidden ones included); empty if it does not exist.
inline std::set<std::string> listing(const std::filesystem::path& dir) {
  std::set<std::string> names;
  std::error_code ec;
  if (!std::filesystem::exists(dir, ec)) return names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

}  // namespace attnprof::testing
