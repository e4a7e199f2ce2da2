// The pre-pass of flash's FP8 forward (flash_fwd_sm90_fp8.cuh says why):
// an e4m3 V [B, Hkv, Skv, D] (any strides, rows 16-byte aligned) into V^T
// [B, Hkv, D, fp8_vt_cols(Skv)], contiguous, the keys past Skv zero, each
// 16-key group's columns permuted by kKeyOfColumn.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace attnprof::cuda::kernels {

// The key (of 16) in V^T's column c of a 16-key group.
__host__ __device__ constexpr int kKeyOfColumn(int c) { return 2 * (c / 4) + (c % 2) + 8 * ((c % 4) / 2); }

// One CTA of 256 threads: 128 keys x 128 columns of V of one (batch, KV
// head). In: 16-byte loads, eight threads a 128-byte row, into shared
// memory with the 16-byte chunks of row r XOR-swizzled by (r / 16) % 8, so
// that the reads below hit 32 distinct banks. Out: thread (warp w, lane)
// takes key group g = lane % 8 (16 keys) and columns 4 (4w + lane / 8) .. + 3;
// for each quad of V^T's columns it reads the four keys' 4-byte words and
// transposes the 4 x 4 bytes in registers (byte_perm), then writes each
// column's 16 keys as one 16-byte store, a warp's eight groups one 128-byte
// run of a V^T row.
template <int kKeys = 128, int kCols = 128>
__global__ void __launch_bounds__(256)
    transpose_v_e4m3_kernel(const std::uint8_t* __restrict__ v, std::int64_t v_batch_stride, std::int64_t v_head_stride,
                            std::int64_t v_row_stride, std::uint8_t* __restrict__ vt, int kv_heads, int seq_k,
                            int vt_cols, int head_dim) {
  static_assert(kKeys == 128 && kCols == 128, "the thread mapping below");
  __shared__ __align__(16) std::uint32_t tile[kKeys][kCols / 4];
  const int n0 = blockIdx.x * kKeys, d0 = blockIdx.y * kCols;
  const int b = blockIdx.z / kv_heads, h = blockIdx.z % kv_heads;
  const int tid = threadIdx.x;
  const std::uint8_t* const src = v + b * v_batch_stride + h * v_head_stride;
#pragma unroll
  for (int it = 0; it < kKeys * kCols / 16 / 256; ++it) {
    const int item = it * 256 + tid, r = item / 8, c = item % 8, n = n0 + r, d = d0 + 16 * c;
    uint4 x = make_uint4(0, 0, 0, 0);
    if (n < seq_k && d < head_dim) x = *reinterpret_cast<const uint4*>(src + n * v_row_stride + d);
    *reinterpret_cast<uint4*>(&tile[r][4 * (c ^ (r / 16 % 8))]) = x;
  }
  __syncthreads();
  const int lane = tid % 32, g = lane % 8, dq = 4 * (tid / 32) + lane / 8;  // key group, column quad
  std::uint32_t out[4][4];  // [column of the quad][word q of its 16 keys]
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    // Word q of a 16-key group holds keys kKeyOfColumn(4q .. 4q + 3) = 2q, 2q + 1, 8 + 2q, 9 + 2q.
    const int word = dq ^ (4 * g);  // the swizzled column quad; rows 16 g .. 16 g + 15 share it
    const std::uint32_t a = tile[16 * g + kKeyOfColumn(4 * q)][word];
    const std::uint32_t bb = tile[16 * g + kKeyOfColumn(4 * q + 1)][word];
    const std::uint32_t c = tile[16 * g + kKeyOfColumn(4 * q + 2)][word];
    const std::uint32_t d = tile[16 * g + kKeyOfColumn(4 * q + 3)][word];
    const std::uint32_t t0 = __byte_perm(a, bb, 0x5140), t1 = __byte_perm(a, bb, 0x7362);
    const std::uint32_t t2 = __byte_perm(c, d, 0x5140), t3 = __byte_perm(c, d, 0x7362);
    out[0][q] = __byte_perm(t0, t2, 0x5410);
    out[1][q] = __byte_perm(t0, t2, 0x7632);
    out[2][q] = __byte_perm(t1, t3, 0x5410);
    out[3][q] = __byte_perm(t1, t3, 0x7632);
  }
  const int n = n0 + 16 * g;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int d = d0 + 4 * dq + i;
    if (d < head_dim && n < vt_cols) {
      *reinterpret_cast<uint4*>(vt + (static_cast<std::int64_t>(b * kv_heads + h) * head_dim + d) * vt_cols + n) =
          make_uint4(out[i][0], out[i][1], out[i][2], out[i][3]);
    }
  }
}

// V^T of a [batch, kv_heads, seq_k, head_dim] e4m3 V (byte strides, rows
// 16-byte aligned) into vt, contiguous [batch, kv_heads, head_dim, vt_cols].
inline cudaError_t launch_transpose_v_e4m3(const void* v, std::int64_t v_batch_stride, std::int64_t v_head_stride,
                                           std::int64_t v_row_stride, void* vt, int batch, int kv_heads, int seq_k,
                                           int vt_cols, int head_dim, cudaStream_t stream) {
  const dim3 grid((vt_cols + 127) / 128, (head_dim + 127) / 128, batch * kv_heads);
  transpose_v_e4m3_kernel<><<<grid, 256, 0, stream>>>(static_cast<const std::uint8_t*>(v), v_batch_stride,
                                                      v_head_stride, v_row_stride, static_cast<std::uint8_t*>(vt),
                                                      kv_heads, seq_k, vt_cols, head_dim);
  return cudaGetLastError();
}

}  // namespace attnprof::cuda::kernels
