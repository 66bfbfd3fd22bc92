// Arg-reductions: argmax, argmin, nanargmax, nanargmin (cukern/argreduce.py); for complex inputs also the
// index cukern.amax / amin / nanmax / nanmin gather their result from (cukern/reduce.py).
//
//   out[r] = the least i in [0, n) whose x[r, i] is best: the largest (argmax) or smallest (argmin) value,
//            a NaN counting as better than any number (NumPy: the first NaN wins), or, for the nan forms, as
//            worse than any number (an all-NaN row is an error the host raises).
//
// Every element becomes an unsigned key whose unsigned order is the op's order (below), so all four ops
// and every dtype are one search: the pair (key, index) with the largest key and, among equal keys, the
// least index. That is a total order on pairs, and the winner of a total order is the same whichever
// pairs meet first, so any split over threads, blocks and launches gives the same index: the result
// depends on the values alone, never on the grid, the block, the knobs, the SM count or the GPU, with
// no fixed tree to keep (cukern/reference.py `argmax_emulated` and its siblings compute the same keys).
// Complex numbers are ordered as NumPy orders them, lexicographically (real part, then imaginary part), so
// their key is the real part's key followed by the imaginary part's: 64 bits for complex64, two 64-bit
// words (Key128) for complex128, where a NaN in either part makes the whole element a NaN.
//
// The six questions (cukern/argreduce.py `plan` keeps the launch math as a pure plan; the card in
// cukern/lab/argreduce.py shows the same answers):
// 1. Output tile: argreduce_span: rows x spans x ways blocks. A row is cut into spans of `span` consecutive
//    indices (one span unless the row is longer than a 32-bit count allows), and `ways` blocks search each
//    span together, interleaved: block w takes its span's steps w, w + ways, w + 2 ways, ..., a step being
//    BLOCK x UNROLL vectors, so the whole grid sweeps memory as one front (thousands of blocks each
//    streaming a distant contiguous run read slower: docs/design/argreduce.md). The last block of a row to finish
//    combines the row's partials. argreduce_cols: one row per thread, for rows that lie next to each other in memory
//    (a reduction over the leading axis of a C-ordered array), walking its row index by index.
// 2. Input traffic: every element read once, the int64 result written once. A span of a unit-stride row
//    is read as 16-byte vectors, UNROLL in flight per thread, with element loads for the unaligned head
//    and the tail; other strides read element by element (coalesced in the column kernel, where a warp's
//    threads own adjacent rows).
// 3. Accumulation: no arithmetic: per thread the best (key, index) pair, then shuffles, shared memory
//    (common/reduce.cuh's block_tree_reduce, with the pair's shuffle below) and the blocks'
//    partials. Any order gives the same result (above).
// 4. Staging: registers; shared memory for the block combine (2 * BLOCK / 32 pairs) and one flag.
// 5. Tuning: how many blocks search a row (cukern/argreduce.py `Knobs`: blocks per SM and the least
//    number of indices a block searches); neither can change a result.
// 6. Profile: a handful of integer operations per element against sizeof(T) bytes: memory-bound; the
//    target is the device-to-device copy bandwidth.
#include "common/dtype.cuh"
#include "common/vec.cuh"
#include "common/reduce.cuh"

namespace cukern {

constexpr int ARG_BLOCK = 256;  // cukern/argreduce.py BLOCK
constexpr int ARG_UNROLL = 4;
constexpr long long NO_INDEX = 0x7fffffffffffffffll;

// How the bits of an element are ordered (cukern/argreduce.py KINDS): IEEE floats of 4 or 8 bytes, the
// two 16-bit floats, two's complement and unsigned integers, bool (any nonzero byte is True), and complex
// numbers of two IEEE parts (8 or 16 bytes, the real part first in memory).
enum : int { KIND_FLOAT = 0, KIND_HALF = 1, KIND_BFLOAT = 2, KIND_SIGNED = 3, KIND_UNSIGNED = 4, KIND_BOOL = 5,
             KIND_COMPLEX = 6 };

template <int BYTES> struct Bits;
template <> struct Bits<1> { using type = unsigned char; };
template <> struct Bits<2> { using type = unsigned short; };
template <> struct Bits<4> { using type = unsigned; };
template <> struct Bits<8> { using type = unsigned long long; };
template <> struct Bits<16> { using type = ulonglong2; };  // complex128: one 16-byte load, x the real part

// A complex128 key: the real part's 64-bit key (hi), then the imaginary part's (lo), compared
// lexicographically. An aggregate without constructors, so shared memory can hold it; splat makes one.
struct Key128 {
  unsigned long long hi, lo;
};
__device__ __forceinline__ bool operator>(const Key128& a, const Key128& b) {
  return a.hi > b.hi || (a.hi == b.hi && a.lo > b.lo);
}
__device__ __forceinline__ bool operator==(const Key128& a, const Key128& b) { return a.hi == b.hi && a.lo == b.lo; }

// Keys of up to 32 bits are compared as 32-bit words, 64-bit ones as such, 128-bit ones as Key128.
template <int BYTES> struct KeyOf { using type = typename Bits<(BYTES < 4 ? 4 : BYTES)>::type; };
template <> struct KeyOf<16> { using type = Key128; };
template <int BYTES> using key_t = typename KeyOf<BYTES>::type;

// A key whose every word is v (the launch's flip and nan_key are 0 or all ones; 0 is the no-key key).
template <typename K> __device__ __forceinline__ K splat(unsigned long long v) {
  if constexpr (sizeof(K) == 16) {
    return K{v, v};
  } else {
    return static_cast<K>(v);
  }
}

// One IEEE part of a complex number (4 or 8 bytes): whether it is a NaN, and its order bits as the float
// kind's key below (-0 as +0) before any flip.
template <typename P> __device__ __forceinline__ bool part_is_nan(P b) {
  constexpr P kSign = static_cast<P>(P(1) << (8 * sizeof(P) - 1));
  constexpr P kInf = static_cast<P>(sizeof(P) == 4 ? 0x7f800000ull : 0x7ff0000000000000ull);
  return static_cast<P>(b & ~kSign) > kInf;
}
template <typename P> __device__ __forceinline__ P part_order(P b) {
  constexpr P kSign = static_cast<P>(P(1) << (8 * sizeof(P) - 1));
  const P mag = static_cast<P>(b & ~kSign);
  return (b & kSign) && mag ? static_cast<P>(~b) : static_cast<P>(mag | kSign);
}

// A complex element's key: NaN if either part is (NumPy's max, min, argmax and argmin let such an element
// win, its nan forms skip it), else the real part's order bits over the imaginary part's, all flipped for
// the minima (flipping every bit reverses the lexicographic order too). No number's key is 0 or all ones
// (the real part's word never is), so the all-NaN test below holds for complex rows as well.
template <int BYTES>
__device__ __forceinline__ key_t<BYTES> complex_key(typename Bits<BYTES>::type b, key_t<BYTES> flip,
                                                    key_t<BYTES> nan_key) {
  if constexpr (BYTES == 8) {
    const unsigned re = static_cast<unsigned>(b), im = static_cast<unsigned>(b >> 32);
    if (part_is_nan(re) || part_is_nan(im)) return nan_key;
    return ((static_cast<unsigned long long>(part_order(re)) << 32) | part_order(im)) ^ flip;
  } else {
    if (part_is_nan(b.x) || part_is_nan(b.y)) return nan_key;
    return Key128{part_order(b.x) ^ flip.hi, part_order(b.y) ^ flip.lo};
  }
}

// The bits of a positive infinity: a float's magnitude above it is a NaN.
template <int KIND, int BYTES> __device__ __forceinline__ constexpr unsigned long long infinity_bits() {
  return KIND == KIND_HALF     ? 0x7c00ull
         : KIND == KIND_BFLOAT ? 0x7f80ull
         : BYTES == 4          ? 0x7f800000ull
                               : 0x7ff0000000000000ull;
}

// The key of an element's bits b. Floats: a number's key grows with its value (a positive number sets the
// sign bit over its magnitude, a negative one inverts all its bits; -0 takes +0's key, since NumPy calls
// them equal and the first of them wins), then `flip` (all ones for argmin, else 0) reverses the order;
// a NaN takes `nan_key` whatever `flip` is: all ones (it beats every number) or 0 (it loses to every
// number). No number's key is 0 or all ones, so a row's best key is 0 exactly when the row is all NaN.
// Integers: the sign bit inverted (signed) or the bits as they are, then `flip`. Complex: complex_key.
template <int KIND, int BYTES>
__device__ __forceinline__ key_t<BYTES> element_key(typename Bits<BYTES>::type b, key_t<BYTES> flip,
                                                    key_t<BYTES> nan_key) {
  if constexpr (KIND == KIND_COMPLEX) {
    return complex_key<BYTES>(b, flip, nan_key);
  } else {
    using U = typename Bits<BYTES>::type;
    using K = key_t<BYTES>;
    constexpr U kSign = static_cast<U>(U(1) << (8 * BYTES - 1));
    constexpr K kMask = static_cast<K>(static_cast<U>(~U(0)));
    if constexpr (KIND == KIND_BOOL) {
      return (b != 0 ? K(1) : K(0)) ^ (flip & kMask);
    } else if constexpr (KIND == KIND_SIGNED) {
      return static_cast<K>(static_cast<U>(b ^ kSign)) ^ (flip & kMask);
    } else if constexpr (KIND == KIND_UNSIGNED) {
      return static_cast<K>(b) ^ (flip & kMask);
    } else {
      // No branch: -0 becomes +0, then one shift of the sign makes the mask (all ones for a negative
      // number, the sign bit alone else) and the NaN test is a select. The same keys as a test-and-branch
      // form, whose early return for a NaN cost argmax fp32 2^28 3% of the copy (docs/design/argreduce.md).
      const U mag = static_cast<U>(b & static_cast<U>(~kSign));
      const U c = mag ? b : U(0);
      const U mask = static_cast<U>(static_cast<U>(U(0) - static_cast<U>(c >> (8 * BYTES - 1))) | kSign);
      const K k = static_cast<K>(static_cast<U>(c ^ mask)) ^ (flip & kMask);
      return mag > static_cast<U>(infinity_bits<KIND, BYTES>()) ? static_cast<K>(nan_key & kMask) : k;
    }
  }
}

// A candidate: its key and its index in the row (NO_INDEX: none yet, beaten by any element).
template <typename K> struct Best {
  K key;
  long long index;
};

template <typename K> __device__ __forceinline__ bool beats(K key, long long index, const Best<K>& b) {
  return key > b.key || (key == b.key && index < b.index);
}

template <typename K> __device__ __forceinline__ void offer(Best<K>& b, K key, long long index) {
  if (beats(key, index, b)) b = {key, index};
}

// The pair order as a combine for common/reduce.cuh: commutative bit for bit, since two distinct pairs
// never tie.
struct ArgBest {
  template <typename B> __device__ __forceinline__ static B identity() {
    return B{splat<decltype(B::key)>(0), NO_INDEX};
  }
  template <typename B> __device__ __forceinline__ static B apply(B a, B b) { return beats(b.key, b.index, a) ? b : a; }
};

// common/reduce.cuh's shuffle for a pair, field by field (its trees find this overload by argument-dependent
// lookup, so block_tree_reduce takes pairs as they are); a Key128 word by word.
template <typename K> __device__ __forceinline__ K shuffle_key(K k, int m) {
  return __shfl_xor_sync(0xffffffffu, k, m);
}
__device__ __forceinline__ Key128 shuffle_key(Key128 k, int m) {
  return {__shfl_xor_sync(0xffffffffu, k.hi, m), __shfl_xor_sync(0xffffffffu, k.lo, m)};
}
template <typename K> __device__ __forceinline__ Best<K> shuffle_xor(Best<K> v, int m) {
  return {shuffle_key(v.key, m), __shfl_xor_sync(0xffffffffu, v.index, m)};
}

// A partial's key read past L1 (another block wrote it), word by word.
template <typename K> __device__ __forceinline__ K load_key_cg(const K* k) { return __ldcg(k); }
__device__ __forceinline__ Key128 load_key_cg(const Key128* k) { return {__ldcg(&k->hi), __ldcg(&k->lo)}; }

// The block's best pair, in every thread (parity as for common/reduce.cuh's block_tree_reduce).
template <typename K> __device__ __forceinline__ Best<K> block_best(const Best<K>& v, Best<K>* scratch, int parity) {
  const Best<K> one[1] = {v};
  return block_tree_reduce<ARG_BLOCK, ArgBest>(one, scratch, parity);
}

// Every scalar of a launch (cukern/argreduce.py PARAMS, the same fields in the same order). Row r starts
// at element (r / inner) * s0 + (r % inner) * s1 of x; its element i is `stride` further on, i < n.
struct ArgParams {
  long long inner, s0, s1;
  long long n, stride;
  long long span, spans, ways;  // argreduce_span: indices per span, spans per row, blocks per span
  long long rows;
  unsigned long long flip, nan_key;
  int check_nan;  // nanargmax / nanargmin of a float: flag a row whose best key is 0 (all NaN)
};

__device__ __forceinline__ long long row_start(unsigned row, const ArgParams& p) {
  const unsigned inner = static_cast<unsigned>(p.inner);  // at most the row count, below 2^31
  const unsigned q = row / inner;
  return static_cast<long long>(q) * p.s0 + static_cast<long long>(row - q * inner) * p.s1;
}

template <int KIND, int BYTES>
__device__ __forceinline__ key_t<BYTES> key_at(const typename Bits<BYTES>::type* x, long long at, const ArgParams& p) {
  return element_key<KIND, BYTES>(x[at], splat<key_t<BYTES>>(p.flip), splat<key_t<BYTES>>(p.nan_key));
}

template <typename K> __device__ __forceinline__ void finish_row(long long* out, int* all_nan, unsigned row,
                                                                 const Best<K>& b, const ArgParams& p) {
  out[row] = b.index;
  if (p.check_nan && b.key == splat<K>(0)) *all_nan = 1;
}

// Block `way` of `ways` searches its steps of indices [first, first + count) of a row starting at x (a
// step: BLOCK x UNROLL vectors, or elements for other strides; step s is the block's when s % ways == way).
// Each thread offers its own elements: with a unit stride, the head up to a 16-byte boundary and the tail
// (block 0), and 16-byte vectors (UNROLL loads issued before any is used); else one element at a time,
// UNROLL loads at once.
template <int KIND, int BYTES>
__device__ __forceinline__ Best<key_t<BYTES>> search_steps(const typename Bits<BYTES>::type* x, long long first,
                                                           unsigned count, unsigned way, unsigned ways,
                                                           const ArgParams& p) {
  using U = typename Bits<BYTES>::type;
  using K = key_t<BYTES>;
  constexpr int VEC = 16 / BYTES;
  constexpr unsigned kStep = ARG_BLOCK * ARG_UNROLL;
  Best<K> b{splat<K>(0), NO_INDEX};
  const unsigned t = threadIdx.x;
  const unsigned start = way * kStep + t;  // the thread's first vector (or element)
  const unsigned stride = ways * kStep;
  if (p.stride == 1) {
    const U* s = x + first;
    const unsigned misaligned = static_cast<unsigned>(reinterpret_cast<unsigned long long>(s) % 16) / BYTES;
    unsigned head = misaligned ? VEC - misaligned : 0;
    head = head < count ? head : count;
    const unsigned vectors = (count - head) / VEC;
    const unsigned tail = count - head - vectors * VEC;
    if (way == 0 && t < head) offer(b, key_at<KIND, BYTES>(s, t, p), first + t);
    const U* body = s + head;
    // The body's best as a key and a 32-bit position in the body: a thread visits its elements in
    // increasing order, so only a strictly larger key replaces the best (an equal one comes later and
    // loses). It starts as key 0 (no key is below it) at the thread's first element, which the first
    // comparison keeps if that element's key is 0. The 64-bit index is formed once, after the loop.
    K best_key = splat<K>(0);
    unsigned best_at = start * VEC;
    for (unsigned v0 = start; v0 < vectors; v0 += stride) {
      Pack<U, VEC> pk[ARG_UNROLL];
#pragma unroll
      for (int u = 0; u < ARG_UNROLL; ++u) {
        if (v0 + u * ARG_BLOCK < vectors) load(pk[u], body + static_cast<size_t>(v0 + u * ARG_BLOCK) * VEC);
      }
#pragma unroll
      for (int u = 0; u < ARG_UNROLL; ++u) {
        const unsigned v = v0 + u * ARG_BLOCK;
        if (v < vectors) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            const K k = element_key<KIND, BYTES>(pk[u].v[j], splat<K>(p.flip), splat<K>(p.nan_key));
            const bool better = k > best_key;
            best_key = better ? k : best_key;
            best_at = better ? v * VEC + j : best_at;
          }
        }
      }
    }
    if (start < vectors) offer(b, best_key, first + head + static_cast<long long>(best_at));
    if (way == 0 && t < tail) {
      const unsigned i = head + vectors * VEC + t;
      offer(b, key_at<KIND, BYTES>(s, i, p), first + i);
    }
  } else {
    for (unsigned i0 = start; i0 < count; i0 += stride) {
      U v[ARG_UNROLL];
#pragma unroll
      for (int u = 0; u < ARG_UNROLL; ++u) {
        const unsigned i = i0 + u * ARG_BLOCK;
        if (i < count) v[u] = x[(first + i) * p.stride];
      }
#pragma unroll
      for (int u = 0; u < ARG_UNROLL; ++u) {
        const unsigned i = i0 + u * ARG_BLOCK;
        if (i < count) {
          offer(b, element_key<KIND, BYTES>(v[u], splat<K>(p.flip), splat<K>(p.nan_key)), first + i);
        }
      }
    }
  }
  return b;
}

// Rows cut into spans, `ways` blocks a span (question 1). With one block a row the block writes the result;
// otherwise it publishes its pair in partials[block], and the row's counter (counters[row], zero between
// launches: the last block resets it) tells the last of the row's blocks to combine them. The barrier
// before thread 0 writes `last` keeps that write after every thread's reads of the block combine's slots.
template <int KIND, int BYTES>
__global__ void __launch_bounds__(ARG_BLOCK)
    argreduce_span(long long* out, Best<key_t<BYTES>>* partials, unsigned* counters, int* all_nan,
                   const typename Bits<BYTES>::type* x, const __grid_constant__ ArgParams p) {
  using K = key_t<BYTES>;
  __shared__ Best<K> scratch[2 * ARG_BLOCK / 32];
  __shared__ bool last;
  const unsigned ways = static_cast<unsigned>(p.ways);
  const unsigned blocks = static_cast<unsigned>(p.spans) * ways;  // a row's
  const unsigned row = blockIdx.x / blocks;
  const unsigned rest = blockIdx.x - row * blocks;
  const unsigned part = rest / ways;
  const long long first = static_cast<long long>(part) * p.span;
  const long long left = p.n - first;
  const unsigned count = static_cast<unsigned>(left < p.span ? left : p.span);
  const Best<K> mine = search_steps<KIND, BYTES>(x + row_start(row, p), first, count, rest - part * ways, ways, p);
  const Best<K> b = block_best(mine, scratch, 0);
  if (blocks == 1) {
    if (threadIdx.x == 0) finish_row(out, all_nan, row, b, p);
    return;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = b;
    __threadfence();
    last = atomicAdd(counters + row, 1u) == blocks - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  Best<K> folded{splat<K>(0), NO_INDEX};
  for (unsigned s = threadIdx.x; s < blocks; s += ARG_BLOCK) {
    const Best<K> q{load_key_cg(&partials[row * blocks + s].key), __ldcg(&partials[row * blocks + s].index)};
    folded = ArgBest::apply(folded, q);
  }
  const Best<K> w = block_best(folded, scratch, 1);
  if (threadIdx.x == 0) {
    finish_row(out, all_nan, row, w, p);
    counters[row] = 0;
  }
}

// One row per thread, for rows adjacent in memory (s1 small, stride large): a warp's 32 loads of one
// index fall in a few sectors. Indices in increasing order, UNROLL loads issued before any is used.
template <int KIND, int BYTES>
__global__ void __launch_bounds__(ARG_BLOCK)
    argreduce_cols(long long* out, int* all_nan, const typename Bits<BYTES>::type* x,
                   const __grid_constant__ ArgParams p) {
  using U = typename Bits<BYTES>::type;
  using K = key_t<BYTES>;
  const long long r = static_cast<long long>(blockIdx.x) * ARG_BLOCK + threadIdx.x;
  if (r >= p.rows) return;
  const U* s = x + row_start(static_cast<unsigned>(r), p);
  Best<K> b{splat<K>(0), NO_INDEX};
  for (long long i0 = 0; i0 < p.n; i0 += ARG_UNROLL) {
    U v[ARG_UNROLL];
#pragma unroll
    for (int u = 0; u < ARG_UNROLL; ++u) {
      if (i0 + u < p.n) v[u] = s[(i0 + u) * p.stride];
    }
#pragma unroll
    for (int u = 0; u < ARG_UNROLL; ++u) {
      if (i0 + u < p.n) offer(b, element_key<KIND, BYTES>(v[u], splat<K>(p.flip), splat<K>(p.nan_key)), i0 + u);
    }
  }
  finish_row(out, all_nan, static_cast<unsigned>(r), b, p);
}

}  // namespace cukern
