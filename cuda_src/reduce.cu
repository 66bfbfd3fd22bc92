// Reductions: the ladder (sum, one measured change per rung), then the production kernels behind
// cukern.sum / amax / amin / mean / sum_of_squares / norm.
//
// The ladder (cukern/ladder.py runs it; each rung is a complete sum: the multi-pass rungs are applied again
// to their per-block partials until one value is left):
//   v1  interleaved addressing, divergent branch            (tid % (2s) == 0)
//   v2  interleaved addressing, strided index               (no divergence, shared-memory bank conflicts)
//   v3  sequential addressing                               (conflict-free, half the threads idle at once)
//   v4  first add during the global load                    (every thread busy in the first step)
//   v5  last warp unrolled with __syncwarp                  (no barriers in the last six steps)
//   v6  warp-shuffle reduction                              (registers instead of shared memory)
//   v7  grid-stride loop, grid sized from the SM count      (many elements per thread, tiny second pass)
//   v8  16-byte vector loads                                (a quarter of the load instructions)
//   v9  last block done                                     (one launch: the last block combines partials)
//   v10 four independent 16-byte loads in flight            (the production kernel, same body as reduce_full)
//
// The six questions for the production kernels (cukern/reduce.py keeps the launch math as pure plans):
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
//    accumulators, combined in order), then a shuffle butterfly and a shared-memory stage of fixed shape.
//    The final combine of per-block partials (full: last block done; columns: a second tiny pass) reads
//    them in index order. No float atomics anywhere: results are bit-identical run to run for a given
//    input, its alignment and the plan, and the plan depends only on sizes, dtypes and the SM count.
// 4. Staging: registers; shared memory only for the block-level combine (and the column kernel's
//    cross-row-lane combine).
// 5. Tuning: block sizes, blocks per SM, tpr and slices come from cukern/reduce.py `plan_*`.
// 6. Profile: one add per element against sizeof(T) bytes: memory-bound; the target is the copy bandwidth.
#include "common/dtype.cuh"
#include "common/vec.cuh"

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

template <int OP, typename A> __device__ __forceinline__ A identity() {
  if constexpr (OP == OP_MAX) return Limits<A>::lowest();
  else if constexpr (OP == OP_MIN) return Limits<A>::highest();
  else return A(0);
}

// What one element contributes (its square for OP_SUMSQ).
template <int OP, typename A> __device__ __forceinline__ A lift(A v) {
  if constexpr (OP == OP_SUMSQ) return v * v;
  else return v;
}

// NaN-aware max and min (a != a only for NaN): a NaN anywhere wins, as in NumPy. Both operands are treated
// alike, so combining in any fixed order gives the same NaN-or-not answer.
template <int OP, typename A> __device__ __forceinline__ A combine(A a, A b) {
  if constexpr (OP == OP_MAX) return (a != a || a > b) ? a : b;
  else if constexpr (OP == OP_MIN) return (a != a || a < b) ? a : b;
  else return a + b;
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

// Butterfly over aligned groups of `width` lanes (a power of two, at most 32); all 32 lanes call it and
// every lane of a group ends with the group's value. Each step combines a pair the same way on both
// sides, so the result depends only on `width`.
template <int OP, typename A> __device__ __forceinline__ A group_reduce(A v, int width) {
  for (int m = width / 2; m >= 1; m /= 2) v = combine<OP>(v, __shfl_xor_sync(0xffffffffu, v, m));
  return v;
}

// Whole-block combine (blockDim.x a power of two from 64 to 1024); thread 0 gets the result. scratch
// holds blockDim.x / 32 values; alternate between two such slots in consecutive calls so one barrier per
// call is enough.
template <int OP, typename A> __device__ __forceinline__ A block_reduce(A v, A* scratch) {
  const int warps = static_cast<int>(blockDim.x) >> 5;
  v = group_reduce<OP>(v, 32);
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = (static_cast<int>(threadIdx.x) < warps) ? scratch[threadIdx.x] : identity<OP, A>();
    v = group_reduce<OP>(v, warps);
  }
  return v;
}

// Shared by the ladder and the production kernels.

// This thread's element of a one-element-per-thread block (v1-v3), or the accumulator's zero past n.
template <typename T, typename A> __device__ __forceinline__ A load_one(const T* x, long long n) {
  const long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  return i < n ? to_acc<A>(x[i]) : A(0);
}

// This thread's two elements, BLOCK apart, of a block covering 2 * BLOCK elements (v4-v6), added.
template <typename T, typename A, int BLOCK> __device__ __forceinline__ A load_two(const T* x, long long n) {
  const long long i = static_cast<long long>(blockIdx.x) * (2 * BLOCK) + threadIdx.x;
  A v = i < n ? to_acc<A>(x[i]) : A(0);
  if (i + BLOCK < n) v += to_acc<A>(x[i + BLOCK]);
  return v;
}

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
// The ladder. T is the element type, A the accumulator (float, or double for float64); each multi-pass
// rung writes one partial per block and cukern/ladder.py launches it again on the partials.

template <typename T, typename A, int BLOCK>
__global__ void __launch_bounds__(BLOCK) reduce_v1_interleaved_divergent(A* out, const T* x, long long n) {
  // The textbook start: one element per thread into shared memory, then pairs at distance 1, 2, 4, ...
  // Only threads with tid % (2s) == 0 work: every warp stays busy in step one but the active threads
  // are scattered, so warps diverge and the % (an integer division on a runtime value) costs more than
  // the add. Predicted: far below bandwidth (a few % of the copy peak).
  __shared__ A s[BLOCK];
  const unsigned tid = threadIdx.x;
  s[tid] = load_one<T, A>(x, n);
  __syncthreads();
  for (unsigned stride = 1; stride < blockDim.x; stride *= 2) {
    if (tid % (2 * stride) == 0) s[tid] += s[tid + stride];
    __syncthreads();
  }
  if (tid == 0) out[blockIdx.x] = s[0];
}

template <typename T, typename A, int BLOCK>
__global__ void __launch_bounds__(BLOCK) reduce_v2_interleaved_strided_index(A* out, const T* x, long long n) {
  // Changed from v1: thread tid works on index 2 * s * tid, so active threads are the low, contiguous
  // ones and whole warps retire together (no divergence, no modulo). New flaw: a warp's accesses are
  // 2s words apart, so from s = 16 on (4-byte A) many lanes hit the same shared-memory bank and the access
  // replays. Predicted: about 1.5-2x over v1.
  __shared__ A s[BLOCK];
  const unsigned tid = threadIdx.x;
  s[tid] = load_one<T, A>(x, n);
  __syncthreads();
  for (unsigned stride = 1; stride < blockDim.x; stride *= 2) {
    const unsigned index = 2 * stride * tid;
    if (index < blockDim.x) s[index] += s[index + stride];
    __syncthreads();
  }
  if (tid == 0) out[blockIdx.x] = s[0];
}

template <typename T, typename A, int BLOCK>
__global__ void __launch_bounds__(BLOCK) reduce_v3_sequential_addressing(A* out, const T* x, long long n) {
  // Changed from v2: fold the upper half onto the lower half (distance blockDim/2, /4, ...), so lanes read
  // consecutive words: no bank conflicts. New flaw: half the threads are idle from the first step, and
  // each thread loaded only one element. Predicted: modest gain over v2.
  __shared__ A s[BLOCK];
  const unsigned tid = threadIdx.x;
  s[tid] = load_one<T, A>(x, n);
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (tid < stride) s[tid] += s[tid + stride];
    __syncthreads();
  }
  if (tid == 0) out[blockIdx.x] = s[0];
}

template <typename T, typename A, int BLOCK>
__global__ void __launch_bounds__(BLOCK) reduce_v4_first_add_during_load(A* out, const T* x, long long n) {
  // Changed from v3: each block covers 2 * BLOCK elements and every thread adds its two while loading, so
  // no thread idles in the first step and the grid (and the shared-memory tree work) halves.
  // Predicted: close to 2x over v3.
  __shared__ A s[BLOCK];
  const unsigned tid = threadIdx.x;
  s[tid] = load_two<T, A, BLOCK>(x, n);
  __syncthreads();
  for (unsigned stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (tid < stride) s[tid] += s[tid + stride];
    __syncthreads();
  }
  if (tid == 0) out[blockIdx.x] = s[0];
}

template <typename T, typename A, int BLOCK>
__global__ void __launch_bounds__(BLOCK) reduce_v5_unroll_last_warp(A* out, const T* x, long long n) {
  // Changed from v4: the block size is a compile-time constant, so the tree unrolls completely, and once
  // 64 values remain one warp finishes without __syncthreads. Since Volta the lanes of a warp are not
  // implicitly in lockstep (independent thread scheduling), so the old `volatile` idiom is a data race:
  // each step here writes its value, __syncwarp, reads its partner, __syncwarp. Predicted: ~1.3x over v4
  // (the instruction overhead of the tree's barriers and loop control goes away).
  static_assert(BLOCK >= 64, "the last-warp stage folds 64 values");
  __shared__ A s[BLOCK];
  const unsigned tid = threadIdx.x;
  A v = load_two<T, A, BLOCK>(x, n);
  s[tid] = v;
  __syncthreads();
#pragma unroll
  for (int stride = BLOCK / 2; stride > 32; stride >>= 1) {
    if (tid < stride) s[tid] = v = v + s[tid + stride];
    __syncthreads();
  }
  if (tid < 32) {
    v += s[tid + 32];
#pragma unroll
    for (int stride = 16; stride > 0; stride >>= 1) {
      __syncwarp();
      s[tid] = v;
      __syncwarp();
      v += s[tid + stride];
    }
    if (tid == 0) out[blockIdx.x] = v;
  }
}

// Sum over the 32 lanes of a warp with shuffles; lane 0 ends with the total.
template <typename A> __device__ __forceinline__ A warp_sum_down(A v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;
}

// Block sum with shuffles: each warp sums in registers, lane 0 of each writes one value, warp 0 sums
// those. Thread 0 gets the result.
template <int BLOCK, typename A> __device__ __forceinline__ A block_sum_shuffle(A v) {
  constexpr int kWarps = BLOCK / 32;
  __shared__ A warp_sums[kWarps];
  v = warp_sum_down(v);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < kWarps ? warp_sums[threadIdx.x] : A(0);
    v = warp_sum_down(v);
  }
  return v;
}

template <typename T, typename A, int BLOCK>
__global__ void __launch_bounds__(BLOCK) reduce_v6_warp_shuffle(A* out, const T* x, long long n) {
  // Changed from v5: the tree runs in registers with __shfl_down_sync (5 shuffle steps per warp) and
  // shared memory holds only one value per warp; one barrier per block instead of log2(BLOCK).
  // Predicted: small gain; the rung is now limited by how little each thread loads (2 elements) and by
  // the 2^n / 512 blocks each paying launch and tail costs.
  A v = load_two<T, A, BLOCK>(x, n);
  v = block_sum_shuffle<BLOCK>(v);
  if (threadIdx.x == 0) out[blockIdx.x] = v;
}

template <typename T, typename A, int BLOCK>
__global__ void __launch_bounds__(BLOCK) reduce_v7_grid_stride(A* out, const T* x, long long n) {
  // Changed from v6: the grid is a fixed number of resident blocks (the SM count times the blocks that
  // fit per SM, from the host), and each thread sums many elements with a grid-stride loop before the
  // block combine. Block-level overhead is paid once per thread instead of once per two elements, and
  // the second pass shrinks from n / 512 partials to about a thousand. Predicted: a big step, to a large
  // fraction of the bandwidth, limited by one 4-byte load in flight per iteration.
  const long long stride = static_cast<long long>(gridDim.x) * BLOCK;
  A v = A(0);
  for (long long i = static_cast<long long>(blockIdx.x) * BLOCK + threadIdx.x; i < n; i += stride) v += to_acc<A>(x[i]);
  v = block_sum_shuffle<BLOCK>(v);
  if (threadIdx.x == 0) out[blockIdx.x] = v;
}

template <typename T, typename A, int BLOCK>
__global__ void __launch_bounds__(BLOCK) reduce_v8_vector_loads(A* out, const T* x, long long n) {
  // Changed from v7: each load moves 16 bytes (4 float32, 8 float16/bfloat16) after a scalar head that
  // reaches the first 16-byte boundary, and a scalar tail. A quarter of the load instructions and the
  // loop overhead for float32. Predicted: 10-30% over v7, mostly from more bytes in flight per thread.
  const long long lanes = static_cast<long long>(gridDim.x) * BLOCK;
  A v = thread_span<T, A, OP_SUM, 1>(x, n, static_cast<long long>(blockIdx.x) * BLOCK + threadIdx.x, lanes);
  v = block_sum_shuffle<BLOCK>(v);
  if (threadIdx.x == 0) out[blockIdx.x] = v;
}

template <typename T, typename A, int BLOCK>
__global__ void __launch_bounds__(BLOCK)
    reduce_v9_last_block_done(A* out, A* partials, unsigned* counter, const T* x, long long n) {
  // Changed from v8: one launch instead of three. Each block publishes its partial, fences, and bumps a
  // counter; the block that sees the count reach gridDim.x - 1 is the last, reads all partials in index
  // order (deterministic) and writes the sum, then resets the counter for the next launch (no memset,
  // replayable in a CUDA graph). Predicted: the two small launches (a few microseconds each) disappear;
  // large at mid sizes, ~1% at 2^28.
  const long long lanes = static_cast<long long>(gridDim.x) * BLOCK;
  A v = thread_span<T, A, OP_SUM, 1>(x, n, static_cast<long long>(blockIdx.x) * BLOCK + threadIdx.x, lanes);
  v = block_sum_shuffle<BLOCK>(v);
  if (!last_block_done(partials, counter, v)) return;
  A w = thread_partials<OP_SUM>(partials);
  __syncthreads();  // block_sum_shuffle's scratch is reused
  w = block_sum_shuffle<BLOCK>(w);
  if (threadIdx.x == 0) {
    *out = w;
    *counter = 0;
  }
}

// ---------------------------------------------------------------------------------------------------------
// Production kernels.

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
  v = block_reduce<C>(v, scratch);
  if (!last_block_done(partials, counter, v)) return;
  A w = thread_partials<C>(partials);
  w = block_reduce<C>(w, scratch + BLOCK / 32);
  if (threadIdx.x == 0) {
    *out = finish<O, C>(w, finalize, divisor);
    *counter = 0;
  }
}

template <typename T, typename A, int BLOCK, int UNROLL>
__global__ void __launch_bounds__(BLOCK)
    reduce_v10_loads_in_flight(A* out, A* partials, unsigned* counter, const T* x, long long n) {
  // Changed from v9: UNROLL independent 16-byte loads per thread per iteration, all issued before the
  // first is used, each summed into its own accumulator; larger blocks (512) and a grid of two blocks per
  // SM, so the partials are fewer and each thread streams longer. This is the production kernel
  // (reduce_full with OP_SUM; same body, same plan). Predicted: from ~85-90% to the copy peak or above
  // (a read-only stream beats a copy, which also writes).
  full_reduce_body<T, A, OP_SUM, BLOCK, UNROLL>(out, partials, counter, x, n, 1, FINISH_NONE, 1.0);
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
// block (blockDim a power of two, at most MAX_BLOCK). Out is contiguous, one value per row. Each row's
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
      v = block_reduce<C>(v, scratch + parity * (MAX_BLOCK / 32));
      parity ^= 1;
    } else {
      v = group_reduce<C>(v, tpr);
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
    v = group_reduce<C>(v, 32);
    if (lane == 0) out[o] = finish<O, C>(v, finalize, divisor);
  }
}

}  // namespace cukern
