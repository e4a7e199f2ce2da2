// The caller's DLPack arrays as borrowed Tensors, and every check a call
// makes of them, written once for the dense, paged and packed calls.
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>

#include "attnprof/error.h"
#include "attnprof/problem_spec.h"
#include "bindings/bindings.h"

namespace attnprof::python {
namespace {

constexpr auto kFloat = static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float);
constexpr auto kBfloat = static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat);
constexpr auto kInt = static_cast<std::uint8_t>(nb::dlpack::dtype_code::Int);
constexpr auto kBool = static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bool);
// DLPack 1.1's kDLFloat8_e4m3fn (torch.float8_e4m3fn exports it), which this
// nanobind's dtype_code does not name.
constexpr std::uint8_t kFloat8E4m3fn = 10;

// A DLPack producer can claim any shape: sizes past what an int64 offset can
// address are refused before any arithmetic on them, and so is an empty
// array (whose strides DLPack leaves meaningless).
constexpr std::uint64_t kMaxElements = std::uint64_t{1} << 48;

void require_addressable(const char* name, const Array& a) {
  std::uint64_t elements = 1;
  for (std::size_t i = 0; i < a.ndim; ++i) {
    const std::uint64_t n = a.size(i);
    const std::int64_t stride = a.stride(i);
    if (n == 0) {
      fail(ErrorKind::InvalidArgument,
           std::string(name) + " is empty (dimension " + std::to_string(i) + " has size 0)");
    }
    if (n > kMaxElements || elements > kMaxElements / n) {
      fail(ErrorKind::InvalidArgument,
           std::string(name) + " has more than 2^48 elements: more than attnprof addresses");
    }
    if (stride > static_cast<std::int64_t>(kMaxElements) || stride < -static_cast<std::int64_t>(kMaxElements)) {
      fail(ErrorKind::InvalidArgument,
           std::string(name) + " has a stride beyond 2^48 elements in dimension " + std::to_string(i));
    }
    elements *= n;
  }
}

void* data_of(const Array& a) {
  // q, k and v are only read, though a Tensor's data is not const.
  return const_cast<void*>(a.data);
}

}  // namespace

std::string where_name(const Array& a) {
  switch (a.device_type) {
    case nb::device::cpu::value:
      return "cpu";
    case nb::device::cuda::value:
      return "cuda:" + std::to_string(a.device_id);
    default:
      return "DLPack device type " + std::to_string(a.device_type);
  }
}

Device device_of(const char* name, const Array& a) {
  if (a.device_type == nb::device::cpu::value) return Device::Cpu;
  if (a.device_type == nb::device::cuda::value) {
    // The CUDA runtime (its allocator, cuBLAS and cuDNN handles) is device 0's.
    if (a.device_id != 0) {
      fail(ErrorKind::Unsupported,
           std::string(name) + " is on " + where_name(a) + ": attnprof runs on cuda:0 (set CUDA_VISIBLE_DEVICES)");
    }
    return Device::Cuda;
  }
  fail(ErrorKind::Unsupported, std::string(name) + " is on " + where_name(a) + ": attnprof takes CPU and CUDA arrays");
}

DType dtype_of(const char* name, const Array& a) {
  const nb::dlpack::dtype t = a.dtype;
  if (t.lanes == 1 && t.code == kFloat) {
    if (t.bits == 32) return DType::F32;
    if (t.bits == 16) return DType::F16;
  }
  if (t.lanes == 1 && t.bits == 16 && t.code == kBfloat) return DType::BF16;
  if (t.lanes == 1 && t.bits == 8 && t.code == kFloat8E4m3fn) return DType::F8E4M3;
  fail(ErrorKind::InvalidArgument, std::string(name) + " is " + dtype_text(a) +
                                       ", a dtype attnprof does not take: use float32, float16, bfloat16 or "
                                       "float8_e4m3fn");
}

std::string dtype_text(const Array& a) {
  const nb::dlpack::dtype t = a.dtype;
  const std::string bits = std::to_string(t.bits);
  std::string name;
  if (t.code == kBool) {
    name = "bool";
  } else if (t.code == kFloat8E4m3fn && t.bits == 8) {
    name = "float8_e4m3fn";
  } else if (t.code == kInt || t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::UInt) || t.code == kFloat ||
             t.code == kBfloat || t.code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Complex)) {
    static constexpr const char* kStems[] = {"int", "uint", "float", "", "bfloat", "complex"};
    name = kStems[t.code] + bits;
  } else {
    name = "DLPack dtype code " + std::to_string(t.code) + " of " + bits + " bits";
  }
  return t.lanes == 1 ? name : name + " x " + std::to_string(t.lanes) + " lanes";
}

std::string dims_of(const Array& a) {
  std::string dims = "[";
  for (std::size_t i = 0; i < a.ndim; ++i) dims += (i ? ", " : "") + std::to_string(a.size(i));
  return dims + "]";
}

void require_like_q(const char* name, const Array& a, const Array& q, Device device, DType dtype) {
  if (device_of(name, a) != device) {
    fail(ErrorKind::InvalidArgument, std::string("q and ") + name + " are on different devices: q on " + where_name(q) +
                                         ", " + name + " on " + where_name(a) + "; move them to one device");
  }
  if (const DType t = dtype_of(name, a); t != dtype) {
    fail(ErrorKind::InvalidArgument, std::string("q is ") + std::string(dtype_name(dtype)) + " but " + name + " is " +
                                         std::string(dtype_name(t)) + ": pass one dtype");
  }
}

Tensor view_of(const char* name, const Array& a, bool bshd, Device device, DType dtype) {
  if (a.ndim != 4) {
    fail(ErrorKind::InvalidArgument, std::string(name) + " must be 4-d, " +
                                         (bshd ? "[batch, seq, heads, head_dim]" : "[batch, heads, seq, head_dim]") +
                                         "; got " + std::to_string(a.ndim) + "-d " + dims_of(a));
  }
  require_addressable(name, a);
  Dims sizes{}, strides{};
  for (std::size_t i = 0; i < 4; ++i) {
    sizes[i] = static_cast<std::int64_t>(a.size(i));
    strides[i] = a.stride(i);
  }
  Tensor t = Tensor::from_blob(data_of(a), sizes, strides, dtype, device);
  if (bshd) t = t.transpose(1, 2);
  if (!t.rows_contiguous()) {
    fail(ErrorKind::InvalidArgument, std::string(name) + " " + t.describe() +
                                         " has a strided head_dim: attnprof views any batch, head and sequence "
                                         "strides but reads each row of head_dim contiguously (call .contiguous())");
  }
  return t;
}

Tensor cache_view_of(const char* name, const Array& a, Device device, DType dtype) {
  if (a.ndim != 4) {
    fail(ErrorKind::InvalidArgument, std::string(name) +
                                         " must be 4-d, [num_pages, kv_heads, page_size, head_dim]; got " +
                                         std::to_string(a.ndim) + "-d " + dims_of(a));
  }
  return view_of(name, a, false, device, dtype);
}

Tensor packed_view_of(const char* name, const Array& a, Device device, DType dtype) {
  if (a.ndim != 3) {
    fail(ErrorKind::InvalidArgument, std::string(name) +
                                         " must be 3-d with cu_seqlens, [total, heads, head_dim]; got " +
                                         std::to_string(a.ndim) + "-d " + dims_of(a));
  }
  require_addressable(name, a);
  const auto total = static_cast<std::int64_t>(a.size(0));
  const Dims sizes{1, static_cast<std::int64_t>(a.size(1)), total, static_cast<std::int64_t>(a.size(2))};
  const Dims strides{total * a.stride(0), a.stride(1), a.stride(0), a.stride(2)};
  Tensor t = Tensor::from_blob(data_of(a), sizes, strides, dtype, device);
  if (!t.rows_contiguous()) {
    fail(ErrorKind::InvalidArgument, std::string(name) + " " + t.describe() +
                                         " has a strided head_dim: rows of head_dim are read contiguously "
                                         "(call .contiguous())");
  }
  return t;
}

// broadcast_mask() checks the view against the problem.
Tensor mask_view(const Array& a, Device device) {
  if (a.ndim < 1 || a.ndim > 4) {
    fail(ErrorKind::InvalidArgument, "attn_mask " + dims_of(a) + " has " + std::to_string(a.ndim) +
                                         " dimensions: a mask has 1 to 4, broadcastable to [B, H, S, Skv]");
  }
  if (device_of("attn_mask", a) != device) {
    fail(ErrorKind::InvalidArgument,
         "attn_mask is on " + where_name(a) + " but q is on " + device_name(device) + ": move the mask to q's device");
  }
  const nb::dlpack::dtype t = a.dtype;
  DType dtype = DType::Bool;
  if (t.lanes == 1 && t.bits == 8 && t.code == kBool) {
    dtype = DType::Bool;
  } else if (t.code == kFloat || t.code == kBfloat) {
    try {
      dtype = dtype_of("attn_mask", a);
    } catch (const Error&) {
      fail(ErrorKind::InvalidArgument, "attn_mask is a " + std::to_string(t.bits) +
                                           "-bit float: a float mask takes q's dtype (float32, float16 or bfloat16)");
    }
  } else {
    fail(ErrorKind::InvalidArgument,
         "attn_mask is " + dtype_text(a) + ": a mask is bool (True attends) or an additive float in q's dtype");
  }
  Dims sizes{1, 1, 1, 1}, strides{0, 0, 0, 0};
  const std::size_t lead = 4 - a.ndim;
  for (std::size_t i = 0; i < a.ndim; ++i) {
    if (a.size(i) == 0) fail(ErrorKind::InvalidArgument, "attn_mask " + dims_of(a) + " is empty");
    if (a.size(i) > (std::uint64_t{1} << 31)) {
      fail(ErrorKind::InvalidArgument, "attn_mask " + dims_of(a) + " has a dimension beyond 2^31");
    }
    sizes[lead + i] = static_cast<std::int64_t>(a.size(i));
    strides[lead + i] = a.size(i) == 1 ? 0 : a.stride(i);
  }
  return Tensor::from_blob(data_of(a), sizes, strides, dtype, device);
}

Tensor index_view(const char* name, const Array& a, std::size_t ndim, Device device) {
  const nb::dlpack::dtype t = a.dtype;
  if (t.lanes != 1 || t.bits != 32 || t.code != kInt) {
    fail(ErrorKind::InvalidArgument, std::string(name) + " must be int32, not " + dtype_text(a));
  }
  if (a.ndim != ndim) {
    const bool cumulative = std::string_view(name).starts_with("cu_seqlens");
    fail(ErrorKind::InvalidArgument, std::string(name) + " must be " + std::to_string(ndim) + "-d, " +
                                         (ndim == 2    ? "[batch, pages_per_seq]"
                                          : cumulative ? "[batch + 1]"
                                                       : "[batch]") +
                                         "; got " + dims_of(a));
  }
  if (device_of(name, a) != device) {
    fail(ErrorKind::InvalidArgument, std::string(name) + " is on " + where_name(a) + " but q is on " +
                                         device_name(device) + ": move it to q's device");
  }
  Dims sizes{1, 1, 1, 1}, strides{0, 0, 0, 0};
  for (std::size_t i = 0; i < ndim; ++i) {
    if (a.size(i) == 0) fail(ErrorKind::InvalidArgument, std::string(name) + " " + dims_of(a) + " is empty");
    if (a.size(i) > (std::uint64_t{1} << 31)) {
      fail(ErrorKind::InvalidArgument, std::string(name) + " " + dims_of(a) + " has a dimension beyond 2^31");
    }
    sizes[4 - ndim + i] = static_cast<std::int64_t>(a.size(i));
    strides[4 - ndim + i] = a.stride(i);
  }
  return Tensor::from_blob(data_of(a), sizes, strides, DType::I32, device);
}

Tensor descale_view(const char* name, const Array& a) {
  const nb::dlpack::dtype t = a.dtype;
  std::uint64_t n = 1;
  for (std::size_t i = 0; i < a.ndim; ++i) n *= a.size(i);
  if (t.lanes != 1 || t.bits != 32 || t.code != kFloat || n != 1) {
    fail(ErrorKind::InvalidArgument,
         std::string(name) + " must be a number or a float32 tensor of one element, got " + dtype_text(a) + " " +
             dims_of(a),
         {name});
  }
  return Tensor::from_blob(data_of(a), {1, 1, 1, 1}, {1, 1, 1, 1}, DType::F32, device_of(name, a));
}

Tensor rows_view(const char* name, const Array& a, std::int64_t batch, Device device, bool ends_ok) {
  const std::string b = std::to_string(batch);
  const auto refuse = [&](const std::string& got) {
    fail(ErrorKind::InvalidArgument,
         std::string(name) + " must be int32 [B, 2] = [" + b + ", 2], each sequence's (begin, end) rows" +
             (ends_ok ? " (or [" + b + ", 1], its key ends from 0)" : "") + ", or the core's [1, 1, " + b + ", " +
             (ends_ok ? "2 or 1" : "2") + "]; got " + got);
  };
  const nb::dlpack::dtype t = a.dtype;
  if (t.lanes != 1 || t.bits != 32 || t.code != kInt) refuse(dtype_text(a) + " " + dims_of(a));
  if (a.ndim != 2 && a.ndim != 4) refuse(std::to_string(a.ndim) + "-d " + dims_of(a));
  const std::size_t n = a.ndim;
  const std::uint64_t width = a.size(n - 1);
  if ((n == 4 && (a.size(0) != 1 || a.size(1) != 1)) || a.size(n - 2) != static_cast<std::uint64_t>(batch) ||
      !(width == 2 || (ends_ok && width == 1))) {
    refuse(dims_of(a));
  }
  if (device_of(name, a) != device) {
    fail(ErrorKind::InvalidArgument, std::string(name) + " is on " + where_name(a) + " but q is on " +
                                         device_name(device) + ": move it to q's device");
  }
  return Tensor::from_blob(data_of(a), {1, 1, batch, static_cast<std::int64_t>(width)},
                           {0, 0, a.stride(n - 2), a.stride(n - 1)}, DType::I32, device);
}

// Dimensions by increasing stride must each step past all the elements of
// the ones below (as_strided views that overlap do not).
void require_writable_layout(const char* name, const Tensor& out) {
  for (int i = 0; i < 4; ++i) {
    if (out.size(i) > 1 && out.stride(i) == 0) {
      fail(ErrorKind::InvalidArgument, std::string(name) + " " + out.describe() +
                                           " is a broadcast view (stride 0 in dimension " + std::to_string(i) +
                                           "): pass a tensor that owns one element per position");
    }
  }
  std::array<int, 4> order{0, 1, 2, 3};
  std::sort(order.begin(), order.end(), [&](int a, int b) { return out.stride(a) < out.stride(b); });
  std::int64_t span = 1;  // elements spanned by the dimensions below
  for (const int i : order) {
    if (out.size(i) <= 1) continue;
    if (out.stride(i) < span) {
      fail(ErrorKind::InvalidArgument, std::string(name) + " " + out.describe() + " overlaps itself (dimension " +
                                           std::to_string(i) +
                                           "'s stride is less than the elements below it span): pass a tensor that "
                                           "owns one element per position");
    }
    span = out.stride(i) * out.size(i);
  }
}

void require_same(const char* what, const char* a_name, std::int64_t a, const char* b_name, std::int64_t b) {
  if (a != b) {
    fail(ErrorKind::InvalidArgument, std::string(what) + " differs: " + a_name + " has " + std::to_string(a) + ", " +
                                         b_name + " has " + std::to_string(b));
  }
}

// Thousands of threads would each be created, with an OpenBLAS buffer apiece.
void check_threads(int threads) {
  if (threads < 0 || threads > 4096) {
    fail(ErrorKind::InvalidArgument, "threads must be from 0 (every core) to 4096, got " + std::to_string(threads));
  }
}

void set_mask(Problem& p, const std::string& mask) {
  p.mask = mask_from_text(mask);
  if (p.mask == MaskKind::Boolean || p.mask == MaskKind::Bias) {
    fail(ErrorKind::InvalidArgument,
         "mask '" + mask + "' names a mask tensor: pass the tensor as attn_mask=", {"mask"});
  }
}

nb::ndarray<float> owned_lse(const Tensor& lse, Device device, std::size_t ndim, const std::size_t* shape,
                             const std::int64_t* strides) {
  auto* held = new Tensor(lse);
  nb::capsule owner(held, [](void* t) noexcept { delete static_cast<Tensor*>(t); });
  const int device_type = device == Device::Cpu ? nb::device::cpu::value : nb::device::cuda::value;
  return nb::ndarray<float>(held->data(), ndim, shape, owner, strides, nb::dtype<float>(), device_type, 0);
}

}  // namespace attnprof::python
