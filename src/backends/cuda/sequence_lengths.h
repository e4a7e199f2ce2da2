// The device-side sequence lengths that flash's kernels read
// (FusedParams::cu_seqlens_q/k): a packed batch's cumulative lengths; and
// the int32 buffers kept on the device by value that flash's lengths and
// cudnn's ragged offsets and lengths (cudnn_inputs.h) are both kept in. (A
// dense batch's rows, FusedParams::q_rows and kv_rows, are the caller's own
// device tensors: nothing here copies or reads them.)
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "attnprof/problem.h"
#include "attnprof/tensor.h"
#include "core/mask_lowering.h"

namespace attnprof::cuda {

// `values` as int32 [n, 1, 1, 1] on the device, from `allocator`: copied on
// `stream` and waited for, so that `values` may go at once and a kernel on
// any stream may read the copy.
Tensor device_ints(const std::vector<std::int32_t>& values, Allocator& allocator, cudaStream_t stream);

// int32 sets kept on the device by their values: data a kernel or a graph
// reads that is the same on every call of a problem (a packed batch's
// cumulative lengths, cuDNN's ragged offsets and lengths). The first ask for
// a set copies it (device_ints()); later asks find the same buffer, so
// repeated calls bind the same addresses.
//
// The copy and the cache only: its two owners keep lifetimes of their own,
// which differ. flash's cumulative lengths (device_cu_seqlens()) are
// process-wide, one cache per device that every flash call on it shares (the
// fused backends keep no per-call state), in memory of their own that no
// run's allocator counts, and go only after a device synchronise, since
// kernels queued on any stream may still read them. cudnn's (cudnn_inputs.h)
// belong to one backend, come from its calls' allocator (counted in its
// workspace_bytes()) and go at the start of a call, before anything is bound,
// together with the variant packs cached on their addresses.
class KeptInts {
 public:
  // The kept copy of `values`; null when there is none.
  const Tensor* find(const std::vector<std::int32_t>& values) const;
  // The kept copy of `values`, made from `allocator` on `stream` the first
  // time they are asked for.
  const Tensor& get(const std::vector<std::int32_t>& values, Allocator& allocator, cudaStream_t stream);
  std::size_t size() const { return kept_.size(); }
  void clear() { kept_.clear(); }

 private:
  std::map<std::vector<std::int32_t>, Tensor> kept_;
};

struct PackedLengths {
  const std::int32_t* cu_q = nullptr;  // [batch + 1], from 0
  const std::int32_t* cu_k = nullptr;
};

// Device copies of a packed problem's cumulative lengths on the current
// device: made on the first call with these lengths (one copy on `stream`,
// waited for) and kept (KeptInts), so that a training loop over the same
// batch shapes copies nothing per call. At most kKeptLengthSets sets are
// kept; past that the device is synchronised and the cache starts again.
inline constexpr std::size_t kKeptLengthSets = 256;
PackedLengths device_cu_seqlens(const Problem& p, cudaStream_t stream);

// This device's input-error word (FusedParams::input_errors): kernels that
// read per-sequence counts or a block table on the device clamp what is out
// of range and OR in kInputBadKeyCount or kInputBadPage. Allocated and zeroed
// on the device's first ask (a synchronous cudaMalloc and cudaMemset, once
// per process); never freed, since a queued kernel may still write it.
unsigned* device_input_errors();

// The current device's input-error bits, read in `stream`'s order (what was
// queued on it before has reported) and waited for, then cleared: for tests
// and for the checking mode's callers, never on a call's default path.
unsigned take_input_errors(cudaStream_t stream);

}  // namespace attnprof::cuda
