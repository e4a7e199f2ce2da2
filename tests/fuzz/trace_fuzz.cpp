// libFuzzer target: the input is a trace file (JSON or gzipped JSON) handed to
// what `attnprof analyze FILE --json J --html H` and `attnprof diff FILE FILE`
// run: read_chrome_trace on a file, analyze_trace, the text, JSON and HTML
// renderings, and diff (the whole trace against itself, and its first step
// against its last). The bytes go through a memfd named by its /proc path,
// so the file half of the reader (open, fstat, zlib) runs as on a disk file
// and no temporary file is left behind. attnprof::Error is the expected
// answer to a bad trace and must be one line; anything else (a sanitizer
// report, another exception, a hang, a blow-up in memory) is a bug.
// The reader's text also goes through in chunks of a few bytes (as a large
// file or a pipe gives it, 1 MiB at a time): the events read, or the reason
// for refusing, must not depend on where the chunks end.
// Reproduce a finding with `build/fuzz/trace_fuzz CRASH_FILE`, or run
// `attnprof analyze CRASH_FILE`: the input is a plain trace file.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "analysis/trace_stream.h"
#include "analysis/trace_unreadable.h"
#include "attnprof/analyze.h"
#include "attnprof/error.h"
#include "attnprof/html.h"
#include "attnprof/report.h"
#include "attnprof/trace_reader.h"

namespace {

// Limits a fuzzing run can afford (the CLI's are GiB): refusals past them are
// the reader's own paths, tested by hostile_inputs_test.cpp.
attnprof::AnalyzeOptions fuzz_options() {
  attnprof::AnalyzeOptions o;
  o.read.max_bytes = std::uint64_t{64} << 20;
  o.read.max_events = 200'000;
  o.ceiling_tflops = 100.0;  // so attention calls' percent of a ceiling is computed too
  return o;
}

std::optional<int> step_of(const attnprof::StepAnalysis& s) {
  constexpr std::string_view kPrefix = "ProfilerStep#";
  std::string_view l = s.label;
  if (!l.starts_with(kPrefix)) return std::nullopt;
  l.remove_prefix(kPrefix.size());
  int n = 0;
  const auto [p, ec] = std::from_chars(l.data(), l.data() + l.size(), n);
  if (ec != std::errc() || p != l.data() + l.size()) return std::nullopt;
  return n;
}

// What the reader makes of `text` fed in chunks of `sizes` (cycled): the
// events' names and times, or the reason it refused.
std::string read_in_chunks(std::string_view text, const std::vector<std::size_t>& sizes,
                           const attnprof::TraceReadOptions& o) {
  std::size_t pos = 0, k = 0;
  try {
    const attnprof::Trace t = attnprof::read_trace_stream(
        [&](char* buf, std::size_t cap) {
          const std::size_t n = std::min({cap, sizes[k++ % sizes.size()], text.size() - pos});
          std::memcpy(buf, text.data() + pos, n);
          pos += n;
          return n;
        },
        o);
    std::string out = "read " + std::to_string(t.activities.size()) + " events, base " + std::to_string(t.base_ns);
    for (const auto& a : t.activities) out += "\n" + a.name + " " + std::to_string(a.start_ns);
    return out;
  } catch (const attnprof::trace_reading::Unreadable& u) {
    return "refused: " + u.why;
  }
}

void same_in_chunks(const std::uint8_t* data, std::size_t size, const attnprof::TraceReadOptions& o) {
  if (size >= 2 && data[0] == 0x1f && data[1] == 0x8b) return;  // gzip: zlib hands on what it inflates
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  // Chunk sizes from the input's length, so that a finding replays the same.
  std::vector<std::size_t> sizes;
  for (std::size_t x = size * 2654435761u + 1, i = 0; i < 16;
       ++i, x = x * 6364136223846793005u + 1442695040888963407u) {
    sizes.push_back(1 + (x >> 33) % (i % 4 == 0 ? 4 : 97));
  }
  const std::string whole = read_in_chunks(text, {size + 1}, o), pieces = read_in_chunks(text, sizes, o);
  if (whole != pieces) {
    std::fprintf(stderr, "the reader depends on where its chunks end:\nwhole:  %.2000s\nchunks: %.2000s\n",
                 whole.c_str(), pieces.c_str());
    std::abort();
  }
}

void run(const std::string& path) {
  const attnprof::AnalyzeOptions o = fuzz_options();
  std::vector<attnprof::TraceAnalysis> all;
  all.push_back(attnprof::analyze_trace(attnprof::read_chrome_trace(path, o.read), path, o));
  const attnprof::TraceAnalysis& a = all.front();
  // The renderings live in another library: each runs in full although its text is dropped.
  (void)attnprof::analysis_text(a, 10);
  (void)attnprof::analysis_json(all);
  (void)attnprof::html_report(attnprof::analysis_html(all), "/* plotly */");
  const attnprof::TraceDiff d = attnprof::diff_analyses(a, std::nullopt, a, std::nullopt);
  (void)attnprof::diff_text(d, 15);
  (void)attnprof::diff_json(d);
  (void)attnprof::html_report(attnprof::diff_html(d), "/* plotly */");
  if (a.steps.size() >= 2) {
    const auto first = step_of(a.steps.front()), last = step_of(a.steps.back());
    if (first && last) (void)attnprof::diff_text(attnprof::diff_analyses(a, first, a, last), 15);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const int fd = memfd_create("trace", MFD_CLOEXEC);
  if (fd < 0) std::abort();
  for (std::size_t done = 0; done < size;) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n <= 0) std::abort();
    done += static_cast<std::size_t>(n);
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  same_in_chunks(data, size, fuzz_options().read);
  try {
    run(path);
  } catch (const attnprof::Error& e) {
    // The project's promise for a bad file: one line, saying why.
    const std::string_view what = e.what();
    if (what.empty() || what.find('\n') != std::string_view::npos) {
      std::fprintf(stderr, "attnprof::Error is not one line: \"%s\"\n", e.what());
      std::abort();
    }
  }
  ::close(fd);
  return 0;
}
