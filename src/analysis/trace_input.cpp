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
#include <vector>

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

// A trace file's bytes as its text: gzip members inflated one after another
// (as gzip -d takes concatenated ones), anything else read as it is. Junk
// after the last member is refused, where zlib's gzread drops it unread.
class GzipOrPlain {
 public:
  explicit GzipOrPlain(int fd) : fd_(fd), in_(1 << 18) {}
  ~GzipOrPlain() {
    if (gzip_) inflateEnd(&z_);
  }
  GzipOrPlain(const GzipOrPlain&) = delete;
  GzipOrPlain& operator=(const GzipOrPlain&) = delete;

  // Up to `cap` bytes of text into buf; 0 at the end.
  std::size_t read(char* buf, std::size_t cap) {
    if (!started_) start();
    if (!gzip_) {
      if (avail_ > 0) {
        const std::size_t n = std::min(cap, avail_);
        std::memcpy(buf, in_.data() + at_, n);
        at_ += n;
        avail_ -= n;
        return n;
      }
      return raw(buf, cap);
    }
    if (done_) return 0;
    z_.next_out = reinterpret_cast<Bytef*>(buf);
    z_.avail_out = static_cast<uInt>(std::min<std::size_t>(cap, 1u << 30));
    const uInt room = z_.avail_out;
    while (z_.avail_out == room) {
      if (z_.avail_in == 0 && !eof_) fill(0);
      const int r = inflate(&z_, Z_NO_FLUSH);
      if (r == Z_STREAM_END) {
        // Another member, or the end: anything else after a member is junk.
        if (z_.avail_in < 2 && !eof_) fill(2);
        if (z_.avail_in == 0) {
          done_ = true;
          break;
        }
        if (z_.avail_in < 2 || z_.next_in[0] != 0x1f || z_.next_in[1] != 0x8b) {
          refuse("junk after its gzip stream (bytes that are not another gzip member)");
        }
        inflateReset(&z_);
      } else if (r == Z_BUF_ERROR) {
        if (z_.avail_in == 0 && eof_) refuse("truncated gzip stream (it ends inside a member)");
      } else if (r != Z_OK) {
        refuse("corrupt gzip data (zlib: " + std::string(z_.msg != nullptr ? z_.msg : "error") + ")");
      }
    }
    return room - z_.avail_out;
  }

 private:
  // The first bytes say which: gzip's magic, or text.
  void start() {
    started_ = true;
    while (avail_ < 2 && !eof_) {
      const std::size_t n = raw(reinterpret_cast<char*>(in_.data()) + avail_, in_.size() - avail_);
      avail_ += n;
    }
    if (avail_ < 2 || in_[0] != 0x1f || in_[1] != 0x8b) return;
    gzip_ = true;
    if (inflateInit2(&z_, 16 + MAX_WBITS) != Z_OK) refuse("zlib could not start (out of memory)");
    z_.next_in = in_.data();
    z_.avail_in = static_cast<uInt>(avail_);
  }
  // More input behind what inflate has not read yet, until `want` bytes are there or the file ends.
  void fill(std::size_t want) {
    std::memmove(in_.data(), z_.next_in, z_.avail_in);
    std::size_t have = z_.avail_in;
    do {
      have += raw(reinterpret_cast<char*>(in_.data()) + have, in_.size() - have);
    } while (!eof_ && have < std::max<std::size_t>(want, 1));
    z_.next_in = in_.data();
    z_.avail_in = static_cast<uInt>(have);
  }
  std::size_t raw(char* buf, std::size_t cap) {
    for (;;) {
      const ssize_t n = ::read(fd_, buf, cap);
      if (n > 0) return static_cast<std::size_t>(n);
      if (n == 0) {
        eof_ = true;
        return 0;
      }
      if (errno != EINTR) refuse(errno_reason(errno));
    }
  }

  int fd_;
  std::vector<unsigned char> in_;
  std::size_t at_ = 0, avail_ = 0;  // text read by start() and not yet handed on (the plain case)
  z_stream z_{};
  bool started_ = false, gzip_ = false, eof_ = false, done_ = false;
};

}  // namespace

Trace read_chrome_trace(const std::filesystem::path& path, const TraceReadOptions& options) {
  const std::string name = path.string();
  const std::function<void(const std::string&)> cannot = [&](const std::string& why) {
    fail(ErrorKind::BadInput, "cannot read " + name + ": " + why);
  };
  const int fd = name == "-" ? ::dup(0) : open_trace_file(path, cannot);
  if (fd < 0) cannot(errno_reason(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  GzipOrPlain text(fd);
  try {
    return read_trace_stream([&](char* buf, std::size_t cap) { return text.read(buf, cap); }, options);
  } catch (const Unreadable& u) {
    cannot(u.why);
  } catch (const std::bad_alloc&) {
    cannot("not enough memory for its events");
  }
  return {};
}

}  // namespace attnprof
