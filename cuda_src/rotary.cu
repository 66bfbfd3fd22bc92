// Rotary position embedding (RoPE), applied in place to query and key in one launch.
//
//   p = positions[t]; for each head of q and k and each pair j < rot / 2:
//     c = cache[p][j], s = cache[p][W / 2 + j]              (W: the cache's width; s -> -s when inverse)
//     (x, y) = (v[j], v[j + rot / 2])   NeoX                 (x, y) = (v[2j], v[2j + 1])   GPT-J
//     x' = x * c - y * s;   y' = y * c + x * s
//   elements from rot on are neither read nor written; a position outside [0, cache_rows) leaves its token
//   as it is and reads nothing from the cache.
//
// The six questions (cukern/rotary.py `plan` computes the numbers for a given call):
// 1. Output tile: one token per group of lanes x groups threads. A "unit" is the VEC-wide slice of one
//    head a thread rotates: NeoX, VEC pairs (VEC elements from each half); GPT-J, VEC consecutive elements
//    (VEC / 2 interleaved pairs; one pair when VEC = 1). Lane u owns unit u of every head (so its cos and
//    sin stay in registers for the whole token); group g takes heads g, g + groups, ... of q then k.
//    tokens_per_block groups share a block; the grid covers the tokens once and a block walks further
//    tokens with a grid-stride loop only when the grid would pass 2^31 - 1 blocks.
// 2. Input traffic: each rotated element read once and written once with 16-byte accesses when the
//    pointers, strides and rot / 2 (NeoX) or rot (GPT-J) allow; one cache row (rot values) per token, read
//    by every group of that token from L1; positions once per thread from L1. Lanes of a warp cover
//    consecutive units of a head, then the next head: a warp's loads are whole 128-byte lines.
// 3. Accumulation: none; each output is two float32 products and one add, independent of the plan.
// 4. Staging: registers only. ITEMS units (two packs each for NeoX) are loaded before any is rotated, so a
//    thread keeps up to ITEMS x 32 bytes of loads in flight; ITEMS = 2 stays within 64 registers (half the
//    SM's threads resident), where 4 needs about 100. No shared memory, no barriers.
// 5. Tuning: lanes from the head's units, groups from how many heads a thread should take (one while
//    the launch fits in one wave of resident threads, up to ITEMS as it grows), tokens_per_block to fill
//    about 256 threads; VEC from alignment. All in `plan`.
// 6. Profile: 6 flops per pair against 4 * sizeof(T) bytes: memory-bound; the target is copy bandwidth.
//
// rotary_first_bad_position is the host-checked mode's guard: one block finds the first token whose
// position is out of range (reading ahead UNROLL positions a thread), so the host syncs once and raises
// before the rotation is launched.
#include "common/dtype.cuh"
#include "common/vec.cuh"

namespace cukern {

// One thread's slice of one head. Split units load x and y from two places (NeoX: the two halves;
// GPT-J scalar: the two elements of one pair); joined units (GPT-J, VEC >= 2) load both in one pack.
template <typename T, int VEC, bool NEOX> struct RotaryUnit {
  static constexpr bool kSplit = NEOX || VEC == 1;
  static constexpr int kPairs = NEOX ? VEC : (VEC > 1 ? VEC / 2 : 1);
  static constexpr int kWidth = kSplit ? kPairs : 2 * kPairs;

  Pack<T, kWidth> lo, hi;

  __device__ __forceinline__ void load(const T* at, int dy) {
    cukern::load(lo, at);
    if constexpr (kSplit) cukern::load(hi, at + dy);
  }

  __device__ __forceinline__ void rotate_store(T* at, int dy, const float (&c)[kPairs],
                                               const float (&s)[kPairs]) const {
    Pack<T, kWidth> olo, ohi;
#pragma unroll
    for (int j = 0; j < kPairs; ++j) {
      float x, y;
      if constexpr (kSplit) {
        x = to_float(lo.v[j]);
        y = to_float(hi.v[j]);
      } else {
        x = to_float(lo.v[2 * j]);
        y = to_float(lo.v[2 * j + 1]);
      }
      const T xo = from_float<T>(x * c[j] - y * s[j]);
      const T yo = from_float<T>(y * c[j] + x * s[j]);
      if constexpr (kSplit) {
        olo.v[j] = xo;
        ohi.v[j] = yo;
      } else {
        olo.v[2 * j] = xo;
        olo.v[2 * j + 1] = yo;
      }
    }
    cukern::store(at, olo);
    if constexpr (kSplit) cukern::store(at + dy, ohi);
  }
};

// Strides are in elements and signed; every offset is 64-bit. `positions` is int32 or int64 (pos64): a
// uniform branch, cheaper than doubling the instantiations. k may be null when heads == q_heads.
template <typename T, typename C, int VEC, bool NEOX, int ITEMS, int MAX_BLOCK>
__global__ void __launch_bounds__(MAX_BLOCK)
    rotary_embedding(T* __restrict__ q, T* __restrict__ k, const C* __restrict__ cache,
                     const void* __restrict__ positions, long long tokens, long long q_ts, long long q_hs,
                     long long k_ts, long long k_hs, long long pos_stride, int pos64, long long cache_rows,
                     long long cache_ts, long long sin_offset, int q_heads, int heads, int rot, int lanes,
                     int groups, int tokens_per_block, float sin_sign) {
  using Unit = RotaryUnit<T, VEC, NEOX>;
  constexpr int P = Unit::kPairs;
  const int tpt = lanes * groups;
  const int slot = static_cast<int>(threadIdx.x) / tpt;
  if (slot >= tokens_per_block) return;
  const int r = static_cast<int>(threadIdx.x) - slot * tpt;
  const int lane = r % lanes;
  const int group = r / lanes;
  const int half = rot / 2;
  const int units = half / P;
  const int dy = NEOX ? half : 1;

  for (long long tok = static_cast<long long>(blockIdx.x) * tokens_per_block + slot; tok < tokens;
       tok += static_cast<long long>(gridDim.x) * tokens_per_block) {
    const long long pos = pos64 ? static_cast<const long long*>(positions)[tok * pos_stride]
                                : static_cast<long long>(static_cast<const int*>(positions)[tok * pos_stride]);
    if (pos < 0 || pos >= cache_rows) continue;
    const C* row = cache + pos * cache_ts;
    T* qt = q + tok * q_ts;
    T* kt = k + tok * k_ts;

    for (int u = lane; u < units; u += lanes) {
      float c[P], s[P];
      Pack<C, P> cp, sp;
      load(cp, row + u * P);
      load(sp, row + sin_offset + u * P);
#pragma unroll
      for (int j = 0; j < P; ++j) {
        c[j] = to_float(cp.v[j]);
        s[j] = sin_sign * to_float(sp.v[j]);
      }
      const int first = NEOX ? u * P : 2 * u * P;

      for (int h0 = group; h0 < heads; h0 += groups * ITEMS) {
        Unit w[ITEMS];
        T* at[ITEMS];
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
          const int h = h0 + i * groups;
          at[i] = nullptr;
          if (h < heads) {
            at[i] = (h < q_heads ? qt + h * q_hs : kt + (h - q_heads) * k_hs) + first;
            w[i].load(at[i], dy);
          }
        }
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
          if (at[i] != nullptr) w[i].rotate_store(at[i], dy, c, s);
        }
      }
    }
  }
}

// found[0]: the first token whose position is outside [0, cache_rows), or tokens if none; found[1]: that
// position (0 if none). Launched as exactly one block of BLOCK threads.
template <typename P, int BLOCK, int UNROLL>
__global__ void __launch_bounds__(BLOCK)
    rotary_first_bad_position(long long* found, const P* positions, long long pos_stride, long long tokens,
                              long long cache_rows) {
  __shared__ long long warp_first[BLOCK / 32];
  long long first = tokens;
  for (long long base = threadIdx.x; base < tokens && first == tokens;
       base += static_cast<long long>(BLOCK) * UNROLL) {
    long long p[UNROLL];
#pragma unroll
    for (int j = 0; j < UNROLL; ++j) {
      const long long t = base + static_cast<long long>(j) * BLOCK;
      p[j] = t < tokens ? static_cast<long long>(positions[t * pos_stride]) : 0;
    }
#pragma unroll
    for (int j = 0; j < UNROLL; ++j) {
      const long long t = base + static_cast<long long>(j) * BLOCK;
      if (first == tokens && t < tokens && (p[j] < 0 || p[j] >= cache_rows)) first = t;
    }
  }
#pragma unroll
  for (int m = 16; m >= 1; m /= 2) {
    const long long other = __shfl_xor_sync(0xffffffffu, first, m);
    first = other < first ? other : first;
  }
  if ((threadIdx.x & 31) == 0) warp_first[threadIdx.x >> 5] = first;
  __syncthreads();
  if (threadIdx.x == 0) {
    long long best = tokens;
#pragma unroll
    for (int w = 0; w < BLOCK / 32; ++w) best = warp_first[w] < best ? warp_first[w] : best;
    found[0] = best;
    found[1] = best < tokens ? static_cast<long long>(positions[best * pos_stride]) : 0;
  }
}

}  // namespace cukern
