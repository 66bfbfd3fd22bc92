// THE warp and block reductions of cukern (every family that reduces includes this one). The order in
// which values are combined depends only on the group or block size, never on timing or on how many groups
// the launch has: results are bit-identical run to run, and a row's result does not depend on the batch.
//
// A combine C is a type with `template <typename T> static T identity()` and `template <typename T> static
// T apply(T a, T b)`, the accumulator type T any type __shfl_xor_sync moves (float, double, int, long long).
// Sum is here; reduce.cu adds NaN-propagating max and min, and a (count, mean, M2) struct accumulator, which
// the tree helpers move between lanes through shuffle_xor (reduce.cu overloads it for that struct).
#pragma once

namespace cukern {

// One lane's value from lane (lane ^ m). A dependent call, so an overload for an accumulator struct declared
// beside that struct (found by argument-dependent lookup) takes over for it.
template <typename T> __device__ __forceinline__ T shuffle_xor(T v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }

struct Sum {
  template <typename T> __device__ __forceinline__ static T identity() { return T(0); }
  template <typename T> __device__ __forceinline__ static T apply(T a, T b) { return a + b; }
};

// PTX max.NaN / min.NaN (sm_80 on): one instruction, a NaN operand gives a NaN. Of two zeros either may
// come back, so these serve where only the value reaches a result (an amax of |values|, logsumexp's
// maximum), not NumPy's max and min (+0 over -0: reduce.cu's Max and Min).
__device__ __forceinline__ float max_nan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

__device__ __forceinline__ float min_nan(float a, float b) {
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// Butterfly over aligned groups of G lanes (a power of two, at most 32). Every lane of the warp must call
// it; each lane gets its group's result. Both lanes of a pair combine the same two values, so every lane
// of a group ends with the same bits.
template <int G, typename C, typename T> __device__ __forceinline__ T group_reduce(T v) {
#pragma unroll
  for (int m = G / 2; m >= 1; m /= 2) v = C::apply(v, __shfl_xor_sync(0xffffffffu, v, m));
  return v;
}

// The same butterfly for a group width known only at run time (`width` as G above).
template <typename C, typename T> __device__ __forceinline__ T group_reduce(T v, int width) {
  for (int m = width / 2; m >= 1; m /= 2) v = C::apply(v, __shfl_xor_sync(0xffffffffu, v, m));
  return v;
}

// Over a whole block of BLOCK threads (a multiple of 32): each warp combines its lanes, lane 0 stores the
// warp's value, and every thread then combines the BLOCK / 32 warp values in warp order, starting from the
// identity, so every thread gets the result. scratch holds 2 * BLOCK / 32 values; `parity` alternates
// between consecutive calls (a block reducing in a loop) so that one barrier per call is enough: a thread
// can write this slot again only after every thread has passed the next call's barrier, past its reads.
template <int BLOCK, typename C, typename T> __device__ __forceinline__ T block_reduce(T v, T* scratch, int parity) {
  constexpr int kWarps = BLOCK / 32;
  v = group_reduce<32, C>(v);
  T* slot = scratch + parity * kWarps;
  if ((threadIdx.x & 31) == 0) slot[threadIdx.x >> 5] = v;
  __syncthreads();
  T total = C::template identity<T>();
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total = C::apply(total, slot[w]);
  return total;
}

// The fixed tree (rms_norm.cu: the same bits whatever the launch shape). N values, N a power of
// two, are the leaves of a perfect binary tree with neighbours paired first: ((v0 + v1) + (v2 + v3)) + ...
// The three helpers below compute parts of that one tree: leaves held by one thread, one leaf per lane of
// a group, or N leaves per thread of a block. Composed so that a thread's own leaves are the low bits of
// the leaf index, its lane the next bits and its warp the next, any split of the leaves over threads gives
// the same bits. C::apply must be commutative bit for bit (a xor butterfly forms a + b in one lane and
// b + a in its partner), as IEEE addition is.

// The tree over one thread's N values.
template <typename C, int N, typename T> __device__ __forceinline__ T tree_reduce(const T (&v)[N]) {
  static_assert(N > 0 && (N & (N - 1)) == 0, "the tree needs a power-of-two number of leaves");
  T s[N];
#pragma unroll
  for (int i = 0; i < N; ++i) s[i] = v[i];
#pragma unroll
  for (int w = 1; w < N; w *= 2) {
#pragma unroll
    for (int i = 0; i < N; i += 2 * w) s[i] = C::apply(s[i], s[i + w]);
  }
  return s[0];
}

// The tree over aligned groups of G lanes (a power of two, at most 32), lane L of a group being leaf L:
// partners at distance 1, 2, 4, ... (group_reduce pairs them the other way round, which is another tree).
// Every lane of the warp must call it; every lane of a group gets the group's result.
template <int G, typename C, typename T> __device__ __forceinline__ T group_tree_reduce(T v) {
#pragma unroll
  for (int m = 1; m < G; m *= 2) v = C::apply(v, shuffle_xor(v, m));
  return v;
}

// The tree over a block of BLOCK threads (a power of two, at least 32) holding N values each: value n of
// thread t is leaf n * BLOCK + t, so warp w's subtree over value n is the tree's (n * BLOCK / 32 + w)-th
// subtree of 32 leaves. It is formed in two steps around one barrier. store_warp_subtrees: each warp forms
// its N subtrees and lane 0 stores subtree n in slot[n * BLOCK / 32 + warp]. load_warp_subtrees, after a
// __syncthreads: every thread reads the N * BLOCK / 32 slots back, in leaf order, for tree_reduce to complete
// the tree, so every thread gets the result. A kernel that reduces something else beside the tree
// (rms_norm.cu's float8 max) calls these itself, storing its own values in further slots before the same
// barrier.
template <int BLOCK, typename C, int N, typename T>
__device__ __forceinline__ void store_warp_subtrees(const T (&v)[N], T* slot) {
  constexpr int kWarps = BLOCK / 32;
  static_assert(kWarps > 0 && (kWarps & (kWarps - 1)) == 0, "a power-of-two number of warps");
  const int warp = static_cast<int>(threadIdx.x) >> 5;
#pragma unroll
  for (int n = 0; n < N; ++n) {
    const T s = group_tree_reduce<32, C>(v[n]);
    if ((threadIdx.x & 31) == 0) slot[n * kWarps + warp] = s;
  }
}

template <int M, typename T> __device__ __forceinline__ void load_warp_subtrees(const T* slot, T (&all)[M]) {
#pragma unroll
  for (int i = 0; i < M; ++i) all[i] = slot[i];
}

// Both steps with their barrier. scratch holds 2 * span * BLOCK / 32 values; `parity` as for block_reduce.
// A kernel that reduces different counts of values a thread through one scratch passes the largest as
// `span`, so that each parity's slots are the same span whatever the count (else parity 1's slots of a short
// call would lie inside parity 0's of a long one, still being read).
template <int BLOCK, typename C, int N, typename T>
__device__ __forceinline__ T block_tree_reduce(const T (&v)[N], T* scratch, int parity, int span = N) {
  T* slot = scratch + parity * span * (BLOCK / 32);
  store_warp_subtrees<BLOCK, C>(v, slot);
  __syncthreads();
  T all[N * (BLOCK / 32)];
  load_warp_subtrees(slot, all);
  return tree_reduce<C>(all);
}

// block_tree_reduce for wide states (layer_norm.cu's (count, mean, M2)), where N * BLOCK / 32 of them a thread
// would not fit in registers: the same tree, its top taken by every warp from the M slots (after the
// barrier) with each lane holding M / 32 neighbouring slots (one, for M < 32, lanes repeating modulo M), then
// a butterfly; every lane of the block gets the result. scratch and parity as for block_tree_reduce.
template <int BLOCK, typename C, int N, typename T>
__device__ __forceinline__ T block_tree_reduce_wide(const T (&v)[N], T* scratch, int parity) {
  constexpr int kSlots = N * (BLOCK / 32);
  constexpr int kLanes = kSlots >= 32 ? 32 : kSlots;
  constexpr int kPer = kSlots / kLanes;
  T* slot = scratch + parity * kSlots;
  store_warp_subtrees<BLOCK, C>(v, slot);
  __syncthreads();
  const int lane = static_cast<int>(threadIdx.x & 31) % kLanes;
  T mine[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) mine[i] = slot[lane * kPer + i];
  return group_tree_reduce<kLanes, C>(tree_reduce<C>(mine));
}

// group_tree_reduce for a group width known only at run time (`width` as G above).
template <typename C, typename T> __device__ __forceinline__ T group_tree_reduce(T v, int width) {
  for (int m = 1; m < width; m *= 2) v = C::apply(v, shuffle_xor(v, m));
  return v;
}

// The same tree over a sequence too long to hold at once (reduce.cu): consecutive aligned subtrees of
// equal size, given one at a time as subtree k = 0, 1, 2, ..., are merged as a binary counter merges
// carries, so that after `count` pushes tree_result gives the tree over all of them, a count that is not a
// power of two padded with the identity (which the tree adds exactly). `level` holds one value per level
// (the bit length of the largest count), in shared memory, owned by one thread (lanes of a warp sharing one
// race, even pushing the same values: nothing orders one lane's read after another's write). K, the count's
// type: unsigned long long unless a caller whose counts stay below 2^31 names unsigned (fewer instructions).
// It is never deduced (NoDeduce), so a caller passing an int keeps the 64-bit counter.
template <typename K> struct NoDeduce { using type = K; };
template <typename C, typename T, typename K = unsigned long long>
__device__ __forceinline__ void tree_push(T* level, T v, typename NoDeduce<K>::type k) {
  int l = 0;
  for (; (k >> l) & 1; ++l) v = C::apply(level[l], v);
  level[l] = v;
}

template <typename C, typename T, typename K = unsigned long long>
__device__ __forceinline__ T tree_result(const T* level, typename NoDeduce<K>::type count) {
  T v = C::template identity<T>();
  bool any = false;
  for (int l = 0; (count >> l) != 0; ++l) {
    if ((count >> l) & 1) {
      v = any ? C::apply(level[l], v) : level[l];
      any = true;
    }
  }
  return v;
}

}  // namespace cukern
