// Where a trace's text comes from (attnprof/trace_reader.h): a file opened
// without blocking and refused when it is no file, read through zlib (gzipped
// or not), or text in memory; the events are read by read_trace_stream
// (trace_reader.cpp). Every refusal is one "cannot read SOURCE: why".
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <new>
#include <string>
#include <system_error>

#include "analysis/trace_splitter.h"
#include "analysis/trace_stream.h"
#include "attnprof/error.h"
#include "attnprof/trace_reader.h"

namespace attnprof {
namespace {

using namespace trace_reading;

std::string errno_reason(int err) { return std::generic_category().message(err); }

}  // namespace

Trace parse_chrome_trace(std::string_view json, std::string_view source, const TraceReadOptions& options) {
  std::size_t pos = 0;
  try {
    return read_trace_stream(
        [&](char* buf, std::size_t cap) {
          const std::size_t n = std::min(cap, json.size() - pos);
          std::memcpy(buf, json.data() + pos, n);
          pos += n;
          return n;
        },
        options);
  } catch (const Unreadable& u) {
    fail(ErrorKind::BadInput, "cannot read " + std::string(source) + ": " + u.why);
  } catch (const std::bad_alloc&) {
    fail(ErrorKind::BadInput, "cannot read " + std::string(source) + ": not enough memory for its events");
  }
}

namespace {

// Opens `path` for reading without blocking, and refuses what is no file: a
// directory, a device (/dev/zero never ends), a socket, a FIFO nobody writes
// to within a few seconds. A FIFO or pipe that is written to (`analyze
// <(zcat t.json.gz)`) is read.
int open_trace_file(const std::filesystem::path& path, const std::function<void(const std::string&)>& cannot) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) cannot("no such file");
    if (err == ELOOP) cannot("a loop of symbolic links");
    if (err == ENXIO) cannot("it is a socket, not a trace file");
    cannot(errno_reason(err));
  }
  struct Closer {
    int fd;
    bool armed = true;
    ~Closer() {
      if (armed) ::close(fd);
    }
  } guard{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) cannot(errno_reason(errno));
  if (S_ISDIR(st.st_mode)) cannot("it is a directory, not a trace file");
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) cannot("it is a device, not a trace file");
  if (S_ISSOCK(st.st_mode)) cannot("it is a socket, not a trace file");
  if (S_ISFIFO(st.st_mode)) {
    constexpr int kWaitMs = 3000;
    pollfd p{fd, POLLIN, 0};
    int ready;
    while ((ready = ::poll(&p, 1, kWaitMs)) < 0 && errno == EINTR) {
    }
    if (ready == 0) {
      cannot("it is a FIFO that no process wrote to within " + std::to_string(kWaitMs / 1000) +
             " s: start its writer, or pipe the trace to standard input (analyze -)");
    }
  } else if (!S_ISREG(st.st_mode)) {
    cannot("it is not a regular file");
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  guard.armed = false;
  return fd;
}

}  // namespace

Trace read_chrome_trace(const std::filesystem::path& path, const TraceReadOptions& options) {
  const std::string name = path.string();
  const std::function<void(const std::string&)> cannot = [&](const std::string& why) {
    fail(ErrorKind::BadInput, "cannot read " + name + ": " + why);
  };
  const int fd = name == "-" ? ::dup(0) : open_trace_file(path, cannot);
  if (fd < 0) cannot(errno_reason(errno));
  errno = 0;
  gzFile f = gzdopen(fd, "rb");
  if (!f) {
    ::close(fd);
    cannot(errno ? errno_reason(errno) : "cannot open it");
  }
  struct Closer {
    gzFile f;
    ~Closer() { gzclose(f); }
  } closer{f};
  gzbuffer(f, 1 << 18);
  try {
    return read_trace_stream(
        [&](char* buf, std::size_t cap) -> std::size_t {
          errno = 0;
          const int n = gzread(f, buf, static_cast<unsigned>(cap));
          int err = Z_OK;
          const char* msg = gzerror(f, &err);
          if (n < 0 || (err != Z_OK && err != Z_STREAM_END)) {
            if (err == Z_ERRNO) refuse(errno_reason(errno));
            if (err == Z_BUF_ERROR) refuse("truncated gzip stream (" + std::string(msg ? msg : "") + ")");
            refuse("corrupt gzip data (zlib: " + std::string(msg ? msg : "error") + ")");
          }
          return static_cast<std::size_t>(n);
        },
        options);
  } catch (const Unreadable& u) {
    cannot(u.why);
  } catch (const std::bad_alloc&) {
    cannot("not enough memory for its events");
  }
  return {};
}

}  // namespace attnprof
