// What the row kernels of rms_norm.cu, rms_norm_backward.cu, qk_norm_rope.cu and layer_norm.cu share: how a
// row is addressed, the residual add of the fused forms and the correctly rounded 1 / sqrt(v / hidden + eps)
// that all of them normalize by (common/rms.cuh adds what only the RMSNorm kernels share).
#pragma once

#include "dtype.cuh"
#include "vec.cuh"

namespace cukern {

// Rows are addressed through two leading dimensions (outer, inner) with free strides, so views into a
// fused buffer and per-head layouts need no copy. All offsets are 64-bit. A row number is split once per
// row for all arrays; a 64-bit division costs about a hundred instructions, so the split skips it for
// one-level layouts (inner == rows) and uses 32-bit division whenever the numbers fit.
struct RowSplit {
  long long outer, inner;
};

__device__ __forceinline__ RowSplit split_row(long long row, long long inner) {
  if (row < inner) return {0, row};
  if (row <= 0xffffffffLL) {
    const unsigned q = static_cast<unsigned>(row) / static_cast<unsigned>(inner);
    return {q, row - static_cast<long long>(q) * inner};
  }
  return {row / inner, row % inner};
}

struct RowAddress {
  long long inner;
  long long s0, s1;
  __device__ __forceinline__ long long operator()(RowSplit r) const { return r.outer * s0 + r.inner * s1; }
};

// 1 / sqrt(v / hidden + eps), each operation rounded to nearest: v is rms_norm's sum of squares and
// layer_norm's M2 (hidden times the variance), so one formula serves every kernel of both.
__device__ __forceinline__ float inverse_rms(float v, int hidden, float eps) {
  return __frcp_rn(__fsqrt_rn(__fadd_rn(__fdiv_rn(v, static_cast<float>(hidden)), eps)));
}

template <typename T, int VEC>
__device__ __forceinline__ Pack<T, VEC> residual_sum(const Pack<T, VEC>& x, const Pack<T, VEC>& r) {
  // In float32 and rounded once to T: exact for float32, and for 16-bit types the float32 sum is close
  // enough (24 >= 2 * 11 + 2 bits) that rounding it again gives the correctly rounded sum in T.
  Pack<T, VEC> s;
#pragma unroll
  for (int j = 0; j < VEC; ++j) s.v[j] = from_float<T>(__fadd_rn(to_float(x.v[j]), to_float(r.v[j])));
  return s;
}

}  // namespace cukern
