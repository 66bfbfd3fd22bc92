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
// rotary_embedding_positions is the same rotation with no cache: each block first computes cos and sin of its
// tokens' angles p w_j (w_j: the pair's frequency, float64 from the host) into shared memory, each (token,
// pair) once, with cos_sin_at below, then rotates as rotary_embedding does from that table (the same lanes,
// groups, units and turn). Its cos and sin are within half a float32 ulp, plus 2^-40, of a cos(p w_j) and
// a sin(p w_j) for |p| < 2^24: the float32 cache's accuracy, at any position in that range.
//
// rotary_embedding_mrope is the same rotation with three positions a token (multimodal RoPE), each pair's cos
// and sin from the cache row of its section's position (see RotaryMropeParams).
//
// rotary_first_bad_position is the host-checked mode's guard: one block finds the first token whose
// position is out of range (reading ahead UNROLL positions a thread) and writes it into pinned host memory,
// so the host syncs once, reads it without a copy and raises before the rotation is launched.
#include "common/bounds.cuh"
#include "common/dtype.cuh"
#include "common/rope.cuh"
#include "common/vec.cuh"

namespace cukern {

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

// ITEMS heads h0, h0 + groups, ... (q's first, then k's) of one token: pointers and loads. Head indices are
// unsigned, as are the loops that step h0: heads reach 2^31 - 1, and a step past the last passes int's range.
template <typename Unit, int ITEMS, typename T>
__device__ __forceinline__ void load_batch(Unit (&w)[ITEMS], T* (&at)[ITEMS], unsigned h0, unsigned groups,
                                           unsigned q_heads, unsigned heads, T* qt, T* kt, long long q_hs,
                                           long long k_hs, int first, int dy) {
#pragma unroll
  for (int i = 0; i < ITEMS; ++i) {
    const unsigned h = h0 + i * groups;
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
__global__ void __launch_bounds__(MAX_BLOCK, arch_min_blocks(MIN_BLOCKS))
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
      for (unsigned h0 = group + groups * ITEMS; h0 < static_cast<unsigned>(heads); h0 += groups * ITEMS) {
        load_batch<Unit, ITEMS>(w, at, h0, groups, q_heads, heads, qt, kt, q_hs, k_hs, first, dy);
        store_batch<Unit, ITEMS>(w, at, dy, cs, sin_mask);
      }
    }
    // the next token's position (grid capped by waves): read after this token's stores are issued
    pos = next < tokens ? read_position(positions, pos64, next * pos_stride) : 0;
  }
}

// rotary_embedding_mrope: multimodal RoPE (Qwen2-VL, Qwen2.5-VL, Qwen3-VL). A token has three positions
// (temporal, height, width: positions[r][t], rows pos_row_stride apart) and each pair j takes cos and sin from
// the cache row of one of them: sections of pairs [0, a) -> 0, [a, b) -> 1, [b, rot/2) -> 2; interleaved,
// pair j -> 1 when j % 3 == 1 and j < a, -> 2 when j % 3 == 2 and j < b, else 0. A token any of whose three
// positions is outside the cache is left as it is. Otherwise the launch, the units and turn are
// rotary_embedding's; the unit's cos and sin are gathered pair by pair from L1 into registers, then serve
// every head of the token.
struct RotaryMropeParams {
  long long tokens, q_ts, q_hs, k_ts, k_hs, pos_stride, pos_row_stride, cache_rows, cache_ts, sin_offset;
  int pos64, q_heads, heads, rot, lanes, groups, tokens_per_block, section_a, section_b, interleaved;
};

// The cos and sin of a unit's VEC pairs (pair indices as CosSin's), each from its section's cache row.
template <int VEC, bool NEOX> struct MropeCosSin {
  float c[VEC], s[VEC];

  template <typename C>
  __device__ __forceinline__ void load(const C* const (&rows)[3], int u, long long sin_offset, int quarter,
                                       const RotaryMropeParams& p) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      int j;
      if constexpr (NEOX || VEC == 1) {
        j = u * VEC + i;
      } else {
        j = (i < VEC / 2 ? 0 : quarter) + u * (VEC / 2) + i % (VEC / 2);
      }
      const int m = j % 3;
      const int r = p.interleaved ? ((m == 1 && j < p.section_a) ? 1 : (m == 2 && j < p.section_b) ? 2 : 0)
                                  : (j < p.section_a ? 0 : j < p.section_b ? 1 : 2);
      const C* row = r == 0 ? rows[0] : r == 1 ? rows[1] : rows[2];
      c[i] = to_float(row[j]);
      s[i] = to_float(row[sin_offset + j]);
    }
  }

  __device__ __forceinline__ void widen(float (&cf)[VEC], float (&sf)[VEC]) const {
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      cf[i] = c[i];
      sf[i] = s[i];
    }
  }
};

// One block an SM in the launch bound: the gathered cos and sin, in float, need more than 64 registers.
template <typename T, typename C, int VEC, bool NEOX, int ITEMS, int MAX_BLOCK>
__global__ void __launch_bounds__(MAX_BLOCK, 1)
    rotary_embedding_mrope(T* __restrict__ q, T* __restrict__ k, const C* __restrict__ cache,
                           const void* __restrict__ positions, const __grid_constant__ RotaryMropeParams p) {
  using Unit = RotaryUnit<T, VEC, NEOX>;
  const int lanes = p.lanes, groups = p.groups, tpb = p.tokens_per_block, heads = p.heads;
  const int tpt = lanes * groups;
  const int slot = static_cast<int>(threadIdx.x) / tpt;
  if (slot >= tpb) return;
  const int rest = static_cast<int>(threadIdx.x) - slot * tpt;
  const int group = rest / lanes;
  const int lane = rest - group * lanes;
  const int half = p.rot / 2;
  const int units = half / VEC;
  const int dy = (NEOX || VEC > 1) ? half : 1;
  const int quarter = p.rot / 4;
  for (long long tok = static_cast<long long>(blockIdx.x) * tpb + slot; tok < p.tokens;
       tok += static_cast<long long>(gridDim.x) * tpb) {
    T* qt = q + tok * p.q_ts;
    T* kt = k + tok * p.k_ts;
    long long pos[3];
    bool valid = true;
#pragma unroll
    for (int r = 0; r < 3; ++r) {
      pos[r] = read_position(positions, p.pos64, r * p.pos_row_stride + tok * p.pos_stride);
      valid = valid && pos[r] >= 0 && pos[r] < p.cache_rows;
    }
    if (!valid) continue;
    const C* const rows[3] = {cache + pos[0] * p.cache_ts, cache + pos[1] * p.cache_ts, cache + pos[2] * p.cache_ts};
    for (int u = lane; u < units; u += lanes) {
      const int first = (NEOX || VEC > 1) ? u * VEC : 2 * u;
      MropeCosSin<VEC, NEOX> cs;
      cs.load(rows, u, p.sin_offset, quarter, p);
      for (unsigned h0 = group; h0 < static_cast<unsigned>(heads); h0 += groups * ITEMS) {
        Unit w[ITEMS];
        T* at[ITEMS];
        load_batch<Unit, ITEMS>(w, at, h0, groups, p.q_heads, heads, qt, kt, p.q_hs, p.k_hs, first, dy);
        store_batch<Unit, ITEMS>(w, at, dy, cs, 0u);
      }
    }
  }
}

// rotary_embedding_positions' scalars (cukern/rotary.py POSITIONS_PARAMS): strides in elements; the attention
// factor; 2 / pi and pi / 2 in three parts (pio2_1 + pio2_2 + pio2_3, the first two of 29 significant bits).
struct RotaryPositionsParams {
  long long tokens, q_ts, q_hs, k_ts, k_hs, pos_stride;
  double attention, two_over_pi, pio2_1, pio2_2, pio2_3;
  int pos64, q_heads, heads, rot, lanes, groups, tokens_per_block;
};

// a cos(p w) and a sin(p w) rounded to float, w = w_hi + w_lo with w_hi of 29 significant bits (the host splits
// it), every float64 step rounded to nearest with no fused multiply-add, so cukern/reference.py
// `rotary_positions_cos_sin` repeats it bit for bit. For |p| < 2^24 and |w| <= 1: p w_hi and p w_lo are exact
// (24 + 29 bits), k = rint(p w_hi 2 / pi) < 2^24, so k pio2_1 and k pio2_2 are exact and p w_hi - k pio2_1
// is exact (Sterbenz), and r = p w - k pi / 2 comes out with an error of a few 2^-54 in |r| < 0.82, where the
// Taylor series to r^17 (sin) and r^18 (cos) are within 2^-60 of sin r and cos r. The float64 results are thus
// within about 2^-52 of the true values, and rounding them to float adds at most half an ulp.
__device__ __forceinline__ void cos_sin_at(long long pos, double w_hi, double w_lo, const RotaryPositionsParams& p,
                                           float& c_out, float& s_out) {
  const double x = static_cast<double>(pos);
  const double a_hi = __dmul_rn(x, w_hi), a_lo = __dmul_rn(x, w_lo);
  const double k = rint(__dmul_rn(a_hi, p.two_over_pi));
  double r = __dsub_rn(a_hi, __dmul_rn(k, p.pio2_1));
  r = __dsub_rn(r, __dmul_rn(k, p.pio2_2));
  r = __dadd_rn(r, a_lo);
  r = __dsub_rn(r, __dmul_rn(k, p.pio2_3));
  const double r2 = __dmul_rn(r, r);
  double sp = -1.0 / 355687428096000.0;  // -1 / 17!
  sp = __dadd_rn(1.0 / 1307674368000.0, __dmul_rn(r2, sp));
  sp = __dadd_rn(-1.0 / 6227020800.0, __dmul_rn(r2, sp));
  sp = __dadd_rn(1.0 / 39916800.0, __dmul_rn(r2, sp));
  sp = __dadd_rn(-1.0 / 362880.0, __dmul_rn(r2, sp));
  sp = __dadd_rn(1.0 / 5040.0, __dmul_rn(r2, sp));
  sp = __dadd_rn(-1.0 / 120.0, __dmul_rn(r2, sp));
  sp = __dadd_rn(1.0 / 6.0, __dmul_rn(r2, sp));
  const double sin_r = __dsub_rn(r, __dmul_rn(__dmul_rn(r, r2), sp));  // r - r^3 (1/6 - r^2 / 120 + ...)
  double cp = 1.0 / 6402373705728000.0;  // 1 / 18!
  cp = __dadd_rn(-1.0 / 20922789888000.0, __dmul_rn(r2, cp));
  cp = __dadd_rn(1.0 / 87178291200.0, __dmul_rn(r2, cp));
  cp = __dadd_rn(-1.0 / 479001600.0, __dmul_rn(r2, cp));
  cp = __dadd_rn(1.0 / 3628800.0, __dmul_rn(r2, cp));
  cp = __dadd_rn(-1.0 / 40320.0, __dmul_rn(r2, cp));
  cp = __dadd_rn(1.0 / 720.0, __dmul_rn(r2, cp));
  cp = __dadd_rn(-1.0 / 24.0, __dmul_rn(r2, cp));
  cp = __dadd_rn(0.5, __dmul_rn(r2, cp));
  const double cos_r = __dsub_rn(1.0, __dmul_rn(r2, cp));  // 1 - r^2 (1/2 - r^2 / 24 + ...)
  // theta = r + k pi / 2: the quadrant k mod 4 swaps and negates (exact)
  const int quadrant = static_cast<int>(static_cast<long long>(k) & 3);
  const double c = quadrant == 0 ? cos_r : quadrant == 1 ? -sin_r : quadrant == 2 ? -cos_r : sin_r;
  const double s = quadrant == 0 ? sin_r : quadrant == 1 ? cos_r : quadrant == 2 ? -sin_r : -cos_r;
  c_out = __double2float_rn(__dmul_rn(p.attention, c));
  s_out = __double2float_rn(__dmul_rn(p.attention, s));
}

// freqs: rot / 2 pairs (w_hi, w_lo). Dynamic shared memory: tokens_per_block rows of rot floats (cos, then sin).
// The launch bound names one block an SM: left implicit, ptxas kept the NeoX 16-byte form in 64 registers and
// spilled; holding the first loads across the table's float64 work, it takes under 96.
template <typename T, int VEC, bool NEOX, int ITEMS, int MAX_BLOCK>
__global__ void __launch_bounds__(MAX_BLOCK, 1)
    rotary_embedding_positions(T* __restrict__ q, T* __restrict__ k, const double* __restrict__ freqs,
                               const void* __restrict__ positions, const __grid_constant__ RotaryPositionsParams p) {
  using Unit = RotaryUnit<T, VEC, NEOX>;
  extern __shared__ float4 table_words[];
  float* table = reinterpret_cast<float*>(table_words);
  const long long tokens = p.tokens;
  const int rot = p.rot, half = rot / 2, lanes = p.lanes, groups = p.groups, tpb = p.tokens_per_block;
  const int tpt = lanes * groups;
  const int slot = static_cast<int>(threadIdx.x) / tpt;
  const int rest = static_cast<int>(threadIdx.x) - slot * tpt;
  const int group = rest / lanes;
  const int lane = rest - group * lanes;
  const int units = half / VEC;
  const int dy = (NEOX || VEC > 1) ? half : 1;
  const int quarter = rot / 4;

  for (long long first = static_cast<long long>(blockIdx.x) * tpb; first < tokens;
       first += static_cast<long long>(gridDim.x) * tpb) {
    const long long tok = first + slot;
    const bool mine = slot < tpb && tok < tokens;
    T* qt = q + tok * p.q_ts;
    T* kt = k + tok * p.k_ts;
    // A thread's first batch of q/k loads does not depend on the table: issued before it is computed, so the
    // float64 work overlaps them.
    Unit w[ITEMS];
    T* ptr[ITEMS];
    if (mine && lane < units) {
      load_batch<Unit, ITEMS>(w, ptr, group, groups, p.q_heads, p.heads, qt, kt, p.q_hs, p.k_hs,
                              (NEOX || VEC > 1) ? lane * VEC : 2 * lane, dy);
    }
    __syncthreads();  // the previous tokens' rotations have read the table
    for (int i = static_cast<int>(threadIdx.x); i < tpb * half; i += static_cast<int>(blockDim.x)) {
      const int t = i / half, j = i - t * half;
      const long long tok = first + t;
      if (tok < tokens) {
        float c, s;
        cos_sin_at(read_position(positions, p.pos64, tok * p.pos_stride), freqs[2 * j], freqs[2 * j + 1], p, c, s);
        table[t * rot + j] = c;
        table[t * rot + half + j] = s;
      }
    }
    __syncthreads();
    if (!mine) continue;
    const float* row = table + slot * rot;
    for (int u = lane; u < units; u += lanes) {
      const int at = (NEOX || VEC > 1) ? u * VEC : 2 * u;
      CosSin<float, VEC, NEOX> cs;
      cs.load(row, u, half, quarter);
      if (u != lane) load_batch<Unit, ITEMS>(w, ptr, group, groups, p.q_heads, p.heads, qt, kt, p.q_hs, p.k_hs, at, dy);
      store_batch<Unit, ITEMS>(w, ptr, dy, cs, 0u);
      for (unsigned h0 = group + groups * ITEMS; h0 < static_cast<unsigned>(p.heads); h0 += groups * ITEMS) {
        load_batch<Unit, ITEMS>(w, ptr, h0, groups, p.q_heads, p.heads, qt, kt, p.q_hs, p.k_hs, at, dy);
        store_batch<Unit, ITEMS>(w, ptr, dy, cs, 0u);
      }
    }
  }
}

// The position check's scalars (cukern/rotary.py CHECK_PARAMS): the positions' stride in elements.
struct RotaryCheckParams {
  long long pos_stride, tokens, cache_rows;
};

// found[0]: the first token whose position is outside [0, cache_rows), or tokens if none; found[1]: that
// position (0 if none). found is host memory mapped into the device's address space: the host sets found[0]
// to -1 before the launch and waits for it to change (cukern/rotary.py), so found[1] is written first and a
// system-scope fence orders the two stores. Launched as exactly one block of BLOCK threads.
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
    found[1] = best < tokens ? static_cast<long long>(positions[best * pos_stride]) : 0;
    __threadfence_system();
    found[0] = best;
  }
}

}  // namespace cukern
