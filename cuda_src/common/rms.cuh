// What RMSNorm's kernels share beyond common/rows.cuh (rms_norm.cu, rms_norm_backward.cu, qk_norm_rope.cu):
// the rounded step of a row's sum of squares and the row loads, so that the backward's recomputed rstd has the
// forward's bits by construction, not by a second copy kept in step. The row addressing and inverse_rms, which
// LayerNorm shares too, are rows.cuh's.
#pragma once

#include "rows.cuh"
#include "vec.cuh"

namespace cukern {

__device__ __forceinline__ float square_add(float acc, float v) { return __fadd_rn(acc, __fmul_rn(v, v)); }

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
