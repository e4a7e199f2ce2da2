#include "attnprof/tensor.h"

#include <sstream>
#include <utility>

#include "attnprof/error.h"

namespace attnprof {

Storage::Storage(Allocator& allocator, std::size_t bytes)
    : allocator_(&allocator), data_(allocator.allocate(bytes)), bytes_(bytes), device_(allocator.device()) {}

Storage::Storage(void* data, std::size_t bytes, Device device)
    : allocator_(nullptr), data_(data), bytes_(bytes), device_(device) {}

Storage::~Storage() {
  if (allocator_) allocator_->deallocate(data_, bytes_);
}

Dims contiguous_strides(const Dims& sizes) {
  Dims strides{};
  std::int64_t s = 1;
  for (int i = 3; i >= 0; --i) {
    strides[static_cast<std::size_t>(i)] = s;
    s *= sizes[static_cast<std::size_t>(i)];
  }
  return strides;
}

Tensor Tensor::empty(const Dims& sizes, DType dtype, Allocator& allocator) {
  for (auto s : sizes) {
    if (s < 0) fail(ErrorKind::InvalidArgument, "negative tensor size");
  }
  Tensor t;
  t.sizes_ = sizes;
  t.strides_ = contiguous_strides(sizes);
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(allocator, t.nbytes());
  return t;
}

Tensor Tensor::from_blob(void* data, const Dims& sizes, const Dims& strides, DType dtype, Device device) {
  if (!data) fail(ErrorKind::InvalidArgument, "from_blob: null data pointer");
  // The buffer spans one element past the farthest one the strides reach.
  std::int64_t last = 0;
  bool empty = false;
  for (std::size_t i = 0; i < 4; ++i) {
    if (sizes[i] < 0) fail(ErrorKind::InvalidArgument, "negative tensor size");
    if (strides[i] < 0) {
      fail(ErrorKind::InvalidArgument, "negative stride " + std::to_string(strides[i]) + " in dimension " +
                                           std::to_string(i) + ": pass a tensor with non-negative strides");
    }
    if (sizes[i] == 0) empty = true;
    last += (sizes[i] - 1) * strides[i];
  }
  Tensor t;
  t.sizes_ = sizes;
  t.strides_ = strides;
  t.dtype_ = dtype;
  const std::size_t bytes = empty ? 0 : static_cast<std::size_t>(last + 1) * element_size(dtype);
  t.storage_ = std::make_shared<Storage>(data, bytes, device);
  return t;
}

Device Tensor::device() const { return storage_ ? storage_->device() : Device::Cpu; }

void* Tensor::data() const {
  if (!storage_) return nullptr;
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<std::int64_t>(element_size(dtype_));
}

bool Tensor::is_contiguous() const { return strides_ == contiguous_strides(sizes_); }

Tensor Tensor::transpose(int a, int b) const {
  Tensor t = *this;
  std::swap(t.sizes_[static_cast<std::size_t>(a)], t.sizes_[static_cast<std::size_t>(b)]);
  std::swap(t.strides_[static_cast<std::size_t>(a)], t.strides_[static_cast<std::size_t>(b)]);
  return t;
}

Tensor Tensor::as_strided(const Dims& sizes, const Dims& strides, std::int64_t offset) const {
  Tensor t = *this;
  t.sizes_ = sizes;
  t.strides_ = strides;
  t.offset_ = offset;
  return t;
}

Tensor Tensor::expand(const Dims& sizes) const {
  Tensor t = *this;
  for (std::size_t i = 0; i < 4; ++i) {
    if (sizes_[i] == sizes[i]) continue;
    if (sizes_[i] != 1) {
      fail(ErrorKind::InvalidArgument, "cannot broadcast " + describe() + " to size " + std::to_string(sizes[i]) +
                                           " in dimension " + std::to_string(i));
    }
    t.sizes_[i] = sizes[i];
    t.strides_[i] = 0;
  }
  return t;
}

std::string dims_string(const Dims& d) {
  // Appended piece by piece: g++ 12 warns (-Wrestrict, a false positive) on
  // chains of operator+ over temporaries, and this runs once per profiled op.
  std::string s = "[";
  for (std::size_t i = 0; i < d.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(d[i]);
  }
  s += ']';
  return s;
}

std::string Tensor::dims_string() const { return attnprof::dims_string(sizes_); }

std::string Tensor::describe() const {
  std::ostringstream os;
  os << dtype_name(dtype_) << "[" << sizes_[0] << ", " << sizes_[1] << ", " << sizes_[2] << ", " << sizes_[3] << "]";
  if (!is_contiguous()) {
    os << " strides [" << strides_[0] << ", " << strides_[1] << ", " << strides_[2] << ", " << strides_[3] << "]";
  }
  return os.str();
}

}  // namespace attnprof
