// The GPU stack is loaded only when a GPU is asked for: a CPU run of the
// attnprof command fits under an address-space limit the CUDA libraries alone
// exceed, and `--device cuda` without a usable GPU is one line and a non-zero
// exit, never a loader error. In CUDA builds the plugin is also loaded for
// real against the toolkit's stub driver (the command exports everything the
// plugin takes from it), and under the limit (it cannot, and says so).
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
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "attnprof/runner.h"
#include "common/temp_dir.h"

#ifndef ATTNPROF_CLI_PATH
#error "ATTNPROF_CLI_PATH must name the attnprof executable"
#endif

namespace attnprof {
namespace {

namespace fs = std::filesystem;

// The address space a CPU run of kSmall is given. Measured (VmPeak, one
// thread): about 430 MB, of which 256 MB is the copy-ceiling probe's two
// 128 MB buffers (backends/cpu/runtime.cpp); mapping libcudart, cuBLAS(Lt),
// NVRTC, CUPTI and cuDNN takes about 790 MB more (CUDA 13), so a command that
// loaded them at start-up (about 1.2 GB) could not run under this limit.
constexpr rlim_t kAddressSpaceLimit = 768ull << 20;

const std::vector<std::string> kSmall = {"--device", "cpu",   "--batch", "1",          "--heads",
                                         "2",        "--seq", "128",     "--head-dim", "64"};

struct Child {
  int code = -1;  // exit status, or 128 + signal
  bool timed_out = false;
  std::string out, err;
  std::vector<std::string> err_lines() const {
    std::vector<std::string> lines;
    std::istringstream is(err);
    for (std::string l; std::getline(is, l);) lines.push_back(l);
    return lines;
  }
};

using testing::slurp;

struct TempDir : testing::TempDir {
  TempDir() : testing::TempDir("attnprof_plugin") {}
};

struct Launch {
  std::vector<std::string> args;
  std::optional<rlim_t> address_space;  // RLIMIT_AS for the child
  std::vector<std::string> env;         // NAME=value, added to ours
  std::chrono::seconds timeout{120};    // then SIGKILL
};

// Runs the attnprof command in a child (fork, setrlimit, exec), its output in
// files under `io`, stdin /dev/null.
Child run(const Launch& l, const TempDir& io) {
  const std::string out = (io.path() / "stdout").string(), err = (io.path() / "stderr").string();
  std::vector<std::string> argv_s = {ATTNPROF_CLI_PATH};
  argv_s.insert(argv_s.end(), l.args.begin(), l.args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  // Our environment, with l.env's names replaced.
  std::vector<std::string> env_s;
  for (char** e = environ; *e; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& mine : l.env) replaced = replaced || mine.rfind(name + "=", 0) == 0;
    if (!replaced) env_s.push_back(entry);
  }
  env_s.insert(env_s.end(), l.env.begin(), l.env.end());
  std::vector<char*> envp;
  for (auto& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);

  const pid_t pid = ::fork();
  if (pid == 0) {
    // Only async-signal-safe calls from here to exec.
    const int in = ::open("/dev/null", O_RDONLY);
    const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (in < 0 || o < 0 || e < 0 || ::dup2(in, 0) < 0 || ::dup2(o, 1) < 0 || ::dup2(e, 2) < 0) ::_exit(126);
    if (l.address_space) {
      const rlimit lim{*l.address_space, *l.address_space};
      if (::setrlimit(RLIMIT_AS, &lim) != 0) ::_exit(125);
    }
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  Child c;
  if (pid < 0) return c;
  const auto deadline = std::chrono::steady_clock::now() + l.timeout;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      c.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  c.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  c.out = slurp(out);
  c.err = slurp(err);
  return c;
}

// One thread everywhere, so the CPU run's own address space does not grow
// with the machine's core count (each OpenMP and OpenBLAS thread reserves
// its stack and buffers).
const std::vector<std::string> kOneThread = {"OMP_NUM_THREADS=1", "OPENBLAS_NUM_THREADS=1", "OMP_WAIT_POLICY=PASSIVE"};

std::vector<std::string> compare_args(const TempDir& dir, const std::vector<std::string>& problem) {
  std::vector<std::string> a = {"compare", "--quiet", "--threads", "1", "--trace-dir", (dir.path() / "t").string()};
  a.insert(a.end(), problem.begin(), problem.end());
  return a;
}

TEST(CudaPlugin, CpuRunFitsUnderAnAddressSpaceLimit) {
  TempDir dir;
  const Child c = run({.args = compare_args(dir, kSmall), .address_space = kAddressSpaceLimit, .env = kOneThread}, dir);
  EXPECT_FALSE(c.timed_out) << "compare hung under RLIMIT_AS = " << (kAddressSpaceLimit >> 20) << " MiB";
  EXPECT_EQ(c.code, 0) << "under RLIMIT_AS = " << (kAddressSpaceLimit >> 20) << " MiB, stderr:\n" << c.err;
  EXPECT_NE(c.out.find("naive"), std::string::npos) << c.out;
  EXPECT_EQ(c.err.find("error while loading shared libraries"), std::string::npos) << c.err;
}

bool has_gpu() {
  std::error_code ec;
  return fs::exists("/dev/nvidia0", ec) || fs::exists("/dev/dxg", ec);
}

// Without a usable GPU (a CPU-only build, a CUDA build without the driver or
// without the plugin), --device cuda is one line naming CUDA and a non-zero
// exit: never the dynamic loader's own message and exit 127.
TEST(CudaPlugin, DeviceCudaWithoutAGpuIsOneLine) {
  if (cuda_built() && has_gpu()) GTEST_SKIP() << "this machine has a GPU: --device cuda runs";
  TempDir dir;
  std::vector<std::string> problem = kSmall;
  problem[1] = "cuda";
  const Child c = run({.args = compare_args(dir, problem)}, dir);
  EXPECT_FALSE(c.timed_out);
  EXPECT_NE(c.code, 0);
  EXPECT_NE(c.code, 127) << c.err;
  EXPECT_LT(c.code, 128) << "killed by signal " << c.code - 128;
  const auto lines = c.err_lines();
  ASSERT_EQ(lines.size(), 1u) << c.err;
  EXPECT_EQ(lines[0].rfind("attnprof: ", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find("CUDA"), std::string::npos) << lines[0];
}

#ifdef ATTNPROF_CUDA_STUB_DRIVER
// The toolkit's stub libcuda.so stands in for the driver: the plugin and
// every CUDA library load (so every symbol the plugin takes from the command
// resolved, RTLD_NOW), and the CUDA runtime itself says there is no device.
TEST(CudaPlugin, LoadsAgainstTheStubDriverAndSaysThereIsNoDevice) {
  TempDir dir;
  const fs::path lib = dir.path() / "lib";
  fs::create_directories(lib);
  fs::create_symlink(ATTNPROF_CUDA_STUB_DRIVER, lib / "libcuda.so.1");
  std::vector<std::string> problem = kSmall;
  problem[1] = "cuda";
  const Child c = run({.args = compare_args(dir, problem), .env = {"LD_LIBRARY_PATH=" + lib.string()}}, dir);
  EXPECT_FALSE(c.timed_out);
  EXPECT_NE(c.code, 0);
  EXPECT_LT(c.code, 127) << c.err;
  const auto lines = c.err_lines();
  ASSERT_EQ(lines.size(), 1u) << c.err;
  EXPECT_NE(lines[0].find("no CUDA device"), std::string::npos)
      << "the plugin did not get as far as the runtime: " << lines[0];
}

// The limit means something: under it, the same --device cuda run cannot map
// the CUDA libraries, and says so in one line (the loader's own words) instead
// of dying in the loader.
TEST(CudaPlugin, UnderTheLimitTheCudaLibrariesDoNotLoadAndItSaysSo) {
  TempDir dir;
  const fs::path lib = dir.path() / "lib";
  fs::create_directories(lib);
  fs::create_symlink(ATTNPROF_CUDA_STUB_DRIVER, lib / "libcuda.so.1");
  std::vector<std::string> problem = kSmall;
  problem[1] = "cuda";
  std::vector<std::string> env = kOneThread;
  env.push_back("LD_LIBRARY_PATH=" + lib.string());
  const Child c = run({.args = compare_args(dir, problem), .address_space = kAddressSpaceLimit, .env = env}, dir);
  EXPECT_FALSE(c.timed_out);
  EXPECT_NE(c.code, 0);
  EXPECT_LT(c.code, 127) << c.err;
  const auto lines = c.err_lines();
  ASSERT_EQ(lines.size(), 1u) << c.err;
  EXPECT_EQ(lines[0].rfind("attnprof: ", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find("cannot load the CUDA plugin"), std::string::npos) << lines[0];
}
#endif

}  // namespace
}  // namespace attnprof
