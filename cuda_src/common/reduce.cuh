// Deterministic float sums across a group of threads: the order of additions depends only on the
// group's size, never on timing or on how many groups the launch has.
#pragma once

namespace cukern {

// Butterfly sum over aligned groups of G lanes (G a power of two, at most 32). Every lane of the warp
// must call it; each lane gets its group's sum.
template <int G> __device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int m = G / 2; m >= 1; m /= 2) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

// Sum over a whole block of BLOCK threads (a multiple of 32). scratch holds 2 * BLOCK / 32 floats;
// `parity` alternates between calls so one barrier per call is enough when the block reduces in a loop.
template <int BLOCK> __device__ __forceinline__ float block_sum(float v, float* scratch, int parity) {
  constexpr int kWarps = BLOCK / 32;
  v = group_sum<32>(v);
  float* slot = scratch + parity * kWarps;
  if ((threadIdx.x & 31) == 0) slot[threadIdx.x >> 5] = v;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += slot[w];
  return total;
}

}  // namespace cukern
