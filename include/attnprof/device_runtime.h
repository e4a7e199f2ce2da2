// The device a backend runs on and the profiler records: its allocator, stream,
// collectors, ceilings and transfers. Backends implement one per device; the
// runner (dispatch) picks it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attnprof/activity.h"
#include "attnprof/backend.h"
#include "attnprof/profiler.h"
#include "attnprof/tensor.h"

namespace attnprof {

class DeviceRuntime {
 public:
  virtual ~DeviceRuntime() = default;
  virtual Device device() const = 0;
  virtual Allocator& allocator() = 0;
  virtual void* stream() { return nullptr; }
  virtual void synchronize() {}
  // Bytes that can still be allocated (for refusing before allocating).
  virtual std::int64_t available_bytes() const = 0;
  virtual std::vector<std::unique_ptr<Collector>> make_collectors() { return {}; }
  // Moves inputs made on the CPU to this device (identity on the CPU), the
  // FP8 descales with them.
  virtual Inputs upload(const Inputs& host) = 0;
  virtual Tensor upload(const Tensor& host) = 0;  // one more tensor (the backward's dO)
  virtual Tensor download(const Tensor& t) = 0;
  // t read in `stream`'s order (what the caller queued on it before is
  // written) and waited for: the checking mode's read of a caller's index
  // tensors (attnprof/check_inputs.h). The host's runtime has no streams.
  virtual Tensor download(const Tensor& t, void* stream) {
    (void)stream;
    return download(t);
  }
  virtual void poison(Tensor& t) = 0;  // fills with NaN so unwritten elements show
  // Measured matrix-product ceiling (TFLOP/s) for this dtype, measured once.
  virtual double ceiling_tflops(DType dtype) = 0;
  // Measured copy ceiling (GB/s): a large device-to-device copy, the bytes it
  // read plus the bytes it wrote over its time, measured once. The memory roof
  // a memory-bound run is judged against (the ridge point is
  // ceiling_tflops / copy_bandwidth_gbs).
  virtual double copy_bandwidth_gbs() = 0;
  // "NVIDIA H200, driver 580.159, CUDA 13.0" / "AMD EPYC, 2 threads, OpenBLAS 0.3.21"
  virtual std::string description() const = 0;
  virtual std::optional<DeviceProperties> properties() const { return std::nullopt; }
};

}  // namespace attnprof
