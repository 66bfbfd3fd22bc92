// THE warp and block reductions of cukern (rms_norm.cu and reduce.cu use these, nothing else). The order in
// which values are combined depends only on the group or block size, never on timing or on how many groups
// the launch has: results are bit-identical run to run, and a row's result does not depend on the batch.
//
// A combine C is a type with `template <typename T> static T identity()` and `template <typename T> static
// T apply(T a, T b)`, the accumulator type T any type __shfl_xor_sync moves (float, double, int, long long).
// Sum is here; reduce.cu adds NaN-propagating max and min.
#pragma once

namespace cukern {

struct Sum {
  template <typename T> __device__ __forceinline__ static T identity() { return T(0); }
  template <typename T> __device__ __forceinline__ static T apply(T a, T b) { return a + b; }
};

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

// The float sums rms_norm.cu uses.
template <int G> __device__ __forceinline__ float group_sum(float v) { return group_reduce<G, Sum>(v); }

template <int BLOCK> __device__ __forceinline__ float block_sum(float v, float* scratch, int parity) {
  return block_reduce<BLOCK, Sum>(v, scratch, parity);
}

}  // namespace cukern
