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
// 1. Output tile: one token per group of lanes x groups threads. A "unit" is the slice of one head a thread
//    rotates: two packs of VEC elements, VEC pairs, in both styles. NeoX: VEC elements from each half.
//    GPT-J: VEC consecutive elements from each half of the rotated span (VEC / 2 interleaved pairs each;
//    so a GPT-J thread moves as many bytes per head as a NeoX one), or the single pair (2u, 2u + 1) when
//    VEC = 1. Lane u owns unit u of every head (its cos and sin stay in registers for the whole token);
//    group g takes heads g, g + groups, ... of q then k. tokens_per_block groups share a block; the grid
//    covers the tokens once, or is capped at a few waves (Knobs.waves) with blocks walking further tokens.
// 2. Input traffic: each rotated element read once and written once with 16-byte accesses when the
//    pointers, strides and rot / 2 allow; one cache row (rot values) per token, read by every group of
//    that token from L1 as VEC-wide (NeoX) or VEC/2-wide (GPT-J) vectors; positions once per thread per
//    token. Lanes of a warp cover consecutive units of a head, then the next head: a warp's loads are
//    whole 128-byte lines. A token's first q/k loads are issued before its position is checked, so the
//    position's latency overlaps the data's instead of preceding it.
// 3. Accumulation: none; each output is two float32 products and one sum, each rounded once with no
//    fused multiply-add (`turn`): bit for bit the same on every plan, vector width and placement.
// 4. Staging: registers only. ITEMS units (two packs each) are loaded before any is rotated, so a thread
//    keeps ITEMS x 32 bytes of loads in flight. cos/sin are kept in the cache's type and widened per
//    head. MIN_BLOCKS (launch bound) caps registers: 2 -> 64 (half the SM's threads), spill-free for
//    ITEMS <= 2; ITEMS = 4 needs ~110 (MIN_BLOCKS = 1). No shared memory, no barriers.
// 5. Tuning: lanes from the head's units, groups from how many heads a thread should take (one while
//    the launch fits in one wave of resident threads, up to ITEMS as it grows), tokens_per_block to fill
//    Knobs.target_block threads; VEC from alignment. All in `plan`; bench/sweep_rotary.py measures it.
// 6. Profile: 6 flops per pair against 4 * sizeof(T) bytes: memory-bound; the target is copy bandwidth.
//
// rotary_first_bad_position is the host-checked mode's guard: one block finds the first token whose
// position is out of range (reading ahead UNROLL positions a thread) and writes it into pinned host memory,
// so the host syncs once, reads it without a copy and raises before the rotation is launched.
#include "common/dtype.cuh"
#include "common/vec.cuh"

namespace cukern {

template <typename T> struct IsBf16 { static constexpr bool value = false; };
template <> struct IsBf16<bf16> { static constexpr bool value = true; };

// A pack of T as VEC floats: bfloat16 two at a time from 32-bit words (a shift and a mask), others one by
// one.
template <typename T, int VEC>
__device__ __forceinline__ void widen(float (&f)[VEC], const Pack<T, VEC>& p) {
  if constexpr (IsBf16<T>::value && VEC % 2 == 0) {
#pragma unroll
    for (int j = 0; j < VEC / 2; ++j) {
      f[2 * j] = __uint_as_float(p.u[j] << 16);
      f[2 * j + 1] = __uint_as_float(p.u[j] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j) f[j] = to_float(p.v[j]);
  }
}

// The pair (x, y) turned by (c, s): x c - y s and y c + x s, every product and sum rounded once, in this
// one order on every path. Left to itself the compiler contracts `x * c - y * s` into a fused multiply-add
// where it likes, and it liked different places in the 16-byte and the element-wise instantiations, so a
// token's last bit depended on its address in a buffer; explicitly rounded operations are never
// contracted. `sin_mask` 0x80000000 negates sin (the inverse rotation): flipping the sign of the sin
// products gives the same bits (rounding is symmetric) without holding a negated copy of the token's sin
// in registers, which the 64-register launch bound has no room for.
__device__ __forceinline__ float flip_sign(float v, unsigned mask) {
  return __uint_as_float(__float_as_uint(v) ^ mask);
}

__device__ __forceinline__ void turn(float x, float y, float c, float s, unsigned sin_mask, float& x_out,
                                     float& y_out) {
  // The sin products first: in this order ptxas fits every instantiation in 64 registers without spills.
  const float ys = flip_sign(__fmul_rn(y, s), sin_mask), xs = flip_sign(__fmul_rn(x, s), sin_mask);
  x_out = __fsub_rn(__fmul_rn(x, c), ys);
  y_out = __fadd_rn(__fmul_rn(y, c), xs);
}

// One thread's slice of one head: two packs of VEC elements, `lo` at the unit's first element and `hi`
// dy elements on, rotating VEC pairs with VEC cos/sin values.
//   NeoX:            lo = v[u VEC ..), hi = v[rot/2 + u VEC ..)  (dy = rot/2); pair j = (lo[j], hi[j]).
//   GPT-J, VEC = 1:  lo = v[2u], hi = v[2u + 1] (dy = 1); the pair (lo, hi).
//   GPT-J, VEC >= 2: lo = v[u VEC ..), hi = v[rot/2 + u VEC ..) (dy = rot/2); pairs (lo[2j], lo[2j+1])
//                    then (hi[2j], hi[2j+1]): pair indices u VEC/2 + j and rot/4 + u VEC/2 + j.
// Every form moves 2 VEC elements a head with two accesses, and a warp's accesses to lo (and to hi) are
// consecutive.
template <typename T, int VEC, bool NEOX> struct RotaryUnit {
  static constexpr bool kInterleaved = !NEOX && VEC > 1;
  Pack<T, VEC> lo, hi;

  __device__ __forceinline__ void load(const T* at, int dy) {
    cukern::load(lo, at);
    cukern::load(hi, at + dy);
  }

  template <typename CS>
  __device__ __forceinline__ void rotate_store(T* at, int dy, const CS& cs, unsigned sin_mask) const {
    float c[VEC], s[VEC];
    cs.widen(c, s);
    float a[VEC], b[VEC], l[VEC], h[VEC];
    widen(l, lo);
    widen(h, hi);
    if constexpr (kInterleaved) {
#pragma unroll
      for (int j = 0; j < VEC / 2; ++j) {
        turn(l[2 * j], l[2 * j + 1], c[j], s[j], sin_mask, a[2 * j], a[2 * j + 1]);
        turn(h[2 * j], h[2 * j + 1], c[VEC / 2 + j], s[VEC / 2 + j], sin_mask, b[2 * j], b[2 * j + 1]);
      }
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) turn(l[j], h[j], c[j], s[j], sin_mask, a[j], b[j]);
    }
    Pack<T, VEC> olo, ohi;
    round_into(olo, a);
    round_into(ohi, b);
    cukern::store(at, olo);
    cukern::store(at + dy, ohi);
  }
};

// cos and sin of a unit's VEC pairs from one cache row (cos at row[0 ..), sin at row[sin_offset ..)), kept
// in the cache's own type (a 16-bit cache takes half the registers) and widened for each head they turn.
// NeoX and scalar GPT-J: VEC consecutive values; GPT-J: VEC / 2 values for each half of the unit.
template <typename C, int VEC, bool NEOX> struct CosSin {
  static constexpr int H = (NEOX || VEC == 1) ? VEC : VEC / 2;
  static constexpr int N = VEC / H;  // packs of each
  Pack<C, H> c[N], s[N];

  __device__ __forceinline__ void load(const C* row, int u, long long sin_offset, int quarter) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      cukern::load(c[i], row + i * quarter + u * H);
      cukern::load(s[i], row + sin_offset + i * quarter + u * H);
    }
  }

  __device__ __forceinline__ void widen(float (&cf)[VEC], float (&sf)[VEC]) const {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      float a[H], b[H];
      cukern::widen(a, c[i]);
      cukern::widen(b, s[i]);
#pragma unroll
      for (int j = 0; j < H; ++j) {
        cf[i * H + j] = a[j];
        sf[i * H + j] = b[j];
      }
    }
  }
};

__device__ __forceinline__ long long read_position(const void* positions, int pos64, long long at) {
  return pos64 ? __ldg(static_cast<const long long*>(positions) + at)
               : static_cast<long long>(__ldg(static_cast<const int*>(positions) + at));
}

// ITEMS heads h0, h0 + groups, ... (q's first, then k's) of one token: pointers and loads.
template <typename Unit, int ITEMS, typename T>
__device__ __forceinline__ void load_batch(Unit (&w)[ITEMS], T* (&at)[ITEMS], int h0, int groups, int q_heads,
                                           int heads, T* qt, T* kt, long long q_hs, long long k_hs, int first,
                                           int dy) {
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const int h = h0 + i * groups;
    at[i] = nullptr;
    if (h < heads) {
      at[i] = (h < q_heads ? qt + h * q_hs : kt + (h - q_heads) * k_hs) + first;
      w[i].load(at[i], dy);
    }
  }
}

template <typename Unit, int ITEMS, typename T, typename CS>
__device__ __forceinline__ void store_batch(const Unit (&w)[ITEMS], T* const (&at)[ITEMS], int dy, const CS& cs,
                                            unsigned sin_mask) {
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    if (at[i] != nullptr) w[i].rotate_store(at[i], dy, cs, sin_mask);
  }
}

// Every scalar of a launch, passed by value as one struct (cukern/rotary.py `PARAMS` packs it once per plan:
// one kernel argument where separate scalars would cost the host a conversion each). Strides are in
// elements and signed; every offset is 64-bit. `positions` is int32 or int64 (pos64): a uniform branch,
// cheaper than doubling the instantiations. The kernel takes it `const __grid_constant__`: its fields are
// then read from the constant bank where they are used, as separate parameters are. A plain by-value
// struct is a private copy the compiler loads into registers up front (+2 to +5 registers here, and a
// spill at the 64-register launch bound).
struct RotaryParams {
  long long tokens, q_ts, q_hs, k_ts, k_hs, pos_stride, cache_rows, cache_ts, sin_offset;
  int pos64, q_heads, heads, rot, lanes, groups, tokens_per_block;
  float sin_sign;
};

// k may be null when heads == q_heads.
template <typename T, typename C, int VEC, bool NEOX, int ITEMS, int MAX_BLOCK, int MIN_BLOCKS>
__global__ void __launch_bounds__(MAX_BLOCK, MIN_BLOCKS)
    rotary_embedding(T* __restrict__ q, T* __restrict__ k, const C* __restrict__ cache,
                     const void* __restrict__ positions, const __grid_constant__ RotaryParams p) {
  using Unit = RotaryUnit<T, VEC, NEOX>;
  const long long tokens = p.tokens, q_ts = p.q_ts, q_hs = p.q_hs, k_ts = p.k_ts, k_hs = p.k_hs;
  const long long pos_stride = p.pos_stride, cache_rows = p.cache_rows, cache_ts = p.cache_ts;
  const long long sin_offset = p.sin_offset;
  const int pos64 = p.pos64, q_heads = p.q_heads, heads = p.heads, rot = p.rot, lanes = p.lanes;
  const int groups = p.groups, tokens_per_block = p.tokens_per_block;
  const int tpt = lanes * groups;
  const int slot = static_cast<int>(threadIdx.x) / tpt;
  if (slot >= tokens_per_block) return;
  const int r = static_cast<int>(threadIdx.x) - slot * tpt;
  const int group = r / lanes;
  const int lane = r - group * lanes;
  const int half = rot / 2;
  const int units = half / VEC;
  const int dy = (NEOX || VEC > 1) ? half : 1;
  const int quarter = rot / 4;
  const long long step = static_cast<long long>(gridDim.x) * tokens_per_block;
  const unsigned sin_mask = p.sin_sign < 0.0f ? 0x80000000u : 0u;

  long long tok = static_cast<long long>(blockIdx.x) * tokens_per_block + slot;
  long long pos = tok < tokens ? read_position(positions, pos64, tok * pos_stride) : 0;
  for (; tok < tokens; tok += step) {
    const long long next = tok + step;
    const bool valid = pos >= 0 && pos < cache_rows;
    const C* row = cache + pos * cache_ts;
    T* qt = q + tok * q_ts;
    T* kt = k + tok * k_ts;

    for (int u = lane; u < units; u += lanes) {
      const int first = (NEOX || VEC > 1) ? u * VEC : 2 * u;
      // The first batch of q/k loads does not depend on the position: it is issued before the check.
      Unit w[ITEMS];
      T* at[ITEMS];
      load_batch<Unit, ITEMS>(w, at, group, groups, q_heads, heads, qt, kt, q_hs, k_hs, first, dy);
      if (!valid) continue;
      CosSin<C, VEC, NEOX> cs;
      cs.load(row, u, sin_offset, quarter);
      store_batch<Unit, ITEMS>(w, at, dy, cs, sin_mask);
      for (int h0 = group + groups * ITEMS; h0 < heads; h0 += groups * ITEMS) {
        load_batch<Unit, ITEMS>(w, at, h0, groups, q_heads, heads, qt, kt, q_hs, k_hs, first, dy);
        store_batch<Unit, ITEMS>(w, at, dy, cs, sin_mask);
      }
    }
    // the next token's position (grid capped by waves): read after this token's stores are issued
    pos = next < tokens ? read_position(positions, pos64, next * pos_stride) : 0;
  }
}

// The position check's scalars (cukern/rotary.py CHECK_PARAMS): the positions' stride in elements.
struct RotaryCheckParams {
  long long pos_stride, tokens, cache_rows;
};

// found[0]: the first token whose position is outside [0, cache_rows), or tokens if none; found[1]: that
// position (0 if none). found is host memory mapped into the device's address space, read by the host once
// the stream is synchronized. Launched as exactly one block of BLOCK threads.
template <typename P, int BLOCK, int UNROLL>
__global__ void __launch_bounds__(BLOCK)
    rotary_first_bad_position(long long* found, const P* positions, const __grid_constant__ RotaryCheckParams p) {
  const long long pos_stride = p.pos_stride, tokens = p.tokens, cache_rows = p.cache_rows;
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
