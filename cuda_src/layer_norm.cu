// LayerNorm forward and backward, and fused residual-add + LayerNorm.
//
//   forward:  mean, var = the row's moments; rstd = 1 / sqrt(var + eps);
//             xhat = (x - mean) * rstd; out = xhat * weight + bias
//   fused:    residual = round(residual + x); out = layer_norm(residual)
//   backward: g = dy * weight; dx = rstd * ((g - mean(g)) - xhat * mean(g * xhat)) (+ dresidual),
//             mean(v) = sum(v) * (1 / hidden);
//             dweight = sum over rows of dy * xhat; dbias = sum over rows of dy
//
// The six questions (cukern/layernorm.py keeps the same answers as data):
// 1. Output tile: rms_norm.cu's row tile (cukern/rmsnorm.py `plan`): one row per group of TPR threads, TPR
//    <= 32 packing BLOCK / TPR rows into a block, TPR = BLOCK one row a block. The forward's grid covers the
//    rows (a grid-stride loop when capped). The backward's group owns a chunk of R consecutive rows (R from
//    the row count alone: cukern/layernorm.py `chunk_rows`) and walks it in row order, writing one float32
//    partial row of dweight and of dbias per chunk; layer_norm_param_grads then sums the partials of 32
//    columns per block, 32 lanes of chunks each, and writes dweight and dbias.
// 2. Input traffic: the forward reads x (and residual) once and writes out (and residual) once, weight and
//    bias re-read from L1/L2 by every row (loaded with the row where the grid is one wave: HOLD); the
//    backward reads dy and x (and dresidual) once and writes dx once (its vector kernels load the weight once
//    and hold it across their rows), plus 2 * 4 * hidden bytes a chunk of partials, written and read back
//    once. 16-byte vectors in the forward, vectors of at most four elements in the backward (two with one-row
//    chunks: cukern/layernorm.py `backward_vec_cap`) where pointers and strides allow, element accesses
//    otherwise, a warp's accesses contiguous. The half types' backward loads the next row of its chunk while
//    it reduces the current one.
// 3. Accumulation, in float32, every step rounded once (__fadd_rn, __fmul_rn: no contraction into FMAs):
//    * the row's mean and M2, in two passes over the row in registers: rms_norm.cu's classes (C =
//      cukern/rmsnorm.py `tree_classes(hidden)`, element i in class i % C), each summed in index order from
//      -0, the class sums added up rms_norm's tree (neighbours first: a thread's lanes, then its row lanes,
//      then its groups), the mean that sum divided by hidden; then the squares of (x - mean) up the same
//      classes and tree, M2. rstd = 1 / sqrt(M2 / hidden + eps), correctly rounded step by step.
//    * the backward's sum(g) and sum(g * xhat): the same classes, each summed in index order, the class
//      sums added up the same tree (both sums in one pass through it); the means are the sums times
//      1 / hidden (that reciprocal rounded once, on the host).
//    * dweight and dbias: each chunk's rows added in row order, then the chunks' partials added as a perfect
//      binary tree, neighbours first, padded with -0 (the exact identity of addition) to a power of two.
//    No tree depends on the grid, the block, the knobs, the alignment, the SM count or the GPU: a row's
//    outputs depend only on its own values, and dweight and dbias on the values and the row count.
//    cukern/reference/layernorm.py repeats every step on the host. No float atomics.
//    The backward reads the statistics; without the forward's it has layer_norm_rows write them first (its
//    statistics alone): one more read of x, and no statistics tree in the backward kernel, whose registers
//    hold the partials instead.
// 4. Staging: the row stays in registers as loaded, between the reduction and the output, so each byte
//    crosses DRAM once; the backward also holds its columns' dweight and dbias partials (two floats an
//    element) across the chunk's rows. Shared memory for the block trees only, and the param-grads kernel's
//    stack of subtrees. Rows longer than the registers hold (cukern/layernorm.py `MAX_HIDDEN`) are refused.
// 5. Tuning: rms_norm's knobs and plan (the tile); the chunk length and the param-grads tree are fixed by
//    the row count, not tuned.
// 6. Profile: under ten flops an element against 2 * sizeof(T) bytes (forward) or 3 * sizeof(T) bytes
//    (backward): memory-bound; the target is the device-to-device copy bandwidth.
#include "common/bounds.cuh"
#include "common/dtype.cuh"
#include "common/reduce.cuh"
#include "common/rows.cuh"
#include "common/vec.cuh"

namespace cukern {

// The forward's scalars (cukern/layernorm.py `PARAMS`): row strides in elements, the statistics' (mean,
// rstd, one float a row) in floats.
struct LayerNormParams {
  long long rows, inner;
  long long out_s0, out_s1, res_s0, res_s1, x_s0, x_s1, st_s0, st_s1;
  int hidden;
  float eps;
};

// The backward's scalars (cukern/layernorm.py `BACKWARD_PARAMS`): chunk_rows rows a chunk, chunks of them. It
// reads each row's mean and rstd: the forward's, or, when the caller has none, those layer_norm_rows writes
// with a null `out` (the statistics alone), launched first: the forward's own code, hence its bits.
struct LayerNormBackwardParams {
  long long rows, inner;
  long long dx_s0, dx_s1, dy_s0, dy_s1, x_s0, x_s1, dr_s0, dr_s1, st_s0, st_s1;
  long long chunk_rows;
  int chunks, hidden;
  float inv_hidden;  // 1 / hidden, correctly rounded on the host
};

struct RowStats {
  float mean, rstd;
};

// xhat = (x - mean) * rstd, both steps rounded: the one formula of the forward and of both backward passes.
__device__ __forceinline__ float normalized(float x, RowStats st) { return __fmul_rn(__fsub_rn(x, st.mean), st.rstd); }

// g = dy * weight; without a weight g is dy itself (the product by 1 would be exact anyway).
__device__ __forceinline__ float weighted_dy(float dy, float w, bool has_weight) {
  return has_weight ? __fmul_rn(dy, w) : dy;
}

// The top of a row's tree over its threads' per-group subtrees (group g's of lane t being the row's
// (g * TPR + t)-th subtree): through shuffles when a row has a sub-warp group, through the block otherwise.
template <int TPR, int BLOCK, typename C, int GROUPS, typename T>
__device__ __forceinline__ T row_tree(T (&part)[GROUPS], T* scratch, int parity) {
  if constexpr (TPR <= 32) {
#pragma unroll
    for (int g = 0; g < GROUPS; ++g) part[g] = group_tree_reduce<TPR, C>(part[g]);
    return tree_reduce<C>(part);
  } else {
    return block_tree_reduce_wide<BLOCK, C>(part, scratch, parity);
  }
}

// A row's (mean, rstd) over the classes that a thread's ITEMS vectors hold (the layout of rms_norm.cu:
// vector k is element k / GROUPS of classes ((k % GROUPS) * TPR + lane) * VEC + j), `in[k]` whether vector k
// lies in the row (those that do are a prefix of each class), in two passes over the registers: each class
// summed in index order from -0 and the class sums added up rms_norm's tree, the mean that sum divided by
// hidden; then the same for the squares of (x - mean), M2. `scratch` holds the two block trees' slots.
template <typename T, int VEC, int TPR, int GROUPS, int ITEMS, int BLOCK>
__device__ __forceinline__ RowStats row_stats(const Pack<T, VEC> (&a)[ITEMS], const bool (&in)[ITEMS], int hidden,
                                              float eps, float* scratch, int parity) {
  float part[GROUPS];
#pragma unroll
  for (int g = 0; g < GROUPS; ++g) {
    float s[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) s[j] = -0.f;
#pragma unroll
    for (int k = g; k < ITEMS; k += GROUPS) {
      if (in[k]) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) s[j] = __fadd_rn(s[j], element(a[k], j));
      }
    }
    part[g] = tree_reduce<Sum>(s);
  }
  const float mean = __fdiv_rn(row_tree<TPR, BLOCK, Sum>(part, scratch, parity), static_cast<float>(hidden));
#pragma unroll
  for (int g = 0; g < GROUPS; ++g) {
    float s[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) s[j] = -0.f;
#pragma unroll
    for (int k = g; k < ITEMS; k += GROUPS) {
      if (in[k]) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float e = __fsub_rn(element(a[k], j), mean);
          s[j] = __fadd_rn(s[j], __fmul_rn(e, e));
        }
      }
    }
    part[g] = tree_reduce<Sum>(s);
  }
  const float m2 = row_tree<TPR, BLOCK, Sum>(part, scratch + 2 * GROUPS * (BLOCK / 32), parity);
  return RowStats{mean, inverse_rms(m2, hidden, eps)};
}

// Zero past the row, so that a short row's slots hold no stale bits.
template <typename T, int VEC> __device__ __forceinline__ void load_or_zero(Pack<T, VEC>& p, const T* src, bool in) {
  if (in) {
    load(p, src);
  } else {
#pragma unroll
    for (int i = 0; i < Pack<T, VEC>::kWords; ++i) p.w[i] = {};
  }
}

// A row's output, ((x - mean) * rstd) * weight + bias, each step rounded in float32, then once to T. Without a
// weight the product by 1 is left out (it is exact); without a bias the add of -0 (the exact identity, which
// keeps a -0 as it is). One instance for each of the four cases, so that every element's steps are
// straight-line code (no select or branch an element). HOLD: the weight and bias were loaded with the row
// (`wh`, `bh`); otherwise they are loaded here.
template <bool WEIGHTED, bool BIASED, int TPR, bool HOLD, typename T, typename W, int VEC, int ITEMS, int HELD>
__device__ __forceinline__ void store_normalized(T* orow, const Pack<T, VEC> (&a)[ITEMS], const bool (&in)[ITEMS],
                                                 RowStats st, const W* weight, const W* bias,
                                                 const Pack<W, VEC> (&wh)[HELD], const Pack<W, VEC> (&bh)[HELD],
                                                 int lane) {
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
    if (in[k]) {
      const int col = (lane + k * TPR) * VEC;
      Pack<W, VEC> w, b;
      if constexpr (HOLD) {
        w = wh[k];
        b = bh[k];
      } else {
        if constexpr (WEIGHTED) load(w, weight + col);
        if constexpr (BIASED) load(b, bias + col);
      }
      float f[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        float y = normalized(element(a[k], j), st);
        if constexpr (WEIGHTED) y = __fmul_rn(y, element(w, j));
        f[j] = __fadd_rn(y, BIASED ? element(b, j) : -0.f);
      }
      Pack<T, VEC> y;
      round_into(y, f);
      store(orow + col, y);
    }
  }
}

template <typename T, typename W, int VEC, int TPR, int GROUPS, int ITEMS, int BLOCK, bool FUSED, bool HOLD>
__device__ __forceinline__ void layer_norm_rows_impl(T* out, T* residual, float* mean_out, float* rstd_out,
                                                     const T* x, const W* weight, const W* bias,
                                                     const LayerNormParams& p) {
  static_assert(TPR <= 32 || TPR == BLOCK, "a row is handled by a sub-warp group or by the whole block");
  static_assert(ITEMS % GROUPS == 0, "every group of classes gets the same number of vectors");
  constexpr int kRowsPerBlock = BLOCK / TPR;
  __shared__ float scratch[4 * GROUPS * (BLOCK / 32)];  // two block trees, double-buffered
  const int lane = static_cast<int>(threadIdx.x) % TPR;
  const int slot = static_cast<int>(threadIdx.x) / TPR;
  const RowAddress out_at{p.inner, p.out_s0, p.out_s1}, res_at{p.inner, p.res_s0, p.res_s1};
  const RowAddress x_at{p.inner, p.x_s0, p.x_s1}, st_at{p.inner, p.st_s0, p.st_s1};
  int parity = 0;
  for (long long first = static_cast<long long>(blockIdx.x) * kRowsPerBlock; first < p.rows;
       first += static_cast<long long>(gridDim.x) * kRowsPerBlock) {
    const long long row = first + slot;
    const bool live = row < p.rows;
    const RowSplit at = split_row(live ? row : 0, p.inner);
    const T* xr = x + x_at(at);
    bool in[ITEMS];
    Pack<T, VEC> a[ITEMS];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      in[k] = live && (lane + k * TPR) * VEC < p.hidden;
      load_or_zero(a[k], xr + (lane + k * TPR) * VEC, in[k]);
    }
    if constexpr (FUSED) {
      T* rr = residual + res_at(at);
      Pack<T, VEC> r[ITEMS];
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) load_or_zero(r[k], rr + (lane + k * TPR) * VEC, in[k]);
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        if (in[k]) {
          a[k] = residual_sum(a[k], r[k]);
          store(rr + (lane + k * TPR) * VEC, a[k]);
        }
      }
    }
    // HOLD (a grid of one wave, cukern/layernorm.py `holds_params`): the weight and bias are loaded with the
    // row, so that their latency passes during the statistics; there is no other block's work to hide it.
    Pack<W, VEC> wh[HOLD ? ITEMS : 1], bh[HOLD ? ITEMS : 1];
    if constexpr (HOLD) {
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        load_or_zero(wh[k], weight + (lane + k * TPR) * VEC, in[k] && weight != nullptr && out != nullptr);
        load_or_zero(bh[k], bias + (lane + k * TPR) * VEC, in[k] && bias != nullptr && out != nullptr);
      }
    }
    const RowStats st = row_stats<T, VEC, TPR, GROUPS, ITEMS, BLOCK>(a, in, p.hidden, p.eps, scratch, parity);
    parity ^= 1;
    if (mean_out != nullptr && live && lane == 0) {
      mean_out[st_at(at)] = st.mean;
      rstd_out[st_at(at)] = st.rstd;
    }
    if (out != nullptr) {
      T* orow = out + out_at(at);
      if (weight != nullptr) {
        if (bias != nullptr) {
          store_normalized<true, true, TPR, HOLD>(orow, a, in, st, weight, bias, wh, bh, lane);
        } else {
          store_normalized<true, false, TPR, HOLD>(orow, a, in, st, weight, bias, wh, bh, lane);
        }
      } else if (bias != nullptr) {
        store_normalized<false, true, TPR, HOLD>(orow, a, in, st, weight, bias, wh, bh, lane);
      } else {
        store_normalized<false, false, TPR, HOLD>(orow, a, in, st, weight, bias, wh, bh, lane);
      }
    }
  }
}

// `out` null: the statistics alone (layer_norm_backward without the forward's); `mean` null: no statistics.
// The forward kernels state one resident block: with the block size alone, ptxas gave the 512-thread element
// path 39 registers on sm_90 and spilled 8 bytes around the division's slow-path call (48 registers, none
// spilled, with the count stated).
template <typename T, typename W, int VEC, int TPR, int GROUPS, int ITEMS, int BLOCK, bool HOLD>
__global__ void __launch_bounds__(BLOCK, 1)
    layer_norm_rows(T* out, float* mean, float* rstd, const T* x, const W* weight, const W* bias,
                    const __grid_constant__ LayerNormParams p) {
  layer_norm_rows_impl<T, W, VEC, TPR, GROUPS, ITEMS, BLOCK, false, HOLD>(out, nullptr, mean, rstd, x, weight, bias,
                                                                          p);
}

template <typename T, typename W, int VEC, int TPR, int GROUPS, int ITEMS, int BLOCK>
__global__ void __launch_bounds__(BLOCK, 1)
    fused_add_layer_norm_rows(T* out, T* residual, const T* x, const W* weight, const W* bias,
                              const __grid_constant__ LayerNormParams p) {
  layer_norm_rows_impl<T, W, VEC, TPR, GROUPS, ITEMS, BLOCK, true, false>(out, residual, nullptr, nullptr, x, weight,
                                                                          bias, p);
}

// The backward's two row sums, reduced together: one pass through the tree (and one barrier) for both.
struct SumPair {
  float g, gx;
};

__device__ __forceinline__ SumPair shuffle_xor(SumPair v, int m) {
  return SumPair{__shfl_xor_sync(0xffffffffu, v.g, m), __shfl_xor_sync(0xffffffffu, v.gx, m)};
}

struct PairSum {
  template <typename A> __device__ __forceinline__ static A identity() { return A{-0.f, -0.f}; }
  template <typename A> __device__ __forceinline__ static A apply(A a, A b) {
    return A{__fadd_rn(a.g, b.g), __fadd_rn(a.gx, b.gx)};
  }
};

// A group walks chunk c's rows in order, so that each column's partials add the rows in row order whatever
// the plan; every lane of a warp runs the same number of steps (rows past the end are dead, loading
// nothing), as the shuffles need. dw_part (null without a weight) and db_part: [chunks, hidden] floats.
// Elements are read with to_float, not through the pack's words as the forward reads them (`element`): the
// word reads took fewer instructions here too, but the kernel ran about 18% slower with them (the design note).
template <typename T, typename W, int VEC, int TPR, int GROUPS, int ITEMS, int BLOCK>
__global__ void CUKERN_BOUNDS(BLOCK)
    layer_norm_backward_rows(T* dx, float* dw_part, float* db_part, const T* dy, const T* x, const W* weight,
                             const float* mean, const float* rstd, const T* dresidual,
                             const __grid_constant__ LayerNormBackwardParams p) {
  static_assert(TPR <= 32 || TPR == BLOCK, "a row is handled by a sub-warp group or by the whole block");
  static_assert(ITEMS % GROUPS == 0, "every group of classes gets the same number of vectors");
  constexpr int kRowsPerBlock = BLOCK / TPR;
  __shared__ SumPair sums[2 * GROUPS * (BLOCK / 32)];
  const int lane = static_cast<int>(threadIdx.x) % TPR;
  const int slot = static_cast<int>(threadIdx.x) / TPR;
  const RowAddress dx_at{p.inner, p.dx_s0, p.dx_s1}, dy_at{p.inner, p.dy_s0, p.dy_s1};
  const RowAddress x_at{p.inner, p.x_s0, p.x_s1}, dr_at{p.inner, p.dr_s0, p.dr_s1}, st_at{p.inner, p.st_s0, p.st_s1};
  // The weight of this thread's columns is the same for every row it walks: the four-element tiles load it
  // once (zero past the row, or without a weight). The narrower ones (one-row chunks, views aligned for less,
  // the element path) load it from L1 where it is used: holding it spilled their 64- and 128-register tiles.
  constexpr bool kHoldWeight = VEC >= 4;
  Pack<W, VEC> held[kHoldWeight ? ITEMS : 1];
  if constexpr (kHoldWeight) {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int col = (lane + k * TPR) * VEC;
      load_or_zero(held[k], weight + col, weight != nullptr && col < p.hidden);
    }
  }
  auto weight_of = [&](int k) {
    if constexpr (kHoldWeight) {
      return held[k];
    } else {
      Pack<W, VEC> w;
      load_or_zero(w, weight + (lane + k * TPR) * VEC, weight != nullptr);
      return w;
    }
  };
  int parity = 0;
  for (int first = blockIdx.x * kRowsPerBlock; first < p.chunks; first += gridDim.x * kRowsPerBlock) {
    const int chunk = first + slot;
    float dw[ITEMS][VEC], db[ITEMS][VEC];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) dw[k][j] = db[k][j] = -0.f;
    }
    // Row r's x, dy and statistics. The half types' vector kernels load row r + 1 before reducing row r, so
    // that a row's loads are in flight across the tree (their rows take half float32's registers); the
    // others load each row in its turn (a second row would not fit their registers).
    constexpr bool kPrefetch = sizeof(T) < 4 && VEC >= 4;
    bool next_in[ITEMS];
    Pack<T, VEC> next_a[ITEMS], next_d[ITEMS];
    RowStats next_st;
    RowSplit next_at;
    auto fetch = [&](long long r, RowSplit& f_at, bool (&f_in)[ITEMS], Pack<T, VEC> (&f_a)[ITEMS],
                     Pack<T, VEC> (&f_d)[ITEMS], RowStats& f_st) {
      const long long row = static_cast<long long>(chunk) * p.chunk_rows + r;
      const bool live = chunk < p.chunks && row < p.rows && r < p.chunk_rows;
      f_at = split_row(live ? row : 0, p.inner);
      const T* xr = x + x_at(f_at);
      const T* dyr = dy + dy_at(f_at);
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        f_in[k] = live && (lane + k * TPR) * VEC < p.hidden;
        load_or_zero(f_a[k], xr + (lane + k * TPR) * VEC, f_in[k]);
        load_or_zero(f_d[k], dyr + (lane + k * TPR) * VEC, f_in[k]);
      }
      f_st = live ? RowStats{mean[st_at(f_at)], rstd[st_at(f_at)]} : RowStats{0.f, 0.f};
    };
    if constexpr (kPrefetch) fetch(0, next_at, next_in, next_a, next_d, next_st);
    for (long long r = 0; r < p.chunk_rows; ++r) {
      RowSplit at;
      bool in[ITEMS];
      Pack<T, VEC> a[ITEMS], d[ITEMS];
      RowStats st;
      if constexpr (kPrefetch) {
        at = next_at;
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
          in[k] = next_in[k];
          a[k] = next_a[k];
          d[k] = next_d[k];
        }
        st = next_st;
        fetch(r + 1, next_at, next_in, next_a, next_d, next_st);
      } else {
        fetch(r, at, in, a, d, st);
      }
      // The class sums of g and g * xhat, in index order from -0, then up the tree.
      SumPair part[GROUPS];
#pragma unroll
      for (int g = 0; g < GROUPS; ++g) {
        SumPair c[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) c[j] = SumPair{-0.f, -0.f};
#pragma unroll
        for (int k = g; k < ITEMS; k += GROUPS) {
          if (in[k]) {
            const Pack<W, VEC> w = weight_of(k);
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
              const float xhat = normalized(to_float(a[k].v[j]), st);
              const float gj = weighted_dy(to_float(d[k].v[j]), to_float(w.v[j]), weight != nullptr);
              c[j].g = __fadd_rn(c[j].g, gj);
              c[j].gx = __fadd_rn(c[j].gx, __fmul_rn(gj, xhat));
            }
          }
        }
        part[g] = tree_reduce<PairSum>(c);
      }
      const SumPair total = row_tree<TPR, BLOCK, PairSum>(part, sums, parity);
      parity ^= 1;
      // Means as products with 1 / hidden: a division's slow-path call made the 512-thread element path spill
      // on sm_80, and the reciprocal is the same float for every row.
      const float mg = __fmul_rn(total.g, p.inv_hidden);
      const float mgx = __fmul_rn(total.gx, p.inv_hidden);
      T* dxr = dx + dx_at(at);
      const T* drr = dresidual != nullptr ? dresidual + dr_at(at) : nullptr;
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        if (in[k]) {
          const int col = (lane + k * TPR) * VEC;
          const Pack<W, VEC> w = weight_of(k);
          Pack<T, VEC> res;
          if (drr != nullptr) load(res, drr + col);
          float f[VEC];
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            const float dyj = to_float(d[k].v[j]);
            const float xhat = normalized(to_float(a[k].v[j]), st);
            const float gj = weighted_dy(dyj, to_float(w.v[j]), weight != nullptr);
            const float v = __fmul_rn(st.rstd, __fsub_rn(__fsub_rn(gj, mg), __fmul_rn(xhat, mgx)));
            f[j] = drr != nullptr ? __fadd_rn(v, to_float(res.v[j])) : v;
            dw[k][j] = __fadd_rn(dw[k][j], __fmul_rn(dyj, xhat));
            db[k][j] = __fadd_rn(db[k][j], dyj);
          }
          Pack<T, VEC> y;
          round_into(y, f);
          store(dxr + col, y);
        }
      }
    }
    if (chunk < p.chunks) {
      const long long base = static_cast<long long>(chunk) * p.hidden;
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        const int col = (lane + k * TPR) * VEC;
        if (col < p.hidden) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            if (dw_part != nullptr) dw_part[base + col + j] = dw[k][j];
            db_part[base + col + j] = db[k][j];
          }
        }
      }
    }
  }
}

// Sums of a [chunks, hidden] float partials array over its chunks, as one perfect binary tree of `leaves`
// (a power of two, at least 8 * LANES) with neighbours paired first, chunks past the count being -0. Block:
// 32 columns by LANES lanes; lane y takes the aligned subtree of leaves [y * leaves / LANES, ...) eight
// loads at a time (the eight a tree of their own), merging those subtrees in a stack like a binary counter
// (common/reduce.cuh tree_push); the LANES subtrees then meet in shared memory, in order.
// Lanes: 32, so that a lane's subtree is one or two loads of eight (512 chunks at most, 16 leaves a lane):
// the kernel waits on memory once or twice a gradient, not eight times as with 8 lanes. The tree is the same
// perfect tree whatever the lanes: only its padding with -0 grows, which adds exactly.
constexpr int kParamLanes = 32;
constexpr int kParamLevels = 3;  // a stack a thread for up to 7 pushes of 8 (2 at most); odd: no bank conflicts

struct ParamGradsParams {
  long long hidden;  // a partial row's length, which scales a chunk's 64-bit offset
  int chunks, leaves;
};

template <int LANES>
__device__ __forceinline__ float chunk_tree(const float* part, int col, float* stack, const ParamGradsParams& p) {
  const int span = p.leaves / LANES;
  const int start = static_cast<int>(threadIdx.y) * span;
  for (int b = 0; b < span / 8; ++b) {
    float v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int c = start + b * 8 + i;
      v[i] = c < p.chunks && col < p.hidden ? part[c * p.hidden + col] : -0.f;
    }
    tree_push<Sum, float, unsigned>(stack, tree_reduce<Sum>(v), static_cast<unsigned>(b));
  }
  return tree_result<Sum, float, unsigned>(stack, static_cast<unsigned>(span / 8));
}

template <typename W>
__global__ void CUKERN_BOUNDS(32 * kParamLanes)
    layer_norm_param_grads(W* dweight, W* dbias, const float* dw_part, const float* db_part,
                           const __grid_constant__ ParamGradsParams p) {
  // An odd stride between threads' stacks: the 32 lanes of a warp hit 32 different banks.
  __shared__ float stack[32 * kParamLanes * kParamLevels];
  __shared__ float lanes[kParamLanes][32];
  const int col = static_cast<int>(blockIdx.x) * 32 + static_cast<int>(threadIdx.x);
  float* own = stack + (threadIdx.y * 32 + threadIdx.x) * kParamLevels;
  for (int which = 0; which < 2; ++which) {
    const float* part = which == 0 ? db_part : dw_part;
    W* result = which == 0 ? dbias : dweight;
    if (part == nullptr) continue;
    lanes[threadIdx.y][threadIdx.x] = chunk_tree<kParamLanes>(part, col, own, p);
    __syncthreads();
    if (threadIdx.y == 0 && col < p.hidden) {
      float v[kParamLanes];
#pragma unroll
      for (int y = 0; y < kParamLanes; ++y) v[y] = lanes[y][threadIdx.x];
      result[col] = from_float<W>(tree_reduce<Sum>(v));
    }
    __syncthreads();
  }
}

}  // namespace cukern
