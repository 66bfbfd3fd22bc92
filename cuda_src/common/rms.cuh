// What RMSNorm's forward and backward kernels share (rms_norm.cu, rms_norm_backward.cu): the row addressing
// and the correctly rounded steps of a row's sum of squares and its inverse root, so that the backward's
// recomputed rstd has the forward's bits by construction, not by a second copy kept in step.
#pragma once

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

__device__ __forceinline__ float square_add(float acc, float v) { return __fadd_rn(acc, __fmul_rn(v, v)); }

// 1 / sqrt(ss / hidden + eps), each operation rounded to nearest: one formula for every kernel that forms rstd.
__device__ __forceinline__ float inverse_rms(float ss, int hidden, float eps) {
  return __frcp_rn(__fsqrt_rn(__fadd_rn(__fdiv_rn(ss, static_cast<float>(hidden)), eps)));
}

// Thread `lane`'s share of a row in the rows kernels' layout: vector column lane + k * TPR (VEC elements) as
// a[k], every load issued before any is used; in[k] says whether it lies in the row (of a live row). Slots past
// the row are zero: a square adds +0 there, which leaves a class's sum as it is.
template <int TPR, typename T, int VEC, int ITEMS>
__device__ __forceinline__ void load_row(Pack<T, VEC> (&a)[ITEMS], bool (&in)[ITEMS], const T* row, int lane, bool live,
                                         int hidden) {
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    const int col = (lane + k * TPR) * VEC;
    in[k] = live && col < hidden;
    if (in[k]) {
      load(a[k], row + col);
    } else {
#pragma unroll
      for (int i = 0; i < Pack<T, VEC>::kWords; ++i) a[k].w[i] = {};
    }
  }
}

}  // namespace cukern
