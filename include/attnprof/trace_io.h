// Chrome trace output: the Trace records written in the schema PyTorch's
// profiler writes, so Perfetto, chrome://tracing and trace-analysis libraries
// read them. Writers see only the records (Kineto's layering).
#pragma once

#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "attnprof/activity.h"

namespace attnprof {

// The whole trace as one JSON document's text. Times are microseconds relative to
// baseTimeNanoseconds (Trace::base_ns, or the earliest event when that is
// unset or later), so doubles keep nanosecond precision.
std::string chrome_trace_json(const Trace& trace);

// Writes chrome_trace_json(trace) to `path`, creating its directory (the
// write of write_file_atomically). Throws Error(Io) naming the path and the reason.
void write_chrome_trace(const Trace& trace, const std::filesystem::path& path);

// The write of every output (traces, tables, summaries, --json, --html);
// `what` names it in the error message ("trace", "table", ...). A regular
// file, or a path where nothing is yet, appears complete or not at all: a
// temporary in the same directory renamed at the end (a replaced file keeps
// its permissions; a read-only one is refused). A character device, a FIFO
// with a reader, or one of our descriptors (/dev/stdout, /dev/fd/N) is
// written through instead, and survives. Symbolic links are followed, so a
// link stays a link. Refused with Error(Io) and the reason: directories,
// block devices, sockets, a FIFO no one reads, a loop of links, and any
// failed write (no space left on device, the file-size limit).
void write_file_atomically(const std::filesystem::path& path, std::string_view contents, std::string_view what);
// The same write with the contents produced in pieces: `produce` hands each
// piece, in order, to the writer it is given, so a document of millions of
// events is never whole in memory. An exception from `produce` leaves no file.
using WritePiece = std::function<void(std::string_view)>;
void write_file_atomically(const std::filesystem::path& path, const std::function<void(const WritePiece&)>& produce,
                           std::string_view what);

// Checks, before any work, that outputs can be written: a directory that can
// be created and written into, or a file path as write_file_atomically takes
// it. Leaves nothing behind but the directories it created. Throws Error(Io)
// naming `flag` ("--trace-dir", "--json") and the reason.
void check_output_dir(const std::filesystem::path& dir, std::string_view flag);
void check_output_file(const std::filesystem::path& path, std::string_view flag);

// A file a command writes (output) or reads, named for messages ("--json",
// "the naive trace", "the trace").
struct NamedFile {
  std::string what;
  std::filesystem::path path;
  bool output = true;
};

// Whether two paths name one file: the same inode when both exist, the same
// resolved path when neither does.
bool same_file(const std::filesystem::path& a, const std::filesystem::path& b);

// Refuses, before any work, an output that is the same file as another
// output or as an input (Error(InvalidArgument) naming both). Several outputs
// to one character device (/dev/null) are allowed.
void check_distinct_files(const std::vector<NamedFile>& files);

// For a command-line program: on SIGINT, SIGTERM, SIGHUP and SIGPIPE, unlink
// the temporaries of writes in progress, say why in one line (not for
// SIGPIPE), and die of the signal; SIGXFSZ is ignored so that a write past
// the file-size limit fails (EFBIG) and is reported. Signals the caller
// ignores (nohup) stay ignored. Not for libraries inside another runtime
// (Python keeps its own handlers).
void remove_temporaries_on_signals();

}  // namespace attnprof
