// The production reductions behind cukern.sum / amax / amin / mean / sum_of_squares / norm. The teaching
// ladder (ten rungs from the textbook first try to reduce_full) is cuda_src/reduce_ladder.cu.
//
// The six questions (cukern/reduce_plan.py keeps the launch math as pure plans):
// 1. Output tile: reduce_full: the whole array, one value, from a fixed grid (a few blocks per SM);
//    reduce_rows: one row per group of tpr threads (a sub-warp group, or the whole block for long rows);
//    reduce_cols: a strip of cw * VEC adjacent columns by a slice of rows per block; reduce_strided: one
//    output per warp, for layouts neither rows nor columns fit.
// 2. Input traffic: every element read once. Contiguous spans (full, rows) are read as a scalar head up to
//    the first 16-byte boundary, then 16-byte vectors, then a scalar tail, so misaligned views (x[1:]) keep
//    vector loads. Columns: each thread owns VEC adjacent columns and walks down the rows, so a warp reads
//    32 * 16 contiguous bytes per row: coalesced with no transpose.
// 3. Accumulation: in acc_t<O>: float for float32/float16/bfloat16 results, double for float64, long long
//    for integer results. Each thread combines its elements in a fixed order (UNROLL independent
//    accumulators, combined in order), then the warp and block reductions of common/reduce.cuh (a shuffle
//    butterfly, then the warp values in warp order). The final combine of per-block partials (full: last
//    block done; columns: a second tiny pass) reads them in index order. No float atomics anywhere: results
//    are bit-identical run to run for a given input, its alignment and the plan, and the plan depends only
//    on sizes, dtypes and the SM count.
// 4. Staging: registers; shared memory only for the block-level combine (and the column kernel's
//    cross-row-lane combine).
// 5. Tuning: block sizes, blocks per SM, tpr and slices come from cukern/reduce_plan.py `plan_*`.
// 6. Profile: one add per element against sizeof(T) bytes: memory-bound; the target is the copy bandwidth.
#include "common/dtype.cuh"
#include "common/vec.cuh"
#include "common/reduce.cuh"

namespace cukern {

// ---------------------------------------------------------------------------------------------------------
// Element types, accumulators and the four reduction operators.

enum : int { OP_SUM = 0, OP_SUMSQ = 1, OP_MAX = 2, OP_MIN = 3 };
enum : int { FINISH_NONE = 0, FINISH_DIVIDE = 1, FINISH_SQRT = 2 };

// The accumulator for a result type: half types widen to float, integers to 64 bits.
template <typename O> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };
template <> struct Acc<int> { using type = long long; };
template <> struct Acc<long long> { using type = long long; };
template <typename O> using acc_t = typename Acc<O>::type;

template <typename A, typename T> __device__ __forceinline__ A to_acc(T v) { return static_cast<A>(v); }
template <typename A> __device__ __forceinline__ A to_acc(f16 v) { return static_cast<A>(to_float(v)); }
template <typename A> __device__ __forceinline__ A to_acc(bf16 v) { return static_cast<A>(to_float(v)); }

template <typename O> struct Store {
  template <typename A> __device__ __forceinline__ static O from(A a) { return static_cast<O>(a); }
};
template <> struct Store<f16> {
  template <typename A> __device__ __forceinline__ static f16 from(A a) { return from_float<f16>(static_cast<float>(a)); }
};
template <> struct Store<bf16> {
  template <typename A> __device__ __forceinline__ static bf16 from(A a) { return from_float<bf16>(static_cast<float>(a)); }
};

template <typename A> struct Limits;
template <> struct Limits<float> {
  __device__ __forceinline__ static float lowest() { return __int_as_float(0xff800000); }
  __device__ __forceinline__ static float highest() { return __int_as_float(0x7f800000); }
};
template <> struct Limits<double> {
  __device__ __forceinline__ static double lowest() { return __longlong_as_double(0xfff0000000000000ll); }
  __device__ __forceinline__ static double highest() { return __longlong_as_double(0x7ff0000000000000ll); }
};
template <> struct Limits<long long> {
  __device__ __forceinline__ static long long lowest() { return -0x7fffffffffffffffll - 1; }
  __device__ __forceinline__ static long long highest() { return 0x7fffffffffffffffll; }
};

// NaN-aware max and min (a != a only for NaN): a NaN anywhere wins, as in NumPy. Both operands are treated
// alike, so combining in any fixed order gives the same NaN-or-not answer.
struct Max {
  template <typename A> __device__ __forceinline__ static A identity() { return Limits<A>::lowest(); }
  template <typename A> __device__ __forceinline__ static A apply(A a, A b) { return (a != a || a > b) ? a : b; }
};
struct Min {
  template <typename A> __device__ __forceinline__ static A identity() { return Limits<A>::highest(); }
  template <typename A> __device__ __forceinline__ static A apply(A a, A b) { return (a != a || a < b) ? a : b; }
};

// The combine of each op: sums and sums of squares add (a square is lifted once, then added).
template <int OP> struct CombineOf { using type = Sum; };
template <> struct CombineOf<OP_MAX> { using type = Max; };
template <> struct CombineOf<OP_MIN> { using type = Min; };
template <int OP> using combine_t = typename CombineOf<OP>::type;

template <int OP, typename A> __device__ __forceinline__ A identity() { return combine_t<OP>::template identity<A>(); }
template <int OP, typename A> __device__ __forceinline__ A combine(A a, A b) { return combine_t<OP>::apply(a, b); }

// What one element contributes (its square for OP_SUMSQ).
template <int OP, typename A> __device__ __forceinline__ A lift(A v) {
  if constexpr (OP == OP_SUMSQ) return v * v;
  else return v;
}

// Partials are combined, not lifted again: a sum of squares combines its partial sums by adding them.
template <int OP> __host__ __device__ constexpr int combine_op() { return OP == OP_SUMSQ ? OP_SUM : OP; }

// The result from the accumulator: as it is, divided (mean) or square-rooted (norm). Max and min never
// finish (so their kernels carry no double-precision sqrt slow path).
template <typename O, int OP, typename A> __device__ __forceinline__ O finish(A a, int finalize, double divisor) {
  if (OP == OP_MAX || OP == OP_MIN || finalize == FINISH_NONE) return Store<O>::from(a);
  const double d = static_cast<double>(a);
  return Store<O>::from(finalize == FINISH_DIVIDE ? d / divisor : sqrt(d));
}

// Shared by the kernels below and by the ladder (reduce_ladder.cu includes this file).

// Elements before the first 16-byte boundary of x (all of them when x is not even element-aligned).
template <typename T> __device__ __forceinline__ long long aligned_head(const T* x, long long n) {
  const unsigned long long addr = reinterpret_cast<unsigned long long>(x);
  if (addr % sizeof(T)) return n;
  const long long head = static_cast<long long>(((16 - addr % 16) % 16) / sizeof(T));
  return head < n ? head : n;
}

// One thread's share of n contiguous elements: elements lane, lane + lanes, ... as a scalar head to the
// first 16-byte boundary, then UNROLL independent 16-byte loads per iteration (all issued before any is
// used, each with its own accumulator), then the leftover vectors and a scalar tail. Accumulators are
// combined in index order, so the result depends only on (n, alignment, lane, lanes). I is the index type:
// long long for any n, or int (fewer registers) when n + UNROLL * lanes * 16 stays below 2^31.
template <typename T, typename A, int OP, int UNROLL, typename I = long long>
__device__ __forceinline__ A thread_span(const T* x, I n, I lane, I lanes) {
  constexpr int VEC = 16 / sizeof(T);
  A acc[UNROLL];
#pragma unroll
  for (int k = 0; k < UNROLL; ++k) acc[k] = identity<OP, A>();
  const I head = static_cast<I>(aligned_head(x, static_cast<long long>(n)));
  const I nvec = (n - head) / VEC;
  const T* body = x + head;
  for (I i = lane; i < head; i += lanes) acc[0] = combine<OP>(acc[0], lift<OP>(to_acc<A>(x[i])));
  I i = lane;
  for (; i + (UNROLL - 1) * lanes < nvec; i += UNROLL * lanes) {
    Pack<T, VEC> p[UNROLL];
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) load(p[k], body + (i + k * lanes) * VEC);
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) acc[k] = combine<OP>(acc[k], lift<OP>(to_acc<A>(p[k].v[j])));
    }
  }
  for (; i < nvec; i += lanes) {
    Pack<T, VEC> p;
    load(p, body + i * VEC);
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc[0] = combine<OP>(acc[0], lift<OP>(to_acc<A>(p.v[j])));
  }
  for (I t = head + nvec * VEC + lane; t < n; t += lanes) acc[0] = combine<OP>(acc[0], lift<OP>(to_acc<A>(x[t])));
#pragma unroll
  for (int k = 1; k < UNROLL; ++k) acc[0] = combine<OP>(acc[0], acc[k]);
  return acc[0];
}

// Last block done: thread 0 publishes the block's partial v, fences, and bumps the counter; returns (in
// every thread of the block) whether this block was the last to finish, in which case every partial is
// visible to it. Callers then combine partials[0 .. gridDim.x) in index order and reset the counter.
template <typename A> __device__ __forceinline__ bool last_block_done(A* partials, unsigned* counter, A v) {
  __shared__ bool last;
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = v;
    __threadfence();
    last = atomicAdd(counter, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (last) __threadfence();
  return last;
}

// This thread's share of the partials, in index order (threads stride by the block).
template <int OP, typename A> __device__ __forceinline__ A thread_partials(const A* partials) {
  A w = identity<OP, A>();
  for (unsigned i = threadIdx.x; i < gridDim.x; i += blockDim.x) w = combine<OP>(w, __ldcg(partials + i));
  return w;
}

// ---------------------------------------------------------------------------------------------------------
// The kernels.

// The same share of n elements `stride` apart (any stride but 1): scalar loads, one accumulator.
template <typename T, typename A, int OP>
__device__ __forceinline__ A thread_span_strided(const T* x, long long n, long long stride, long long lane,
                                                 long long lanes) {
  A acc = identity<OP, A>();
  for (long long i = lane; i < n; i += lanes) acc = combine<OP>(acc, lift<OP>(to_acc<A>(x[i * stride])));
  return acc;
}

// The whole-array reduction in one launch: every block reduces its grid-stride share, publishes a
// partial, and the last block to finish combines the partials in index order and writes the result. The
// counter is reset by that block, so the buffer needs zeroing only once, when it is allocated.
template <typename T, typename O, int OP, int BLOCK, int UNROLL>
__device__ __forceinline__ void full_reduce_body(O* out, acc_t<O>* partials, unsigned* counter, const T* x,
                                                 long long n, long long stride, int finalize, double divisor) {
  using A = acc_t<O>;
  constexpr int C = combine_op<OP>();
  __shared__ A scratch[2 * (BLOCK / 32)];
  const long long lanes = static_cast<long long>(gridDim.x) * BLOCK;
  const long long lane = static_cast<long long>(blockIdx.x) * BLOCK + threadIdx.x;
  A v = stride == 1 ? thread_span<T, A, OP, UNROLL>(x, n, lane, lanes)
                    : thread_span_strided<T, A, OP>(x, n, stride, lane, lanes);
  v = block_reduce<BLOCK, combine_t<C>>(v, scratch, 0);
  if (!last_block_done(partials, counter, v)) return;
  A w = thread_partials<C>(partials);
  w = block_reduce<BLOCK, combine_t<C>>(w, scratch, 1);
  if (threadIdx.x == 0) {
    *out = finish<O, C>(w, finalize, divisor);
    *counter = 0;
  }
}

template <typename T, typename O, int OP, int BLOCK, int UNROLL>
__global__ void __launch_bounds__(BLOCK)
    reduce_full(O* out, acc_t<O>* partials, unsigned* counter, const T* x, long long n, long long stride,
                int finalize, double divisor) {
  full_reduce_body<T, O, OP, BLOCK, UNROLL>(out, partials, counter, x, n, stride, finalize, divisor);
}

// (quotient, remainder) of a row index by `inner`, advanced by a fixed step without 64-bit division
// (whose subroutine call would cost a stack frame): first and step are below 2^31 (the grid is capped),
// so 32-bit division sets them up, and each advance carries the remainder at most once.
struct RowCursor {
  long long q, r, step_q, step_r, inner;
  __device__ __forceinline__ RowCursor(long long first, long long step, long long inner_) : inner(inner_) {
    if (inner_ >= (1ll << 31)) {
      q = 0, r = first, step_q = 0, step_r = step;
    } else {
      const unsigned d = static_cast<unsigned>(inner_);
      q = static_cast<unsigned>(first) / d, r = static_cast<unsigned>(first) % d;
      step_q = static_cast<unsigned>(step) / d, step_r = static_cast<unsigned>(step) % d;
    }
  }
  __device__ __forceinline__ void advance() {
    q += step_q;
    r += step_r;
    if (r >= inner) r -= inner, ++q;
  }
};

// Rows of `length` contiguous elements; row i starts at (i / inner) * s0 + (i % inner) * s1. A group of
// tpr threads owns a row: tpr <= 32 packs blockDim / tpr rows into a block, tpr == blockDim gives a row a
// block (blockDim == MAX_BLOCK, a power of two). Out is contiguous, one value per row. Each row's
// order depends only on its length, alignment, tpr and UNROLL (UNROLL independent 16-byte loads in flight
// per thread). MIN_BLOCKS caps the registers (__launch_bounds__) so that MIN_BLOCKS blocks of MAX_BLOCK
// threads stay resident per SM: the planner sizes the grid from it. I indexes within a row: int (fewer
// registers) for rows shorter than 2^30 elements, long long otherwise. Half-type inputs with 8-byte
// accumulators (eight doubles or int64 per 16-byte pack, UNROLL of them) get half that occupancy: at 64
// registers they spill.
template <typename T, typename O> __host__ __device__ constexpr int row_min_blocks(int min_blocks) {
  return sizeof(T) == 2 && sizeof(acc_t<O>) == 8 && min_blocks > 1 ? min_blocks / 2 : min_blocks;
}

template <typename T, typename O, int OP, int MAX_BLOCK, int UNROLL, int MIN_BLOCKS, typename I>
__global__ void __launch_bounds__(MAX_BLOCK, row_min_blocks<T, O>(MIN_BLOCKS))
    reduce_rows(O* out, const T* x, long long rows, long long length, long long inner, long long s0, long long s1,
                int tpr, int finalize, double divisor) {
  using A = acc_t<O>;
  constexpr int C = combine_op<OP>();
  __shared__ A scratch[2 * (MAX_BLOCK / 32)];
  const int lane = static_cast<int>(threadIdx.x) % tpr;
  const int slot = static_cast<int>(threadIdx.x) / tpr;
  const int per_block = static_cast<int>(blockDim.x) / tpr;
  const long long step = static_cast<long long>(gridDim.x) * per_block;
  const long long first = static_cast<long long>(blockIdx.x) * per_block;
  RowCursor at(first + slot, step, inner);
  int parity = 0;
  for (long long base = first; base < rows; base += step, at.advance()) {
    const long long row = base + slot;
    A v = identity<C, A>();
    if (row < rows) {
      v = thread_span<T, A, OP, UNROLL, I>(x + at.q * s0 + at.r * s1, static_cast<I>(length), static_cast<I>(lane),
                                           static_cast<I>(tpr));
    }
    if (tpr > 32) {
      v = block_reduce<MAX_BLOCK, combine_t<C>>(v, scratch, parity);
      parity ^= 1;
    } else {
      v = group_reduce<combine_t<C>>(v, tpr);
    }
    if (lane == 0 && row < rows) out[row] = finish<O, C>(v, finalize, divisor);
  }
}

// Columns: for each of `outer` matrices at x + o * s_outer, reduce `rows` rows (s_row apart) of `cols`
// contiguous columns. Block b owns a strip of cw * VEC columns and a slice of rows_per_slice rows;
// thread (tx, ty) owns VEC adjacent columns and rows ty, ty + BLOCK / cw, ... of the slice, reading one
// VEC-wide pack per row (16 bytes when VEC = 16 / sizeof(T)), UNROLL rows in flight, when `vector` says
// every pack is aligned; otherwise VEC scalar loads per row. The BLOCK / cw row
// lanes are combined in ty order through shared memory. Out is [outer, slices, cols]: partials of type
// P = acc_t when slices > 1 (a second launch of this kernel over the slices finishes), the result when
// slices == 1. __maxnreg__(64) (in place of __launch_bounds__, which cannot be combined with it): left
// to itself ptxas holds some instantiations to 40 registers and spills; 64 x 256 threads still fits four
// blocks, 64 KiB of loads in flight, per SM.
template <typename T, typename P, int OP, int VEC, int BLOCK>
__global__ void __maxnreg__(64)
    reduce_cols(P* out, const T* x, long long outer, long long rows, long long cols, long long s_outer,
                long long s_row, long long rows_per_slice, int slices, int strips, int cw, int vector, int finalize,
                double divisor) {
  using A = acc_t<P>;
  constexpr int UNROLL = 4;
  constexpr int C = combine_op<OP>();
  __shared__ A stage[BLOCK * VEC];
  const long long span = static_cast<long long>(cw) * VEC;
  // The grid is below 2^31 blocks, so the block index splits with 32-bit division.
  const unsigned b = blockIdx.x;
  const long long strip = b % static_cast<unsigned>(strips);
  const unsigned rest = b / static_cast<unsigned>(strips);
  const long long slice = rest % static_cast<unsigned>(slices);
  const long long o = rest / static_cast<unsigned>(slices);
  const int tx = static_cast<int>(threadIdx.x) % cw;
  const int ty = static_cast<int>(threadIdx.x) / cw;
  const int lanes = BLOCK / cw;
  const long long c0 = strip * span + static_cast<long long>(tx) * VEC;
  const long long r_begin = slice * rows_per_slice;
  const long long r_end = r_begin + rows_per_slice < rows ? r_begin + rows_per_slice : rows;
  const T* base = x + o * s_outer + c0;

  A acc[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) acc[j] = identity<C, A>();
  if (vector && c0 + VEC <= cols) {
    long long r = r_begin + ty;
    for (; r + (UNROLL - 1) * lanes < r_end; r += UNROLL * lanes) {
      Pack<T, VEC> p[UNROLL];
#pragma unroll
      for (int k = 0; k < UNROLL; ++k) load(p[k], base + (r + k * lanes) * s_row);
#pragma unroll
      for (int k = 0; k < UNROLL; ++k) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[j] = combine<C>(acc[j], lift<OP>(to_acc<A>(p[k].v[j])));
      }
    }
    for (; r < r_end; r += lanes) {
      Pack<T, VEC> p;
      load(p, base + r * s_row);
#pragma unroll
      for (int j = 0; j < VEC; ++j) acc[j] = combine<C>(acc[j], lift<OP>(to_acc<A>(p.v[j])));
    }
  } else if (c0 < cols) {
    for (long long r = r_begin + ty; r < r_end; r += lanes) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        if (c0 + j < cols) acc[j] = combine<C>(acc[j], lift<OP>(to_acc<A>(base[r * s_row + j])));
      }
    }
  }
  if (lanes > 1) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) stage[j * BLOCK + threadIdx.x] = acc[j];
    __syncthreads();
    if (ty == 0) {
      for (int t = 1; t < lanes; ++t) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[j] = combine<C>(acc[j], stage[j * BLOCK + t * cw + tx]);
      }
    }
  }
  if (ty == 0) {
    P* dst = out + (o * slices + slice) * cols + c0;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      if (c0 + j < cols) dst[j] = finish<P, C>(acc[j], finalize, divisor);
    }
  }
}

// Any other layout of at most two kept and two reduced levels, without a copy: one warp per output,
// lanes striding through the `count` reduced elements (element r at (r / r_inner) * r_s0 + (r % r_inner) *
// r_s1 from the output's base). Correct everywhere, coalesced only when the reduced inner stride is 1.
template <typename T, typename O, int OP, int BLOCK>
__global__ void __launch_bounds__(BLOCK)
    reduce_strided(O* out, const T* x, long long outputs, long long o_inner, long long o_s0, long long o_s1,
                   long long count, long long r_inner, long long r_s0, long long r_s1, int finalize, double divisor) {
  using A = acc_t<O>;
  constexpr int C = combine_op<OP>();
  constexpr int kWarps = BLOCK / 32;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  for (long long first = static_cast<long long>(blockIdx.x) * kWarps; first < outputs;
       first += static_cast<long long>(gridDim.x) * kWarps) {
    const long long o = first + (threadIdx.x >> 5);
    if (o >= outputs) break;
    const T* base = x + (o / o_inner) * o_s0 + (o % o_inner) * o_s1;
    A v = identity<C, A>();
    for (long long r = lane; r < count; r += 32) {
      v = combine<C>(v, lift<OP>(to_acc<A>(base[(r / r_inner) * r_s0 + (r % r_inner) * r_s1])));
    }
    v = group_reduce<combine_t<C>>(v, 32);
    if (lane == 0) out[o] = finish<O, C>(v, finalize, divisor);
  }
}

}  // namespace cukern
