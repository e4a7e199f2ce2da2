// A Problem's names for people and files: the shape key, the file stem a
// run's outputs take, and the one-line description headers and messages print.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "attnprof/problem.h"
#include "core/problem_detail.h"

namespace attnprof {

using problem_detail::format_real;
using problem_detail::max_of;
using problem_detail::sum_of;

std::string Problem::shape_key() const {
  return std::to_string(batch) + "_" + std::to_string(heads) + "_" + std::to_string(seq) + "_" +
         std::to_string(head_dim);
}

std::string Problem::file_stem() const {
  // Appended piece by piece, as dims_string is (g++ 12's -Wrestrict). A soft
  // cap changes the numbers, so it is in the stem too ("_softcap30").
  std::string s = shape_key();
  if (pass != Pass::Forward) {
    s += '_';
    s += pass_name(pass);
  }
  if (softcap > 0) {
    s += "_softcap";
    s += format_real(softcap);
  }
  if (kv_cache == KvCache::Paged) {
    s += "_paged";
    s += std::to_string(page_size);
  }
  // An FP8 run beside the bf16 one of its shape, whose error it is read against.
  if (is_fp8(dtype)) s += "_fp8";
  if (varlen()) {
    // Two packed batches of one count and maximum differ in their lengths:
    // a hash of them keeps their files apart.
    std::uint32_t h = 2166136261u;  // FNV-1a over the lengths
    for (const auto* lens : {&seq_lens, &kv_seq_lens}) {
      for (const std::int64_t n : *lens) {
        for (int byte = 0; byte < 8; ++byte) h = (h ^ static_cast<std::uint32_t>((n >> (8 * byte)) & 0xff)) * 16777619u;
      }
      h = (h ^ 0xffu) * 16777619u;
    }
    char hex[16];
    std::snprintf(hex, sizeof hex, "%08x", h);
    s += "_varlen";
    s += std::to_string(total_q());
    s += '_';
    s += hex;
  }
  return s;
}

std::string Problem::describe() const {
  std::ostringstream os;
  if (varlen()) {
    // The lengths themselves while they are few, else their range and sum.
    const auto lengths = [&os](const std::vector<std::int64_t>& lens) {
      if (lens.size() <= 8) {
        for (std::size_t b = 0; b < lens.size(); ++b) os << (b ? "," : "") << lens[b];
      } else {
        os << *std::min_element(lens.begin(), lens.end()) << ".." << max_of(lens);
      }
      os << " (" << sum_of(lens) << " rows)";
    };
    os << "packed batch of " << batch << " sequences, ";
    if (lengths_on_device) {
      os << "lengths on the device (" << packed_total_q << " query rows, " << packed_total_kv << " key rows)";
    } else {
      os << "seq lens ";
      lengths(seq_lens);
      if (!kv_seq_lens.empty() && kv_seq_lens != seq_lens) {
        os << ", kv lens ";
        lengths(kv_seq_lens);
      }
    }
    os << ", heads " << heads;
    if (kv_heads != heads) os << " (kv " << kv_heads << ")";
    os << ", max seq " << seq;
    if (kv_seq != seq) os << " (kv " << kv_seq << ")";
    if (const double padded = this->padded().flops(); padded > 0 && !lengths_on_device) {
      char pct[32];
      std::snprintf(pct, sizeof pct, "%.0f%%", 100.0 * flops() / padded);
      os << " (" << pct << " of the padded batch's FLOPs)";
    }
  } else {
    os << "batch " << batch << ", heads " << heads;
    if (kv_heads != heads) os << " (kv " << kv_heads << ")";
    os << ", seq " << seq;
    if (kv_seq != seq) os << " (kv " << kv_seq << ")";
  }
  os << ", head_dim " << head_dim << ", " << dtype_name(dtype);
  if (is_fp8(dtype)) os << " (e4m3 inputs with per-tensor descales, " << dtype_name(output_dtype(dtype)) << " output)";
  os << ", " << mask_name(mask);
  if (mask == MaskKind::SlidingWindow) os << " " << window;
  if (softcap > 0) os << ", soft cap " << format_real(softcap);
  os << " on " << device_name(device);
  if (pass != Pass::Forward) os << ", " << pass_name(pass) << " pass" << (deterministic ? " (deterministic)" : "");
  if (kv_cache == KvCache::Paged) {
    os << ", paged KV cache (" << pages_per_seq() << " pages of " << page_size << " keys per sequence";
    if (kv_seq % page_size != 0) os << ", the last one padded";
    os << ")";
  }
  return os.str();
}

}  // namespace attnprof
