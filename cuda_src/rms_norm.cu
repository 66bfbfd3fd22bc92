// RMSNorm and fused residual-add + RMSNorm.
//
//   out = x / sqrt(mean(x^2) + eps) * (offset + weight)           (offset = 1 is the Gemma form)
//   fused: residual = round(residual + x); out = rmsnorm(residual)
//   float8 (e4m3fn) outputs: q = e4m3(y * (1 / s)), y = (x * (offset + weight)) * inv (inv = 1 / rms, the
//   product in the other order), s a static scale or, per token, max(amax / 448, 2^-126), amax =
//   max |x * (offset + weight)| * inv (the row's largest |y| where inv is finite), stored beside q
//   rstd (return_rstd, the plain and fused forms): each row's inv = 1 / rms also stored as float32, for
//   rms_norm_backward.cu; a template flag (RSTD), so calls without it run unchanged code
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
// 3. Accumulation: sum of squares in float32 as one fixed tree that depends on the hidden size alone
//    (below): per-class sums in index order in each thread, a tree over a thread's classes, a butterfly
//    over the row's lanes (and the warps' values through shared memory when TPR > 32). Every plan, knob
//    and vector width adds the same numbers in the same order, so a row's bits depend only on its values,
//    hidden, the dtypes, eps and offset: not on the batch, the launch or the GPU.
// 4. Staging: rms_norm_rows keeps its row in registers, as loaded (ITEMS packs a thread, at most 64 bytes:
//    rmsnorm.MAX_BYTES), between the reduction and the scaling, so each byte crosses DRAM once; shared
//    memory only for the block sum (2 * GROUPS * BLOCK / 32 floats). rms_norm_wide, for rows longer than the
//    registers of a block can hold, reads the row twice (the second read mostly from L2).
// 5. Tuning: the classes C come from the hidden size, VEC from alignment; GROUPS (how many groups of VEC
//    classes a thread owns, hence TPR = C / (GROUPS * VEC)) and the grid from the knobs. cukern/rmsnorm.py
//    `plan` picks them; none of them changes the tree.
// 6. Profile: about 3 flops an element against 2 * sizeof(T) bytes: far under the ridge point, so
//    memory-bound; the target is the device-to-device copy bandwidth.
// The float8 kernels (rms_norm_fp8_*, fused_add_rms_norm_fp8_*) answer the same, but: out is one byte an
// element (VEC-byte stores) plus one float per row for per-token scales; t = x * (offset + weight) is formed
// as the row is read, with the squares, and its max |t| (a max: no order to fix) is reduced beside the sum
// of squares, one barrier for both (fl(max |t| * inv) is max |y|: inv > 0 and rounding is monotone); the
// rows kernel then holds t, not the packed row, to the bytes (the wide kernel forms it again in its second
// pass); the conversion to e4m3 gives the same byte on every GPU (e4m3x2).
#include "common/dtype.cuh"
#include "common/vec.cuh"
#include "common/reduce.cuh"
#include "common/rms.cuh"
#include "common/rows.cuh"

namespace cukern {

// Every scalar of a launch, passed by value as one struct (cukern/rmsnorm.py `PARAMS` packs it once per plan:
// one kernel argument where separate scalars would cost the host a conversion each). Strides are in
// elements; res_* are unused without the residual, rs_* (in floats) without rstd. Kernels take it
// `const __grid_constant__` so its fields are read from the constant bank where they are used, like separate
// parameters (see rotary.cu).
struct RmsNormParams {
  long long rows, inner;
  long long out_s0, out_s1, res_s0, res_s1, x_s0, x_s1;
  int hidden;
  float eps, offset;
  long long rs_s0, rs_s1;
};

// The float8 kernels' scalars (cukern/rmsnorm.py `FP8_PARAMS`): RmsNormParams' fields (rs_* unused: no rstd
// is kept), then the per-token scales' row strides (in floats) and the static scale.
struct RmsNormFp8Params {
  long long rows, inner;
  long long out_s0, out_s1, res_s0, res_s1, x_s0, x_s1;
  int hidden;
  float eps, offset;
  long long rs_s0, rs_s1;
  long long sc_s0, sc_s1;
  float scale;
};

// What a row's values become: rounded to T (kNone), or to e4m3 after division by a scale (kFp8).
enum Quant { kNone = 0, kFp8 = 1 };

// The scale of a kFp8 launch: per token when `scales` is given (one float a row is written there, at
// `at`), else the static `scale`. A run-time choice (uniform over the launch, one branch a row) where a
// template flag would double the instantiations.
struct Fp8Out {
  float* scales;
  RowAddress at;
  float scale;
};

// The amax takes common/reduce.cuh's max_nan: a row holding a NaN gets a NaN amax, hence a NaN scale and
// NaN outputs, rather than the NaN being skipped as fmaxf would.

// The per-token amax combine for common/reduce.cuh: values are |t| >= +0, so +0 is the identity and max is
// exact and commutative, NaN or not: any tree over the row gives the same amax.
struct MaxNaN {
  template <typename T> __device__ __forceinline__ static T identity() { return T(0); }
  template <typename T> __device__ __forceinline__ static T apply(T a, T b) { return max_nan(a, b); }
};

// The scale of a row whose amax (largest |y|) is given: amax / 448 correctly rounded, at least 2^-126 (the least
// normal float, whose reciprocal 2^126 is finite), so an all-zero row gets 2^-126 and zeros; NaN stays NaN.
__device__ __forceinline__ float per_token_scale(float amax) { return max_nan(__fdiv_rn(amax, 448.f), 0x1p-126f); }

// float -> float8 e4m3fn bits: round to nearest even, saturate to +-448 (infinities too), every NaN -> 0x7f.
// sm_89 and newer convert two floats in one instruction (cvt.rn.satfinite.e4m3x2.f32, which has exactly
// these rules); older GPUs (sm_80 has no float8 conversion) use integer and float32 arithmetic that gives
// the same byte for every float, which cukern/reference.py `float8_e4m3fn_bits` repeats on the host.
// Compiling with -DCUKERN_FP8_SOFTWARE selects the arithmetic on any GPU, so tests/test_rmsnorm_fp8.py can
// compare the two on one device. The arithmetic: |v| is clamped to 448 with NaN kept; from 2^-6 up, the
// float's bits are rounded to 3 mantissa bits (adding 0x7ffff plus the kept lowest bit rounds half to
// even, a carry moving into the exponent) and the exponent rebased from 127 to 7; below, adding 2^14
// rounds to the subnormal step 2^-9 in float arithmetic and the float's low bits are the code (0..8, 8
// being 2^-6). A NaN's bits give a code over 0x7f, which the min makes 0x7f, left unsigned.
__device__ __forceinline__ unsigned e4m3_arithmetic(float v) {
  const float a = min_nan(fabsf(v), 448.f);
  const unsigned b = __float_as_uint(a);
  const unsigned normal = (b - (120u << 23) + 0x7ffffu + ((b >> 20) & 1u)) >> 20;
  const unsigned subnormal = __float_as_uint(__fadd_rn(a, 16384.f)) - __float_as_uint(16384.f);
  const unsigned code = a < 0x1p-6f ? subnormal : min(normal, 0x7fu);
  return code == 0x7fu ? code : code | ((__float_as_uint(v) >> 24) & 0x80u);
}

// Two floats as two e4m3fn bytes, lo in the low byte.
__device__ __forceinline__ unsigned e4m3x2(float lo, float hi) {
#if __CUDA_ARCH__ >= 890 && !defined(CUKERN_FP8_SOFTWARE)
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return e4m3_arithmetic(lo) | (e4m3_arithmetic(hi) << 8);
#endif
}

// The sum of squares is one fixed tree that depends on the row length only, so a row's bits never depend
// on the batch, the grid, the block, the knobs, the alignment, the SM count or the GPU. With C =
// cukern/rmsnorm.py `tree_classes(hidden)`, element i belongs to class i % C; partial[c] sums its class's
// squares in increasing index order, and the C partials are combined by common/reduce.cuh's tree.
//
// Both kernels lay a row out the same way: thread t of a row's TPR holds vector columns t + k * TPR (k <
// ITEMS), VEC elements each, so it owns the classes (g * TPR + t) * VEC + j for GROUPS groups g = k %
// GROUPS and lanes j < VEC, with GROUPS * TPR * VEC = C. It keeps one accumulator per class it owns, so
// each class is summed in index order; its VEC lanes are the low bits of the class, its lane in the row
// the next and its group the top ones, which is the order tree_reduce, group_tree_reduce and
// block_tree_reduce combine them in. Every plan of the same hidden thus adds the same numbers in the same
// order: a 16-byte path (VEC = 8) and an element path (VEC = 1, more groups) give the same bits.
//
// Every multiply and add is written with its rounding (__fmul_rn, __fadd_rn): left to itself the compiler
// contracts x * x + s into a fused multiply-add on some paths and not on others. The intrinsics say so at
// the line that needs it, where compiling with -fmad=false would say it for the whole module, out of
// sight in the build options (it would cost nothing else: integer address math has no such contraction).
// The finish is correctly rounded, step by step, instead of the approximate rsqrtf; cukern/reference.py
// `rms_norm_emulated` repeats these roundings on the host, and tests/test_rmsnorm.py checks the PTX for
// fma.rn.f32 and .approx.

// (x * inv) * scale, scale = offset + weight: the one scaling of both kernels, rounded once more to T.
__device__ __forceinline__ float scaled(float x, float inv, float scale) { return __fmul_rn(__fmul_rn(x, inv), scale); }

// The float8 bytes of one vector: y = t * inv, then q = e4m3(y * rcp), rcp = 1 / s (division by the scale
// as a product with its correctly rounded reciprocal: one division a row, not one an element), each
// product rounded to float32. (One product t * (inv * rcp) would save one an element, but inv * rcp
// overflows where the scale is tiny: an all-zero row's 2^-126.)
template <int VEC>
__device__ __forceinline__ void store_e4m3(unsigned char* dst, const float (&t)[VEC], float inv, float rcp) {
  Pack<unsigned char, VEC> q;
  if constexpr (VEC == 1) {
    q.v[0] = static_cast<unsigned char>(e4m3x2(__fmul_rn(__fmul_rn(t[0], inv), rcp), 0.f));
  } else {
#pragma unroll
    for (int j = 0; j < VEC; j += 2) {
      const unsigned pair = e4m3x2(__fmul_rn(__fmul_rn(t[j], inv), rcp), __fmul_rn(__fmul_rn(t[j + 1], inv), rcp));
      if (j % 4 == 0) {
        q.u[j / 4] = pair;
      } else {
        q.u[j / 4] |= pair << 16;
      }
    }
  }
  store(dst, q);
}

// t = x * (offset + weight) of one vector (float8 forms), weight null meaning 1.
template <typename T, typename W, int VEC>
__device__ __forceinline__ void weighted(float (&t)[VEC], const Pack<T, VEC>& a, const Pack<W, VEC>& w, bool has_weight,
                                         float offset, float unweighted) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    t[j] = __fmul_rn(to_float(a.v[j]), has_weight ? __fadd_rn(offset, to_float(w.v[j])) : unweighted);
  }
}

// The per-token scale needs max |y| of the row before its first byte; with y = t * inv (inv > 0, rounding
// monotone) that is fl(max |t| * inv), so the row's max |t| is found in the same pass as its sum of squares
// and reduced beside it: one barrier for both. The sums take block_tree_reduce's two steps (the same tree,
// slots and order); each warp's max |t| goes to slot N * BLOCK / 32 + warp before the barrier. scratch:
// 2 * (N + 1) * BLOCK / 32 floats.
template <int BLOCK, int N>
__device__ __forceinline__ float block_sum_and_max(const float (&part)[N], float& tmax, float* scratch, int parity) {
  constexpr int kWarps = BLOCK / 32;
  float* slot = scratch + parity * (N + 1) * kWarps;
  store_warp_subtrees<BLOCK, Sum>(part, slot);
  const float m = group_tree_reduce<32, MaxNaN>(tmax);
  if ((threadIdx.x & 31) == 0) slot[N * kWarps + (static_cast<int>(threadIdx.x) >> 5)] = m;
  __syncthreads();
  float all[N * kWarps];
  load_warp_subtrees(slot, all);
  float top = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) top = max_nan(top, slot[N * kWarps + w]);
  tmax = top;
  return tree_reduce<Sum>(all);
}

// RSTD: each row's inv is also stored, as float32, at rstd + rs_at(row), for rms_norm_backward.cu to reuse; a
// template flag, so the calls that do not ask for it run the code they ran before it existed.
template <typename T, typename W, int VEC, int TPR, int GROUPS, int ITEMS, int BLOCK, bool FUSED,
          int QUANT = kNone, typename O = T, bool RSTD = false>
__device__ __forceinline__ void rms_norm_rows_impl(O* out, T* residual, const T* x, const W* weight,
                                                   long long rows, RowAddress out_at, RowAddress res_at,
                                                   RowAddress x_at, int hidden, float eps, float offset,
                                                   Fp8Out fp8 = {}, float* rstd = nullptr, RowAddress rs_at = {}) {
  static_assert(TPR <= 32 || TPR == BLOCK, "a row is handled by a sub-warp group or by the whole block");
  static_assert(ITEMS % GROUPS == 0, "every group of classes gets the same number of vectors");
  constexpr int kRowsPerBlock = BLOCK / TPR;
  constexpr bool kFp8 = QUANT != kNone;
  __shared__ float scratch[2 * (kFp8 ? GROUPS + 1 : GROUPS) * (BLOCK / 32)];
  const int lane = static_cast<int>(threadIdx.x) % TPR;
  const int slot = static_cast<int>(threadIdx.x) / TPR;
  const float unweighted = __fadd_rn(offset, 1.f);
  const bool per_token = kFp8 && fp8.scales != nullptr;
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
    // zero: their squares add +0, which leaves a class's sum as it is.
    bool in[ITEMS];
    Pack<T, VEC> a[ITEMS];
    load_row<TPR>(a, in, xr, lane, live, hidden);
    // The float8 forms take the weight with the row (from L1: every row reads the same one), zero past it.
    Pack<W, VEC> wq[kFp8 ? ITEMS : 1];
    if constexpr (kFp8) {
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        if (in[k] && weight != nullptr) {
          load(wq[k], weight + (lane + k * TPR) * VEC);
        } else {
#pragma unroll
          for (int i = 0; i < Pack<W, VEC>::kWords; ++i) wq[k].w[i] = {};
        }
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
          a[k] = residual_sum(a[k], r[k]);
          store(rr + (lane + k * TPR) * VEC, a[k]);
        }
      }
    }
    // float8: every t of the thread, held from here to the bytes in place of the packed row, and (per token
    // only) its max |t|. Past the row t = 0 * (offset + 0), which leaves the max as it is.
    float acc[GROUPS][VEC];
    float t[kFp8 ? ITEMS : 1][VEC];
    float tmax = 0.f;
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float f = to_float(a[k].v[j]);
        acc[k % GROUPS][j] = k < GROUPS ? __fmul_rn(f, f) : square_add(acc[k % GROUPS][j], f);
      }
      if constexpr (kFp8) weighted(t[k], a[k], wq[k], weight != nullptr, offset, unweighted);
    }
    if constexpr (kFp8) {
      if (per_token) {
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) tmax = max_nan(tmax, fabsf(t[k][j]));
        }
      }
    }
    float part[GROUPS];
#pragma unroll
    for (int g = 0; g < GROUPS; ++g) part[g] = tree_reduce<Sum>(acc[g]);
    float ss;
    if constexpr (TPR <= 32) {
#pragma unroll
      for (int g = 0; g < GROUPS; ++g) part[g] = group_tree_reduce<TPR, Sum>(part[g]);
      ss = tree_reduce<Sum>(part);
      if (per_token) tmax = group_tree_reduce<TPR, MaxNaN>(tmax);
    } else if constexpr (kFp8) {
      ss = block_sum_and_max<BLOCK>(part, tmax, scratch, parity);
      parity ^= 1;
    } else {
      ss = block_tree_reduce<BLOCK, Sum>(part, scratch, parity);
      parity ^= 1;
    }
    const float inv = inverse_rms(ss, hidden, eps);
    if constexpr (RSTD) {
      if (live && lane == 0) rstd[rs_at(at)] = inv;
    }

    O* orow = out + out_at(at);
    if constexpr (kFp8) {
      // s: static, or per token from the row's largest |y| = fl(max |t| * inv); then the bytes.
      float s = fp8.scale;
      if (per_token) {
        s = per_token_scale(__fmul_rn(tmax, inv));
        if (live && lane == 0) fp8.scales[fp8.at(at)] = s;
      }
      const float rcp = __frcp_rn(s);
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        if (in[k]) store_e4m3(orow + (lane + k * TPR) * VEC, t[k], inv, rcp);
      }
    } else if (weight != nullptr) {
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
          for (int j = 0; j < VEC; ++j) f[j] = scaled(to_float(a[k].v[j]), inv, __fadd_rn(offset, to_float(w[k].v[j])));
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
          for (int j = 0; j < VEC; ++j) f[j] = scaled(to_float(a[k].v[j]), inv, unweighted);
          Pack<T, VEC> y;
          round_into(y, f);
          store(orow + (lane + k * TPR) * VEC, y);
        }
      }
    }
  }
}

// The plain and fused kernels take rstd (null unless RSTD) before their scalars.
template <typename T, typename W, int VEC, int TPR, int GROUPS, int ITEMS, int BLOCK, bool RSTD = false>
__global__ void __launch_bounds__(BLOCK)
    rms_norm_rows(T* out, const T* x, const W* weight, float* rstd, const __grid_constant__ RmsNormParams p) {
  const RowAddress out_at{p.inner, p.out_s0, p.out_s1};
  rms_norm_rows_impl<T, W, VEC, TPR, GROUPS, ITEMS, BLOCK, false, kNone, T, RSTD>(
      out, nullptr, x, weight, p.rows, out_at, out_at, RowAddress{p.inner, p.x_s0, p.x_s1}, p.hidden, p.eps,
      p.offset, {}, rstd, RowAddress{p.inner, p.rs_s0, p.rs_s1});
}

template <typename T, typename W, int VEC, int TPR, int GROUPS, int ITEMS, int BLOCK, bool RSTD = false>
__global__ void __launch_bounds__(BLOCK)
    fused_add_rms_norm_rows(T* out, T* residual, const T* x, const W* weight, float* rstd,
                            const __grid_constant__ RmsNormParams p) {
  rms_norm_rows_impl<T, W, VEC, TPR, GROUPS, ITEMS, BLOCK, true, kNone, T, RSTD>(
      out, residual, x, weight, p.rows, RowAddress{p.inner, p.out_s0, p.out_s1},
      RowAddress{p.inner, p.res_s0, p.res_s1}, RowAddress{p.inner, p.x_s0, p.x_s1}, p.hidden, p.eps, p.offset, {},
      rstd, RowAddress{p.inner, p.rs_s0, p.rs_s1});
}

// The float8 forms: out holds e4m3 bytes; with `scales` (not null) one scale a row is written there, else
// p.scale is used.
// The float8 wide kernels state one resident block an SM as their bound (with none, ptxas aimed some
// 512-thread kernels at four blocks, 32 registers a thread, and spilled). The rows kernels, where the
// conversion is one instruction (sm_89 on), hold a thread's t (32 floats at most) and gain from more
// resident rows: 1024 threads an SM (64 registers), or 640 (96) for a kernel that holds more: the fused
// form (the residual's loads) and weights wider than x (float32 weights of 16-bit x spilled at 64): the most
// that fit with no spill (a 256-thread static float8 launch at 90 registers ran 17% slower than at 72, in
// the probe that found it). The arithmetic conversion of older GPUs spills at those bounds and keeps one
// block.
__host__ __device__ constexpr int fp8_rows_min_blocks(int block, bool holds_more) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 && !defined(CUKERN_FP8_SOFTWARE)
  const int blocks = (holds_more ? 640 : 1024) / block;
  return blocks > 1 ? blocks : 1;
#else
  return 1;
#endif
}

template <typename T, typename W, int VEC, int TPR, int GROUPS, int ITEMS, int BLOCK>
__global__ void __launch_bounds__(BLOCK, fp8_rows_min_blocks(BLOCK, sizeof(W) > sizeof(T)))
    rms_norm_fp8_rows(unsigned char* out, float* scales, const T* x, const W* weight,
                      const __grid_constant__ RmsNormFp8Params p) {
  const RowAddress out_at{p.inner, p.out_s0, p.out_s1};
  rms_norm_rows_impl<T, W, VEC, TPR, GROUPS, ITEMS, BLOCK, false, kFp8>(
      out, nullptr, x, weight, p.rows, out_at, out_at, RowAddress{p.inner, p.x_s0, p.x_s1}, p.hidden, p.eps,
      p.offset, Fp8Out{scales, RowAddress{p.inner, p.sc_s0, p.sc_s1}, p.scale});
}

template <typename T, typename W, int VEC, int TPR, int GROUPS, int ITEMS, int BLOCK>
__global__ void __launch_bounds__(BLOCK, fp8_rows_min_blocks(BLOCK, true))
    fused_add_rms_norm_fp8_rows(unsigned char* out, float* scales, T* residual, const T* x, const W* weight,
                                const __grid_constant__ RmsNormFp8Params p) {
  rms_norm_rows_impl<T, W, VEC, TPR, GROUPS, ITEMS, BLOCK, true, kFp8>(
      out, residual, x, weight, p.rows, RowAddress{p.inner, p.out_s0, p.out_s1},
      RowAddress{p.inner, p.res_s0, p.res_s1}, RowAddress{p.inner, p.x_s0, p.x_s1}, p.hidden, p.eps, p.offset,
      Fp8Out{scales, RowAddress{p.inner, p.sc_s0, p.sc_s1}, p.scale});
}

// Rows too long for registers: a block owns a row and streams it twice in chunks of BLOCK * ITEMS * VEC.
// Pass one sums squares (and, fused, writes the new residual); pass two rescales. Each thread reads back
// exactly the elements it wrote, so the fused form needs no barrier between passes. Vector column
// c * ITEMS + k of chunk c is item k of the rows kernel's layout with TPR = BLOCK, so with GROUPS dividing
// ITEMS a thread's accumulators are the same classes, each still summed in index order.
// The float8 forms find max |t| in pass one (per token), beside the sum of squares, and form t again in pass
// two.
template <typename T, typename W, int VEC, int GROUPS, int ITEMS, int BLOCK, bool FUSED, int QUANT = kNone,
          typename O = T, bool RSTD = false>
__device__ __forceinline__ void rms_norm_wide_impl(O* out, T* residual, const T* x, const W* weight,
                                                   long long rows, RowAddress out_at, RowAddress res_at,
                                                   RowAddress x_at, int hidden, float eps, float offset,
                                                   Fp8Out fp8 = {}, float* rstd = nullptr, RowAddress rs_at = {}) {
  static_assert(ITEMS % GROUPS == 0, "a chunk holds whole groups of classes");
  constexpr bool kFp8 = QUANT != kNone;
  __shared__ float scratch[2 * (kFp8 ? GROUPS + 1 : GROUPS) * (BLOCK / 32)];
  const float unweighted = __fadd_rn(offset, 1.f);
  const bool per_token = kFp8 && fp8.scales != nullptr;
  int parity = 0;
  for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
    // A wide row holds over 2048 elements, so the row count fits in 32 bits: no 64-bit division here.
    const unsigned q = static_cast<unsigned>(row) / static_cast<unsigned>(x_at.inner);
    const RowSplit at{q, row - static_cast<long long>(q) * x_at.inner};
    const T* xr = x + x_at(at);
    T* rr = FUSED ? residual + res_at(at) : nullptr;
    const T* src = FUSED ? rr : xr;
    O* orow = out + out_at(at);

    // Columns are unsigned (they stay under 2^31): with int, whose overflow is undefined, the compiler keeps
    // a 64-bit address per item live across the loop, and the fused element path spilled.
    float acc[GROUPS][VEC];
#pragma unroll
    for (int g = 0; g < GROUPS; ++g) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) acc[g][j] = 0.f;
    }
    float tmax = 0.f;
    for (int base = 0; base < hidden; base += BLOCK * ITEMS * VEC) {
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        const unsigned col = static_cast<unsigned>(base) + (threadIdx.x + k * BLOCK) * VEC;
        if (col < static_cast<unsigned>(hidden)) {
          Pack<T, VEC> a;
          load(a, xr + col);
          if constexpr (FUSED) {
            Pack<T, VEC> r;
            load(r, rr + col);
            a = residual_sum(a, r);
            store(rr + col, a);
          }
#pragma unroll
          for (int j = 0; j < VEC; ++j) acc[k % GROUPS][j] = square_add(acc[k % GROUPS][j], to_float(a.v[j]));
          if (per_token) {
            Pack<W, VEC> w;
            if (weight != nullptr) load(w, weight + col);
            float t[VEC];
            weighted(t, a, w, weight != nullptr, offset, unweighted);
#pragma unroll
            for (int j = 0; j < VEC; ++j) tmax = max_nan(tmax, fabsf(t[j]));
          }
        }
      }
    }
    float part[GROUPS];
#pragma unroll
    for (int g = 0; g < GROUPS; ++g) part[g] = tree_reduce<Sum>(acc[g]);
    float ss;
    if constexpr (kFp8) {
      ss = block_sum_and_max<BLOCK>(part, tmax, scratch, parity);
    } else {
      ss = block_tree_reduce<BLOCK, Sum>(part, scratch, parity);
    }
    parity ^= 1;
    const float inv = inverse_rms(ss, hidden, eps);
    if constexpr (RSTD) {
      if (threadIdx.x == 0) rstd[rs_at(at)] = inv;
    }

    float rcp = 0.f;
    if constexpr (kFp8) {
      float s = fp8.scale;
      if (per_token) {
        s = per_token_scale(__fmul_rn(tmax, inv));
        if (threadIdx.x == 0) fp8.scales[fp8.at(at)] = s;
      }
      rcp = __frcp_rn(s);
    }

    for (int base = 0; base < hidden; base += BLOCK * ITEMS * VEC) {
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        const unsigned col = static_cast<unsigned>(base) + (threadIdx.x + k * BLOCK) * VEC;
        if (col < static_cast<unsigned>(hidden)) {
          Pack<T, VEC> a;
          load(a, src + col);
          if constexpr (kFp8) {
            Pack<W, VEC> w;
            if (weight != nullptr) load(w, weight + col);
            float t[VEC];
            weighted(t, a, w, weight != nullptr, offset, unweighted);
            store_e4m3(orow + col, t, inv, rcp);
          } else if (weight != nullptr) {
            Pack<W, VEC> w;
            load(w, weight + col);
            Pack<T, VEC> y;
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
              y.v[j] = from_float<T>(scaled(to_float(a.v[j]), inv, __fadd_rn(offset, to_float(w.v[j]))));
            }
            store(orow + col, y);
          } else {
            Pack<T, VEC> y;
#pragma unroll
            for (int j = 0; j < VEC; ++j) y.v[j] = from_float<T>(scaled(to_float(a.v[j]), inv, unweighted));
            store(orow + col, y);
          }
        }
      }
    }
  }
}

template <typename T, typename W, int VEC, int GROUPS, int ITEMS, int BLOCK, bool RSTD = false>
__global__ void __launch_bounds__(BLOCK)
    rms_norm_wide(T* out, const T* x, const W* weight, float* rstd, const __grid_constant__ RmsNormParams p) {
  const RowAddress out_at{p.inner, p.out_s0, p.out_s1};
  rms_norm_wide_impl<T, W, VEC, GROUPS, ITEMS, BLOCK, false, kNone, T, RSTD>(
      out, nullptr, x, weight, p.rows, out_at, out_at, RowAddress{p.inner, p.x_s0, p.x_s1}, p.hidden, p.eps,
      p.offset, {}, rstd, RowAddress{p.inner, p.rs_s0, p.rs_s1});
}

template <typename T, typename W, int VEC, int GROUPS, int ITEMS, int BLOCK, bool RSTD = false>
__global__ void __launch_bounds__(BLOCK)
    fused_add_rms_norm_wide(T* out, T* residual, const T* x, const W* weight, float* rstd,
                            const __grid_constant__ RmsNormParams p) {
  rms_norm_wide_impl<T, W, VEC, GROUPS, ITEMS, BLOCK, true, kNone, T, RSTD>(
      out, residual, x, weight, p.rows, RowAddress{p.inner, p.out_s0, p.out_s1},
      RowAddress{p.inner, p.res_s0, p.res_s1}, RowAddress{p.inner, p.x_s0, p.x_s1}, p.hidden, p.eps, p.offset, {},
      rstd, RowAddress{p.inner, p.rs_s0, p.rs_s1});
}

template <typename T, typename W, int VEC, int GROUPS, int ITEMS, int BLOCK>
__global__ void __launch_bounds__(BLOCK, 1)
    rms_norm_fp8_wide(unsigned char* out, float* scales, const T* x, const W* weight,
                      const __grid_constant__ RmsNormFp8Params p) {
  const RowAddress out_at{p.inner, p.out_s0, p.out_s1};
  rms_norm_wide_impl<T, W, VEC, GROUPS, ITEMS, BLOCK, false, kFp8>(
      out, nullptr, x, weight, p.rows, out_at, out_at, RowAddress{p.inner, p.x_s0, p.x_s1}, p.hidden, p.eps,
      p.offset, Fp8Out{scales, RowAddress{p.inner, p.sc_s0, p.sc_s1}, p.scale});
}

template <typename T, typename W, int VEC, int GROUPS, int ITEMS, int BLOCK>
__global__ void __launch_bounds__(BLOCK, 1)
    fused_add_rms_norm_fp8_wide(unsigned char* out, float* scales, T* residual, const T* x, const W* weight,
                                const __grid_constant__ RmsNormFp8Params p) {
  rms_norm_wide_impl<T, W, VEC, GROUPS, ITEMS, BLOCK, true, kFp8>(
      out, residual, x, weight, p.rows, RowAddress{p.inner, p.out_s0, p.out_s1},
      RowAddress{p.inner, p.res_s0, p.res_s1}, RowAddress{p.inner, p.x_s0, p.x_s1}, p.hidden, p.eps, p.offset,
      Fp8Out{scales, RowAddress{p.inner, p.sc_s0, p.sc_s1}, p.scale});
}

}  // namespace cukern
