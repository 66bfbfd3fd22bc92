// The production reductions behind cukern.sum / amax / amin / mean / sum_of_squares / norm / var / std /
// nansum / nanmax / nanmin / nanmean / count_nonzero / any / all / prod / logsumexp. The teaching ladder (ten rungs from the textbook first try to reduce_full) is cuda_src/reduce_ladder.cu.
//
// One tree per reduced length. Each output reduces n values v_i = lift(x_i), i the C-order index
// over the reduced axes of x as the caller sees them (strides, alignment and memory order play no part):
//   * leaves of LEAF = 256 consecutive indices; in leaf k, chain c (c < 32) adds v_{256k + c + 32m},
//     m = 0..7, one after another into the identity (0 for sums, 1 for products, -inf / +inf for max /
//     min); var and logsumexp form a chain's state from its (up to) eight elements at once (chain_state:
//     one division a chain for var's mean, one exp an element for logsumexp), not by merging one element
//     at a time;
//   * the chain values, in order of 32k + c, are the leaves of a perfect binary tree with neighbours
//     paired first ((p0 + p1) + (p2 + p3)) + ..., their count padded to a power of two with the identity.
// Every kernel below is a different split of that one tree over threads, warps, blocks and launches, so
// the bits of a result depend on the values, n, the dtypes and the op only: not on the number of outputs,
// the grid, the block, the tuning knobs, the SM count, the stream or the GPU. Sums add with __fadd_rn /
// __dadd_rn and square with __fmul_rn / __dmul_rn (never contracted into an FMA, so every architecture
// rounds the same); max and min are commutative bit for bit (+0 beats -0 in max, -0 in min; a NaN gives
// a NaN). Integer sums are exact and wrap as int64, so their order is immaterial; so are integer products.
// The lift of sum, max and min is a run-time mode (LIFT_*: NaN to the identity, x != 0 to 1 or 0), so the
// NaN-aware ops and the counts share their kernels. Float products multiply with __fmul_rn; complex64 and
// complex128 products (Complex<S>, the pairs read as they are) by the textbook formula in correctly rounded
// steps, with 1 + 0i an exact identity, so that padding changes nothing (mul_rn of Complex); var carries
// (count, mean, M2) and merges chains with Chan's formula; logsumexp carries (max, scaled sum) and merges
// chains with cukern's own exp and log (exp_nonpositive, log_at_least_one),
// made of steps that each round once (correctly rounded operations, and float's exp its explicit fused
// multiply-adds). cukern/reference.py (`*_emulated`) evaluates the same tree in NumPy with no launch
// parameter at all.
//
// The six questions (cukern/reduce_plan.py keeps the launch math as pure plans):
// 1. Output tile: reduce_full: the whole array, one value: each block takes an aligned span of groups of
//    BLOCK / 32 chunks (a chunk is the 32 lanes' share of 16 / sizeof(T) leaves at most), a warp a chunk
//    of each group, and combines a batch of groups after each barrier; the last block to finish combines
//    the blocks; reduce_rows: one row per group of tpr threads (a sub-warp
//    group for rows of one chunk, else tpr / 32 warps, each with its span of chunks); reduce_cols: a strip
//    of columns by a span of leaves per block, 32 / Q row lanes each owning Q chains, and reduce_cols_fold
//    for the spans' partials when a column has more than one span; reduce_strided: one output per warp,
//    one chain per lane; so do reduce_lse_weighted (logsumexp with weights), reading x and the weights
//    through strides of their own (a broadcast weight, zero strides, is read again for each output), and
//    reduce_lse_complex (complex logsumexp, weighted or not).
// 2. Input traffic: every element read once. Contiguous spans whose start is 16-byte aligned are read as
//    16-byte vectors (each lane's vector holds its next CV chains); any other start or stride reads the
//    same elements one by one into the same chains. Columns: each thread owns VEC adjacent columns, so a
//    warp reads a contiguous run of every row it visits: coalesced with no transpose.
// 3. Accumulation: in acc_t<O>: float for float32/float16/bfloat16 results, double for float64, long long
//    for integer results, double for counts (Count, stored as int64) and any / all (bool results),
//    Complex<float> / Complex<double> for complex products (and for complex logsumexp's sum, beside a real
//    maximum), along the tree above:
//    chains sequentially, then pairs through the lanes' own values, shuffles, shared memory (tree_push /
//    tree_result for spans) and the last block. No float atomics anywhere.
// 4. Staging: registers; shared memory for the full kernel's chunk slots and its block's span stack, the
//    rows kernel's warp span stacks, the block-level combines and the column kernel's cross-row-lane
//    combine.
// 5. Tuning: block size, blocks per SM, loads in flight, threads per row, grid caps: all splits of the one
//    tree, so any of them gives the same bits (cukern/reduce_plan.py `Knobs`).
// 6. Profile: one add per element against sizeof(T) bytes: memory-bound; the target is the copy bandwidth.
//    var adds a subtraction, a square and two adds per element and a division per chain (the full merge
//    per element cost a division each); logsumexp an exp per element (for float a compare, twelve float
//    operations, nine of them fused multiply-adds, and two integer ones: no rounding or conversion
//    instruction), with no merge and its selects per element. Both hold a chain's eight loads at once, which
//    is why their rows kernels keep more registers (row_min_blocks). Complex logsumexp adds a cos and a sin
//    an element (about 50 floating operations an element for complex64, 100 for complex128).
#include "common/bounds.cuh"
#include "common/dtype.cuh"
#include "common/vec.cuh"
#include "common/complex.cuh"
#include "common/moments.cuh"
#include "common/reduce.cuh"

namespace cukern {

// The tree (cukern/reduce_plan.py TREE_CHAINS and TREE_CHAIN_LENGTH must say the same).
constexpr int CHAINS = 32;
constexpr int CHAIN_LENGTH = 8;
constexpr int LEAF = CHAINS * CHAIN_LENGTH;
// Levels of a span stack: spans of up to 2^39 chunks, more than any array a GPU holds.
constexpr int STACK_DEPTH = 40;
// Partials the last block of reduce_full combines per thread (the planner keeps the grid within it).
constexpr int FULL_FOLD = 8;
// Levels of a binary counter over n (a power of two) values: log2(n) + 1.
__host__ __device__ constexpr int levels_of(int n) { return n <= 1 ? 1 : 1 + levels_of(n / 2); }
// Groups of chunks reduce_full combines after one barrier (a power of two, at most 32: a lane of warp 0 each).
constexpr int FULL_BATCH = 8;
constexpr int ROW_LIFT_BLOCK = 128;  // the one rows block that lifts (cukern/reduce_plan.py LIFT_ROW_MAX_TPR)
constexpr int COL_BLOCK = 256;
constexpr int COL_LOADS = 4;  // rows in flight per column thread
constexpr int COL_STACK_DEPTH = 20;
constexpr int FOLD_BLOCK = 128;
constexpr int FOLD_DEPTH = 12;  // up to 2048 column spans (cukern/reduce_plan.py COL_FOLD_SPANS)

// ---------------------------------------------------------------------------------------------------------
// Element types, accumulators and the four reduction operators.

enum : int { OP_SUM = 0, OP_SUMSQ = 1, OP_MAX = 2, OP_MIN = 3, OP_VAR = 4, OP_PROD = 5, OP_LSE = 6 };
enum : int { FINISH_NONE = 0, FINISH_DIVIDE = 1, FINISH_SQRT = 2, FINISH_EQUALS = 3 };
// What an element becomes before sum, max and min take it: a run-time mode, not a template parameter (a
// select per element costs nothing in a memory-bound kernel, and every op keeps its one set of kernels):
// itself; the op's identity for a NaN (nansum, nanmax, nanmin); 1 for x != 0, else 0 (count_nonzero, any,
// all: a NaN counts); 1 for a non-NaN, else 0 (nanmean's count). The kernels take it in the bits of
// `finalize` above FINISH_BITS, so that no kernel signature changes.
enum : int { LIFT_PLAIN = 0, LIFT_SKIP_NAN = 1, LIFT_NONZERO = 2, LIFT_NOT_NAN = 3 };
constexpr int FINISH_BITS = 4;
__device__ __forceinline__ int finish_of(int finalize) { return finalize & ((1 << FINISH_BITS) - 1); }
__device__ __forceinline__ int lift_of(int finalize) { return finalize >> FINISH_BITS; }

// count_nonzero's result: an int64 count, summed in double (the lift lives in the float64 sums; exact below
// 2^53) and stored converted, so that the kernel writes the result itself.
struct Count {
  long long v;
};

// The accumulator for a result type: half types widen to float, integers to 64 bits; complex is its own.
// Counts and bool results (any, all) add the lift's 1s in double.
template <typename O> struct Acc { using type = float; };
template <> struct Acc<double> { using type = double; };
template <> struct Acc<Count> { using type = double; };
template <> struct Acc<bool> { using type = double; };
template <typename O> constexpr bool kBoolResult = false;
template <> constexpr bool kBoolResult<bool> = true;
template <> struct Acc<int> { using type = long long; };
template <> struct Acc<long long> { using type = long long; };
template <typename S> struct Acc<Complex<S>> { using type = Complex<S>; };
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
template <> struct Store<Count> {
  template <typename A> __device__ __forceinline__ static Count from(A a) { return Count{static_cast<long long>(a)}; }
};

// Correctly rounded and never fused: the default -fmad=true would otherwise turn a square and an add into
// one FMA on some paths and not on others.
// (float and double add_rn, sub_rn, mul_rn, div_rn: common/complex.cuh)
__device__ __forceinline__ long long add_rn(long long a, long long b) { return a + b; }
__device__ __forceinline__ long long mul_rn(long long a, long long b) {  // wraps, as NumPy's int64
  return static_cast<long long>(static_cast<unsigned long long>(a) * static_cast<unsigned long long>(b));
}

template <typename A> __device__ __forceinline__ bool is_negative_zero(A) { return false; }
__device__ __forceinline__ bool is_negative_zero(float a) { return __float_as_uint(a) == 0x80000000u; }
__device__ __forceinline__ bool is_negative_zero(double a) {
  return __double_as_longlong(a) == static_cast<long long>(0x8000000000000000ull);
}

struct SumRn {
  template <typename A> __device__ __forceinline__ static A identity() { return A(0); }
  template <typename A> __device__ __forceinline__ static A apply(A a, A b) { return add_rn(a, b); }
};

// Max and min as NumPy propagates NaN (a NaN anywhere gives a NaN), commutative bit for bit as the
// shuffle trees need: a NaN operand gives the sum (a NaN), and of two equal values max keeps +0 over -0
// and min -0 over +0. Selects of predicates joined by | and &, no branch: written as early returns (or with
// || and &&), each element's compare became a divergent branch (the float32 max kernel's loop held 563
// branches against the sum's 19).
struct Max {
  template <typename A> __device__ __forceinline__ static A identity() { return Limits<A>::lowest(); }
  template <typename A> __device__ __forceinline__ static A apply(A a, A b) {
    const A m = (a > b) | ((a == b) & !is_negative_zero(a)) ? a : b;
    return (a != a) | (b != b) ? add_rn(a, b) : m;
  }
};
struct Min {
  template <typename A> __device__ __forceinline__ static A identity() { return Limits<A>::highest(); }
  template <typename A> __device__ __forceinline__ static A apply(A a, A b) {
    const A m = (a < b) | ((a == b) & is_negative_zero(a)) ? a : b;
    return (a != a) | (b != b) ? add_rn(a, b) : m;
  }
};

// var and std: Moments and the Chan merge, common/moments.cuh.

// The complex product (mul_rn of Complex): common/complex.cuh.

// prod: correctly rounded products (integers wrap, in any order the same; complex ones as above).
struct MulRn {
  template <typename A> __device__ __forceinline__ static A identity() { return A(1); }
  template <typename A> __device__ __forceinline__ static A apply(A a, A b) { return mul_rn(a, b); }
};

// logsumexp's exp and log, built from correctly rounded additions, multiplications and divisions, float's
// fused multiply-adds (__fmaf_rn: one rounding, the same on every GPU), exact scalings by powers of two and
// frexp only: not correctly rounded (a few ulps), but every step is one IEEE operation that the host
// reproduces exactly, so cukern/reference.py (`_exp_nonpositive`, `_log_at_least_one`, `_fma32` for the
// fused multiply-add) gives their bits, which CUDA's expf / logf would not allow. The constants are exact
// binary values (hex literals; tests/test_reduce.py checks the host's against these).
template <typename S> struct ExpLog;
template <> struct ExpLog<float> {
  static constexpr float kUnderflow = -104.0f;  // e^-104 is below half the smallest subnormal
  static constexpr float kInvLn2 = 0x1.715476p+0f;
  static constexpr float kMagic = 0x1.8p+23f;  // v + kMagic rounds v to an integer, ties to even, for |v| < 2^22
  static constexpr float kLn2Hi = 0x1.62e4p-1f;  // 15 bits: k * kLn2Hi is exact for |k| < 2^8 (the log's)
  static constexpr float kLn2Lo = 0x1.7f7d1cp-20f;
  // The exp's r = d - k ln2 in one fused step with ln2 rounded to float: its error, k (ln2 - kLn2) with
  // |k| <= 150, adds under 0.2 ulp to e^d for d > -11 and up to 4 at d = -87 (whose e^d, below 2^-125, no
  // logsumexp of a state s >= 1 can see); one fused multiply-add an exp fewer than Cody and Waite's two
  static constexpr bool kOneStep = true;
  static constexpr float kLn2 = 0x1.62e430p-1f;
  // e^r for |r| <= ln2 / 2: a degree-5 polynomial fitted to e^r's relative error (1 + r + c2 r^2 + ..., the
  // c_k rounded to float; Lawson's weighted least squares, probe/expfit.py), six terms where the Taylor series
  // needs eight: two fused multiply-adds an element fewer, and the exp within 2.3 ulp of e^d for d > -11
  // (0.98 with degree 6; a row's logsumexp of 16384 normal values 1.4 ulp from float64's, 1.2;
  // docs/design/reductions.md)
  static constexpr int kExpTerms = 6;
  static constexpr float kExp[kExpTerms] = {0x1p+0f, 0x1p+0f, 0x1.fffdfcp-2f, 0x1.5557aep-3f, 0x1.5729e6p-5f,
                                            0x1.10625ap-7f};
  static constexpr float kSqrtHalf = 0x1.6a09e6p-1f;
  static constexpr int kLogTerms = 5;  // atanh series 1 / (2k + 1), k = 0..4, for |u| <= 0.172
  static constexpr float kLog[kLogTerms] = {0x1p+0f, 0x1.555556p-2f, 0x1.99999ap-3f, 0x1.24924ap-3f, 0x1.c71c72p-4f};
  __device__ __forceinline__ static float pow2(int k) { return __int_as_float((k + 127) << 23); }
  // k from t = kMagic + k (|k| < 2^22): the sum's significand holds k in its low bits
  __device__ __forceinline__ static int magic_int(float t) { return __float_as_int(t) - __float_as_int(kMagic); }
  // the exp's multiply-adds: one rounding each (fewer instructions than a product and a sum, and less error)
  __device__ __forceinline__ static float mad(float a, float b, float c) { return __fmaf_rn(a, b, c); }
};
template <> struct ExpLog<double> {
  static constexpr double kUnderflow = -746.0;
  static constexpr double kInvLn2 = 0x1.71547652b82fep+0;
  static constexpr double kMagic = 0x1.8p+52;  // v + kMagic rounds v to an integer, ties to even, for |v| < 2^51
  static constexpr double kLn2Hi = 0x1.62e42feep-1;  // 32 bits: k * kLn2Hi is exact for |k| < 2^21
  static constexpr double kLn2Lo = 0x1.a39ef35793c76p-33;
  static constexpr bool kOneStep = false;  // r in two steps (Cody and Waite)
  static constexpr int kExpTerms = 14;
  static constexpr double kExp[kExpTerms] = {
      0x1p+0, 0x1p+0, 0x1p-1, 0x1.5555555555555p-3, 0x1.5555555555555p-5, 0x1.1111111111111p-7,
      0x1.6c16c16c16c17p-10, 0x1.a01a01a01a01ap-13, 0x1.a01a01a01a01ap-16, 0x1.71de3a556c734p-19,
      0x1.27e4fb7789f5cp-22, 0x1.ae64567f544e4p-26, 0x1.1eed8eff8d898p-29, 0x1.6124613a86d09p-33};
  static constexpr double kSqrtHalf = 0x1.6a09e667f3bcdp-1;
  static constexpr int kLogTerms = 11;
  static constexpr double kLog[kLogTerms] = {
      0x1p+0, 0x1.5555555555555p-2, 0x1.999999999999ap-3, 0x1.2492492492492p-3, 0x1.c71c71c71c71cp-4,
      0x1.745d1745d1746p-4, 0x1.3b13b13b13b14p-4, 0x1.1111111111111p-4, 0x1.e1e1e1e1e1e1ep-5,
      0x1.af286bca1af28p-5, 0x1.8618618618618p-5};
  __device__ __forceinline__ static double pow2(int k) { return __longlong_as_double(static_cast<long long>(k + 1023) << 52); }
  // k from t = kMagic + k (|k| < 2^31): the bits of t are kMagic's plus k, and kMagic's low word is 0
  __device__ __forceinline__ static int magic_int(double t) { return __double2loint(t); }
  // a correctly rounded product, then sum (NumPy has no double-precision fused multiply-add to reproduce)
  __device__ __forceinline__ static double mad(double a, double b, double c) { return add_rn(mul_rn(a, b), c); }
};

// e^d for d <= 0 (-inf gives 0): d = k ln2 + r (Cody and Waite's two steps; float's one, kOneStep), k =
// rint(d / ln2) by adding and subtracting kMagic (no rounding or conversion instruction: k also lies in the
// sum's low bits), e^r by Horner, then p 2^k rounded once (subnormal results included) as one product,
// p 2^-64 times 2^(k + 64): the coefficients are scaled by 2^-64 (exactly, at compile time), which scales
// every step of Horner's exactly (each stays normal), and 2^(k + 64) is normal for every k the exp forms
// (k >= -150 for float, -1076 for double). The same bits as p 2^(k + 64) (exact) times 2^-64, one
// multiplication fewer. Below kUnderflow (and for -inf or a NaN) the result is 0: d is raised to
// kUnderflow, whose e^d these steps already round to 0 (tests/test_reduce.py checks it), one max
// instruction where a test and a select took two.
template <typename S> __device__ __forceinline__ S exp_nonpositive(S d) {
  using E = ExpLog<S>;
  constexpr S kScale = S(0x1p-64);
  d = fmax(d, E::kUnderflow);
  const S t = E::mad(d, E::kInvLn2, E::kMagic);
  const S k = sub_rn(t, E::kMagic);
  S r;
  if constexpr (E::kOneStep) {
    r = E::mad(k, -E::kLn2, d);
  } else {
    r = E::mad(k, -E::kLn2Lo, E::mad(k, -E::kLn2Hi, d));
  }
  S p = E::kExp[E::kExpTerms - 1] * kScale;
#pragma unroll
  for (int i = E::kExpTerms - 2; i >= 0; --i) p = E::mad(p, r, E::kExp[i] * kScale);
  return mul_rn(p, E::pow2(E::magic_int(t) + 64));
}

// log(f 2^e) for f in [sqrt(1/2), sqrt(2)): e ln2 in two parts, plus log f = 2 atanh((f - 1) / (f + 1)).
template <typename S> __device__ __forceinline__ S log_parts(S f, int e) {
  using E = ExpLog<S>;
  const S u = div_rn(sub_rn(f, S(1)), add_rn(f, S(1)));
  const S w = mul_rn(u, u);
  S p = E::kLog[E::kLogTerms - 1];
#pragma unroll
  for (int i = E::kLogTerms - 2; i >= 0; --i) p = add_rn(mul_rn(p, w), E::kLog[i]);
  const S se = static_cast<S>(e);
  return add_rn(mul_rn(se, E::kLn2Hi), add_rn(mul_rn(se, E::kLn2Lo), mul_rn(add_rn(u, u), p)));
}

// s > 0 (normal) as f 2^e, f in [sqrt(1/2), sqrt(2)): frexp's fraction, doubled below sqrt(1/2).
template <typename S> __device__ __forceinline__ S log_split(S s, int& e) {
  S f = frexp(s, &e);
  if (f < ExpLog<S>::kSqrtHalf) f = mul_rn(f, S(2)), --e;
  return f;
}

// log(s) for finite s >= 1.
template <typename S> __device__ __forceinline__ S log_at_least_one(S s) {
  int e;
  const S f = log_split(s, e);
  return log_parts(f, e);
}

// ---------------------------------------------------------------------------------------------------------
// The complex logsumexp's cos and sin, atan2 and log|s| (reduce_lse_complex): cukern's own, as the exp and log
// above, so that cukern/reference.py (cukern/reference/_elementary.py: `_cis`, `_phase`, `_log_abs`) gives
// their bits. Every step is a correctly rounded operation (add_rn ... div_rn, __fsqrt_rn / __dsqrt_rn), a
// fused multiply-add (float's Horner steps, as the exp's; and fma(a, b, c) where its result is exact: a
// product's rounding error, a division's remainder, which the host forms exactly without one), an exact
// scaling by powers of two, or integer arithmetic; nothing from CUDA's math library (sincos, atan2, hypot and
// log differ by architecture and release). Measured against long double on the host (the most over 10^7
// random values of each type; tests/test_logsumexp_complex.py): cos and sin 0.79 ulp, for every finite
// argument, the largest and those nearest multiples of pi/2 included; the phase 1.75 ulp; log|s| 1.07 ulp
// where |log|s|| >= 1, else 0.84 eps absolute; the sign s / |s| 2.41 ulp.

// Constants (exact binary values; cukern/reference/_elementary.py holds the same literals). pi/2 for Cody
// and Waite's reduction in parts (float: three floats, each the rounding of what is left; double: three
// 33-bit truncations, then the rounded rest, so that k P is exact for k < 2^20); pi/2 and pi as hi + lo;
// Taylor's coefficients of sin (r^3 on) and cos (r^4 on) for |r| <= pi/4 and of atan for |v| < 1/16, each
// truncated where the next term is below a hundredth of an ulp; the division's remainder is carried into the
// phase from a ratio of kRestMin up (below it the remainder could underflow, and the ratio alone is exact
// enough).
template <typename S> struct Trig;
template <> struct Trig<float> {
  static constexpr float kTwoOverPi = 0x1.45f306p-1f;
  static constexpr float kMagic = 0x1.8p+23f;
  static constexpr float kCodyWaiteMax = 0x1p+17f;
  static constexpr float kRestMin = 0x1p-60f;
  static constexpr float kPio2Parts[3] = {0x1.921fb6p+0f, -0x1.777a5cp-25f, -0x1.ee59dap-50f};
  static constexpr float kPio2Hi = 0x1.921fb6p+0f, kPio2Lo = -0x1.777a5cp-25f;
  static constexpr float kPiHi = 0x1.921fb6p+1f, kPiLo = -0x1.777a5cp-24f;
  static constexpr int kSinTerms = 4;
  static constexpr float kSin[kSinTerms] = {-0x1.555556p-3f, 0x1.111112p-7f, -0x1.a01a02p-13f, 0x1.71de3ap-19f};
  static constexpr int kCosTerms = 4;
  static constexpr float kCos[kCosTerms] = {0x1.555556p-5f, -0x1.6c16c2p-10f, 0x1.a01a02p-16f, -0x1.27e4fcp-22f};
  static constexpr int kAtanTerms = 3;
  static constexpr float kAtan[kAtanTerms] = {-0x1.555556p-2f, 0x1.99999ap-3f, -0x1.24924ap-3f};
  static constexpr int kLimbs = 2;  // 64-bit words of 2/pi's window in the exact reduction
};
template <> struct Trig<double> {
  static constexpr double kTwoOverPi = 0x1.45f306dc9c883p-1;
  static constexpr double kMagic = 0x1.8p+52;
  static constexpr double kCodyWaiteMax = 0x1p+20;
  static constexpr double kRestMin = 0x1p-500;
  static constexpr double kPio2Parts[4] = {0x1.921fb544p+0, 0x1.0b4611a6p-34, 0x1.3198a2ep-69, 0x1.b839a252049c1p-104};
  static constexpr double kPio2Hi = 0x1.921fb54442d18p+0, kPio2Lo = 0x1.1a62633145c07p-54;
  static constexpr double kPiHi = 0x1.921fb54442d18p+1, kPiLo = 0x1.1a62633145c07p-53;
  static constexpr int kSinTerms = 8;
  static constexpr double kSin[kSinTerms] = {-0x1.5555555555555p-3, 0x1.1111111111111p-7, -0x1.a01a01a01a01ap-13,
                                             0x1.71de3a556c734p-19, -0x1.ae64567f544e4p-26, 0x1.6124613a86d09p-33,
                                             -0x1.ae7f3e733b81fp-41, 0x1.952c77030ad4ap-49};
  static constexpr int kCosTerms = 7;
  static constexpr double kCos[kCosTerms] = {0x1.5555555555555p-5, -0x1.6c16c16c16c17p-10, 0x1.a01a01a01a01ap-16,
                                             -0x1.27e4fb7789f5cp-22, 0x1.1eed8eff8d898p-29, -0x1.93974a8c07c9dp-37,
                                             0x1.ae7f3e733b81fp-45};
  static constexpr int kAtanTerms = 7;
  static constexpr double kAtan[kAtanTerms] = {-0x1.5555555555555p-2, 0x1.999999999999ap-3, -0x1.2492492492492p-3,
                                               0x1.c71c71c71c71cp-4, -0x1.745d1745d1746p-4, 0x1.3b13b13b13b14p-4,
                                               -0x1.1111111111111p-4};
  static constexpr int kLimbs = 3;
};

// 2/pi in 64-bit words: 64 zero bits, then its first 1216 bits after the point (the exact reduction reads 192
// of them from bit E - 1 on, E up to 971).
__constant__ unsigned long long kTwoOverPiWords[20] = {
    0x0000000000000000ull, 0xa2f9836e4e441529ull, 0xfc2757d1f534ddc0ull, 0xdb6295993c439041ull,
    0xfe5163abdebbc561ull, 0xb7246e3a424dd2e0ull, 0x06492eea09d1921cull, 0xfe1deb1cb129a73eull,
    0xe88235f52ebb4484ull, 0xe99c7026b45f7e41ull, 0x3991d639835339f4ull, 0x9c845f8bbdf9283bull,
    0x1ff897ffde05980full, 0xef2f118b5a0a6d1full, 0x6d367ecf27cb09b7ull, 0x4f463f669e5fea2dull,
    0x7527bac7ebe5f17bull, 0x3d0739f78a5292eaull, 0x6bfb5fb11f8d5d08ull, 0x56033046fc7b6babull};

// atan(j / 16), j = 0..16, as hi + lo.
__constant__ float kAtanSixteenthsF[2][17] = {
    {0x0p+0f, 0x1.ff55bcp-5f, 0x1.fd5baap-4f, 0x1.7b97b4p-3f, 0x1.f5b760p-3f, 0x1.362774p-2f, 0x1.6f6194p-2f,
     0x1.a64eecp-2f, 0x1.dac670p-2f, 0x1.0657eap-1f, 0x1.1e00bap-1f, 0x1.345f02p-1f, 0x1.4978fap-1f,
     0x1.5d5898p-1f, 0x1.700a7cp-1f, 0x1.819d0cp-1f, 0x1.921fb6p-1f},
    {0x0p+0f, -0x1.1a6042p-30f, -0x1.54f424p-30f, 0x1.79cb60p-28f, -0x1.b4dfc8p-29f, -0x1.1f0286p-27f,
     0x1.e4def0p-30f, 0x1.e611fep-29f, 0x1.586ed4p-28f, -0x1.6499e6p-26f, 0x1.7bdfd6p-26f, -0x1.98e422p-28f,
     0x1.934f70p-28f, 0x1.c5a6c6p-27f, 0x1.5e118cp-27f, -0x1.1d4eb6p-26f, -0x1.777a5cp-26f}};
__constant__ double kAtanSixteenthsD[2][17] = {
    {0x0p+0, 0x1.ff55bb72cfdeap-5, 0x1.fd5ba9aac2f6ep-4, 0x1.7b97b4bce5b02p-3, 0x1.f5b75f92c80ddp-3,
     0x1.362773707ebccp-2, 0x1.6f61941e4def1p-2, 0x1.a64eec3cc23fdp-2, 0x1.dac670561bb4fp-2, 0x1.0657e94db30d0p-1,
     0x1.1e00babdefeb4p-1, 0x1.345f01cce37bbp-1, 0x1.4978fa3269ee1p-1, 0x1.5d58987169b18p-1, 0x1.700a7c5784634p-1,
     0x1.819d0b7158a4dp-1, 0x1.921fb54442d18p-1},
    {0x0p+0, -0x1.c934d86d23f1dp-60, -0x1.cd37686760c17p-59, 0x1.347b0b4f881cap-58, 0x1.8ab6e3cf7afbdp-57,
     -0x1.963a544b672d8p-57, -0x1.c63aae6f6e918p-56, -0x1.24dec1b50b7ffp-56, 0x1.a2b7f222f65e2p-56,
     -0x1.d5b495f6349e6p-56, -0x1.928df287a668fp-58, 0x1.1021137c71102p-55, 0x1.2419a87f2a458p-56,
     0x1.0028e4bc5e7cap-57, -0x1.8c34d25aadef6p-56, -0x1.bf76229d3b917p-56, 0x1.1a62633145c07p-55}};
__device__ __forceinline__ float atan_sixteenth(float, int part, int j) { return kAtanSixteenthsF[part][j]; }
__device__ __forceinline__ double atan_sixteenth(double, int part, int j) { return kAtanSixteenthsD[part][j]; }

__device__ __forceinline__ float fma_rn(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ __forceinline__ double fma_rn(double a, double b, double c) { return __fma_rn(a, b, c); }
__device__ __forceinline__ float sqrt_rn(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ double sqrt_rn(double a) { return __dsqrt_rn(a); }

// s + e = a + b exactly, s = a + b rounded (Knuth's two-sum).
template <typename S> __device__ __forceinline__ S two_sum(S a, S b, S& e) {
  const S s = add_rn(a, b);
  const S bb = sub_rn(s, a);
  e = add_rn(sub_rn(a, sub_rn(s, bb)), sub_rn(b, bb));
  return s;
}

// p + e = a b exactly, p = a b rounded: the fused multiply-add's result is exact (no underflow here).
template <typename S> __device__ __forceinline__ S two_product(S a, S b, S& e) {
  const S p = mul_rn(a, b);
  e = fma_rn(a, b, -p);
  return p;
}

// v 2^k as two exact scalings (k / 2, toward zero, and the rest): every k the callers form keeps each power
// normal; a subnormal product rounds, as on the host.
template <typename S> __device__ __forceinline__ S scale2(S v, int k) {
  const int k1 = k / 2;
  return mul_rn(mul_rn(v, ExpLog<S>::pow2(k1)), ExpLog<S>::pow2(k - k1));
}

// E with v = f 2^E, f in [1/2, 1), for finite v > 0, subnormal ones too (frexp's exponent, from the bits).
__device__ __forceinline__ int frexp_exponent(float v) {
  int b = static_cast<int>(__float_as_uint(v) >> 23);
  if (b == 0) b = static_cast<int>(__float_as_uint(mul_rn(v, 0x1p+32f)) >> 23) - 32;
  return b - 126;
}
__device__ __forceinline__ int frexp_exponent(double v) {
  int b = static_cast<int>(static_cast<unsigned long long>(__double_as_longlong(v)) >> 52);
  if (b == 0) b = static_cast<int>(static_cast<unsigned long long>(__double_as_longlong(mul_rn(v, 0x1p+64))) >> 52) - 64;
  return b - 1022;
}

// a = q pi/2 + (hi + lo) (q modulo 4), |hi + lo| <= pi/4 (a little more where k's rounding of a 2/pi falls
// the other way), lo below half an ulp of hi.
template <typename S> struct Reduced {
  S hi, lo;
  int q;
};

// Cody and Waite, 0 <= a < kCodyWaiteMax: k = rint(a 2/pi) by the magic constant (q from its bits), a - k P1
// exact; float: k P2 as a product and its exact error, the differences by a two-sum, then k P3 in one fused
// step; double: k P2 and k P3 exact, the differences by two-sums, then k P4.
template <typename S> __device__ __forceinline__ Reduced<S> cody_waite(S a) {
  using T = Trig<S>;
  const S km = ExpLog<S>::mad(a, T::kTwoOverPi, T::kMagic);
  const S k = sub_rn(km, T::kMagic);
  S h, tail;
  int q;
  if constexpr (sizeof(S) == 4) {
    q = (__float_as_int(km) - __float_as_int(T::kMagic)) & 3;
    const S t1 = fma_rn(k, -T::kPio2Parts[0], a);
    S yl, e;
    const S yh = two_product(k, T::kPio2Parts[1], yl);
    h = two_sum(t1, -yh, e);
    tail = fma_rn(k, -T::kPio2Parts[2], sub_rn(e, yl));
  } else {
    q = __double2loint(km) & 3;
    const S t1 = sub_rn(a, mul_rn(k, T::kPio2Parts[0]));
    S e2, e3;
    const S h2 = two_sum(t1, -mul_rn(k, T::kPio2Parts[1]), e2);
    h = two_sum(h2, -mul_rn(k, T::kPio2Parts[2]), e3);
    tail = sub_rn(add_rn(e2, e3), mul_rn(k, T::kPio2Parts[3]));
  }
  const S hi = add_rn(h, tail);
  return Reduced<S>{hi, sub_rn(tail, sub_rn(hi, h)), q};
}

// The top 64 bits of (hi, lo) shifted left by sh in [0, 64).
__device__ __forceinline__ unsigned long long funnel(unsigned long long hi, unsigned long long lo, int sh) {
  return sh == 0 ? hi : (hi << sh) | (lo >> (64 - sh));
}

// The exact reduction, finite a >= kCodyWaiteMax: a = M 2^E (M the integer significand); bits of 2/pi before
// bit E - 1 after the point add multiples of 4 to a 2/pi, so M times the kLimbs words from there on, modulo
// 2^(64 kLimbs), is a 2/pi modulo 4 with 64 kLimbs - 2 fraction bits (error below 2^-100 for float, 2^-135 for
// double: the worst-case rest of either type is above 2^-62). q is that rounded to the nearest integer; the
// rest, in [-1/2, 1/2], normalized (whole words, then clz), is read as hi + lo (its top 48 bits for float,
// 106 for double: integers converted exactly, then scaled) and multiplied by pi/2 as hi + lo.
template <typename S> __device__ __forceinline__ Reduced<S> reduce_exact(S a) {
  using T = Trig<S>;
  using U = unsigned long long;
  constexpr int L = T::kLimbs;
  U m;
  int e;
  if constexpr (sizeof(S) == 4) {
    const unsigned b = __float_as_uint(a);
    e = static_cast<int>(b >> 23) - 150;
    m = (b & 0x7fffffu) | 0x800000u;
  } else {
    const U b = static_cast<U>(__double_as_longlong(a));
    e = static_cast<int>(b >> 52) - 1075;
    m = (b & ((1ull << 52) - 1)) | (1ull << 52);
  }
  const int pos = e + 62, w = pos >> 6, sh = pos & 63;
  U win[L];  // most significant first
#pragma unroll
  for (int i = 0; i < L; ++i) win[i] = funnel(kTwoOverPiWords[w + i], kTwoOverPiWords[w + i + 1], sh);
  U prod[L];  // m win modulo 2^(64 L), least significant first
  prod[0] = m * win[L - 1];
  U carry = __umul64hi(m, win[L - 1]);
#pragma unroll
  for (int i = L - 2, j = 1; i >= 0; --i, ++j) {
    const U v = m * win[i] + carry;
    if (i > 0) carry = __umul64hi(m, win[i]) + (v < carry ? 1ull : 0ull);
    prod[j] = v;
  }
  const U q = (prod[L - 1] + (1ull << 61)) >> 62;
  prod[L - 1] -= q << 62;
  const bool neg = (prod[L - 1] >> 63) != 0;
  U mag[L];  // |rest|, most significant first
  U add = 1;
#pragma unroll
  for (int j = 0; j < L; ++j) {
    const U n = ~prod[j] + add;
    add &= n == 0 ? 1ull : 0ull;
    mag[L - 1 - j] = neg ? n : prod[j];
  }
  int shift = 0;
#pragma unroll
  for (int r = 0; r < L - 1; ++r) {
    if (mag[0] == 0) {
#pragma unroll
      for (int i = 0; i < L - 1; ++i) mag[i] = mag[i + 1];
      mag[L - 1] = 0;
      shift += 64;
    }
  }
  const int lz = __clzll(static_cast<long long>(mag[0]));
  const U h = funnel(mag[0], mag[1], lz);
  S rh, rl;
  if constexpr (sizeof(S) == 4) {
    const int scale = -22 - lz - shift;
    rh = scale2(static_cast<S>(h >> 40), scale);
    rl = scale2(static_cast<S>((h >> 16) & 0xffffffull), scale - 24);
  } else {
    const U next = funnel(mag[1], mag[2], lz);
    const int scale = -51 - lz - shift;
    rh = scale2(static_cast<S>(h >> 11), scale);
    rl = scale2(static_cast<S>(((h & 0x7ffull) << 42) | (next >> 22)), scale - 53);
  }
  if (neg) rh = -rh, rl = -rl;
  S lo;
  const S hi = two_product(rh, T::kPio2Hi, lo);
  lo = add_rn(lo, add_rn(mul_rn(rh, T::kPio2Lo), mul_rn(rl, T::kPio2Hi)));
  const S r = add_rn(hi, lo);
  return Reduced<S>{r, sub_rn(lo, sub_rn(r, hi)), static_cast<int>(q & 3)};
}

template <typename S, int N> __device__ __forceinline__ S horner(const S (&c)[N], S z) {
  S p = c[N - 1];
#pragma unroll
  for (int i = N - 2; i >= 0; --i) p = ExpLog<S>::mad(p, z, c[i]);
  return p;
}

template <typename S> struct CosSin {
  S c, s;
};

// cos and sin of theta. |theta| reduced (Cody and Waite below kCodyWaiteMax, else exactly), then with z = h^2:
// sin = h + (h z s(z) + lo (1 - z / 2)), cos = (1 - z / 2) + (its rounding error, exact + z^2 c(z) - h lo);
// a quarter turn for odd q, a half turn for q >= 2; sin takes theta's sign (sin(-0) = -0). inf and NaN give
// NaN.
template <typename S> __device__ __forceinline__ CosSin<S> cis(S theta) {
  using T = Trig<S>;
  if (!isfinite(theta)) {
    const S nan = sub_rn(theta, theta);
    return CosSin<S>{nan, nan};
  }
  const S a = fabs(theta);
  const Reduced<S> r = a < T::kCodyWaiteMax ? cody_waite(a) : reduce_exact(a);
  const S z = mul_rn(r.hi, r.hi);
  const S hz = mul_rn(S(0.5), z);
  const S sn = add_rn(r.hi, ExpLog<S>::mad(mul_rn(r.hi, z), horner(T::kSin, z), sub_rn(r.lo, mul_rn(hz, r.lo))));
  const S w = sub_rn(S(1), hz);
  const S corr = sub_rn(sub_rn(S(1), w), hz);
  const S cs = add_rn(w, add_rn(corr, sub_rn(mul_rn(mul_rn(z, z), horner(T::kCos, z)), mul_rn(r.hi, r.lo))));
  CosSin<S> v = r.q & 1 ? CosSin<S>{-sn, cs} : CosSin<S>{cs, sn};
  if (r.q & 2) v = CosSin<S>{-v.c, -v.s};
  if (signbit(theta)) v.s = -v.s;
  return v;
}

// log|s| of a finite s != 0, its parts scaled by 2^-E (E the exponent of the larger magnitude, so that the
// larger lies in [1/2, 1)) and the sign s / |s|: q = re'^2 + im'^2 in [1/4, 2), log|s| = log(q 2^(2E)) / 2.
template <typename S> struct LogAbs {
  S log, re, im, sign_re, sign_im;
};
template <typename S> __device__ __forceinline__ LogAbs<S> log_abs(S re, S im) {
  const int e = frexp_exponent(fmax(fabs(re), fabs(im)));
  const S r = scale2(re, -e), i = scale2(im, -e);
  const S q = add_rn(mul_rn(r, r), mul_rn(i, i));
  int eq;
  const S f = log_split(q, eq);
  const S root = sqrt_rn(q);
  return LogAbs<S>{mul_rn(S(0.5), log_parts(f, eq + 2 * e)), r, i, div_rn(r, root), div_rn(i, root)};
}

// atan2(im, re) in (-pi, pi] for (re, im) as log_abs scales them. t = min / max of the magnitudes and the
// division's remainder (exact: one fused multiply-add), j = floor(16 t), atan t = atan(j / 16) + atan v,
// v = (t - j / 16 + remainder / max) / (1 + t j / 16) in [0, 1/16) (t - j / 16 exact), by its series; the
// octant as K + sigma atan t, K in {0, pi/2, pi} (hi + lo, the leading parts added by a two-sum), then the sign
// of im. -pi (a negative zero im, or an angle that rounds to -pi) is given as +pi, SciPy's branch.
template <typename S> __device__ __forceinline__ S phase(S re, S im) {
  using T = Trig<S>;
  const S a = fabs(re), b = fabs(im);
  const bool swap = b > a, neg = re < S(0);
  const S small = swap ? a : b, big = swap ? b : a;
  const S t = div_rn(small, big);
  const S rest = t >= T::kRestMin ? div_rn(fma_rn(-t, big, small), big) : S(0);
  const int j = static_cast<int>(mul_rn(t, S(16)));
  const S cj = mul_rn(static_cast<S>(j), S(0.0625));
  const S v = div_rn(add_rn(sub_rn(t, cj), rest), ExpLog<S>::mad(cj, t, S(1)));
  const S z = mul_rn(v, v);
  const S p = ExpLog<S>::mad(mul_rn(v, z), horner(T::kAtan, z), v);
  const S sigma = swap != neg ? S(-1) : S(1);
  const S khi = swap ? T::kPio2Hi : (neg ? T::kPiHi : S(0));
  const S klo = swap ? T::kPio2Lo : (neg ? T::kPiLo : S(0));
  S e;
  const S s = two_sum(khi, mul_rn(sigma, atan_sixteenth(S(0), 0, j)), e);
  S phi = add_rn(s, add_rn(e, add_rn(klo, mul_rn(sigma, add_rn(atan_sixteenth(S(0), 1, j), p)))));
  if (im < S(0)) phi = -phi;
  return phi == -T::kPiHi ? T::kPiHi : phi;
}

// logsumexp's maximum, of a chain's elements and of two states. Only its value reaches the result, never the
// sign of a zero maximum (x - m and the finish m + log(s) give the same bits for m = +0 and -0: log(s) >= +0)
// nor a NaN's payload (the GPU's arithmetic gives one NaN pattern), so float takes common/reduce.cuh's
// max_nan, one instruction where Max::apply's NumPy rules (+0 over -0, the NaN as a sum) take about seven.
template <typename S> __device__ __forceinline__ S chain_max(S a, S b) { return Max::apply(a, b); }
template <> __device__ __forceinline__ float chain_max(float a, float b) { return max_nan(a, b); }

// logsumexp: (m, s), the running maximum and the sum of e^(x - m), one pass. The identity (lowest, 0) is
// empty; every other state has s >= 1. The merge has no branch: hi is the operand of the larger m (or of a
// NaN m), m = chain_max of the two, s = s_hi + s_lo e^(m_lo - m_hi), one exp_nonpositive. For finite maxima
// that is the textbook merge, commutative in its value (equal maxima give e^0 = 1: s_a + s_b either way;
// the identity adds s_lo 0 = 0); two infinities of one sign or a NaN m make the difference NaN or infinite,
// which exp_nonpositive's clamp turns into e = 0, keeping s_hi (>= 1 but for an all -inf slice against the
// identity, which is empty again). What the operands' order can change (a zero m's sign, the s of an infinite
// or NaN m) never reaches the result: finish returns m itself for an infinite or NaN m with any s != 0.
// V, the sum's type: S, or Complex<S> for the complex logsumexp (reduce_lse_complex), whose m is the maximum of
// the real parts.
template <typename S, typename V = S> struct MaxSum {
  S m;
  V s;
};

template <typename S, typename V> __device__ __forceinline__ MaxSum<S, V> shuffle_xor(MaxSum<S, V> v, int m) {
  return MaxSum<S, V>{__shfl_xor_sync(0xffffffffu, v.m, m), shuffle_xor(v.s, m)};
}

struct LogSumExp {
  template <typename A> __device__ __forceinline__ static A identity() {
    using S = decltype(A::m);
    using V = decltype(A::s);
    return A{Limits<S>::lowest(), V(0)};
  }
  template <typename A> __device__ __forceinline__ static A apply(A a, A b) {
    const bool swap = b.m > a.m || b.m != b.m;
    const A hi = swap ? b : a;
    const A lo = swap ? a : b;
    return A{chain_max(a.m, b.m), add_rn(hi.s, mul_rn(lo.s, exp_nonpositive(sub_rn(lo.m, hi.m))))};
  }
};

// The combine of each op: sums and sums of squares add (a square is lifted once, then added).
template <int OP> struct CombineOf { using type = SumRn; };
template <> struct CombineOf<OP_MAX> { using type = Max; };
template <> struct CombineOf<OP_MIN> { using type = Min; };
template <> struct CombineOf<OP_VAR> { using type = Chan; };
template <> struct CombineOf<OP_PROD> { using type = MulRn; };
template <> struct CombineOf<OP_LSE> { using type = LogSumExp; };

// What the tree carries for result type O: the accumulator, for var its Moments, for logsumexp its MaxSum.
template <typename O, int OP> struct StateOf { using type = acc_t<O>; };
template <typename O> struct StateOf<O, OP_VAR> { using type = Moments<acc_t<O>>; };
template <typename O> struct StateOf<O, OP_LSE> { using type = MaxSum<acc_t<O>>; };
template <typename O, int OP> using state_t = typename StateOf<O, OP>::type;

// The scalar type inside a state.
template <typename A> struct ScalarOf { using type = A; };
template <typename S> struct ScalarOf<Moments<S>> { using type = S; };
template <typename S> struct ScalarOf<MaxSum<S>> { using type = S; };
template <typename A> using scalar_t = typename ScalarOf<A>::type;

// A partial from another block, read past L1 (it was written by another SM).
template <typename A> __device__ __forceinline__ A load_cg(const A* p) { return __ldcg(p); }
template <typename S> __device__ __forceinline__ Moments<S> load_cg(const Moments<S>* p) {
  return Moments<S>{__ldcg(&p->n), __ldcg(&p->mean), __ldcg(&p->m2)};
}
template <typename S> __device__ __forceinline__ MaxSum<S> load_cg(const MaxSum<S>* p) {
  return MaxSum<S>{__ldcg(&p->m), __ldcg(&p->s)};
}
template <int OP> using combine_t = typename CombineOf<OP>::type;

template <int OP, typename A> __device__ __forceinline__ A identity() { return combine_t<OP>::template identity<A>(); }
template <int OP, typename A> __device__ __forceinline__ A combine(A a, A b) { return combine_t<OP>::apply(a, b); }

// The lift modes a kernel of input T, accumulator scalar S and op OP implements, as bits (1 << LIFT_*): the
// planner sends no other (cukern/reduce_plan.py `lift_modes`). Each mode costs instructions on every
// element of every kernel that has it, and so compile time, so each kernel carries only those its callers
// use: float inputs' sums, maxima and minima skip NaN (nansum, nanmax, nanmin); their float64 sums also
// count (count_nonzero, nanmean's count); integer inputs' float64 sums count non-zeros (a NaN cannot
// occur, so skipping is plain there; int64 accumulators would spill); bool values are their own non-zero
// count, so bool kernels, and every other kernel, are plain. The kernels of count results (Count, bool:
// count_nonzero, any, all) only count, with no run-time mode: every mode compiled into each of them made
// it six times as slow to compile as another kernel.
template <typename T> struct FloatInput { static constexpr bool value = false; };
template <> struct FloatInput<float> { static constexpr bool value = true; };
template <> struct FloatInput<double> { static constexpr bool value = true; };
template <> struct FloatInput<f16> { static constexpr bool value = true; };
template <> struct FloatInput<bf16> { static constexpr bool value = true; };
template <typename S1, typename S2> struct Same { static constexpr bool value = false; };
template <typename S1> struct Same<S1, S1> { static constexpr bool value = true; };

template <typename O> struct CountResult { static constexpr bool value = false; };
template <> struct CountResult<Count> { static constexpr bool value = true; };
template <> struct CountResult<bool> { static constexpr bool value = true; };

template <typename T, typename O, typename S, int OP> __host__ __device__ constexpr int lift_modes() {
  constexpr int plain = 1 << LIFT_PLAIN, skip = 1 << LIFT_SKIP_NAN;
  constexpr int counts = (1 << LIFT_NONZERO) | (1 << LIFT_NOT_NAN);
  if (OP != OP_SUM && OP != OP_MAX && OP != OP_MIN) return plain;
  if (CountResult<O>::value) return Same<T, bool>::value ? plain : 1 << LIFT_NONZERO;  // count_nonzero, any, all
  if (!FloatInput<T>::value) {
    return OP == OP_SUM && Same<S, double>::value && !Same<T, bool>::value ? plain | (1 << LIFT_NONZERO) : plain;
  }
  return OP == OP_SUM && Same<S, double>::value ? plain | skip | counts : plain | skip;
}

// What one element v of input type T (in the accumulator scalar type S) contributes: its square for
// OP_SUMSQ; sum, max and min apply the run-time `mode` (LIFT_*) among those lift_modes gives them. var and
// logsumexp lift no single element: their chains are formed whole (chain_state).
template <int OP, int M, typename A, typename S> __device__ __forceinline__ A lift(S v, S, int mode) {
  static_assert(OP != OP_VAR && OP != OP_LSE, "var and logsumexp chains are formed by chain_state");
  if constexpr (OP == OP_SUMSQ) return mul_rn(v, v);
  else if constexpr (M == 1 << LIFT_PLAIN) return v;
  else if constexpr (M == 1 << LIFT_NONZERO) return S(v != S(0));
  else if constexpr (M == ((1 << LIFT_PLAIN) | (1 << LIFT_SKIP_NAN))) return mode != LIFT_PLAIN && v != v ? identity<OP, A>() : v;
  else if constexpr (M == ((1 << LIFT_PLAIN) | (1 << LIFT_NONZERO))) return mode == LIFT_NONZERO ? S(v != S(0)) : v;
  else {
    if (mode == LIFT_PLAIN) return v;
    if (mode == LIFT_SKIP_NAN) return v != v ? identity<OP, A>() : v;
    return (mode == LIFT_NONZERO ? v != S(0) : v == v) ? S(1) : S(0);
  }
}

// How many of a chain's CHAIN_LENGTH elements lie below n when its first lies `left` = n - index before n:
// the present ones are always a prefix in m order (indices grow by CHAINS a step).
template <typename I> __device__ __forceinline__ int chain_count(I left) {
  if (left <= 0) return 0;
  return left > (CHAIN_LENGTH - 1) * CHAINS ? CHAIN_LENGTH : static_cast<int>((left + CHAINS - 1) / CHAINS);
}


// The state of one chain of var or logsumexp from its `count` present elements x[0 .. count) (m order) at
// once, instead of lifting each element and merging it in with the full Chan or LogSumExp merge (a division,
// or an exp and four selects, per element: compute-bound). The merges above the chains are unchanged.
// var: d_m = v_m - shift, S1 = ((d_0 + d_1) + d_2) + ..., mean = S1 / count (one division a chain), then
// M2 = ((e_0^2 + e_1^2) + e_2^2) + ..., e_m = d_m - mean (0 + e_0^2 is e_0^2 exactly, so M2 starts there):
// (count, mean, M2). A non-finite d makes the mean an infinity or a NaN, which no later Chan merge makes
// finite again and finish turns into the NaN result, whatever M2 holds.
// logsumexp: m = the NaN-propagating Max of the elements (commutative, so order-free), then s = ((e^(v_0 - m)
// + e^(v_1 - m)) + ...), one exp_nonpositive per element (the term of the maximum is 1 exactly, so s >= 1),
// then s raised to 1: no change for a finite m, and (m, 1) for an infinite or NaN m, whose every term is 0
// (v - m is -inf or NaN, raised to kUnderflow), with no branch: for such an m nothing after the chain reads
// s beyond s != 0. finish returns m for
// any s != 0. LogSumExp::apply with a NaN operand adds the m's (a NaN) and the s's (no zero: every
// non-identity s is at least 1); against an equal m (two +inf or two -inf) it adds the s's; against the
// identity (s == 0) it returns this state; an m of -inf against a larger m, or a finite m against +inf, goes
// in as s_lo * e^(-inf) = s_lo * 0 = 0 (s_lo finite), leaving the other state's s as it was. So (m, 1) gives
// the bits that any other s != 0 would, and the per-element merges gave.
template <int OP, typename A, typename T>
__device__ __forceinline__ A chain_state(const T (&x)[CHAIN_LENGTH], int count, scalar_t<A> shift) {
  using S = scalar_t<A>;
  static_assert(OP == OP_VAR || OP == OP_LSE, "only var and logsumexp form their chains at once");
  static_assert((CHAIN_LENGTH & (CHAIN_LENGTH - 1)) == 0, "1 / CHAIN_LENGTH is exact");
  if (count == 0) return identity<OP, A>();
  if constexpr (OP == OP_VAR) {
    S s1 = sub_rn(to_acc<S>(x[0]), shift);
#pragma unroll
    for (int m = 1; m < CHAIN_LENGTH; ++m) {
      if (m < count) s1 = add_rn(s1, sub_rn(to_acc<S>(x[m]), shift));
    }
    // a full chain multiplies by 1/8, exactly the correctly rounded quotient s1 / 8 (the same real number
    // rounded once), with no division (whose double slow path is a call that makes the caller spill)
    const S c = static_cast<S>(count);
    const S mean = count == CHAIN_LENGTH ? mul_rn(s1, S(1) / S(CHAIN_LENGTH)) : div_rn(s1, c);
    const S e0 = sub_rn(sub_rn(to_acc<S>(x[0]), shift), mean);
    S m2 = mul_rn(e0, e0);
#pragma unroll
    for (int m = 1; m < CHAIN_LENGTH; ++m) {
      if (m < count) {
        const S e = sub_rn(sub_rn(to_acc<S>(x[m]), shift), mean);
        m2 = add_rn(m2, mul_rn(e, e));
      }
    }
    return A{c, mean, m2};
  } else {
    S hi = to_acc<S>(x[0]);
#pragma unroll
    for (int m = 1; m < CHAIN_LENGTH; ++m) {
      if (m < count) hi = chain_max(hi, to_acc<S>(x[m]));
    }
    S s = exp_nonpositive(sub_rn(to_acc<S>(x[0]), hi));
#pragma unroll
    for (int m = 1; m < CHAIN_LENGTH; ++m) {
      if (m < count) s = add_rn(s, exp_nonpositive(sub_rn(to_acc<S>(x[m]), hi)));
    }
    return A{hi, fmax(s, S(1))};  // s itself for a finite m; 1 for an infinite or NaN m (every term 0)
  }
}

// The shift of a slice whose first element is at p (var only; the other ops never read it).
template <int OP, typename S, typename T> __device__ __forceinline__ S shift_of(const T* p) {
  if constexpr (OP == OP_VAR) return to_acc<S>(*p);
  else return S(0);
}

// Partials are combined, not lifted again: a sum of squares combines its partial sums by adding them.
template <int OP> __host__ __device__ constexpr int combine_op() { return OP == OP_SUMSQ ? OP_SUM : OP; }

// The result from the accumulator: as it is, divided (mean) or square-rooted (norm), both in double
// (IEEE, correctly rounded), then rounded to O. Max, min and prod never finish (so their kernels carry no
// double-precision sqrt slow path, and a complex product no conversion to double). var: M2 / divisor
// (max(n - ddof, 0)), its square root for std, NaN when the mean is not finite (an infinity or a NaN among
// the values, as NumPy gives). all (FINISH_EQUALS): whether the count of non-zero elements is the divisor, n;
// any stores the count itself into bool (non-zero).
// logsumexp: m + log(s), in the accumulator type; an empty or all -inf slice gives -inf, a +inf +inf, a NaN
// NaN. The lift mode in finalize's high bits is dropped first.
template <typename O, int OP, typename A> __device__ __forceinline__ O finish(A a, int finalize, double divisor) {
  finalize = finish_of(finalize);
  if constexpr (OP == OP_LSE) {
    if (a.s == 0 || !isfinite(a.m)) return Store<O>::from(a.s == 0 ? Limits<decltype(a.m)>::lowest() : a.m);
    return Store<O>::from(add_rn(a.m, log_at_least_one(a.s)));
  } else if constexpr (OP == OP_VAR) {
    const double v = isfinite(a.mean) ? static_cast<double>(a.m2) / divisor : __longlong_as_double(0x7ff8000000000000ll);
    return Store<O>::from(finalize == FINISH_SQRT ? sqrt(v) : v);
  } else if constexpr (OP == OP_MAX || OP == OP_MIN || OP == OP_PROD) {
    return Store<O>::from(a);
  } else {
    if (finalize == FINISH_NONE) return Store<O>::from(a);
    const double d = static_cast<double>(a);
    if constexpr (kBoolResult<O>) {  // (only there: elsewhere it cost a bf16 column kernel 8 B of local, sm_80)
      if (finalize == FINISH_EQUALS) return d == divisor;  // all: every element counted
    }
    return Store<O>::from(finalize == FINISH_DIVIDE ? d / divisor : sqrt(d));
  }
}

// Elements a lane reads per chain step: its next CV chains, one 16-byte vector (8 bytes for bool).
template <typename T> __host__ __device__ constexpr int lane_elements() {
  return 16 / static_cast<int>(sizeof(T)) < 8 ? 16 / static_cast<int>(sizeof(T)) : 8;
}

template <typename T> __device__ __forceinline__ bool aligned16(const T* p) {
  return reinterpret_cast<unsigned long long>(p) % 16 == 0;
}

// ---------------------------------------------------------------------------------------------------------
// One lane's chains of one chunk.

// Adds chains e0 .. e0 + CV - 1 of the leaf e0 lies in (elements e0 + j + 32 m, m = 0..7, those below n)
// into acc[j], in m order. Interior chains of a 16-byte aligned span (`vector`) take UNROLL 16-byte loads
// at a time; any other chain reads its elements x[i * stride] one by one, below n only, into the same
// order, so both give the same bits. var and logsumexp hold a chain's eight elements (as loaded, converted
// in each of chain_state's passes) and set acc[j] to chain_state (chunk_value passes identities). I is the
// index type: int (fewer registers) when n + a chunk stays below 2^31.
template <typename T, typename A, int OP, int L, int CV, int UNROLL, typename I>
__device__ __forceinline__ void add_chains(A (&acc)[CV], const T* x, I n, I e0, I stride, bool vector,
                                           scalar_t<A> shift, int mode) {
  static_assert(CHAIN_LENGTH % UNROLL == 0, "UNROLL divides the chain length");
  using S = scalar_t<A>;
  constexpr int C = combine_op<OP>();
  // Kernels that also count (float64 accumulators, the lift's extra registers) keep fewer loads in flight
  // for half-type inputs (two) and int64 ones (half as many): more spill at their register cap (found by
  // compiling every instantiation; the other inputs do not). The chains' order is the same.
  constexpr bool counts = (L & (1 << LIFT_NONZERO)) != 0;
  constexpr int U = !counts || UNROLL <= 2 ? UNROLL
                    : sizeof(T) == 2                                ? 2
                    : sizeof(T) == 8 && !FloatInput<T>::value       ? UNROLL / 2
                                                                    : UNROLL;
  if constexpr (OP == OP_VAR || OP == OP_LSE) {
    if (vector && e0 + (CHAIN_LENGTH - 1) * CHAINS + CV <= n) {
      Pack<T, CV> p[CHAIN_LENGTH];
#pragma unroll
      for (int m = 0; m < CHAIN_LENGTH; ++m) load(p[m], x + e0 + m * CHAINS);
#pragma unroll
      for (int j = 0; j < CV; ++j) {
        T v[CHAIN_LENGTH];
#pragma unroll
        for (int m = 0; m < CHAIN_LENGTH; ++m) v[m] = p[m].v[j];
        acc[j] = chain_state<OP, A>(v, CHAIN_LENGTH, shift);
      }
    } else {
      // G chains' elements at a time: all CV for 4- and 8-byte inputs, one for narrower ones (eight chains of
      // bools or halves hold 64 registers across a partial chain's division, whose slow path is a call: the
      // bool var kernels spilled; the int ones spilled chain by chain instead)
      constexpr int G = sizeof(T) >= 4 ? CV : 1;
#pragma unroll
      for (int j0 = 0; j0 < CV; j0 += G) {
        T v[G][CHAIN_LENGTH];
#pragma unroll
        for (int m = 0; m < CHAIN_LENGTH; ++m) {
#pragma unroll
          for (int g = 0; g < G; ++g) {
            const I i = e0 + m * CHAINS + j0 + g;
            v[g][m] = i < n ? x[i * stride] : T{};
          }
        }
#pragma unroll
        for (int g = 0; g < G; ++g) acc[j0 + g] = chain_state<OP, A>(v[g], chain_count(n - (e0 + j0 + g)), shift);
      }
    }
  } else {
    if (vector && e0 + (CHAIN_LENGTH - 1) * CHAINS + CV <= n) {
#pragma unroll
      for (int m0 = 0; m0 < CHAIN_LENGTH; m0 += U) {
        Pack<T, CV> p[U];
#pragma unroll
        for (int u = 0; u < U; ++u) load(p[u], x + e0 + (m0 + u) * CHAINS);
#pragma unroll
        for (int u = 0; u < U; ++u) {
#pragma unroll
          for (int j = 0; j < CV; ++j) acc[j] = combine<C>(acc[j], lift<OP, L, A>(to_acc<S>(p[u].v[j]), shift, mode));
        }
      }
      return;
    }
    // A few steps' values in flight, at most 64 bytes of them.
    constexpr int BY_SIZE = 64 / (CV * static_cast<int>(sizeof(A)));
    constexpr int STEPS = BY_SIZE < 1 ? 1 : (BY_SIZE < UNROLL ? BY_SIZE : UNROLL);
#pragma unroll
    for (int m0 = 0; m0 < CHAIN_LENGTH; m0 += STEPS) {
      A v[STEPS][CV];
#pragma unroll
      for (int u = 0; u < STEPS; ++u) {
#pragma unroll
        for (int j = 0; j < CV; ++j) {
          const I i = e0 + (m0 + u) * CHAINS + j;
          v[u][j] = i < n ? lift<OP, L, A>(to_acc<S>(x[i * stride]), shift, mode) : identity<C, A>();
        }
      }
#pragma unroll
      for (int u = 0; u < STEPS; ++u) {
#pragma unroll
        for (int j = 0; j < CV; ++j) acc[j] = combine<C>(acc[j], v[u][j]);
      }
    }
  }
}

// The subtree of one chunk of a group of `group` lanes (a power of two, a multiple of CHAINS / CV): this
// lane's chains start at element e0. Every lane of the warp must call it; every lane of the group gets
// the chunk's value.
template <typename T, typename A, int OP, int L, int CV, int UNROLL, typename I>
__device__ __forceinline__ A chunk_value(const T* x, I n, I e0, I stride, bool vector, int group, scalar_t<A> shift,
                                         int mode) {
  using Comb = combine_t<combine_op<OP>()>;
  A acc[CV];
#pragma unroll
  for (int j = 0; j < CV; ++j) acc[j] = Comb::template identity<A>();
  add_chains<T, A, OP, L, CV, UNROLL, I>(acc, x, n, e0, stride, vector, shift, mode);
  return group_tree_reduce<Comb>(tree_reduce<Comb>(acc), group);
}

// Where lane `lane` of a group starts in its group's chunk: chain (lane % (CHAINS / CV)) * CV of leaf
// lane / (CHAINS / CV).
template <int CV> __device__ __forceinline__ int lane_start(int lane) {
  constexpr int kLanesPerLeaf = CHAINS / CV;
  return (lane / kLanesPerLeaf) * LEAF + (lane % kLanesPerLeaf) * CV;
}

// Last block done: thread 0 publishes the block's partial v and bumps the counter with one acquire-release
// atomic (the release orders the partial before the count, in one round trip to L2 where a fence and a
// plain atomic take two); returns (in every thread of the block) whether this block was the last to
// finish, in which case every partial is visible to it. The caller then combines partials[0 .. gridDim.x)
// and resets the counter. The barrier first: every thread has finished reading the block's shared slots
// before thread 0 goes on to write (compute-sanitizer's racecheck reported the slot reads against the write
// of `last` without it).
template <typename A> __device__ __forceinline__ bool last_block_done(A* partials, unsigned* counter, A v) {
  __shared__ bool last;
  __syncthreads();
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = v;
    unsigned before;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;" : "=r"(before) : "l"(counter) : "memory");
    last = before == gridDim.x - 1;
  }
  __syncthreads();
  if (last) __threadfence();
  return last;
}

// ---------------------------------------------------------------------------------------------------------
// The kernels.

// The whole-array reduction in one launch, element i at x[i * stride] (any stride, either sign). Chunks go
// to the warps in groups of BLOCK / 32 consecutive chunks, one a warp, and the blocks split the groups into
// equal aligned spans (a power of two each): every group, every block's span and the grid are subtrees of
// the one tree, whatever the grid. A block reads one contiguous run of memory, a group a round: each warp
// takes its chunk of the group and lane 0 leaves the chunk's value in a shared slot. (Warps streaming spans
// of their own, thousands of narrow fronts far apart, drew less from DRAM: docs/design/reductions.md.)
// Rounds come in batches of up to FULL_BATCH groups (an aligned subtree): one barrier a batch, after which
// warp 0 combines the batch (lane g the tree of group g over its warps, then the lanes' tree) and thread
// 0 pushes it onto the block's stack, while the other warps go on loading the next batch. The block
// publishes its span's value, and the last block to finish combines the partials (at most
// FULL_FOLD * BLOCK) and writes the result. The counter is reset by that block, so the buffer needs zeroing
// only once, when it is allocated.
template <typename T, typename O, int OP, int BLOCK, int UNROLL>
__device__ __forceinline__ void full_reduce_body(O* out, state_t<O, OP>* partials, unsigned* counter, const T* x,
                                                 long long n, long long stride, int finalize, double divisor) {
  using A = state_t<O, OP>;
  constexpr int L = lift_modes<T, O, scalar_t<A>, OP>();  // the lifts this kernel implements
  constexpr int F = combine_op<OP>();
  using Comb = combine_t<F>;
  constexpr int CV = lane_elements<T>();
  constexpr int kWarps = BLOCK / 32;
  constexpr long long kChunk = 32LL * CV * CHAIN_LENGTH;
  constexpr int kWarpLevels = levels_of(kWarps);
  __shared__ A slots[2][FULL_BATCH][kWarps];
  __shared__ A scratch[2 * kWarps];
  __shared__ A stack[STACK_DEPTH];
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const long long chunks = (n + kChunk - 1) / kChunk;
  const long long groups = (chunks + kWarps - 1) / kWarps;
  long long span = 1;
  while (span * gridDim.x < groups) span *= 2;
  const long long first = static_cast<long long>(blockIdx.x) * span;
  const long long left = groups - first;
  const long long count = left < 0 ? 0 : (left < span ? left : span);
  // groups a batch: a power of two, no more than the span (a batch past the span would read the next block's)
  const int batch = span < FULL_BATCH ? static_cast<int>(span) : FULL_BATCH;
  const long long batches = (count + batch - 1) / batch;
  const bool vector = stride == 1 && aligned16(x);
  const long long start = lane_start<CV>(lane);
  const scalar_t<A> shift = shift_of<OP, scalar_t<A>>(x);
  int shift_batch = 0;  // log2(batch)
  while ((1 << shift_batch) < batch) ++shift_batch;
  // one loop over the rounds, the batch's barrier in its last round (a loop of batches around a loop of
  // rounds made ptxas keep several chunks' loads live and spill)
  for (long long r = 0; r < batches * batch; ++r) {
    const long long b = r >> shift_batch;
    const int g = static_cast<int>(r) & (batch - 1);
    A(*slot)[kWarps] = slots[b & 1];  // two sets of slots, so a batch's writes never meet the last one's reads
    // a group past the span's end, or a chunk past the array's (in the last group), reads nothing and gives
    // the identity, the tree's padding
    A c = Comb::template identity<A>();
    if (r < count) {
      const long long chunk = (first + r) * kWarps + warp;
      c = chunk_value<T, A, OP, L, CV, UNROLL, long long>(x, n, chunk * kChunk + start, stride, vector, 32, shift,
                                                       lift_of(finalize));
    }
    if (lane == 0) slot[g][warp] = c;
    if (g == batch - 1) {
      __syncthreads();
      if (warp == 0) {
        A v = Comb::template identity<A>();
        if (lane < batch) {
          // the group's tree over its warps, as a counter of levels (a few registers, not one a warp: var's
          // float64 states would spill)
          A level[kWarpLevels];
#pragma unroll
          for (int i = 0; i < kWarps; ++i) tree_push<Comb>(level, slot[lane][i], i);
          v = level[kWarpLevels - 1];
        }
        v = group_tree_reduce<Comb>(v, batch);
        if (lane == 0) tree_push<Comb>(stack, v, b);  // thread 0 owns the stack
      }
    }
  }
  const A v = threadIdx.x == 0 ? tree_result<Comb>(stack, batches) : Comb::template identity<A>();
  if (!last_block_done(partials, counter, v)) return;
  A p[FULL_FOLD];
#pragma unroll
  for (int i = 0; i < FULL_FOLD; ++i) {
    const unsigned at = threadIdx.x * FULL_FOLD + i;
    p[i] = at < gridDim.x ? load_cg(partials + at) : Comb::template identity<A>();
  }
  const A folded[1] = {tree_reduce<Comb>(p)};
  const A w = block_tree_reduce<BLOCK, Comb>(folded, scratch, 1);
  if (threadIdx.x == 0) {
    *out = finish<O, F>(w, finalize, divisor);
    *counter = 0;
  }
}

template <typename T, typename O, int OP, int BLOCK, int UNROLL>
__global__ void CUKERN_BOUNDS(BLOCK)
    reduce_full(O* out, state_t<O, OP>* partials, unsigned* counter, const T* x, long long n, long long stride,
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

// Rows of `length` contiguous elements; row i starts at (i / inner) * s0 + (i % inner) * s1. tpr threads
// own a row: tpr < 32 (a sub-warp group, blockDim / tpr rows to a block) only when one chunk of tpr lanes
// covers the row; otherwise tpr / 32 warps (blockDim == tpr == MAX_BLOCK, a power of two), each with an
// aligned span of the row's chunks, combined across warps in warp order. Out is contiguous, one value per
// row. MIN_BLOCKS caps the registers (__launch_bounds__) so that MIN_BLOCKS blocks of MAX_BLOCK threads
// stay resident per SM: the planner sizes the grid from it. I indexes within a row: int (fewer registers)
// for rows shorter than 2^30 elements, long long otherwise. Half-type inputs with 8-byte accumulators
// (eight doubles or int64 per 16-byte vector) get half that occupancy: at 64 registers they spill; so do
// some 64-bit-index instantiations, whose rows are so long that a launch has few blocks: they go uncapped.
// var's states (three accumulators a chain) count as wide ones, and its float64 states (24 bytes a chain,
// up to eight chains a lane) get a quarter; logsumexp's count as wide (var and logsumexp hold a chain's
// eight loads at once, and the exps: at the full cap of 64 registers their float32 and float64 rows
// kernels spill).
template <typename T, typename O, int OP, typename I> __host__ __device__ constexpr int row_min_blocks(int min_blocks) {
  if (sizeof(I) == 8) return 1;
  if (OP == OP_VAR && sizeof(state_t<O, OP>) == 24) return min_blocks > 4 ? min_blocks / 4 : 1;
  // float32 var in 128-thread blocks (its default): seven, not four (71 registers, no spill; 28 warps an SM
  // instead of 20, faster than four or six: docs/design/reductions.md; eight spill)
  if (OP == OP_VAR && sizeof(T) == 4 && sizeof(state_t<O, OP>) == 12 && min_blocks == 8) return 7;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  // before sm_90: int64 products of bool and int32 spill at 64 registers (sm_90 fits them); seven fit (72)
  if (OP == OP_PROD && sizeof(T) < 8 && sizeof(state_t<O, OP>) == 8 && min_blocks == 8) return 7;
#endif
  // float32 logsumexp in 128-thread blocks (its default): seven (72 registers, no spill; eight spill), where
  // the halved bound let ptxas take 83 registers, five blocks
  if (OP == OP_LSE && sizeof(T) == 4 && sizeof(state_t<O, OP>) == 8 && min_blocks == 8) return 7;
  // float64 max and min: their selects keep both operands and the NaN sum live; at 64 registers (eight
  // 128-thread blocks) ptxas spilled 8 bytes on sm_90, seven eighths of the blocks fit
  if ((OP == OP_MAX || OP == OP_MIN) && Same<T, double>::value && min_blocks >= 4) return min_blocks * 7 / 8;
  const bool wide = OP == OP_LSE || (sizeof(state_t<O, OP>) >= 8 && (sizeof(T) == 2 || OP == OP_VAR));
  return wide && min_blocks > 1 ? min_blocks / 2 : min_blocks;
}

template <typename T, typename O, int OP, int MAX_BLOCK, int UNROLL, int MIN_BLOCKS, typename I>
__global__ void __launch_bounds__(MAX_BLOCK, arch_min_blocks(row_min_blocks<T, O, OP, I>(MIN_BLOCKS)))
    reduce_rows(O* out, const T* x, long long rows, long long length, long long inner, long long s0, long long s1,
                int tpr, int finalize, double divisor) {
  using A = state_t<O, OP>;
  constexpr int L = lift_modes<T, O, scalar_t<A>, OP>();  // the lifts this kernel implements
  constexpr int F = combine_op<OP>();
  using Comb = combine_t<F>;
  constexpr int CV = lane_elements<T>();
  __shared__ A scratch[2 * (MAX_BLOCK / 32)];
  __shared__ A stacks[MAX_BLOCK / 32][STACK_DEPTH];
  const int group = tpr < 32 ? tpr : 32;
  const int groups = tpr / group;
  // Only blocks of ROW_LIFT_BLOCK lift (the planner gives lifted calls rows of at most 32 threads, which
  // take such blocks): a lift in every block size would cost the family half its compile time again.
  const int mode = MAX_BLOCK == ROW_LIFT_BLOCK ? lift_of(finalize) : LIFT_PLAIN;
  const int t = static_cast<int>(threadIdx.x) % tpr;
  const int slot = static_cast<int>(threadIdx.x) / tpr;
  const int per_block = static_cast<int>(blockDim.x) / tpr;
  const I chunk = static_cast<I>(group) * CV * CHAIN_LENGTH;
  const I chunks = (static_cast<I>(length) + chunk - 1) / chunk;
  I span = 1;
  while (span * groups < chunks) span *= 2;
  const I first = static_cast<I>(t / group) * span;
  const I left = chunks - first;
  const I count = left < 0 ? 0 : (left < span ? left : span);
  const I start = static_cast<I>(lane_start<CV>(t % group));
  A* stack = stacks[threadIdx.x >> 5];
  const bool lane0 = (threadIdx.x & 31) == 0;
  const long long step = static_cast<long long>(gridDim.x) * per_block;
  const long long base0 = static_cast<long long>(blockIdx.x) * per_block;
  RowCursor at(base0 + slot, step, inner);
  int parity = 0;
  for (long long base = base0; base < rows; base += step, at.advance()) {
    const long long row = base + slot;
    // A group past the last row still takes part in the warp's shuffles, reading nothing.
    const bool live = row < rows;
    const T* p = live ? x + at.q * s0 + at.r * s1 : x;
    const I n = live ? static_cast<I>(length) : 0;
    const bool vector = aligned16(p);
    const scalar_t<A> shift = shift_of<OP, scalar_t<A>>(p);
    A v = Comb::template identity<A>();
    for (I k = 0; k < count; ++k) {
      const A c = chunk_value<T, A, OP, L, CV, UNROLL, I>(p, n, (first + k) * chunk + start, 1, vector, group, shift,
                                                          mode);
      if (span == 1) {
        v = c;
      } else if (lane0) {  // every lane holds c; lane 0 owns its warp's stack and alone needs v
        tree_push<Comb>(stack, c, static_cast<unsigned long long>(k));
      }
    }
    if (span > 1 && lane0) v = tree_result<Comb>(stack, static_cast<unsigned long long>(count));
    if (groups > 1) {
      const A mine[1] = {(threadIdx.x & 31) == 0 ? v : Comb::template identity<A>()};
      v = block_tree_reduce<MAX_BLOCK, Comb>(mine, scratch, parity);
      parity ^= 1;
    }
    if (t == 0 && live) out[row] = finish<O, F>(v, finalize, divisor);
  }
}

// Columns: for each of `outer` matrices at x + o * s_outer, reduce `rows` rows (s_row apart, either sign)
// of `cols` contiguous columns. Block b owns a strip of COLS = CW * VEC columns and an aligned span of
// `span` leaves (a power of two); thread (tx, ty) owns VEC adjacent columns and chains Q * ty .. Q * ty +
// Q - 1 of every leaf, reading one VEC-wide pack per row (aligned packs, when `vector` says so) or VEC
// scalars. Per leaf, each thread combines its Q chains, the R row lanes' values meet in shared memory and
// combine across R lanes of one warp, and each column's leaf value joins that column's span stack. Out is
// [outer, spans, cols]: the span's tree (P = acc_t, finalize = FINISH_NONE) for reduce_cols_fold to finish
// when spans > 1, the result when spans == 1.
// The column kernel's resident blocks: none stated on sm_90 (ptxas chooses), one from sm_100 on (as
// CUKERN_BOUNDS). Before sm_90, ptxas left to choose aims some of the 16-bit and float32 instantiations
// (four columns a thread) at 64 registers (four blocks) or 48 (five) and spills a few bytes: 16-bit sums
// and float32 maxima and minima with four chains a thread fit in three blocks (70 to 72 registers), 16-bit
// maxima and minima with one chain in the same five blocks once they are stated.
template <typename T, int OP, int VEC, int Q> __host__ __device__ constexpr int col_min_blocks() {
  const bool half = sizeof(T) == 2, extreme = OP == OP_MAX || OP == OP_MIN;
  if (VEC == 4 && Q == 4 && (half ? !extreme : extreme && sizeof(T) == 4)) return before_sm90_min_blocks(3);
  if (VEC == 4 && Q == 1 && half && extreme) return before_sm90_min_blocks(5);
  return before_sm90_min_blocks(0);
}

template <typename T, typename P, int OP, int VEC, int Q>
__global__ void __launch_bounds__(COL_BLOCK, col_min_blocks<T, OP, VEC, Q>())
    reduce_cols(P* out, const T* x, long long outer, long long rows, long long cols, long long s_outer,
                long long s_row, long long span, int spans, int strips, int vector, int finalize, double divisor) {
  using A = state_t<P, OP>;
  using S = scalar_t<A>;
  constexpr int L = lift_modes<T, P, S, OP>();
  constexpr int F = combine_op<OP>();
  using Comb = combine_t<F>;
  constexpr int R = CHAINS / Q;
  constexpr int CW = COL_BLOCK / R;
  constexpr int COLS = CW * VEC;
  constexpr int STEPS = COL_LOADS / Q > 0 ? COL_LOADS / Q : 1;
  static_assert(CHAIN_LENGTH % STEPS == 0, "steps divide the chain length");
  // Rows padded so that the R lanes reading one column hit R different banks.
  __shared__ A stage[R][COLS + 32 / R];
  __shared__ A stacks[COLS][COL_STACK_DEPTH];
  // The grid is below 2^31 blocks, so the block index splits with 32-bit division.
  const unsigned b = blockIdx.x;
  const long long strip = b % static_cast<unsigned>(strips);
  const unsigned rest = b / static_cast<unsigned>(strips);
  const long long sp = rest % static_cast<unsigned>(spans);
  const long long o = rest / static_cast<unsigned>(spans);
  // Lifted calls never come here (the planner copies their column layouts to rows): a lift in this kernel's
  // wide unrolled body cost registers, spills and compile time.
  constexpr int mode = LIFT_PLAIN;
  const int tx = static_cast<int>(threadIdx.x) % CW;
  const int ty = static_cast<int>(threadIdx.x) / CW;
  const long long c0 = strip * COLS + static_cast<long long>(tx) * VEC;
  const long long leaves = (rows + LEAF - 1) / LEAF;
  const long long first = sp * span;
  const long long left = leaves - first;
  const long long count = left < span ? left : span;
  const T* base = x + o * s_outer + c0;
  const bool packs = vector && c0 + VEC <= cols;
  S shift[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) shift[j] = c0 + j < cols ? shift_of<OP, S>(base + j) : S(0);
  for (long long k = 0; k < count; ++k) {
    const long long r0 = (first + k) * LEAF + Q * ty;
    A acc[Q][VEC];
#pragma unroll
    for (int q = 0; q < Q; ++q) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) acc[q][j] = Comb::template identity<A>();
    }
    if constexpr (OP == OP_VAR || OP == OP_LSE) {
      // a chain's eight rows at once, for chain_state, one chain (q) at a time: all Q chains' rows live across
      // a partial chain's division (a call on its slow path) spilled (bool and int inputs of var)
#pragma unroll
      for (int q = 0; q < Q; ++q) {
        T raw[VEC][CHAIN_LENGTH];
#pragma unroll
        for (int m = 0; m < CHAIN_LENGTH; ++m) {
          const long long r = r0 + m * CHAINS + q;
          const T* row = base + r * s_row;
          if (packs && r < rows) {
            Pack<T, VEC> pk;
            load(pk, row);
#pragma unroll
            for (int j = 0; j < VEC; ++j) raw[j][m] = pk.v[j];
          } else {
#pragma unroll
            for (int j = 0; j < VEC; ++j) raw[j][m] = r < rows && c0 + j < cols ? row[j] : T{};
          }
        }
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          acc[q][j] = chain_state<OP, A>(raw[j], c0 + j < cols ? chain_count(rows - (r0 + q)) : 0, shift[j]);
        }
      }
    } else {
#pragma unroll
      for (int m0 = 0; m0 < CHAIN_LENGTH; m0 += STEPS) {
        A v[STEPS][Q][VEC];
#pragma unroll
        for (int u = 0; u < STEPS; ++u) {
#pragma unroll
          for (int q = 0; q < Q; ++q) {
            const long long r = r0 + (m0 + u) * CHAINS + q;
            const T* row = base + r * s_row;
            if (packs && r < rows) {
              Pack<T, VEC> pk;
              load(pk, row);
#pragma unroll
              for (int j = 0; j < VEC; ++j) v[u][q][j] = lift<OP, L, A>(to_acc<S>(pk.v[j]), shift[j], mode);
            } else {
#pragma unroll
              for (int j = 0; j < VEC; ++j) {
                v[u][q][j] = r < rows && c0 + j < cols ? lift<OP, L, A>(to_acc<S>(row[j]), shift[j], mode) : Comb::template identity<A>();
              }
            }
          }
        }
#pragma unroll
        for (int u = 0; u < STEPS; ++u) {
#pragma unroll
          for (int q = 0; q < Q; ++q) {
#pragma unroll
            for (int j = 0; j < VEC; ++j) acc[q][j] = Comb::apply(acc[q][j], v[u][q][j]);
          }
        }
      }
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      A mine[Q];
#pragma unroll
      for (int q = 0; q < Q; ++q) mine[q] = acc[q][j];
      stage[ty][tx * VEC + j] = tree_reduce<Comb>(mine);
    }
    __syncthreads();
#pragma unroll
    for (int round = 0; round < VEC; ++round) {
      const int at = round * COL_BLOCK + static_cast<int>(threadIdx.x);
      const A w = group_tree_reduce<R, Comb>(stage[at % R][at / R]);
      if (at % R == 0) tree_push<Comb>(stacks[at / R], w, static_cast<unsigned long long>(k));
    }
    __syncthreads();
  }
#pragma unroll
  for (int round = 0; round < VEC; ++round) {
    const int at = round * COL_BLOCK + static_cast<int>(threadIdx.x);
    const long long c = strip * COLS + at / R;
    if (at % R == 0 && c < cols) {
      const A w = tree_result<Comb>(stacks[at / R], static_cast<unsigned long long>(count));
      const long long i = (o * spans + sp) * cols + c;
      if constexpr (F == OP_VAR) {
        // The first of two passes stores the whole state for reduce_cols_fold (out holds `spans` of them).
        if (finish_of(finalize) == FINISH_NONE) {
          reinterpret_cast<A*>(out)[i] = w;
          continue;
        }
      }
      out[i] = finish<P, F>(w, finalize, divisor);
    }
  }
}

// The second pass of a column reduction with `spans` spans a column: partials [outer, spans, cols] of
// reduce_cols (states of accumulator P), combined per column in span order along the same tree, finished
// into out [outer, cols].
template <typename P, typename O, int OP>
__global__ void __launch_bounds__(FOLD_BLOCK)
    reduce_cols_fold(O* out, const state_t<P, OP>* partials, long long outer, long long cols, int spans,
                     int finalize, double divisor) {
  using A = state_t<P, OP>;
  using Comb = combine_t<OP>;
  __shared__ A stacks[FOLD_BLOCK][FOLD_DEPTH];
  const long long i = static_cast<long long>(blockIdx.x) * FOLD_BLOCK + threadIdx.x;
  if (i >= outer * cols) return;
  const long long o = i / cols, c = i % cols;
  const A* p = partials + o * spans * cols + c;
  for (int s = 0; s < spans; ++s) tree_push<Comb>(stacks[threadIdx.x], p[s * cols], static_cast<unsigned long long>(s));
  out[i] = finish<O, OP>(tree_result<Comb>(stacks[threadIdx.x], static_cast<unsigned long long>(spans)), finalize,
                         divisor);
}

// Any other layout of at most two kept and two reduced levels, without a copy: one warp per output, lane
// c holding chain c of each leaf in turn (element r at (r / r_inner) * r_s0 + (r % r_inner) * r_s1 from
// the output's base, the division done once a leaf and carried along the chain). Correct everywhere,
// coalesced only when the reduced inner stride is 1.
template <typename T, typename O, int OP, int BLOCK>
__global__ void __launch_bounds__(BLOCK)
    reduce_strided(O* out, const T* x, long long outputs, long long o_inner, long long o_s0, long long o_s1,
                   long long count, long long r_inner, long long r_s0, long long r_s1, int finalize, double divisor) {
  using A = state_t<O, OP>;
  using S = scalar_t<A>;
  constexpr int L = lift_modes<T, O, S, OP>();
  constexpr int F = combine_op<OP>();
  using Comb = combine_t<F>;
  constexpr int kWarps = BLOCK / 32;
  __shared__ A stacks[kWarps][STACK_DEPTH];
  constexpr int mode = LIFT_PLAIN;  // as reduce_cols: lifted calls are copied to rows first
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const long long leaves = (count + LEAF - 1) / LEAF;
  const long long step_q = CHAINS / r_inner, step_r = CHAINS % r_inner;
  for (long long first = static_cast<long long>(blockIdx.x) * kWarps; first < outputs;
       first += static_cast<long long>(gridDim.x) * kWarps) {
    const long long o = first + warp;
    if (o >= outputs) break;
    const T* base = x + (o / o_inner) * o_s0 + (o % o_inner) * o_s1;
    const S shift = shift_of<OP, S>(base);
    for (long long k = 0; k < leaves; ++k) {
      long long q = (k * LEAF + lane) / r_inner, rem = (k * LEAF + lane) % r_inner;
      A acc = Comb::template identity<A>();
      if constexpr (OP == OP_VAR || OP == OP_LSE) {
        T raw[CHAIN_LENGTH];
#pragma unroll
        for (int m = 0; m < CHAIN_LENGTH; ++m) {
          const long long r = k * LEAF + m * CHAINS + lane;
          raw[m] = r < count ? base[q * r_s0 + rem * r_s1] : T{};
          q += step_q;
          rem += step_r;
          if (rem >= r_inner) rem -= r_inner, ++q;
        }
        acc = chain_state<OP, A>(raw, chain_count(count - (k * LEAF + lane)), shift);
      } else {
        A v[CHAIN_LENGTH];
#pragma unroll
        for (int m = 0; m < CHAIN_LENGTH; ++m) {
          const long long r = k * LEAF + m * CHAINS + lane;
          v[m] = r < count ? lift<OP, L, A>(to_acc<S>(base[q * r_s0 + rem * r_s1]), shift, mode) : Comb::template identity<A>();
          q += step_q;
          rem += step_r;
          if (rem >= r_inner) rem -= r_inner, ++q;
        }
#pragma unroll
        for (int m = 0; m < CHAIN_LENGTH; ++m) acc = Comb::apply(acc, v[m]);
      }
      const A w = group_tree_reduce<32, Comb>(acc);
      if (lane == 0) tree_push<Comb>(stacks[warp], w, static_cast<unsigned long long>(k));  // lane 0 owns the stack
    }
    if (lane == 0) {
      const A v = tree_result<Comb>(stacks[warp], static_cast<unsigned long long>(leaves));
      out[o] = finish<O, F>(v, finalize, divisor);
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Weighted logsumexp: log|sum_i w_i e^(x_i)| and the sum's sign (scipy.special.logsumexp's b and
// return_sign), the weights w read beside x through strides of their own (a broadcast weight has zero
// strides). One warp an output, as reduce_strided: the same tree over the same chains, each chain's state
// formed at once (weighted_chain), the states merged by WeightedLse. x and w are of the result's type T and
// accumulate in acc_t<T>.

// Its scalars (cukern/reduce_plan.py LSE_WEIGHTED_PARAMS, the same fields in the same order). Output o's
// elements start at (o / o_inner) * o_s0 + (o % o_inner) * o_s1 of x (ow_s0, ow_s1 in w), element r of an
// output (r / r_inner) * r_s0 + (r % r_inner) * r_s1 further on (rw_s0, rw_s1 in w), r < count.
struct LseWeightedParams {
  long long outputs, o_inner, o_s0, o_s1, ow_s0, ow_s1;
  long long count, r_inner, r_s0, r_s1, rw_s0, rw_s1;
  int signed_result;  // 1: sgn receives the sum's sign; 0: sgn is not written and a negative sum gives NaN
  int weighted;       // reduce_lse_complex: 0 reads no w (every weight 1); reduce_lse_weighted always reads it
};

// The complex sums' parts, each as a real s (the complex logsumexp's states, MaxSum<S, Complex<S>>).
template <typename S> __device__ __forceinline__ Complex<S> mul_rn(Complex<S> a, S e) {
  return Complex<S>(mul_rn(a.re, e), mul_rn(a.im, e));
}
template <typename S> __device__ __forceinline__ Complex<S> add_rn(Complex<S> a, Complex<S> b) {
  return Complex<S>(add_rn(a.re, b.re), add_rn(a.im, b.im));
}

// The state (m, s): m the NaN-propagating maximum of the elements of non-zero weight (-inf for none), s the
// signed sum of their terms w e^(x - m), any value, 0 included. An element of x = +inf (so m = +inf) adds
// w itself, not w e^(inf - inf): at m = +inf, s is the sum of the weights of the +inf elements, whose sign is
// the result's. The merge is LogSumExp's, s = s_hi + s_lo e^(m_lo - m_hi), but two maxima of +inf add their
// sums (a factor 1, where exp_nonpositive's clamp of the NaN difference gives 0); equal finite maxima give
// e^0 = 1 exactly anyway. Commutative bit for bit (equal maxima add s_a + s_b; the identity (-inf, 0) adds
// s_lo 0 = 0, or keeps a NaN s), as the shuffle trees need. A complex s (reduce_lse_complex) merges each part
// so.
struct WeightedLse {
  template <typename A> __device__ __forceinline__ static A identity() { return LogSumExp::identity<A>(); }
  template <typename A> __device__ __forceinline__ static A apply(A a, A b) {
    using S = decltype(A::m);
    const bool swap = b.m > a.m || b.m != b.m;
    const A hi = swap ? b : a;
    const A lo = swap ? a : b;
    const bool infinite = hi.m == lo.m && hi.m == Limits<S>::highest();
    const S e = infinite ? S(1) : exp_nonpositive(sub_rn(lo.m, hi.m));
    return A{chain_max(a.m, b.m), add_rn(hi.s, mul_rn(lo.s, e))};
  }
};

// One chain's state from its eight (x, w) pairs in m order; a pair past the end has w = 0. A zero weight drops
// its element whatever x is (+inf and NaN included), as SciPy's logsumexp; a NaN weight is not zero, and
// its NaN term makes s NaN. s = ((t_0 + t_1) + t_2) + ... over the kept elements, from 0 (0 + t_0 = t_0).
template <typename A, typename S>
__device__ __forceinline__ A weighted_chain(const S (&x)[CHAIN_LENGTH], const S (&w)[CHAIN_LENGTH]) {
  S m = Limits<S>::lowest();
#pragma unroll
  for (int k = 0; k < CHAIN_LENGTH; ++k) {
    if (w[k] != S(0)) m = chain_max(m, x[k]);
  }
  S s = S(0);
#pragma unroll
  for (int k = 0; k < CHAIN_LENGTH; ++k) {
    if (w[k] != S(0)) {
      s = add_rn(s, x[k] == Limits<S>::highest() ? w[k] : mul_rn(w[k], exp_nonpositive(sub_rn(x[k], m))));
    }
  }
  return A{m, s};
}

// The result of a state: m + log|s| (log_at_least_one's steps hold for any finite s > 0, not only s >= 1)
// and sign(s); NaN (and a NaN sign) for a NaN m or s; -inf and 0 for s == 0 (a cancelled sum, no element
// of non-zero weight, or every such element -inf), but NaN for s == 0 under m = +inf (+inf - inf);
// +inf for m = +inf or an infinite s. Without signed_result a negative sum gives NaN, as SciPy's.
template <typename O, typename S>
__device__ __forceinline__ void finish_weighted(O* out, O* sgn, long long o, MaxSum<S> v, int signed_result) {
  const S nan = Limits<S>::highest() - Limits<S>::highest();
  const S inf = Limits<S>::highest();
  S r, g;
  if (v.m != v.m || v.s != v.s) {
    r = nan, g = nan;
  } else if (v.s == S(0)) {
    r = v.m == inf ? nan : -inf;
    g = v.m == inf ? nan : S(0);
  } else {
    g = v.s > S(0) ? S(1) : S(-1);
    const S a = fabs(v.s);
    r = v.m == inf || a == inf ? inf : add_rn(v.m, log_at_least_one(a));
  }
  if (signed_result) {
    sgn[o] = Store<O>::from(g);
  } else if (g < S(0)) {
    r = nan;
  }
  out[o] = Store<O>::from(r);
}

// The walk of reduce_lse_weighted and reduce_lse_complex: one warp an output, as reduce_strided, lane c
// holding chain c of each leaf in turn: its eight elements of x and w in m order (present: below count; w
// read only where read_w, else T{}), from which chain(xs, ws, present) forms the chain's state; the states
// merged by WeightedLse (a leaf's by shuffles, the leaves' on lane 0's stack), then finish(o, state) on lane 0.
template <int BLOCK, typename A, typename T, typename Chain, typename Finish>
__device__ __forceinline__ void lse_walk(const T* x, const T* w, const LseWeightedParams& p, bool read_w, Chain chain,
                                         Finish finish) {
  constexpr int kWarps = BLOCK / 32;
  __shared__ A stacks[kWarps][STACK_DEPTH];
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const long long leaves = (p.count + LEAF - 1) / LEAF;
  const long long step_q = CHAINS / p.r_inner, step_r = CHAINS % p.r_inner;
  for (long long first = static_cast<long long>(blockIdx.x) * kWarps; first < p.outputs;
       first += static_cast<long long>(gridDim.x) * kWarps) {
    const long long o = first + warp;
    if (o >= p.outputs) break;
    const long long oq = o / p.o_inner, orem = o % p.o_inner;
    const T* xo = x + oq * p.o_s0 + orem * p.o_s1;
    const T* wo = w + oq * p.ow_s0 + orem * p.ow_s1;
    for (long long k = 0; k < leaves; ++k) {
      long long q = (k * LEAF + lane) / p.r_inner, rem = (k * LEAF + lane) % p.r_inner;
      T xs[CHAIN_LENGTH], ws[CHAIN_LENGTH];
      bool present[CHAIN_LENGTH];
#pragma unroll
      for (int m = 0; m < CHAIN_LENGTH; ++m) {
        present[m] = k * LEAF + m * CHAINS + lane < p.count;
        xs[m] = present[m] ? xo[q * p.r_s0 + rem * p.r_s1] : T{};
        ws[m] = present[m] && read_w ? wo[q * p.rw_s0 + rem * p.rw_s1] : T{};
        q += step_q;
        rem += step_r;
        if (rem >= p.r_inner) rem -= p.r_inner, ++q;
      }
      const A v = group_tree_reduce<32, WeightedLse>(chain(xs, ws, present));
      if (lane == 0) tree_push<WeightedLse>(stacks[warp], v, static_cast<unsigned long long>(k));
    }
    if (lane == 0) finish(o, tree_result<WeightedLse>(stacks[warp], static_cast<unsigned long long>(leaves)));
  }
}

// Instantiated as the family's other kernels are, (input, result, op, block): x and w are converted to the
// result type first, so T is O, and the op is logsumexp's. A pair past count has w = 0 (T{}): dropped.
template <typename T, typename O, int OP, int BLOCK>
__global__ void __launch_bounds__(BLOCK)
    reduce_lse_weighted(O* out, O* sgn, const T* x, const T* w, LseWeightedParams p) {
  static_assert(Same<T, O>::value && OP == OP_LSE, "weighted logsumexp reads x and w in the result's type");
  using S = acc_t<O>;
  using A = MaxSum<S>;
  lse_walk<BLOCK, A>(
      x, w, p, true,
      [](const T(&xs)[CHAIN_LENGTH], const T(&ws)[CHAIN_LENGTH], const bool(&)[CHAIN_LENGTH]) {
        S xv[CHAIN_LENGTH], wv[CHAIN_LENGTH];
#pragma unroll
        for (int m = 0; m < CHAIN_LENGTH; ++m) xv[m] = to_acc<S>(xs[m]), wv[m] = to_acc<S>(ws[m]);
        return weighted_chain<A>(xv, wv);
      },
      [&](long long o, A v) { finish_weighted(out, sgn, o, v, p.signed_result); });
}

// ---------------------------------------------------------------------------------------------------------
// Complex logsumexp: log(sum_i w_i e^(x_i)) of complex x (and weights w, complex or every one 1), SciPy's:
// the principal logarithm, its imaginary part in (-pi, pi]; with return_sign, log|sum| and sum / |sum|. One
// warp an output, as reduce_lse_weighted (same scalars, same strides, same tree): a chain's state is (m, s),
// m the NaN-propagating maximum of the real parts of its kept elements, s the complex sum of their terms
// w e^(x_re - m) (cos x_im, sin x_im) with cukern's exp, cos and sin above; the states merge by WeightedLse,
// part by part. x and w are of the result's type.

// One chain's state from its eight elements in m order; keep[k]: present and (weighted) of non-zero weight.
// An element of x_re = +inf adds w (cos x_im, sin x_im) (m = +inf: the sum of the +inf elements' terms);
// one of x_re = -inf adds w 0 (e^(-inf + i y) = 0 for every y, inf and NaN included, as C's cexp), its
// x_im never read. Each product is rounded once; the weight's by the textbook complex product. s =
// ((t_0 + t_1) + t_2) + ... from 0, so no part of s is ever -0.
template <typename A, typename S>
__device__ __forceinline__ A complex_chain(const Complex<S> (&x)[CHAIN_LENGTH], const Complex<S> (&w)[CHAIN_LENGTH],
                                           const bool (&keep)[CHAIN_LENGTH], bool weighted) {
  S m = Limits<S>::lowest();
#pragma unroll
  for (int k = 0; k < CHAIN_LENGTH; ++k) {
    if (keep[k]) m = chain_max(m, x[k].re);
  }
  Complex<S> s(S(0), S(0));
#pragma unroll
  for (int k = 0; k < CHAIN_LENGTH; ++k) {
    if (keep[k]) {
      const CosSin<S> c = cis(x[k].re == Limits<S>::lowest() ? S(0) : x[k].im);
      const S e = x[k].re == Limits<S>::highest() ? S(1) : exp_nonpositive(sub_rn(x[k].re, m));
      Complex<S> t(mul_rn(e, c.c), mul_rn(e, c.s));
      if (weighted) {
        t = Complex<S>(sub_rn(mul_rn(w[k].re, t.re), mul_rn(w[k].im, t.im)),
                       add_rn(mul_rn(w[k].re, t.im), mul_rn(w[k].im, t.re)));
      }
      s = add_rn(s, t);
    }
  }
  return A{m, s};
}

// The result of a state: NaN (every part) for a NaN in m or s, or s == 0 under m = +inf; -inf (+0i; the sign
// 0) for s == 0 (a cancelled sum, no kept element, or -inf at every one); else m + log|s| (+inf for m = +inf or
// an infinite part of s, whose direction then stands for s: each infinite part as +-1, a finite one beside it
// as 0), the phase atan2(s_im, s_re) in (-pi, pi] and the sign s / |s|. signed_result: mag receives the real
// part and sgn the sign; else out the complex log.
template <typename S>
__device__ __forceinline__ void finish_complex(Complex<S>* out, Complex<S>* sgn, S* mag, long long o,
                                               MaxSum<S, Complex<S>> v, int signed_result) {
  const S inf = Limits<S>::highest();
  const S nan = sub_rn(inf, inf);
  const bool zero = v.s.re == S(0) && v.s.im == S(0);
  S re, im;
  Complex<S> g;
  if (v.m != v.m || v.s.re != v.s.re || v.s.im != v.s.im || (zero && v.m == inf)) {
    re = nan, im = nan, g = Complex<S>(nan, nan);
  } else if (zero) {
    re = -inf, im = S(0), g = Complex<S>(S(0), S(0));
  } else {
    const bool wide = isinf(v.s.re) || isinf(v.s.im);
    const S dr = wide ? (isinf(v.s.re) ? copysign(S(1), v.s.re) : S(0)) : v.s.re;
    const S di = wide ? (isinf(v.s.im) ? copysign(S(1), v.s.im) : S(0)) : v.s.im;
    const LogAbs<S> l = log_abs(dr, di);
    re = wide || v.m == inf ? inf : add_rn(v.m, l.log);
    im = phase(l.re, l.im);
    g = Complex<S>(l.sign_re, l.sign_im);
  }
  if (signed_result) {
    mag[o] = re;
    sgn[o] = g;
  } else {
    out[o] = Complex<S>(re, im);
  }
}

template <typename C> struct PartOf;
template <typename S> struct PartOf<Complex<S>> { using type = S; };

// Instantiated as the family's other kernels are, (input, result, op, block), T = O a complex type.
template <typename T, typename O, int OP, int BLOCK>
__global__ void __launch_bounds__(BLOCK)
    reduce_lse_complex(O* out, O* sgn, typename PartOf<O>::type* mag, const T* x, const T* w, LseWeightedParams p) {
  static_assert(Same<T, O>::value && kIsComplex<O> && OP == OP_LSE, "complex logsumexp reads x and w as its result");
  using S = typename PartOf<O>::type;
  using A = MaxSum<S, O>;
  const bool weighted = p.weighted != 0;
  lse_walk<BLOCK, A>(
      x, w, p, weighted,
      [weighted](const T(&xs)[CHAIN_LENGTH], const T(&ws)[CHAIN_LENGTH], const bool(&present)[CHAIN_LENGTH]) {
        bool keep[CHAIN_LENGTH];
#pragma unroll
        for (int m = 0; m < CHAIN_LENGTH; ++m) keep[m] = present[m] && (!weighted || ws[m].re != S(0) || ws[m].im != S(0));
        return complex_chain<A>(xs, ws, keep, weighted);
      },
      [&](long long o, A v) { finish_complex(out, sgn, mag, o, v, p.signed_result); });
}

}  // namespace cukern
