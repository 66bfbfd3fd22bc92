// Fused per-head RMSNorm and rotary position embedding of query and key (Qwen3, Gemma 3, OLMo 2), in place,
// one launch for both.
//
//   for every head v of q (weight qw) and of k (weight kw) of token t, p = positions[t]:
//     v = round(v / sqrt(mean(v^2) + eps) * (offset + w))          (the RMSNorm over head_size, as rms_norm.cu)
//     then the pairs j < rot / 2 of v turned by cache[p][j], cache[p][W / 2 + j]   (as rotary.cu)
//   a position outside [0, cache_rows) leaves its token normalized but not rotated and reads nothing from the
//   cache; elements from rot on are normalized only.
//
// The result is bit for bit rms_norm (over each head) followed by rotary_embedding: the same summation tree
// (rmsnorm.tree_classes of head_size), the same correctly rounded steps, the normalized head rounded to T
// before it is turned (as the two calls store it in between) and common/rope.cuh's turn. Nothing of the
// launch enters the arithmetic (cukern/reference.py `qk_norm_rope_emulated`).
//
// The six questions (cukern/qknorm.py `plan` computes the numbers for a given call):
// 1. Output tile: one head of one token per group of TPR lanes (TPR <= 32, a power of two: a group never
//    straddles a warp); BLOCK / TPR groups share a block and take consecutive (token, head) slots, q's heads
//    then k's. The grid covers the slots once, or is capped at a few waves with blocks walking further slots.
// 2. Input traffic: each element of q and k read once and written once with 16-byte accesses when the
//    pointers, strides, head_size and rot allow; lane u of a group moves vector columns u + i TPR, so a
//    group's accesses to a head are contiguous. The weights (head_size values each), the token's cache row
//    (rot values) and its position are re-read by every head of the token, from L1.
// 3. Accumulation: each head's sum of squares in float32, in rms_norm.cu's fixed tree over head_size: element
//    e in class e % C, each class summed in index order in one thread, the classes combined by
//    common/reduce.cuh's trees over a thread's leaves, the group's lanes and the thread's groups. The
//    rotation reduces nothing: two products and one sum an element, each rounded once (no fused
//    multiply-add), so the bits depend on neither the plan nor the vector width.
// 4. Staging: the head stays in registers, packed in T, from its load through the norm to the rotation:
//    ITEMS packs a thread, at most 64 bytes for the common head sizes. Where a pair's two halves are in one
//    thread (NeoX with rot / 2 a multiple of TPR vectors: PAIR items apart; GPT-J with vectors) nothing is
//    exchanged; GPT-J element-wise exchanges neighbours with one shuffle; other NeoX shapes pass the
//    normalized head through shared memory (head_size values a group, dynamic).
// 5. Tuning: C, VEC, TPR, GROUPS, ITEMS and PAIR follow from head_size, rot, the style, the dtype and the
//    alignment alone; the knobs are BLOCK and the grid cap. All in `plan`; none changes the bits.
// 6. Profile: about 10 flops an element against 2 * sizeof(T) bytes: memory-bound; the target is copy
//    bandwidth.
#include "common/bounds.cuh"
#include "common/dtype.cuh"
#include "common/reduce.cuh"
#include "common/rms.cuh"
#include "common/rows.cuh"
#include "common/rope.cuh"
#include "common/vec.cuh"

namespace cukern {

// Every scalar of a launch, one struct passed by value (cukern/qknorm.py `PARAMS` packs it once per
// call layout), read from the constant bank where used (see rotary.cu). Strides in elements, signed.
struct QkNormRopeParams {
  long long slots, q_ts, q_hs, k_ts, k_hs, pos_stride, cache_rows, cache_ts, sin_offset;
  int pos64, q_heads, heads, head_size, rot;
  float eps, offset;
};

// The (token, head) of a slot: 32-bit division whenever the numbers fit (a 64-bit one costs about a hundred
// instructions).
__device__ __forceinline__ void split_slot(long long n, int heads, long long& tok, int& h) {
  if (n <= 0xffffffffLL) {
    const unsigned t = static_cast<unsigned>(n) / static_cast<unsigned>(heads);
    tok = t;
    h = static_cast<int>(static_cast<unsigned>(n) - t * static_cast<unsigned>(heads));
  } else {
    tok = n / heads;
    h = static_cast<int>(n - tok * heads);
  }
}

// PAIR > 0: NeoX with a pair's halves PAIR items apart in one thread. PAIR == 0: NeoX through shared memory,
// or GPT-J (in a vector, or with the neighbouring lane when VEC == 1).
template <typename T, typename W, typename C, int VEC, int TPR, int GROUPS, int ITEMS, bool NEOX, int PAIR,
          int BLOCK>
__global__ void CUKERN_BOUNDS(BLOCK)
    qk_norm_rope(T* __restrict__ q, T* __restrict__ k, const W* __restrict__ qw, const W* __restrict__ kw,
                 const C* __restrict__ cache, const void* __restrict__ positions,
                 const __grid_constant__ QkNormRopeParams p) {
  static_assert(TPR >= 1 && TPR <= 32 && (TPR & (TPR - 1)) == 0, "a group is a power of two within a warp");
  static_assert(ITEMS % GROUPS == 0, "every group of classes gets the same number of vectors");
  static_assert(NEOX || PAIR == 0, "GPT-J pairs are neighbours");
  static_assert(PAIR == 0 || 2 * PAIR <= ITEMS, "both halves of a pair are among a thread's items");
  static_assert(NEOX || VEC == 1 || VEC % 2 == 0, "GPT-J vectors hold whole pairs");
  constexpr bool kShared = NEOX && PAIR == 0;
  constexpr int kSlots = BLOCK / TPR;
  extern __shared__ uint4 exchange_words[];  // kShared: head_size values of T per group, 16-byte aligned

  const int lane = static_cast<int>(threadIdx.x) % TPR;
  const int slot = static_cast<int>(threadIdx.x) / TPR;
  const int head_size = p.head_size, rot = p.rot, half = rot / 2, q_heads = p.q_heads;
  const float eps = p.eps, offset = p.offset;
  const float unweighted = __fadd_rn(offset, 1.f);
  T* exchange = reinterpret_cast<T*>(exchange_words) + static_cast<long long>(slot) * head_size;

  for (long long first = static_cast<long long>(blockIdx.x) * kSlots; first < p.slots;
       first += static_cast<long long>(gridDim.x) * kSlots) {
    // Every lane of a warp runs every iteration (dead slots with zeros): the shuffles and __syncwarp need it.
    const long long n = first + slot;
    const bool live = n < p.slots;
    long long tok;
    int h;
    split_slot(live ? n : 0, p.heads, tok, h);
    const bool is_q = h < q_heads;
    T* head = is_q ? q + tok * p.q_ts + h * p.q_hs : k + tok * p.k_ts + (h - q_heads) * p.k_hs;
    const W* weight = is_q ? qw : kw;

    // Every load of the head is issued before any value is used, then the position, whose latency they hide.
    bool in[ITEMS];
    Pack<T, VEC> a[ITEMS];
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      const int col = (lane + i * TPR) * VEC;
      in[i] = live && col < head_size;
      if (in[i]) {
        load(a[i], head + col);
      } else {
#pragma unroll
        for (int w = 0; w < Pack<T, VEC>::kWords; ++w) a[i].w[w] = {};
      }
    }
    const long long pos = live ? read_position(positions, p.pos64, tok * p.pos_stride) : -1;
    const bool turned = live && pos >= 0 && pos < p.cache_rows;
    const C* row = cache + (turned ? pos : 0) * p.cache_ts;
    const C* sin_row = row + p.sin_offset;
    // The token's cos and sin (a cold line from DRAM for the first of its heads on this SM) are asked for
    // now, so that their latency overlaps the head's loads and the norm rather than following them.
    if constexpr ((NEOX && PAIR > 0) || (!NEOX && VEC > 1)) {
      if (turned) {
#pragma unroll
        for (int i = 0; i < (NEOX ? PAIR : ITEMS); ++i) {
          const int at = NEOX ? (lane + i * TPR) * VEC : (lane + i * TPR) * VEC / 2;
          if (at < half) {
            prefetch_l1(row + at);
            prefetch_l1(sin_row + at);
          }
        }
      }
    }

    // The sum of squares in rms_norm.cu's tree: item i holds classes ((i % GROUPS) TPR + lane) VEC + j, the
    // items of one class in index order; empty slots add +0.
    float acc[GROUPS][VEC];
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float f = to_float(a[i].v[j]);
        acc[i % GROUPS][j] = i < GROUPS ? __fmul_rn(f, f) : square_add(acc[i % GROUPS][j], f);
      }
    }
    float part[GROUPS];
#pragma unroll
    for (int g = 0; g < GROUPS; ++g) part[g] = group_tree_reduce<TPR, Sum>(tree_reduce<Sum>(acc[g]));
    const float inv = inverse_rms(tree_reduce<Sum>(part), head_size, eps);

    // The normalized head, rounded to T as rms_norm stores it, replaces the loaded one in registers.
#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      float f[VEC];
      if (weight != nullptr && in[i]) {
        Pack<W, VEC> w;
        load(w, weight + (lane + i * TPR) * VEC);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          f[j] = __fmul_rn(__fmul_rn(to_float(a[i].v[j]), inv), __fadd_rn(offset, to_float(w.v[j])));
        }
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) f[j] = __fmul_rn(__fmul_rn(to_float(a[i].v[j]), inv), unweighted);
      }
      round_into(a[i], f);
    }

    if constexpr (NEOX && PAIR > 0) {
      // Item i < PAIR holds x of pairs (lane + i TPR) VEC + j, item i + PAIR their y.
      if (turned) {
#pragma unroll
        for (int i = 0; i < PAIR; ++i) {
          const int pair0 = (lane + i * TPR) * VEC;
          Pack<C, VEC> cp, sp;
          load(cp, row + pair0);
          load(sp, sin_row + pair0);
          float x[VEC], y[VEC], c[VEC], s[VEC], xo[VEC], yo[VEC];
          widen(x, a[i]);
          widen(y, a[i + PAIR]);
          widen(c, cp);
          widen(s, sp);
#pragma unroll
          for (int j = 0; j < VEC; ++j) turn(x[j], y[j], c[j], s[j], 0u, xo[j], yo[j]);
          round_into(a[i], xo);
          round_into(a[i + PAIR], yo);
        }
      }
    } else if constexpr (NEOX) {
      // The head through shared memory: each thread writes its vectors, then turns its own against the other
      // half's. The barrier before the writes keeps them off values a lane of the previous slot still reads.
      __syncwarp();
#pragma unroll
      for (int i = 0; i < ITEMS; ++i) {
        if (in[i]) store(exchange + (lane + i * TPR) * VEC, a[i]);
      }
      __syncwarp();
      if (turned) {
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
          const int e = (lane + i * TPR) * VEC;
          if (in[i] && e < rot) {
            const bool second = e >= half;
            const int pair0 = second ? e - half : e;
            Pack<T, VEC> other;
            load(other, exchange + (second ? pair0 : e + half));
            Pack<C, VEC> cp, sp;
            load(cp, row + pair0);
            load(sp, sin_row + pair0);
            float v[VEC], o[VEC], c[VEC], s[VEC], r[VEC];
            widen(v, a[i]);
            widen(o, other);
            widen(c, cp);
            widen(s, sp);
#pragma unroll
            for (int j = 0; j < VEC; ++j) r[j] = turn_one(v[j], o[j], c[j], s[j], second);
            round_into(a[i], r);
          }
        }
      }
    } else if constexpr (VEC > 1) {
      // GPT-J: a vector holds VEC / 2 whole pairs (2m, 2m + 1); rot is a multiple of VEC.
      if (turned) {
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
          const int e = (lane + i * TPR) * VEC;
          if (in[i] && e < rot) {
            Pack<C, VEC / 2> cp, sp;
            load(cp, row + e / 2);
            load(sp, sin_row + e / 2);
            float v[VEC], c[VEC / 2], s[VEC / 2], r[VEC];
            widen(v, a[i]);
            widen(c, cp);
            widen(s, sp);
#pragma unroll
            for (int m = 0; m < VEC / 2; ++m) turn(v[2 * m], v[2 * m + 1], c[m], s[m], 0u, r[2 * m], r[2 * m + 1]);
            round_into(a[i], r);
          }
        }
      }
    } else {
      // GPT-J element-wise: element e pairs with e ^ 1, held by lane ^ 1 (TPR is even) in the same item.
#pragma unroll
      for (int i = 0; i < ITEMS; ++i) {
        const int e = lane + i * TPR;
        const float v = to_float(a[i].v[0]);
        const float o = __shfl_xor_sync(0xffffffffu, v, 1);
        if (turned && in[i] && e < rot) {
          const float r = turn_one(v, o, to_float(row[e / 2]), to_float(sin_row[e / 2]), e & 1);
          a[i].v[0] = from_float<T>(r);
        }
      }
    }

#pragma unroll
    for (int i = 0; i < ITEMS; ++i) {
      if (in[i]) store(head + (lane + i * TPR) * VEC, a[i]);
    }
  }
}

}  // namespace cukern
