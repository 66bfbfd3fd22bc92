// The sum ladder: ten kernels from the textbook first try to the production kernel, one change per rung,
// each headed by what changed from the rung before and why, with a prediction (cukern/ladder.py runs
// them; each rung is a complete sum: the multi-pass rungs are applied again to their per-block partials
// until one value is left). The rungs stay as they were written, inline shuffles and all: each is a lesson.
//   v1  interleaved addressing, divergent branch            (tid % (2s) == 0)
//   v2  interleaved addressing, strided index               (no divergence, shared-memory bank conflicts)
//   v3  sequential addressing                               (conflict-free, half the threads idle at once)
//   v4  first add during the global load                    (every thread busy in the first step)
//   v5  last warp unrolled with __syncwarp                  (no barriers in the last six steps)
//   v6  warp-shuffle reduction                              (registers instead of shared memory)
//   v7  grid-stride loop, grid sized from the SM count      (many elements per thread, tiny second pass)
//   v8  16-byte vector loads                                (a quarter of the load instructions)
//   v9  last block done                                     (one launch: the last block combines partials)
//   v10 independent 16-byte loads in flight                 (the production kernel, same body as reduce_full)
// and one rung past it, which cukern does not take:
//   v11 no fixed tree                                       (round-robin vectors: what reproducibility costs)
//
// The production file is included, not copied: v9 finishes with its last-block counter, and v10 is its
// full-reduction body itself, so v10 measures the kernel cukern.sum runs. v8 and v9 read with
// thread_span below, the grid-stride share the production kernel used before its fixed tree.
#include "reduce.cu"

namespace cukern {

// Elements before the first 16-byte boundary of x (all of them when x is not even element-aligned).
template <typename T> __device__ __forceinline__ long long aligned_head(const T* x, long long n) {
  const unsigned long long addr = reinterpret_cast<unsigned long long>(x);
  if (addr % sizeof(T)) return n;
  const long long head = static_cast<long long>(((16 - addr % 16) % 16) / sizeof(T));
  return head < n ? head : n;
}

// One thread's share of n contiguous elements (v8, v9): elements lane, lane + lanes, ... as a scalar head
// to the first 16-byte boundary, then 16-byte loads, then a scalar tail, in one accumulator.
template <typename T, typename A> __device__ __forceinline__ A thread_span(const T* x, long long n, long long lane,
                                                                          long long lanes) {
  constexpr int VEC = 16 / sizeof(T);
  A acc = A(0);
  const long long head = aligned_head(x, n);
  const long long nvec = (n - head) / VEC;
  const T* body = x + head;
  for (long long i = lane; i < head; i += lanes) acc += to_acc<A>(x[i]);
  for (long long i = lane; i < nvec; i += lanes) {
    Pack<T, VEC> p;
    load(p, body + i * VEC);
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc += to_acc<A>(p.v[j]);
  }
  for (long long t = head + nvec * VEC + lane; t < n; t += lanes) acc += to_acc<A>(x[t]);
  return acc;
}

// This thread's share of the partials, in index order (threads stride by the block): v9's combine.
template <typename A> __device__ __forceinline__ A thread_partials(const A* partials) {
  A w = A(0);
  for (unsigned i = threadIdx.x; i < gridDim.x; i += blockDim.x) w += __ldcg(partials + i);
  return w;
}

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

// v9's finish, also v11's: each block publishes its total (thread 0's v); the last block to finish adds the
// totals in index order, writes the sum and resets the counter for the next launch.
template <int BLOCK, typename A>
__device__ __forceinline__ void finish_in_last_block(A* out, A* partials, unsigned* counter, A v) {
  if (!last_block_done(partials, counter, v)) return;
  A w = thread_partials(partials);
  __syncthreads();  // block_sum_shuffle's scratch is reused
  w = block_sum_shuffle<BLOCK>(w);
  if (threadIdx.x == 0) {
    *out = w;
    *counter = 0;
  }
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
  A v = thread_span<T, A>(x, n, static_cast<long long>(blockIdx.x) * BLOCK + threadIdx.x, lanes);
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
  A v = thread_span<T, A>(x, n, static_cast<long long>(blockIdx.x) * BLOCK + threadIdx.x, lanes);
  finish_in_last_block<BLOCK>(out, partials, counter, block_sum_shuffle<BLOCK>(v));
}

template <typename T, typename A, int BLOCK, int UNROLL>
__global__ void __launch_bounds__(BLOCK)
    reduce_v10_loads_in_flight(A* out, A* partials, unsigned* counter, const T* x, long long n) {
  // Changed from v9: UNROLL independent 16-byte loads per thread at a time, all issued before the first is
  // used, each element summed into its own chain of the fixed tree; larger blocks (512) and a grid of two
  // blocks per SM, so the partials are fewer and each thread streams longer. This is the production kernel
  // (reduce_full with OP_SUM; same body, same plan). Predicted: from ~85-90% to the copy peak or above
  // (a read-only stream beats a copy, which also writes).
  full_reduce_body<T, A, OP_SUM, BLOCK, UNROLL>(out, partials, counter, x, n, 1, FINISH_NONE, 1.0);
}

template <typename T, typename A, int BLOCK, int UNROLL>
__global__ void __launch_bounds__(BLOCK)
    reduce_v11_no_fixed_tree(A* out, A* partials, unsigned* counter, const T* x, long long n) {
  // Changed from v10: the fixed tree is given up, the rung cukern does not take. The 16-byte vectors are dealt
  // round-robin over the whole grid (one front sweeping memory), UNROLL of them in flight a thread, each summed in
  // arrival order into its own accumulator; the last block adds the block partials in index order. Same block, grid and
  // loads in flight as v10, so the difference is what the tree costs: its blocks read contiguous spans (aligned
  // subtrees) where this rung's warps read side by side. The bits now follow the grid, hence the SM count: run to run
  // the same, GPU to GPU not. Predicted: 1-2% over v10 at 2^29 (the span probes of docs/design/reductions.md), at CUB's
  // speed.
  constexpr int VEC = 16 / sizeof(T);
  const long long lanes = static_cast<long long>(gridDim.x) * BLOCK;
  const long long lane = static_cast<long long>(blockIdx.x) * BLOCK + threadIdx.x;
  const long long head = aligned_head(x, n);
  const long long nvec = (n - head) / VEC;
  const T* body = x + head;
  A acc[UNROLL];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) acc[u] = A(0);
  long long i = lane;
  for (; i + (UNROLL - 1) * lanes < nvec; i += UNROLL * lanes) {
    Pack<T, VEC> p[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) load(p[u], body + (i + u * lanes) * VEC);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) acc[u] += to_acc<A>(p[u].v[j]);
    }
  }
  for (; i < nvec; i += lanes) {  // this thread's last vectors, fewer than UNROLL
    Pack<T, VEC> p;
    load(p, body + i * VEC);
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc[0] += to_acc<A>(p.v[j]);
  }
  for (long long t = lane; t < head; t += lanes) acc[0] += to_acc<A>(x[t]);
  for (long long t = head + nvec * VEC + lane; t < n; t += lanes) acc[0] += to_acc<A>(x[t]);
  A v = acc[0];
#pragma unroll
  for (int u = 1; u < UNROLL; ++u) v += acc[u];
  finish_in_last_block<BLOCK>(out, partials, counter, block_sum_shuffle<BLOCK>(v));
}

}  // namespace cukern
