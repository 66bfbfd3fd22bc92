// RMSNorm backward: the gradients of rms_norm.cu's plain, Gemma-offset and fused-residual forms.
//
//   r = rstd (given, or 1 / sqrt(mean(x^2) + eps) recomputed in rms_norm.cu's own tree), w' = offset + weight
//   g = dy * w',  xhat = x * r,  m = (sum(g * x) * r) / hidden          (m = mean(g * xhat))
//   dx = r * (g - xhat * m)  (+ dresidual)                              (rounded once to x's dtype)
//   dweight = sum over rows of dy * xhat                                (rounded once to weight's dtype)
// For the fused form x is the residual the forward normalized and dresidual the gradient arriving at the
// residual output; dx is then the gradient of both x and the residual input.
//
// The six questions (cukern/lab/rmsnorm_backward.py keeps the same answers as data, for `explain` and the
// bench):
// 1. Output tile: rows are cut into chunks of R consecutive rows, R = cukern/rmsnorm_backward.py
//    `chunk_rows(rows, hidden)`, a function of the row count and hidden alone. One group of TPR threads owns
//    one chunk and walks its rows in order; TPR and the thread's share of a row are rms_norm.cu's rows-kernel
//    layout (TPR <= 32 packs G = BLOCK / TPR chunks into a block; TPR = BLOCK, one chunk a block). The grid
//    covers the chunks once. column_tree (common/partials.cuh) then owns 32 columns of dweight a block.
// 2. Input traffic: dy and x (and dresidual, rstd) read once, dx written once, with 16-byte accesses when
//    pointers and strides allow, a warp's accesses contiguous; weight re-read by every row from L1/L2. dweight
//    costs one float32 partial row a block, written once and read once by column_tree (4 / (R * G) bytes an
//    element of dy: small beside dy, x and dx).
// 3. Accumulation: a row's two sums, sum(x^2) (only when rstd is recomputed) and sum(g * x), in float32, each
//    in rms_norm.cu's tree fixed by hidden (cukern/rmsnorm.py `tree_classes`): per-class sums in index order in
//    a thread, a tree over its classes, over the group's lanes, over the block's warps; sum(x^2) is the
//    forward's exact code, so a recomputed r has the forward's bits. dweight: a thread keeps one float32 per
//    column it owns and adds dy * xhat row by row in the chunk's order (from -0); the chunks' rows are then
//    added in the perfect binary tree, neighbours first, over the chunk count padded with -0 (IEEE addition's
//    identity, so padding changes nothing): the block's G chunks in shared memory, the blocks' rows in
//    column_tree, both parts of that one tree whatever G is. R and so the chunks come from the row count and
//    hidden alone (cukern/rmsnorm_backward.py `chunk_rows`). Nothing depends on the grid, the block, the
//    alignment, the SM count or the GPU, and no atomics: dx's row bits depend on that row's values (and
//    hidden, dtypes, eps, offset), dweight's on the values, hidden and the row count.
//    cukern/reference `rms_norm_backward_emulated` repeats every rounding.
// 4. Staging: dy, x and weight of the row in registers as loaded (ITEMS packs each, at most 64 bytes of x a
//    thread: rmsnorm.MAX_BYTES), and the thread's dweight columns in float32 across the chunk; shared memory
//    for the block's two sums (4 * GROUPS * BLOCK / 32 floats), the G partial rows of a block of several
//    chunks (BLOCK * ITEMS * VEC floats, at most 16 KiB) and column_tree's levels.
// 5. Tuning: none of its own. The row layout is rms_norm's plan at its default knobs (C from hidden, VEC from
//    alignment); R from the row count and hidden. None of them changes a bit of dx; R is part of dweight's
//    definition, G is not.
// 6. Profile: about 10 flops an element against 3 * sizeof(T) bytes: memory-bound; the target is the copy
//    bandwidth for dy, x, dx, weight and the partials.
#include "common/bounds.cuh"
#include "common/dtype.cuh"
#include "common/partials.cuh"
#include "common/reduce.cuh"
#include "common/rms.cuh"
#include "common/rows.cuh"
#include "common/vec.cuh"

namespace cukern {

// Every scalar of a launch (cukern/rmsnorm_backward.py `PARAMS`): strides in elements (rs_* in floats); dr_*
// unused without dresidual, rs_* without rstd.
struct RmsNormBackwardParams {
  long long rows, inner, chunk_rows, chunks;
  long long dx_s0, dx_s1, dy_s0, dy_s1, x_s0, x_s1, dr_s0, dr_s1, rs_s0, rs_s1;
  int hidden;
  float eps, offset;
};

// The row's sums ss = sum(x^2) (with_ss) and dot = sum(g * x) from each thread's GROUPS class-group values, in
// the tree rms_norm.cu's rows kernel takes: the group's lanes by butterfly (TPR <= 32), or each warp's subtrees
// through shared memory, both sums' slots filled before one barrier (TPR = BLOCK). scratch: 2 * 2 * GROUPS *
// BLOCK / 32 floats, `parity` alternating between calls as block_tree_reduce's.
template <int TPR, int BLOCK, int GROUPS>
__device__ __forceinline__ void row_sums(float (&ss)[GROUPS], float (&dot)[GROUPS], bool with_ss, float* scratch,
                                         int parity, float& ss_out, float& dot_out) {
  if constexpr (TPR <= 32) {
#pragma unroll
    for (int g = 0; g < GROUPS; ++g) {
      if (with_ss) ss[g] = group_tree_reduce<TPR, Sum>(ss[g]);
      dot[g] = group_tree_reduce<TPR, Sum>(dot[g]);
    }
    ss_out = tree_reduce<Sum>(ss);
    dot_out = tree_reduce<Sum>(dot);
  } else {
    constexpr int kSlots = GROUPS * (BLOCK / 32);
    float* slot = scratch + parity * 2 * kSlots;
    if (with_ss) store_warp_subtrees<BLOCK, Sum>(ss, slot);
    store_warp_subtrees<BLOCK, Sum>(dot, slot + kSlots);
    __syncthreads();
    float all[kSlots];
    if (with_ss) {
      load_warp_subtrees(slot, all);
      ss_out = tree_reduce<Sum>(all);
    }
    load_warp_subtrees(slot + kSlots, all);
    dot_out = tree_reduce<Sum>(all);
  }
}

// dx of every row, and with a weight each block's partial row of dweight at partials + blockIdx.x * hidden.
// rstd, dresidual and weight may be null (recompute, none, a weight of 1 and no dweight); the choice is
// uniform over the launch, one branch a row.
// Before sm_90 ptxas, left to choose, aimed some element-access kernels at 48 registers and spilled; stating
// 384 resident threads there allows about 170, which the 16-byte kernels need (on sm_90, 158 to 167 with
// float32 weights). sm_90 states nothing more than the block, sm_100 on one block (common/bounds.cuh).
__host__ __device__ constexpr int backward_min_blocks(int block) { return block >= 384 ? 1 : 384 / block; }

template <typename T, typename W, int VEC, int TPR, int GROUPS, int ITEMS, int BLOCK>
__global__ void __launch_bounds__(BLOCK, before_sm90_min_blocks(backward_min_blocks(BLOCK)))
    rms_norm_backward_rows(T* dx, float* partials, const T* dy, const T* x, const W* weight, const float* rstd,
                           const T* dresidual, const __grid_constant__ RmsNormBackwardParams p) {
  static_assert(TPR <= 32 || TPR == BLOCK, "a chunk is handled by a sub-warp group or by the whole block");
  static_assert(ITEMS % GROUPS == 0, "every group of classes gets the same number of vectors");
  constexpr int kChunksPerBlock = BLOCK / TPR;
  __shared__ float scratch[TPR == BLOCK ? 4 * GROUPS * (BLOCK / 32) : 1];
  const int lane = static_cast<int>(threadIdx.x) % TPR;
  const long long chunk = static_cast<long long>(blockIdx.x) * kChunksPerBlock + static_cast<int>(threadIdx.x) / TPR;
  const bool chunk_live = chunk < p.chunks;
  const RowAddress dx_at{p.inner, p.dx_s0, p.dx_s1}, dy_at{p.inner, p.dy_s0, p.dy_s1}, x_at{p.inner, p.x_s0, p.x_s1};
  const RowAddress dr_at{p.inner, p.dr_s0, p.dr_s1}, rs_at{p.inner, p.rs_s0, p.rs_s1};
  const int hidden = p.hidden;
  const float unweighted = __fadd_rn(p.offset, 1.f);
  const bool has_weight = weight != nullptr;
  const bool has_rstd = rstd != nullptr;

  // dweight's columns of this thread, summed over the chunk's rows in order from -0, the identity that
  // keeps a first -0 term (so the sum is exactly the terms' sum, as the emulator adds them).
  float dw[ITEMS][VEC];
#pragma unroll
  for (int k = 0; k < ITEMS; ++k) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) dw[k][j] = -0.f;
  }
  int parity = 0;
  for (long long i = 0; i < p.chunk_rows; ++i) {
    const long long row = chunk * p.chunk_rows + i;
    const bool live = chunk_live && row < p.rows;
    const RowSplit at = split_row(live ? row : 0, p.inner);
    const T* xr = x + x_at(at);
    const T* dyr = dy + dy_at(at);

    // Every load of the row issued before any use (rms_norm.cu's rows kernel: ITEMS loads in flight an
    // array); x is zero past the row, as the forward holds it, so its squares are the forward's. The weight
    // is loaded again for dx (from L1) rather than held across the row's sums: the registers it would hold
    // spilled 512-thread blocks.
    bool in[ITEMS];
    Pack<T, VEC> a[ITEMS], d[ITEMS];
    Pack<W, VEC> w[ITEMS];
    load_row<TPR>(a, in, xr, lane, live, hidden);
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      if (in[k]) {
        load(d[k], dyr + (lane + k * TPR) * VEC);
        if (has_weight) load(w[k], weight + (lane + k * TPR) * VEC);
      }
    }
    // A given rstd is loaded with the row, so that its latency passes with the row's; loaded after the sums
    // (where it is used), it made a chunk's first row wait on memory twice (the later rows find its line in L1).
    const float given = has_rstd && live ? rstd[rs_at(at)] : 0.f;
    float sq[GROUPS][VEC], dot[GROUPS][VEC];
#pragma unroll
    for (int g = 0; g < GROUPS; ++g) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) dot[g][j] = -0.f;
    }
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float f = element(a[k], j);
        sq[k % GROUPS][j] = k < GROUPS ? __fmul_rn(f, f) : square_add(sq[k % GROUPS][j], f);
        if (in[k]) {
          const float g = __fmul_rn(element(d[k], j), has_weight ? __fadd_rn(p.offset, element(w[k], j)) : unweighted);
          dot[k % GROUPS][j] = __fadd_rn(dot[k % GROUPS][j], __fmul_rn(g, f));
        }
      }
    }
    float sp[GROUPS], dp[GROUPS];
#pragma unroll
    for (int g = 0; g < GROUPS; ++g) {
      sp[g] = tree_reduce<Sum>(sq[g]);
      dp[g] = tree_reduce<Sum>(dot[g]);
    }
    float ss = 0.f, s = 0.f;
    row_sums<TPR, BLOCK>(sp, dp, !has_rstd, scratch, parity, ss, s);
    parity ^= 1;
    if (!live) continue;
    const float r = has_rstd ? given : inverse_rms(ss, hidden, p.eps);
    const float m = __fdiv_rn(__fmul_rn(s, r), static_cast<float>(hidden));

    T* dxr = dx + dx_at(at);
    const T* drr = dresidual + dr_at(at);
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      if (in[k]) {
        const int col = (lane + k * TPR) * VEC;
        Pack<T, VEC> res;
        if (dresidual != nullptr) load(res, drr + col);
        if (has_weight) load(w[k], weight + col);
        float o[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float dyv = element(d[k], j);
          const float g = __fmul_rn(dyv, has_weight ? __fadd_rn(p.offset, element(w[k], j)) : unweighted);
          const float xhat = __fmul_rn(element(a[k], j), r);
          o[j] = __fmul_rn(r, __fsub_rn(g, __fmul_rn(xhat, m)));
          if (dresidual != nullptr) o[j] = __fadd_rn(o[j], element(res, j));
          dw[k][j] = __fadd_rn(dw[k][j], __fmul_rn(dyv, xhat));
        }
        Pack<T, VEC> y;
        round_into(y, o);
        store(dxr + col, y);
      }
    }
  }
  if (!has_weight) return;
  // One partial row a block: its chunks' rows added pairwise, neighbours first, in shared memory (an aligned
  // subtree of column_tree's tree; a chunk past the last is all -0, the identity). kSpan columns cover a row.
  float* prow = partials + static_cast<long long>(blockIdx.x) * hidden;
  if constexpr (kChunksPerBlock == 1) {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int col = (lane + k * TPR) * VEC;
      if (col < hidden) {
        Pack<float, VEC> q;
#pragma unroll
        for (int j = 0; j < VEC; ++j) q.v[j] = dw[k][j];
        store(prow + col, q);
      }
    }
  } else {
    constexpr int kSpan = TPR * ITEMS * VEC;
    __shared__ float rows[kChunksPerBlock * kSpan];
    const int g = static_cast<int>(threadIdx.x) / TPR;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) rows[g * kSpan + (lane + k * TPR) * VEC + j] = dw[k][j];
    }
#pragma unroll
    for (int w = 1; w < kChunksPerBlock; w *= 2) {
      __syncthreads();
      if (g % (2 * w) == 0) {
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            const int c = (lane + k * TPR) * VEC + j;
            rows[g * kSpan + c] = rows[g * kSpan + c] + rows[(g + w) * kSpan + c];
          }
        }
      }
    }
    __syncthreads();
    for (int c = static_cast<int>(threadIdx.x); c < hidden; c += BLOCK) prow[c] = rows[c];
  }
}

}  // namespace cukern
