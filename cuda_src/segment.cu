// Segmented reductions over CSR offsets along axis 0: segment_sum, segment_max, segment_min, segment_mean
// (cukern/segment.py).
//
//   out[s, j] = reduce(x[offsets[s] : offsets[s + 1], j])      (mean: the sum / the segment's length)
//
// One tree per segment length: a segment's L values v_i = x[offsets[s] + i, j] are reduced by the
// tree of cuda_src/reduce.cu over L elements (cukern.reduce_plan's TREE_CHAINS, TREE_CHAIN_LENGTH):
//   * leaves of 256 consecutive indices; in leaf k, chain c (c < 32) combines v_{256k + c + 32m}, m = 0..7,
//     one after another into the identity (0 for sums, -inf / +inf for max / min);
//   * the chain values, in order of 32k + c, are the leaves of a perfect binary tree with neighbours paired
//     first, their count padded to a power of two with the identity.
// So a segment's bits depend only on its own values and length: not on its neighbours, the number of
// segments or columns, the grid, the block or the GPU, and they equal cukern.sum / amax / amin of the same
// slice along axis 0 (cukern/reference.py `segment_sum_emulated` evaluates the same tree). Sums add with
// __fadd_rn / __dadd_rn (never contracted); max and min propagate NaN and are commutative bit for bit (+0
// over -0 in max, -0 in min); a mean divides the sum, widened to double, by L once (IEEE), then rounds to
// the result dtype (through float for the half types). An empty segment gives the identity (NaN for mean;
// the dtype's lowest / highest value for an integer max / min). Integer and bool x: sums in 64-bit integers
// (wrapping, exact in any order) into int64 / uint64, maxima and minima exact into x's dtype, means summed
// in double into float64: NumPy's result dtypes (cukern/segment.py `result_dtype`).
//
// The six questions (cukern/segment.py `plan` keeps the launch math as a pure plan; the card in
// cukern/lab/segment.py shows the same answers):
// 1. Output tile: segment_warp: one warp per run of `run` consecutive segments (at most 32) of one column,
//    taken one after another, lane c owning chain c of every leaf, for few columns (a 1-D x above all);
//    segment_cols: one thread per (segment, column), a block a segment and SEG_COL_BLOCK adjacent columns,
//    for rows of 32 columns or more.
// 2. Input traffic: every element of x inside a segment read once, offsets read twice (each segment reads
//    its two bounds), out written once. segment_warp: the run's bounds in one coalesced load (lane l those
//    of the run's segment l), so only a run's first segment waits for its offsets; a warp's 32 loads of
//    one chain step are 32 consecutive rows, contiguous when x is a unit-stride column; segment_cols: a
//    warp's 32 threads read 32 adjacent columns of one row.
// 3. Accumulation: in float (float32, float16, bfloat16), double (float64; integer means) or a 64-bit
//    integer (integer and bool sums, maxima, minima) along the tree above. Warp:
//    chains in the lanes, a leaf's 32 chains by shuffles (common/reduce.cuh group_tree_reduce), leaves by
//    a stack per warp (tree_push / tree_result). Cols: all 32 chains of a leaf in one thread's registers,
//    the leaf by tree_reduce, leaves by a stack per thread in shared memory. No atomics.
// 4. Staging: registers; shared memory for the leaf stacks (SEG_STACK_DEPTH levels a warp or a thread).
// 5. Tuning: none: the launch follows from the shape (which kernel, blocks of 64 / 128 threads, the
//    warp kernel's run: enough warps for any GPU, cukern/segment.py RUN_WARPS).
// 6. Profile: one combine an element against sizeof(T) bytes, so memory-bound for long segments; short ones
//    cost a leaf's instructions (its tree, the segment's bounds and result) for few bytes, and Nsight Compute
//    had segment_warp issuing 3 warp instructions a cycle an SM on random lengths: its instruction count
//    sets the speed there (docs/design/segment.md). The target is the copy bandwidth.
#include "common/bounds.cuh"
#include "common/dtype.cuh"
#include "common/reduce.cuh"

namespace cukern {

constexpr int SEG_CHAINS = 32;
constexpr int SEG_CHAIN_LENGTH = 8;
constexpr int SEG_LEAF = SEG_CHAINS * SEG_CHAIN_LENGTH;
constexpr int SEG_STACK_DEPTH = 35;  // groups of 8 chains of segments up to 2^40 rows
// Two warps a block: runs of random-length segments end at different times, and a block's slot frees only
// when its last warp ends; 256-thread blocks left 67.6% of the copy, 64-thread ones 71.2% (docs/design/segment.md).
constexpr int SEG_WARP_BLOCK = 64;  // cukern/segment.py WARP_BLOCK
constexpr int SEG_COL_BLOCK = 128;   // cukern/segment.py COL_BLOCK
constexpr int SEG_GROUP = 8;         // chains segment_cols holds at once

enum : int { SEG_SUM = 0, SEG_MAX = 1, SEG_MIN = 2 };

// The accumulator for x of type T and a result of type O: float for float32 and the half types, double for
// a double result (float64 x, and the means of integers and bool), else a 64-bit integer: integer and bool
// sums wrap there, as NumPy's, and maxima and minima compare there (signed; unsigned for uint64), since the
// warp's shuffles move 32- and 64-bit values, not bytes or shorts (cukern/segment.py `result_dtype`).
template <typename T> struct SegFloat { static constexpr bool value = false; };  // x of a float type
template <> struct SegFloat<float> { static constexpr bool value = true; };
template <> struct SegFloat<double> { static constexpr bool value = true; };
template <> struct SegFloat<f16> { static constexpr bool value = true; };
template <> struct SegFloat<bf16> { static constexpr bool value = true; };
template <typename T> struct SegWide { using type = long long; };
template <> struct SegWide<unsigned long long> { using type = unsigned long long; };
template <typename T, typename O> struct SegAcc { using type = typename SegWide<T>::type; };
template <typename T> struct SegAcc<T, double> { using type = double; };
template <typename O> struct SegAcc<float, O> { using type = float; };
template <typename O> struct SegAcc<f16, O> { using type = float; };
template <typename O> struct SegAcc<bf16, O> { using type = float; };
template <typename T, typename O> using seg_acc_t = typename SegAcc<T, O>::type;

__device__ __forceinline__ float seg_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double seg_add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ long long seg_add(long long a, long long b) {  // wraps, as NumPy's int64
  return static_cast<long long>(static_cast<unsigned long long>(a) + static_cast<unsigned long long>(b));
}
__device__ __forceinline__ unsigned long long seg_add(unsigned long long a, unsigned long long b) { return a + b; }
template <typename T> __device__ __forceinline__ T seg_load(T v) { return v; }
__device__ __forceinline__ float seg_load(f16 v) { return to_float(v); }
__device__ __forceinline__ float seg_load(bf16 v) { return to_float(v); }

template <typename A> __device__ __forceinline__ bool seg_negative_zero(A) { return false; }
__device__ __forceinline__ bool seg_negative_zero(float a) { return __float_as_uint(a) == 0x80000000u; }
__device__ __forceinline__ bool seg_negative_zero(double a) {
  return __double_as_longlong(a) == static_cast<long long>(0x8000000000000000ull);
}

struct SegSum {
  template <typename A> __device__ __forceinline__ static A identity() { return A(0); }
  template <typename A> __device__ __forceinline__ static A apply(A a, A b) { return seg_add(a, b); }
};
// NumPy's max and min: a NaN operand gives a NaN (their sum), and of two equal values max keeps +0 over -0,
// min -0 over +0, so that both are commutative bit for bit as the shuffle trees need.
struct SegMax {
  template <typename A> __device__ __forceinline__ static A identity() { return Limits<A>::lowest(); }
  template <typename A> __device__ __forceinline__ static A apply(A a, A b) {
    if (a != a || b != b) return seg_add(a, b);
    if (a > b) return a;
    if (b > a) return b;
    return seg_negative_zero(a) ? b : a;
  }
};
struct SegMin {
  template <typename A> __device__ __forceinline__ static A identity() { return Limits<A>::highest(); }
  template <typename A> __device__ __forceinline__ static A apply(A a, A b) {
    if (a != a || b != b) return seg_add(a, b);
    if (a < b) return a;
    if (b < a) return b;
    return seg_negative_zero(a) ? a : b;
  }
};
template <int OP> struct SegCombine { using type = SegSum; };
template <> struct SegCombine<SEG_MAX> { using type = SegMax; };
template <> struct SegCombine<SEG_MIN> { using type = SegMin; };

// A result from its accumulator: the half types through float, the others a plain conversion.
template <typename O> struct SegStore {
  template <typename A> __device__ __forceinline__ static O from(A a) { return static_cast<O>(a); }
};
template <> struct SegStore<f16> {
  template <typename A> __device__ __forceinline__ static f16 from(A a) {
    return from_float<f16>(static_cast<float>(a));
  }
};
template <> struct SegStore<bf16> {
  template <typename A> __device__ __forceinline__ static bf16 from(A a) {
    return from_float<bf16>(static_cast<float>(a));
  }
};

// Every scalar of a launch (cukern/segment.py PARAMS, the same fields in the same order). Row r, column j
// of x is at r * row_stride + j * col_stride; out is C-contiguous [segments, cols].
struct SegParams {
  long long segments, cols, rows;
  long long row_stride, col_stride;
  int mean;
  int run;  // segments a warp (segment_warp), 1 to 32
};

// A segment's rows, clamped into [0, rows] with start <= end, so offsets that were not checked
// (check_offsets=False) can never make a kernel read outside x.
template <typename I> __device__ __forceinline__ void segment_bounds(const I* offsets, long long s, long long rows,
                                                                     long long& start, long long& length) {
  long long a = static_cast<long long>(offsets[s]);
  long long b = static_cast<long long>(offsets[s + 1]);
  a = a < 0 ? 0 : (a > rows ? rows : a);
  b = b < a ? a : (b > rows ? rows : b);
  start = a;
  length = b - a;
}

// A segment's result: a mean divides once in double; an empty segment's max or min is O's own limit (an
// integer accumulator's identity, a 64-bit limit, does not fit a narrower O).
template <typename O, int OP, typename A> __device__ __forceinline__ O seg_finish(A v, long long length, int mean) {
  if (OP == SEG_SUM && mean) return SegStore<O>::from(static_cast<double>(v) / static_cast<double>(length));
  if (OP != SEG_SUM && length == 0) return OP == SEG_MAX ? Limits<O>::lowest() : Limits<O>::highest();
  return SegStore<O>::from(v);
}

// A leaf's chain for lane c of a warp: the values at[32 m], m < M, that lie in the segment (`in_leaf`: its
// rows from this lane's first on), combined in turn into the identity. The caller picks M, the same for every
// lane, past the leaf's last row: a chain's later steps would combine the identity, which leaves a chain's
// bits as they are (a sum's chain never holds -0, max and min keep any value over their identity, and a NaN
// in a chain is already the combine's NaN).
template <int M, typename C, typename A, typename T, typename Index>
__device__ __forceinline__ A seg_chain(const T* at, Index step, int in_leaf) {
  using L = decltype(seg_load(T()));
  L v[M];  // as loaded: widened only when combined
#pragma unroll
  for (int m = 0; m < M; ++m) v[m] = SEG_CHAINS * m < in_leaf ? seg_load(at[m * step]) : C::template identity<L>();
  A chain = C::template identity<A>();
#pragma unroll
  for (int m = 0; m < M; ++m) chain = C::apply(chain, static_cast<A>(v[m]));
  return chain;
}

// The same for a leaf every lane fills (no test a load).
template <typename C, typename A, typename T, typename Index>
__device__ __forceinline__ A seg_full_chain(const T* at, Index step) {
  decltype(seg_load(T())) v[SEG_CHAIN_LENGTH];
#pragma unroll
  for (int m = 0; m < SEG_CHAIN_LENGTH; ++m) v[m] = seg_load(at[m * step]);
  A chain = C::template identity<A>();
#pragma unroll
  for (int m = 0; m < SEG_CHAIN_LENGTH; ++m) chain = C::apply(chain, static_cast<A>(v[m]));
  return chain;
}

// One segment's tree for a warp (its value in lane 0): leaf k's chain c in lane c, the leaf by the shuffle
// tree, the leaves by lane 0's stack (a one-leaf segment's value, most of them, kept off it). `Index` is int
// for a unit-stride segment shorter than 2^31 - 2^9 rows, so that the leaf loop is 32-bit counts and a
// pointer step, a load's offset a constant (Nsight Compute had the kernel issue-bound; docs/design/segment.md),
// long long otherwise.
template <typename Index> struct SegCount { using type = unsigned long long; };
template <> struct SegCount<int> { using type = unsigned; };

template <typename C, typename A, typename Index, typename T>
__device__ __forceinline__ A seg_warp_tree(A* stack, const T* col, Index length, long long row_stride, int lane) {
  const Index leaves = (length + SEG_LEAF - 1) / SEG_LEAF;
  const Index step = static_cast<Index>(SEG_CHAINS * row_stride);
  const T* at = col + lane * row_stride;
  A result = C::template identity<A>();
  Index rest = length;  // the segment's rows from leaf k's first on
  for (Index k = 0; k < leaves; ++k, rest -= SEG_LEAF, at += SEG_LEAF * row_stride) {
    const Index left = rest - lane;
    const int in_leaf = left > SEG_LEAF ? SEG_LEAF : static_cast<int>(left);
    // chain steps by the leaf's rows: short segments (most of them where they are many) load once or 4 times
    const A chain = rest >= SEG_LEAF             ? seg_full_chain<C, A>(at, step)
                    : rest <= SEG_CHAINS         ? seg_chain<1, C, A>(at, step, in_leaf)
                    : rest <= 4 * SEG_CHAINS     ? seg_chain<4, C, A>(at, step, in_leaf)
                                                 : seg_chain<SEG_CHAIN_LENGTH, C, A>(at, step, in_leaf);
    const A leaf = group_tree_reduce<32, C>(chain);
    if (leaves == 1) {
      result = leaf;  // tree_result of one pushed leaf is that leaf
    } else if (lane == 0) {
      tree_push<C, A, typename SegCount<Index>::type>(stack, leaf, k);
    }
  }
  if (leaves > 1 && lane == 0) result = tree_result<C, A, typename SegCount<Index>::type>(stack, leaves);
  return result;
}

// One warp per run of p.run consecutive segments of one column: segments (blockIdx.x * warps + warp) * run
// on, column blockIdx.y. Lane l loads the bounds of the run's segment l, all at once, and the warp takes the
// segments in turn: lane c computes chain c of each leaf (its 8 loads issued before any is combined), the
// leaf is the shuffle tree over the lanes, and lane 0 pushes it onto the warp's stack. Without runs (a warp
// a segment) each warp waited for its offsets, then for its data: two memory latencies for a segment of
// 256 values on average (runs helped; loading the next segment's first leaf ahead as well gave no more,
// docs/design/segment.md). Nsight Compute then showed the kernel issue-bound, not short of loads in flight: so a
// load's offset is a constant for unit strides, a full leaf's loads have no test, a short leaf's chain takes
// only its steps, and a unit-stride segment's leaf loop counts in 32 bits.
// segment_warp's resident blocks: none stated for floats (ptxas chooses); integer and bool x state sixteen,
// 64 registers, on every architecture: left to choose, ptxas spilled 8 to 32 bytes at 32 or 40 registers for
// some of them on sm_100 and sm_120.
template <typename T> __host__ __device__ constexpr int seg_warp_min_blocks() { return SegFloat<T>::value ? 0 : 16; }

template <typename T, int OP, typename I, typename O>
__global__ void __launch_bounds__(SEG_WARP_BLOCK, seg_warp_min_blocks<T>())
    segment_warp(O* out, const T* x, const I* offsets, const __grid_constant__ SegParams p) {
  using A = seg_acc_t<T, O>;
  using C = typename SegCombine<OP>::type;
  constexpr int kWarps = SEG_WARP_BLOCK / 32;
  constexpr long long kShort = (1ll << 31) - 2 * SEG_LEAF;  // leaf counts and rows left stay in an int
  __shared__ A stacks[kWarps][SEG_STACK_DEPTH];
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const long long first = (static_cast<long long>(blockIdx.x) * kWarps + warp) * p.run;
  if (first >= p.segments) return;  // a whole warp leaves together: no shuffle is left waiting
  const int run = static_cast<int>(p.segments - first < p.run ? p.segments - first : p.run);
  const long long j = blockIdx.y;
  long long my_start = 0, my_length = 0;
  if (lane < run) segment_bounds(offsets, first + lane, p.rows, my_start, my_length);
  const T* column = x + j * p.col_stride;
  for (int r = 0; r < run; ++r) {
    const long long start = __shfl_sync(0xffffffffu, my_start, r);
    const long long length = __shfl_sync(0xffffffffu, my_length, r);
    const T* col = column + start * p.row_stride;
    const A result = p.row_stride == 1 && length < kShort
                         ? seg_warp_tree<C, A, int>(stacks[warp], col, static_cast<int>(length), 1, lane)
                         : seg_warp_tree<C, A, long long>(stacks[warp], col, length, p.row_stride, lane);
    if (lane == 0) out[(first + r) * p.cols + j] = seg_finish<O, OP>(result, length, p.mean);
  }
}

// segment_cols' resident blocks: none stated on sm_90 (ptxas chooses), one from sm_100 on (as CUKERN_BOUNDS).
// Before sm_90, ptxas left to choose put the float-accumulator minima at 64 registers and spilled 8 bytes;
// told the eight blocks of those 64 registers, maxima and minima fit them.
// Integer and bool x (64-bit accumulators) state four blocks, 128 registers, before sm_100: left to choose,
// ptxas spilled 8 to 20 bytes at 80 registers for several of them on sm_90.
template <typename T, int OP> __host__ __device__ constexpr int seg_cols_min_blocks() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
  return 1;
#else
  return SegFloat<T>::value ? before_sm90_min_blocks(OP == SEG_SUM ? 0 : 8) : 4;
#endif
}

// One thread per (segment, column): segment blockIdx.x, column blockIdx.y * SEG_COL_BLOCK + thread. A leaf's
// 32 chains are taken SEG_GROUP at a time (all 32 at once, with their loads, spilled for max and min), each
// group's chains in registers, filled row by row, and reduced by tree_reduce; the groups' values are aligned
// subtrees of the one tree (four to a leaf), so the thread's own stack in shared memory, counting groups,
// merges them into the same tree the warp kernel's shuffles and leaf stack form.
template <typename T, int OP, typename I, typename O>
__global__ void __launch_bounds__(SEG_COL_BLOCK, seg_cols_min_blocks<T, OP>())
    segment_cols(O* out, const T* x, const I* offsets, const __grid_constant__ SegParams p) {
  using A = seg_acc_t<T, O>;
  using L = decltype(seg_load(T()));
  using C = typename SegCombine<OP>::type;
  __shared__ A stacks[SEG_COL_BLOCK][SEG_STACK_DEPTH];
  const long long s = blockIdx.x;
  const long long j = static_cast<long long>(blockIdx.y) * SEG_COL_BLOCK + threadIdx.x;
  if (j >= p.cols) return;
  long long start, length;
  segment_bounds(offsets, s, p.rows, start, length);
  const T* col = x + start * p.row_stride + j * p.col_stride;
  const long long leaves = (length + SEG_LEAF - 1) / SEG_LEAF;
  constexpr int kGroups = SEG_CHAINS / SEG_GROUP;
  for (long long k = 0; k < leaves; ++k) {
#pragma unroll 1
    for (int g = 0; g < kGroups; ++g) {
      A chains[SEG_GROUP];
#pragma unroll
      for (int c = 0; c < SEG_GROUP; ++c) chains[c] = C::template identity<A>();
#pragma unroll
      for (int m = 0; m < SEG_CHAIN_LENGTH; ++m) {
        L v[SEG_GROUP];  // as loaded: widened only when combined (int values, not doubles, in flight)
#pragma unroll
        for (int c = 0; c < SEG_GROUP; ++c) {
          const long long i = k * SEG_LEAF + m * SEG_CHAINS + g * SEG_GROUP + c;
          v[c] = i < length ? seg_load(col[i * p.row_stride]) : C::template identity<L>();
        }
#pragma unroll
        for (int c = 0; c < SEG_GROUP; ++c) chains[c] = C::apply(chains[c], static_cast<A>(v[c]));
      }
      tree_push<C>(stacks[threadIdx.x], tree_reduce<C>(chains), static_cast<unsigned long long>(k * kGroups + g));
    }
  }
  const A r = tree_result<C>(stacks[threadIdx.x], static_cast<unsigned long long>(leaves * kGroups));
  out[s * p.cols + j] = seg_finish<O, OP>(r, length, p.mean);
}

}  // namespace cukern
