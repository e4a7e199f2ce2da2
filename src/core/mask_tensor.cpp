// Mask tensors from callers: checks, broadcasting, and the .npy reader.
#include "attnprof/mask_tensor.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <vector>

#include "attnprof/error.h"

namespace attnprof {

MaskKind mask_kind_of(std::string_view name, DType dtype) {
  if (dtype == DType::Bool) return MaskKind::Boolean;
  if (dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16) return MaskKind::Bias;
  fail(ErrorKind::InvalidArgument, std::string(name) + " is " + std::string(dtype_name(dtype)) +
                                       ": a mask is boolean (True attends) or an additive float bias");
}

Tensor broadcast_mask(const Problem& p, const Tensor& mask, std::string_view name, Device where) {
  const std::string n(name);
  if (!mask.defined()) fail(ErrorKind::InvalidArgument, n + " is missing");
  const Dims full{p.batch, p.heads, p.seq, p.kv_seq};
  const MaskKind kind = mask_kind_of(name, mask.dtype());
  if (kind != p.mask)
    fail(ErrorKind::InvalidArgument, n + " is " + std::string(dtype_name(mask.dtype())) +
                                         " but the problem's mask is " + std::string(mask_name(p.mask)));
  // FP8 inputs take a bias in their output's dtype (bf16): e4m3 holds no -inf.
  if (kind == MaskKind::Bias && mask.dtype() != output_dtype(p.dtype)) {
    fail(ErrorKind::InvalidArgument,
         n + " is " + std::string(dtype_name(mask.dtype())) + " but q is " + std::string(dtype_name(p.dtype)) +
             (is_fp8(p.dtype) ? ": a float mask with fp8 inputs is bf16 (the output's dtype)"
                              : ": a float mask takes the query's dtype (as SDPA's does)"));
  }
  if (mask.device() != where) {
    fail(ErrorKind::InvalidArgument, n + " is on " + device_name(mask.device()) + " but q is on " + device_name(where) +
                                         ": move the mask to q's device");
  }
  for (int i = 0; i < 4; ++i) {
    const auto d = static_cast<std::size_t>(i);
    if (mask.sizes()[d] != full[d] && mask.sizes()[d] != 1) {
      fail(ErrorKind::InvalidArgument,
           n + " " + mask.dims_string() + " does not broadcast to [B, H, S, Skv] = " + dims_string(full) +
               " (dimension " + std::to_string(i) + " is " + std::to_string(mask.sizes()[d]) + ", want " +
               std::to_string(full[d]) + " or 1)");
    }
  }
  for (int i = 0; i < 4; ++i) {
    if (mask.stride(i) < 0)
      fail(ErrorKind::InvalidArgument, n + " has a negative stride in dimension " + std::to_string(i));
  }
  return mask.expand(full);
}

void attach_mask(const Problem& p, const Tensor& mask, Inputs& in, std::string_view name) {
  Tensor full = broadcast_mask(p, mask, name, in.q.defined() ? in.q.device() : p.device);
  if (p.mask == MaskKind::Boolean) {
    in.mask = std::move(full);
  } else {
    in.bias = std::move(full);
  }
}

Tensor convert_mask(const Problem& p, const Tensor& mask) {
  const DType want = output_dtype(p.dtype);  // bf16 for fp8 inputs
  if (mask.dtype() == DType::Bool || mask.dtype() == want) return mask;
  Tensor out = Tensor::empty(mask.sizes(), want, cpu_allocator());
  const Dims& s = mask.sizes();
  std::int64_t n = 0;
  for (std::int64_t a = 0; a < s[0]; ++a)
    for (std::int64_t b = 0; b < s[1]; ++b)
      for (std::int64_t c = 0; c < s[2]; ++c)
        for (std::int64_t d = 0; d < s[3]; ++d) store_from_float(out.data(), want, n++, mask.get(a, b, c, d));
  return out;
}

namespace {

[[noreturn]] void bad_file(const std::string& path, const std::string& why) {
  fail(ErrorKind::BadInput, "cannot read mask file " + path + ": " + why);
}

// The value of 'key' in the header's dict literal, up to the next top-level
// ',' or '}' (a tuple's commas are inside its parentheses).
std::string header_value(const std::string& header, const std::string& key, const std::string& path) {
  const std::string quoted[] = {"'" + key + "'", "\"" + key + "\""};
  std::size_t at = std::string::npos;
  for (const auto& q : quoted) {
    if (const auto f = header.find(q); f != std::string::npos) at = f + q.size();
  }
  if (at == std::string::npos) bad_file(path, "the .npy header has no '" + key + "'");
  while (at < header.size() && (header[at] == ' ' || header[at] == ':')) ++at;
  std::size_t end = at;
  int depth = 0;
  for (; end < header.size(); ++end) {
    const char c = header[end];
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (depth == 0 && (c == ',' || c == '}')) break;
  }
  if (end == header.size() || depth != 0) bad_file(path, "the .npy header's '" + key + "' does not parse");
  std::string v = header.substr(at, end - at);
  while (!v.empty() && v.back() == ' ') v.pop_back();
  return v;
}

}  // namespace

Tensor read_mask_file(const std::string& path) {
  // Looked at before it is opened: opening a FIFO would wait for a writer, and a .npy is read by seeking.
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(path, ec);
  if (std::filesystem::is_directory(st)) bad_file(path, "it is a directory, not a .npy file");
  if (std::filesystem::exists(st) && !std::filesystem::is_regular_file(st)) {
    bad_file(path, "it is not a regular file (a FIFO, device or socket): save the mask to a file with numpy.save");
  }
  std::ifstream f(path, std::ios::binary);
  if (!f) bad_file(path, std::string("cannot open it (") + std::strerror(errno) + ")");
  f.seekg(0, std::ios::end);
  const std::streamoff file_size = f.tellg();
  f.seekg(0);
  if (file_size < 0) bad_file(path, "cannot tell its size (not a regular file?)");
  char magic[8] = {};
  if (!f.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0) {
    bad_file(path, "not a .npy file (no \\x93NUMPY magic): save it with numpy.save");
  }
  const int major = static_cast<unsigned char>(magic[6]);
  std::uint32_t header_len = 0;
  if (major == 1) {
    unsigned char l[2];
    if (!f.read(reinterpret_cast<char*>(l), 2)) bad_file(path, "truncated before its header length");
    header_len = static_cast<std::uint32_t>(l[0] | (l[1] << 8));
  } else if (major == 2 || major == 3) {
    unsigned char l[4];
    if (!f.read(reinterpret_cast<char*>(l), 4)) bad_file(path, "truncated before its header length");
    header_len = static_cast<std::uint32_t>(l[0]) | (static_cast<std::uint32_t>(l[1]) << 8) |
                 (static_cast<std::uint32_t>(l[2]) << 16) | (static_cast<std::uint32_t>(l[3]) << 24);
  } else {
    bad_file(path, ".npy format version " + std::to_string(major) + " (attnprof reads versions 1 to 3)");
  }
  constexpr std::uint32_t kMaxHeader = 1 << 16;
  if (header_len > kMaxHeader)
    bad_file(path, "a .npy header of " + std::to_string(header_len) + " bytes (at most 64 KiB)");
  const std::streamoff data_at = f.tellg() + static_cast<std::streamoff>(header_len);
  if (data_at > file_size) bad_file(path, "truncated inside its header");
  std::string header(header_len, '\0');
  f.read(header.data(), header_len);
  for (const char c : header) {
    if (static_cast<unsigned char>(c) < 0x20 && c != '\n') bad_file(path, "its header is not text");
  }

  std::string descr = header_value(header, "descr", path);
  if (descr.size() < 2 || (descr.front() != '\'' && descr.front() != '"') || descr.back() != descr.front()) {
    bad_file(path, "its dtype " + descr + " is not a simple one");
  }
  descr = descr.substr(1, descr.size() - 2);
  DType file_dtype = DType::Bool;
  std::size_t item = 1;
  if (descr == "|b1") {
    file_dtype = DType::Bool;
  } else if (descr == "<f2" || descr == "<f4" || descr == "<f8") {
    file_dtype = DType::F32;
    item = static_cast<std::size_t>(descr[2] - '0');
  } else {
    bad_file(path, "its dtype is '" + descr +
                       "': a mask file holds bool (|b1) or little-endian float16/32/64 (<f2, <f4, <f8)");
  }
  if (header_value(header, "fortran_order", path) != "False") {
    bad_file(path, "it is in Fortran order: save a C-order array (numpy.ascontiguousarray)");
  }
  const std::string shape = header_value(header, "shape", path);
  if (shape.size() < 2 || shape.front() != '(' || shape.back() != ')')
    bad_file(path, "its shape " + shape + " is not a tuple");
  std::vector<std::int64_t> dims;
  constexpr std::int64_t kMaxElements = std::int64_t{1} << 31;
  std::int64_t elements = 1;
  std::size_t at = 1;
  while (at < shape.size() - 1) {
    while (at < shape.size() - 1 && (shape[at] == ' ' || shape[at] == ',')) ++at;
    if (at >= shape.size() - 1) break;
    std::int64_t v = 0;
    std::size_t digits = 0;
    while (at < shape.size() - 1 && shape[at] >= '0' && shape[at] <= '9') {
      v = v * 10 + (shape[at] - '0');
      if (v > kMaxElements) bad_file(path, "its shape " + shape + " has more than 2^31 elements");
      ++at;
      ++digits;
    }
    if (digits == 0) bad_file(path, "its shape " + shape + " is not a tuple of sizes");
    if (v == 0) bad_file(path, "its shape " + shape + " is empty");
    dims.push_back(v);
    elements *= v;
    if (elements > kMaxElements) bad_file(path, "its shape " + shape + " has more than 2^31 elements");
  }
  if (dims.empty() || dims.size() > 4) {
    bad_file(path, "its shape " + shape + " has " + std::to_string(dims.size()) +
                       " dimensions: a mask has 1 to 4, broadcastable to [B, H, S, Skv]");
  }
  const std::streamoff need = static_cast<std::streamoff>(static_cast<std::size_t>(elements) * item);
  if (file_size - data_at != need) {
    bad_file(path, "its shape " + shape + " needs " + std::to_string(need) + " bytes of data, the file holds " +
                       std::to_string(file_size - data_at));
  }

  Dims sizes{1, 1, 1, 1};
  for (std::size_t i = 0; i < dims.size(); ++i) sizes[4 - dims.size() + i] = dims[i];
  Tensor t = Tensor::empty(sizes, file_dtype, cpu_allocator());
  f.seekg(data_at);
  if (file_dtype == DType::Bool) {
    if (!f.read(static_cast<char*>(t.data()), static_cast<std::streamsize>(elements))) bad_file(path, "truncated data");
    const auto* b = t.data_as<const std::uint8_t>();
    for (std::int64_t i = 0; i < elements; ++i) {
      if (b[i] > 1) bad_file(path, "element " + std::to_string(i) + " of its boolean data is neither 0 nor 1");
    }
    return t;
  }
  std::vector<unsigned char> raw(static_cast<std::size_t>(need));
  if (!f.read(reinterpret_cast<char*>(raw.data()), static_cast<std::streamsize>(need)))
    bad_file(path, "truncated data");
  float* out = t.data_as<float>();
  for (std::int64_t i = 0; i < elements; ++i) {
    const unsigned char* src = raw.data() + static_cast<std::size_t>(i) * item;
    double v = 0;
    if (item == 2) {
      std::uint16_t h;
      std::memcpy(&h, src, 2);
      v = load_as_float(&h, DType::F16, 0);
    } else if (item == 4) {
      float x;
      std::memcpy(&x, src, 4);
      v = x;
    } else {
      std::memcpy(&v, src, 8);
    }
    if (std::isnan(v) || v == std::numeric_limits<double>::infinity()) {
      bad_file(path, "element " + std::to_string(i) + " of its bias is " + (std::isnan(v) ? "NaN" : "+inf") +
                         " (a bias is finite, or -inf to mask)");
    }
    out[i] = static_cast<float>(v);
  }
  return t;
}

}  // namespace attnprof
