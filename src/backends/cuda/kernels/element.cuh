// The element types of the fused forwards, as types: a kernel is instantiated
// for an element tag (Bf16, Fp16), never for a flag. A tag says how its values
// are stored in global and shared memory and which PTX type the tensor-core
// instructions name; an 8-bit type (fp8 e4m3, say) would be one more tag with
// a 1-byte Storage, and the kernels that cannot take it say so by static_assert.
#pragma once

#include <concepts>
#include <cstdint>

namespace attnprof::cuda::kernels {

struct Bf16 {
  using Storage = std::uint16_t;
  static constexpr const char* kName = "bf16";
};

struct Fp16 {
  using Storage = std::uint16_t;
  static constexpr const char* kName = "fp16";
};

// The 16-bit floating-point elements that every kernel here takes.
template <class T>
concept Half16 = std::same_as<T, Bf16> || std::same_as<T, Fp16>;

}  // namespace attnprof::cuda::kernels
