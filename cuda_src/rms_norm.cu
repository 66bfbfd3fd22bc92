// RMSNorm and fused residual-add + RMSNorm.
//
//   out = x / sqrt(mean(x^2) + eps) * (offset + weight)           (offset = 1 is the Gemma form)
//   fused: residual = round(residual + x); out = rmsnorm(residual)
//
// The six questions (the card in cukern/lab/rmsnorm.py keeps the same answers as data, for `explain` and
// the bench):
// 1. Output tile: one row per group of TPR threads. TPR <= 32 packs BLOCK / TPR rows into a block
//    (per-head norms over 64..256 elements); TPR = BLOCK gives one row per block. The grid covers the
//    rows once; a block walks further rows with a grid-stride loop when the grid is capped.
// 2. Input traffic: x (and residual) read once, out (and residual) written once, weight re-read by every
//    row from L1/L2 (holding it in registers across rows cost occupancy and measured slower). Thread
//    `lane` of a group moves VEC consecutive elements at vector index lane + k * TPR, so a warp's accesses
//    are contiguous: 16-byte loads when pointers and row strides allow (VEC = 16 / sizeof(T)), element
//    loads otherwise.
// 3. Accumulation: sum of squares in float32, each thread over its ITEMS * VEC elements in order, then a
//    butterfly over the group (and a two-level shuffle + shared-memory sum when TPR > 32). The order
//    depends only on the hidden size and the plan, never on the row count: batch-invariant.
// 4. Staging: rms_norm_rows keeps its row in registers, as loaded (ITEMS packs a thread, at most 64 bytes:
//    rmsnorm.MAX_BYTES), between the reduction and the scaling, so each byte crosses DRAM once; shared
//    memory only for the block sum (2 * BLOCK / 32 floats). rms_norm_wide, for rows longer than the
//    registers of a block can hold, reads the row twice (the second read mostly from L2).
// 5. Tuning: TPR and ITEMS come from the hidden size (target ITEMS vectors in flight per thread), VEC from
//    alignment; cukern/rmsnorm.py `plan` picks them.
// 6. Profile: about 3 flops an element against 2 * sizeof(T) bytes: far under the ridge point, so
//    memory-bound; the target is the device-to-device copy bandwidth.
#include "common/dtype.cuh"
#include "common/vec.cuh"
#include "common/reduce.cuh"

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

// Every scalar of a launch, passed by value as one struct (cukern/rmsnorm.py `PARAMS` packs it once per plan:
// one kernel argument where separate scalars would cost the host a conversion each). Strides are in
// elements; res_* are unused without the residual. Kernels take it `const __grid_constant__` so its fields
// are read from the constant bank where they are used, like separate parameters (see rotary.cu).
struct RmsNormParams {
  long long rows, inner;
  long long out_s0, out_s1, res_s0, res_s1, x_s0, x_s1;
  int hidden;
  float eps, offset;
};

template <typename T, typename W, int VEC, int TPR, int ITEMS, int BLOCK, bool FUSED>
__device__ __forceinline__ void rms_norm_rows_impl(T* out, T* residual, const T* x, const W* weight,
                                                   long long rows, RowAddress out_at, RowAddress res_at,
                                                   RowAddress x_at, int hidden, float eps, float offset) {
  static_assert(TPR <= 32 || TPR == BLOCK, "a row is handled by a sub-warp group or by the whole block");
  constexpr int kRowsPerBlock = BLOCK / TPR;
  __shared__ float scratch[2 * (BLOCK / 32)];
  const int lane = static_cast<int>(threadIdx.x) % TPR;
  const int slot = static_cast<int>(threadIdx.x) / TPR;
  const float inv_hidden = 1.f / static_cast<float>(hidden);
  int parity = 0;

  for (long long first = static_cast<long long>(blockIdx.x) * kRowsPerBlock; first < rows;
       first += static_cast<long long>(gridDim.x) * kRowsPerBlock) {
    const long long row = first + slot;
    const bool live = row < rows;
    const RowSplit at = split_row(live ? row : 0, x_at.inner);
    const T* xr = x + x_at(at);
    T* rr = FUSED ? residual + res_at(at) : nullptr;

    // The row stays in registers as loaded (packed), half the registers of float32 for 16-bit types, so a
    // thread can keep twice as many loads in flight; it is widened again for the scaling pass. Every load
    // of a pass is issued before any value is used: ITEMS independent 16-byte loads in flight per thread
    // (interleaving loads and uses serialized them, one load's latency per item). Slots past the row are
    // zero, so the sum needs no predicate.
    bool in[ITEMS];
    Pack<T, VEC> a[ITEMS];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int col = (lane + k * TPR) * VEC;
      in[k] = live && col < hidden;
      if (in[k]) {
        load(a[k], xr + col);
      } else {
#pragma unroll
        for (int i = 0; i < Pack<T, VEC>::kWords; ++i) a[k].w[i] = {};
      }
    }
    if constexpr (FUSED) {
      Pack<T, VEC> r[ITEMS];
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        if (in[k]) load(r[k], rr + (lane + k * TPR) * VEC);
      }
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        if (in[k]) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) a[k].v[j] = from_float<T>(to_float(a[k].v[j]) + to_float(r[k].v[j]));
          store(rr + (lane + k * TPR) * VEC, a[k]);
        }
      }
    }
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float f = to_float(a[k].v[j]);
        ss += f * f;
      }
    }
    if constexpr (TPR <= 32) {
      ss = group_sum<TPR>(ss);
    } else {
      ss = block_sum<BLOCK>(ss, scratch, parity);
      parity ^= 1;
    }
    const float rstd = rsqrtf(ss * inv_hidden + eps);

    T* orow = out + out_at(at);
    if (weight != nullptr) {
      Pack<W, VEC> w[ITEMS];
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        if (in[k]) load(w[k], weight + (lane + k * TPR) * VEC);
      }
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        if (in[k]) {
          float f[VEC];
#pragma unroll
          for (int j = 0; j < VEC; ++j) f[j] = to_float(a[k].v[j]) * rstd * (offset + to_float(w[k].v[j]));
          Pack<T, VEC> y;
          round_into(y, f);
          store(orow + (lane + k * TPR) * VEC, y);
        }
      }
    } else {
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        if (in[k]) {
          float f[VEC];
#pragma unroll
          for (int j = 0; j < VEC; ++j) f[j] = to_float(a[k].v[j]) * rstd * (offset + 1.f);
          Pack<T, VEC> y;
          round_into(y, f);
          store(orow + (lane + k * TPR) * VEC, y);
        }
      }
    }
  }
}

template <typename T, typename W, int VEC, int TPR, int ITEMS, int BLOCK>
__global__ void __launch_bounds__(BLOCK)
    rms_norm_rows(T* out, const T* x, const W* weight, const __grid_constant__ RmsNormParams p) {
  const RowAddress out_at{p.inner, p.out_s0, p.out_s1};
  rms_norm_rows_impl<T, W, VEC, TPR, ITEMS, BLOCK, false>(out, nullptr, x, weight, p.rows, out_at, out_at,
                                                          RowAddress{p.inner, p.x_s0, p.x_s1}, p.hidden, p.eps,
                                                          p.offset);
}

template <typename T, typename W, int VEC, int TPR, int ITEMS, int BLOCK>
__global__ void __launch_bounds__(BLOCK)
    fused_add_rms_norm_rows(T* out, T* residual, const T* x, const W* weight, const __grid_constant__ RmsNormParams p) {
  rms_norm_rows_impl<T, W, VEC, TPR, ITEMS, BLOCK, true>(out, residual, x, weight, p.rows,
                                                         RowAddress{p.inner, p.out_s0, p.out_s1},
                                                         RowAddress{p.inner, p.res_s0, p.res_s1},
                                                         RowAddress{p.inner, p.x_s0, p.x_s1}, p.hidden, p.eps,
                                                         p.offset);
}

// Rows too long for registers: a block owns a row and streams it twice in chunks of BLOCK * ITEMS * VEC.
// Pass one sums squares (and, fused, writes the new residual); pass two rescales. Each thread reads back
// exactly the elements it wrote, so the fused form needs no barrier between passes.
template <typename T, typename W, int VEC, int ITEMS, int BLOCK, bool FUSED>
__device__ __forceinline__ void rms_norm_wide_impl(T* out, T* residual, const T* x, const W* weight,
                                                   long long rows, RowAddress out_at, RowAddress res_at,
                                                   RowAddress x_at, int hidden, float eps, float offset) {
  __shared__ float scratch[2 * (BLOCK / 32)];
  int parity = 0;
  for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
    // A wide row holds at least 32K elements, so the row count fits in 32 bits: no 64-bit division here.
    const unsigned q = static_cast<unsigned>(row) / static_cast<unsigned>(x_at.inner);
    const RowSplit at{q, row - static_cast<long long>(q) * x_at.inner};
    const T* xr = x + x_at(at);
    T* rr = FUSED ? residual + res_at(at) : nullptr;
    const T* src = FUSED ? rr : xr;
    T* orow = out + out_at(at);

    float ss = 0.f;
    for (int base = 0; base < hidden; base += BLOCK * ITEMS * VEC) {
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        const int col = base + (static_cast<int>(threadIdx.x) + k * BLOCK) * VEC;
        if (col < hidden) {
          Pack<T, VEC> a;
          load(a, xr + col);
          if constexpr (FUSED) {
            Pack<T, VEC> r;
            load(r, rr + col);
#pragma unroll
            for (int j = 0; j < VEC; ++j) a.v[j] = from_float<T>(to_float(a.v[j]) + to_float(r.v[j]));
            store(rr + col, a);
          }
#pragma unroll
          for (int j = 0; j < VEC; ++j) ss += to_float(a.v[j]) * to_float(a.v[j]);
        }
      }
    }
    ss = block_sum<BLOCK>(ss, scratch, parity);
    parity ^= 1;
    const float rstd = rsqrtf(ss / static_cast<float>(hidden) + eps);

    for (int base = 0; base < hidden; base += BLOCK * ITEMS * VEC) {
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        const int col = base + (static_cast<int>(threadIdx.x) + k * BLOCK) * VEC;
        if (col < hidden) {
          Pack<T, VEC> a;
          load(a, src + col);
          Pack<T, VEC> y;
          if (weight != nullptr) {
            Pack<W, VEC> w;
            load(w, weight + col);
#pragma unroll
            for (int j = 0; j < VEC; ++j) y.v[j] = from_float<T>(to_float(a.v[j]) * rstd * (offset + to_float(w.v[j])));
          } else {
#pragma unroll
            for (int j = 0; j < VEC; ++j) y.v[j] = from_float<T>(to_float(a.v[j]) * rstd * (offset + 1.f));
          }
          store(orow + col, y);
        }
      }
    }
  }
}

template <typename T, typename W, int VEC, int ITEMS, int BLOCK>
__global__ void __launch_bounds__(BLOCK)
    rms_norm_wide(T* out, const T* x, const W* weight, const __grid_constant__ RmsNormParams p) {
  const RowAddress out_at{p.inner, p.out_s0, p.out_s1};
  rms_norm_wide_impl<T, W, VEC, ITEMS, BLOCK, false>(out, nullptr, x, weight, p.rows, out_at, out_at,
                                                     RowAddress{p.inner, p.x_s0, p.x_s1}, p.hidden, p.eps,
                                                     p.offset);
}

template <typename T, typename W, int VEC, int ITEMS, int BLOCK>
__global__ void __launch_bounds__(BLOCK)
    fused_add_rms_norm_wide(T* out, T* residual, const T* x, const W* weight, const __grid_constant__ RmsNormParams p) {
  rms_norm_wide_impl<T, W, VEC, ITEMS, BLOCK, true>(out, residual, x, weight, p.rows,
                                                    RowAddress{p.inner, p.out_s0, p.out_s1},
                                                    RowAddress{p.inner, p.res_s0, p.res_s1},
                                                    RowAddress{p.inner, p.x_s0, p.x_s1}, p.hidden, p.eps, p.offset);
}

}  // namespace cukern
