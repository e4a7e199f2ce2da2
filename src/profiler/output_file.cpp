// Output files (attnprof/trace_io.h): every file attnprof writes goes through
// write_file_atomically. A path that names a regular file (or nothing yet) is
// written to a temporary beside it and renamed over it, so readers see the
// old file or the new one; a path that names a character device, a FIFO or
// one of our own descriptors (/dev/stdout, /dev/fd/N) is written through, as
// the shell's `>` would, so /dev/null, a terminal or a pipe get the bytes and
// the device entry survives. Symbolic links are followed to what they name.
// The temporaries alive at any moment are listed where a signal handler can
// unlink them.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "attnprof/error.h"
#include "attnprof/trace_io.h"

namespace attnprof {
namespace {

namespace fs = std::filesystem;

std::string errno_text(int err) {
  if (err == EFBIG) return "file too large (the file-size limit, ulimit -f)";
  if (err == EPIPE) return "the reader closed it (broken pipe)";
  if (err == ELOOP) return "a loop of symbolic links";
  if (err == ENXIO) return "no process is reading it";
  return std::generic_category().message(err);
}

// ---- The temporaries a signal must not leave behind ------------------------------
//
// A fixed table the handler reads without locks or allocation: a slot is
// claimed (1), its path written, then published (2); the handler unlinks the
// published ones. A path too long for a slot, or a table full of concurrent
// writers, is written without the cover (the rename still makes it safe).

constexpr int kSlots = 64;
constexpr std::size_t kSlotPath = 4096;
struct Slot {
  std::atomic<int> state{0};
  char path[kSlotPath];
};
Slot g_slots[kSlots];

class TempFile {
 public:
  explicit TempFile(fs::path path) : path_(std::move(path)) {
    const std::string& s = path_.native();
    if (s.size() >= kSlotPath) return;
    for (int i = 0; i < kSlots; ++i) {
      int free = 0;
      if (!g_slots[i].state.compare_exchange_strong(free, 1)) continue;
      std::memcpy(g_slots[i].path, s.c_str(), s.size() + 1);
      g_slots[i].state.store(2, std::memory_order_release);
      slot_ = i;
      return;
    }
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  // Unlinks the file unless it was renamed away.
  ~TempFile() {
    if (!kept_) ::unlink(path_.c_str());
    release();
  }
  const fs::path& path() const { return path_; }
  void renamed() {
    kept_ = true;
    release();
  }

 private:
  void release() {
    if (slot_ >= 0) g_slots[slot_].state.store(0, std::memory_order_release);
    slot_ = -1;
  }
  fs::path path_;
  int slot_ = -1;
  bool kept_ = false;
};

volatile sig_atomic_t g_stderr_tty = 0;

void write_stderr(const char* s) {
  std::size_t n = std::strlen(s);
  while (n > 0) {
    const ssize_t w = ::write(2, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<std::size_t>(w);
  }
}

void on_fatal_signal(int sig) {
  const int saved = errno;
  for (Slot& slot : g_slots) {
    if (slot.state.load(std::memory_order_acquire) == 2) ::unlink(slot.path);
  }
  // SIGPIPE: the reader of our output went away (`| head`); nothing to say.
  if (sig != SIGPIPE) {
    if (g_stderr_tty) write_stderr("\r\033[K");
    write_stderr(sig == SIGINT    ? "attnprof: interrupted (SIGINT)\n"
                 : sig == SIGTERM ? "attnprof: terminated (SIGTERM)\n"
                                  : "attnprof: hung up (SIGHUP)\n");
  }
  errno = saved;
  // Die of the signal, as the shell expects of an interrupted command.
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

// ---- Where a path's bytes go ------------------------------------------------------

struct Target {
  enum Mode { Replace, Device, Descriptor } mode = Replace;
  fs::path path;              // Replace: the file renamed over; Device: what is opened
  int fd = -1;                // Descriptor: our own open descriptor
  bool exists = false;        // Replace: a file is there now
  mode_t perm = 0666;         // Replace: the existing file's permissions, kept
  bool fifo = false;          // Device: a FIFO, not a character device
  bool through_link = false;  // Replace: `path` is a symbolic link to `path`
  std::string refusal;        // why the path cannot be written at all
};

// /proc/self/fd/N, /proc/<our pid>/fd/N: the descriptor N, or -1.
int own_descriptor(const fs::path& link) {
  std::error_code ec;
  const fs::path dir = fs::weakly_canonical(link.parent_path(), ec);
  if (ec) return -1;
  const std::string d = dir.string();
  if (d != "/proc/self/fd" && d != "/proc/" + std::to_string(::getpid()) + "/fd" && d != "/proc/thread-self/fd") {
    return -1;
  }
  const std::string name = link.filename().string();
  if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos || name.size() > 9) return -1;
  return std::stoi(name);
}

bool under_proc(const fs::path& link) {
  std::error_code ec;
  const std::string d = fs::weakly_canonical(link.parent_path(), ec).string();
  return !ec && (d == "/proc" || d.rfind("/proc/", 0) == 0);
}

// Follows the final component's symbolic links (directories on the way are
// the kernel's to resolve); stops at a link into /proc, whose target text is
// no path ("pipe:[123]").
Target classify(const fs::path& path) {
  Target t;
  fs::path p = path;
  for (int hops = 0;; ++hops) {
    if (hops > 40) {
      t.refusal = errno_text(ELOOP);
      return t;
    }
    struct stat lst;
    if (::lstat(p.c_str(), &lst) != 0) {
      if (errno == ENOENT) break;  // nothing there yet: created by the rename
      t.refusal = errno_text(errno);
      return t;
    }
    if (!S_ISLNK(lst.st_mode)) break;
    if (under_proc(p)) {
      if (const int fd = own_descriptor(p); fd >= 0) {
        t.mode = Target::Descriptor;
        t.fd = fd;
        if (::fcntl(fd, F_GETFL) < 0) t.refusal = "descriptor " + std::to_string(fd) + " is not open";
        return t;
      }
      break;  // another process's descriptor: opened below, through the kernel's link
    }
    std::error_code ec;
    const fs::path target = fs::read_symlink(p, ec);
    if (ec) {
      t.refusal = ec.message();
      return t;
    }
    p = target.is_absolute() ? target : p.parent_path() / target;
    t.through_link = true;
  }
  struct stat st;
  if (::stat(p.c_str(), &st) != 0) {
    if (errno != ENOENT) {
      t.refusal = errno_text(errno);
      return t;
    }
    t.path = p;
    return t;
  }
  t.path = p;
  if (S_ISDIR(st.st_mode)) {
    t.refusal = "it is a directory, not a file";
  } else if (S_ISBLK(st.st_mode)) {
    t.refusal = "it is a block device (a disk): attnprof does not write over disks";
  } else if (S_ISSOCK(st.st_mode)) {
    t.refusal = "it is a socket, not a file";
  } else if (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)) {
    t.mode = Target::Device;
    t.fifo = S_ISFIFO(st.st_mode);
  } else if (under_proc(p) && p != path) {
    t.mode = Target::Device;  // a regular file behind another process's descriptor: written in place
  } else {
    t.exists = true;
    t.perm = st.st_mode & 07777;
  }
  return t;
}

// Writes all of `contents` to `fd`; 0 or the errno of the failure. SIGPIPE is
// held back while it writes, so a reader that went away is EPIPE, one line,
// not a silent death.
int write_all(int fd, std::string_view contents) {
  sigset_t pipe_set, old;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  sigset_t pending;
  sigpending(&pending);
  const bool was_pending = sigismember(&pending, SIGPIPE) == 1;
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
  int err = 0;
  const char* p = contents.data();
  std::size_t left = contents.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {  // a descriptor someone left non-blocking: wait for room
        ::usleep(1000);
        continue;
      }
      err = errno;
      break;
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  if (err == EPIPE && !was_pending) {
    const timespec zero{0, 0};
    ::sigtimedwait(&pipe_set, nullptr, &zero);  // the SIGPIPE this write raised
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return err;
}

std::string temp_name(const fs::path& final_path) {
  static std::atomic<std::uint64_t> counter{0};
  // A name no other writer picks: concurrent writers of one path each rename
  // a complete file, and the last one wins.
  const std::uint64_t unique = std::hash<std::thread::id>{}(std::this_thread::get_id()) ^
                               static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  // Built by appending: GCC 12 warns (-Wrestrict, a false positive) on "." + string.
  std::string name = ".";
  name += final_path.filename().string();
  name += ".tmp" + std::to_string(::getpid()) + "_" + std::to_string(unique % 1000000007) + "_" +
          std::to_string(counter.fetch_add(1));
  return name;
}

// Why files cannot be written into `dir` (created if missing), or nothing.
std::string unwritable_dir(const fs::path& dir) {
  std::error_code ec;
  // The directories this check makes are removed after it (the writers make
  // them again): a run refused later leaves no empty directory behind. Only
  // empty ones are removed, deepest first, up to the first that existed.
  std::vector<fs::path> made;
  for (fs::path d = dir; !d.empty() && !fs::exists(fs::symlink_status(d, ec)); d = d.parent_path()) {
    made.push_back(d);
    if (d == d.parent_path()) break;
  }
  struct Unmake {
    const std::vector<fs::path>& dirs;
    ~Unmake() {
      std::error_code e;
      for (const fs::path& d : dirs) fs::remove(d, e);  // fails, and keeps it, where anything is inside
    }
  } unmake{made};
  fs::create_directories(dir, ec);
  if (ec) return ec == std::errc::too_many_symbolic_link_levels ? errno_text(ELOOP) : ec.message();
  if (!fs::is_directory(dir, ec)) return "not a directory";
  const TempFile probe(dir / (".attnprof-probe-" + std::to_string(::getpid())));
  const int fd = ::open(probe.path().c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    if (err == EEXIST) return {};  // another check of ours made it a moment ago: the directory takes files
    return "cannot create files there (" + errno_text(err) + ")";
  }
  ::close(fd);
  return {};
}

}  // namespace

namespace {

// Pieces of a document gathered into writes of about a megabyte; the first
// failed write's errno is kept and the rest skipped.
class BufferedWrite {
 public:
  explicit BufferedWrite(int fd) : fd_(fd) { buffer_.reserve(kChunk); }
  void operator()(std::string_view piece) {
    if (err_) return;
    if (buffer_.size() + piece.size() > kChunk) flush();
    if (piece.size() >= kChunk) {
      if (!err_) err_ = write_all(fd_, piece);
      return;
    }
    buffer_.append(piece);
  }
  // The errno of the first failed write, 0 when every write went through.
  int finish() {
    flush();
    return err_;
  }

 private:
  static constexpr std::size_t kChunk = std::size_t{1} << 20;
  void flush() {
    if (!err_ && !buffer_.empty()) err_ = write_all(fd_, buffer_);
    buffer_.clear();
  }
  int fd_;
  int err_ = 0;
  std::string buffer_;
};

// produce's text into fd through a BufferedWrite, then fd closed (also when
// produce throws): 0, or the errno of the first write or close that failed.
int write_then_close(int fd, const std::function<void(const WritePiece&)>& produce) {
  BufferedWrite out(fd);
  int err = 0;
  try {
    produce(std::ref(out));
    err = out.finish();
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0 && err == 0 && errno != EINTR) err = errno;
  return err;
}

}  // namespace

void write_file_atomically(const fs::path& path, std::string_view contents, std::string_view what) {
  write_file_atomically(
      path, [contents](const WritePiece& write) { write(contents); }, what);
}

void write_file_atomically(const fs::path& path, const std::function<void(const WritePiece&)>& produce,
                           std::string_view what) {
  const auto fail_io = [&](const std::string& reason) {
    fail(ErrorKind::Io, "cannot write " + std::string(what) + " to " + path.string() + ": " + reason);
  };
  if (path.filename().empty()) fail_io("the path names no file");
  const Target t = classify(path);
  if (!t.refusal.empty()) fail_io(t.refusal);

  if (t.mode == Target::Descriptor) {
    std::fflush(stdout);  // what was printed before comes before it
    BufferedWrite out(t.fd);
    produce(std::ref(out));
    if (const int err = out.finish()) fail_io(errno_text(err));
    return;
  }
  if (t.mode == Target::Device) {
    // Non-blocking open: a FIFO with no reader is ENXIO now, not a hang.
    const fs::path& dev = t.path.empty() ? path : t.path;
    const int fd = ::open(dev.c_str(), O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | (t.fifo ? 0 : O_APPEND));
    if (fd < 0) fail_io(errno_text(errno));
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    if (const int err = write_then_close(fd, produce)) fail_io(errno_text(err));
    return;
  }

  const fs::path& final_path = t.path.empty() ? path : t.path;
  if (t.exists && ::access(final_path.c_str(), W_OK) != 0 && errno == EACCES) {
    fail_io("it is read-only (permission denied)");
  }
  std::error_code ec;
  const fs::path dir = final_path.parent_path();
  if (!dir.empty() && !t.through_link) {  // a link's target is where it points, not where to make directories
    fs::create_directories(dir, ec);
    if (ec) fail_io(ec.message());
  }
  TempFile tmp(dir / temp_name(final_path));
  const int fd = ::open(tmp.path().c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) fail_io(errno == EACCES ? "cannot create a file there (permission denied)" : errno_text(errno));
  if (t.exists) (void)::fchmod(fd, t.perm);  // a replaced file keeps its permissions
  // (On a throw the temporary goes with tmp.)
  if (const int err = write_then_close(fd, produce)) fail_io(errno_text(err));
  if (::rename(tmp.path().c_str(), final_path.c_str()) != 0) fail_io(errno_text(errno));
  tmp.renamed();
}

void check_output_dir(const fs::path& dir, std::string_view flag) {
  if (const std::string why = unwritable_dir(dir); !why.empty()) {
    fail(ErrorKind::Io, "cannot use " + std::string(flag) + " " + dir.string() + ": " + why, {std::string(flag)});
  }
}

void check_output_file(const fs::path& path, std::string_view flag) {
  const auto refuse = [&](const std::string& why) {
    fail(ErrorKind::Io, "cannot write " + std::string(flag) + " " + path.string() + ": " + why, {std::string(flag)});
  };
  if (path.filename().empty()) refuse("it names a directory, not a file");
  const Target t = classify(path);
  if (!t.refusal.empty()) refuse(t.refusal);
  if (t.mode == Target::Descriptor) {
    const int fl = ::fcntl(t.fd, F_GETFL);
    if ((fl & O_ACCMODE) == O_RDONLY) refuse("descriptor " + std::to_string(t.fd) + " is open for reading only");
    return;
  }
  if (t.mode == Target::Device) {
    if (::access(t.path.c_str(), W_OK) != 0) refuse(errno_text(errno));
    return;  // a FIFO's reader is looked for when it is written: opening it here would end the reader's input
  }
  const fs::path& final_path = t.path.empty() ? path : t.path;
  if (t.exists && ::access(final_path.c_str(), W_OK) != 0 && errno == EACCES) {
    refuse("it is read-only (permission denied)");
  }
  const fs::path dir = final_path.parent_path().empty() ? fs::path(".") : final_path.parent_path();
  std::error_code ec;
  if (t.through_link && !fs::is_directory(dir, ec)) {
    refuse("it is a symbolic link to " + final_path.string() + ", whose directory does not exist");
  }
  if (const std::string why = unwritable_dir(dir); !why.empty()) refuse(dir.string() + ": " + why);
}

bool same_file(const fs::path& a, const fs::path& b) {
  struct stat sa, sb;
  const bool ea = ::stat(a.c_str(), &sa) == 0, eb = ::stat(b.c_str(), &sb) == 0;
  if (ea && eb) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  if (ea != eb) return false;
  // Neither exists yet: the same path once links and dots in the directories are resolved.
  std::error_code e1, e2;
  const fs::path ca = fs::weakly_canonical(fs::absolute(a, e1), e1);
  const fs::path cb = fs::weakly_canonical(fs::absolute(b, e2), e2);
  if (e1 || e2) return fs::absolute(a).lexically_normal() == fs::absolute(b).lexically_normal();
  return ca == cb;
}

void check_distinct_files(const std::vector<NamedFile>& files) {
  for (std::size_t i = 0; i < files.size(); ++i) {
    if (!files[i].output) continue;
    for (std::size_t j = 0; j < files.size(); ++j) {
      if (i == j || (files[j].output && j < i)) continue;
      if (!same_file(files[i].path, files[j].path)) continue;
      struct stat st;
      // Two outputs to /dev/null (or one terminal) lose nothing.
      if (files[j].output && ::stat(files[i].path.c_str(), &st) == 0 && S_ISCHR(st.st_mode)) continue;
      fail(ErrorKind::InvalidArgument,
           "cannot write " + files[i].what + " " + files[i].path.string() + ": it is the same file as " +
               files[j].what + " " + files[j].path.string() + (files[j].output ? "" : ", which is read") +
               ": give each output its own path",
           {files[i].what, files[j].what});
    }
  }
}

void remove_temporaries_on_signals() {
  g_stderr_tty = ::isatty(2) ? 1 : 0;
  struct sigaction sa {};
  sa.sa_handler = on_fatal_signal;
  sigemptyset(&sa.sa_mask);
  for (const int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) {
    struct sigaction old {};
    ::sigaction(sig, nullptr, &old);
    if (old.sa_handler == SIG_IGN) continue;  // nohup and friends: still ignored
    ::sigaction(sig, &sa, nullptr);
  }
  // Past the file-size limit a write then fails with EFBIG, which is reported
  // in one line, instead of the process dying of SIGXFSZ mid-file.
  ::signal(SIGXFSZ, SIG_IGN);
}

}  // namespace attnprof
