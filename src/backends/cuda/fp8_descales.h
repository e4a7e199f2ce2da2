// FP8 descales given as device tensors (Inputs::q_descale_tensor ...): the
// pointer a kernel or cuDNN's graph reads, after the checks that need no
// read of the value (issue 56 item 2: the value is read on the device only).
#pragma once

#include <string>
#include <string_view>

#include "attnprof/backend.h"
#include "attnprof/error.h"

namespace attnprof::cuda {

// t's float, or null where t is undefined (the descale is Inputs' float).
// Throws Error(InvalidArgument), one line naming `name`, unless t is an FP32
// tensor of one element on `device`.
inline const float* device_descale(const Tensor& t, std::string_view name, Device device) {
  if (!t.defined()) return nullptr;
  if (t.dtype() != DType::F32 || t.numel() != 1 || t.device() != device) {
    fail(ErrorKind::InvalidArgument,
         std::string(name) + " must be a float32 tensor of one element on " + std::string(device_name(device)) +
             ", got " + t.describe(),
         {std::string(name)});
  }
  return t.data_as<const float>();
}

}  // namespace attnprof::cuda
