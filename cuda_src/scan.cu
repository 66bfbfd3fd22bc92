// Scans: cumsum and cumprod along an axis (cukern/scan.py).
//
//   out[r, i] = x[r, 0] (+) x[r, 1] (+) ... (+) x[r, i]          (+) = + (cumsum) or * (cumprod)
//
// One pass, decoupled look-back over FIXED tiles: a row is cut into tiles of SCAN_BLOCK x ITEMS consecutive
// elements (ITEMS = scan_items<T, O>(): 8 for float32 scanned into float32, 16 for every other pair), and
// every element's value is one fixed expression of the row's values,
// whatever the grid, the order in which blocks run or how far a look-back had to go (cukern/reference.py
// `cumsum_emulated` evaluates it):
//   * in tile t, thread h (warp w, lane l) holds elements ITEMS h .. ITEMS h + ITEMS - 1 of the tile; s_k is
//     their running combine in order (k = 0 .. ITEMS - 1); T_h, the last;
//   * the lanes' inclusive scan of T by the Hillis-Steele ladder (distance 1, 2, 4, 8, 16: x_l = x_{l-d} (+)
//     x_l); L_h is lane l - 1's value (the identity for lane 0);
//   * the warps' totals combined in order: W_w = (...(U_0 (+) U_1) ...) (+) U_{w-1} (identity for w = 0);
//     the tile's aggregate A_t = W_8, the combine of all eight;
//   * tiles in groups of SCAN_GROUP = 32 (tile t in group g = t / 32): Q_t, the fold of the group's aggregates
//     before t in order (the identity for a group's first tile); the group's total S_g = Q_t (+) A_t of its
//     last tile; the row's group prefixes B_0 = the identity, B_{g+1} = B_g (+) S_g; P_{t-1} = B_g (+) Q_t;
//   * out = ((P_{t-1} (+) W_w) (+) L_h) (+) s_k, rounded once from the accumulator to the result dtype.
// The identity is -0.0 for float sums (so that it is exact: -0 + x is x for every x, -0 included), 0 for
// integer sums and 1 for products (1 + 0i for complex ones, which mul_rn returns the other operand for), so
// combining with it never changes a bit. Why groups: a left fold of
// every tile's aggregate in turn (the simpler definition) chains each tile's prefix to the one before it
// across the whole row, one dependent combine and one look-back step a tile, and the walk back to a
// published prefix falls behind at 65,536 tiles (2^28 elements); with groups a tile waits on at most 31
// aggregates of its own group and on the group prefixes, a chain 32 times shorter, whose look-back covers
// 32 groups (1024 tiles) a step. A look-back finds B_g as the nearest published B_j (+) the totals S_j ..
// S_{g-1}, combined from B_j forward: exactly the fold that defines B_g, whichever j it found. So the tile
// and group sizes are part of the result's definition, fixed in this file by the dtypes, and never knobs.
// Why float32's tile is the smaller: scan_ahead's speed follows the tiles in flight an SM, and half the
// values a thread leaves room for six resident blocks, not five (docs/design/scan.md); the half types lost with
// 8 (a tile of 4 KiB: twice the look-backs for the bytes), and the other pairs were not measured.
//
// The six questions (cukern/scan.py `plan` keeps the launch math as a pure plan; the card in
// cukern/lab/scan.py shows the same answers). Three kernels compute it: scan_ahead (below) for rows of unit
// stride whose starts are 16-byte aligned and whose result has x's type (float32, float16, bfloat16),
// scan_columns (last) for many such lines side by side in memory and strided along their length (the
// columns of a matrix; with few column groups, a tile of them a block, in two launches around
// scan_column_prefixes), scan_tiles for everything else.
// 1. Output tile: scan_tiles: a span of 4096 elements of one row per block (one tile, two of float32's):
//    of 128 threads (each thread two of the definition's 256 a tile) where x and the result have one size
//    of 4 or 8 bytes (float32, float64, int64), of 256 otherwise (cukern/scan.py `threads`); spans numbered
//    in the order blocks start (a global counter), so every predecessor of a tile is running or done: the
//    look-back never waits on a block that cannot run. scan_ahead: scan_ahead_blocks<T>() resident blocks an SM of 256 threads, each
//    drawing tiles from the same counter and finishing each one a round after drawing it. scan_columns:
//    one block of 256 threads a group of 32 neighbouring lines, walking every tile of them in order (or one
//    tile of them: COLUMN_AGGREGATES and COLUMN_FINISH).
// 2. Input traffic: x read once and out written once. scan_tiles moves both through shared memory: a warp
//    moves 32 consecutive elements per load or store (coalesced for a unit-stride row), and each thread then
//    takes its ITEMS consecutive elements from shared memory. 4- and 8-byte elements go from global to shared
//    memory by cp.async (sm_80 on), which holds no register: the whole tile is in flight at once. Through
//    registers, at the 32 a thread that eight resident blocks allow, the loads went out a few at a time
//    and a block spent half its life loading, with or without the look-back's waits (docs/design/scan.md).
//    scan_ahead reads a thread's ITEMS elements as 16-byte vectors into registers, twice (the second time a
//    round later, from L1 or L2, streaming), and stores them the same way. scan_columns loads 32
//    neighbouring elements a warp (its lanes' lines), column_runs<T, O>() runs of them at once into
//    registers, and each tile a second time for the results (from L2). The look-back reads a
//    status word and a value from L2 for each earlier tile of the group and for a few earlier groups.
// 3. Accumulation: in double (float64 results), float (float32, float16, bfloat16 results), int64
//    (integer results) or the complex type itself (cumprod of complex64 / complex128), in the fixed order
//    above. Products and sums are correctly rounded (__fmul_rn, __fadd_rn and double forms; never
//    contracted; a complex product is common/complex.cuh's mul_rn, prod's). Integer sums and products wrap
//    as int64 does.
// 4. Staging: registers (ITEMS accumulators a thread); scan_tiles: shared memory for the span (its
//    values of max(sizeof(T), sizeof(O)) bytes, padded against bank conflicts: static up to 8-byte values,
//    complex128's 66 KiB dynamic) and the warps' totals;
//    scan_ahead: the warps' totals only; scan_columns: the 32 run totals of each warp and line (32 KiB).
// 5. Tuning: none: the tile is part of the definition of the result (above); the grid is one block a span
//    (scan_tiles), the resident blocks (scan_ahead) or the column groups (scan_columns), and none changes a
//    bit.
// 6. Profile: one combine an element against sizeof(T) + sizeof(O) bytes: memory-bound; the target is
//    the device-to-device copy bandwidth.
#include "common/bounds.cuh"
#include "common/complex.cuh"
#include "common/dtype.cuh"
#include "common/vec.cuh"

namespace cukern {

constexpr int SCAN_BLOCK = 256;  // cukern/scan.py BLOCK
template <typename T> struct IsFloat32 { static constexpr bool value = false; };
template <> struct IsFloat32<float> { static constexpr bool value = true; };
// Elements a definition thread holds (cukern/scan.py `items`), for x of T scanned into O.
template <typename T, typename O> __host__ __device__ constexpr int scan_items() {
  return IsFloat32<T>::value && IsFloat32<O>::value ? 8 : 16;
}
constexpr int SCAN_WARPS = SCAN_BLOCK / 32;
// The launch: THREADS threads a tile (a template argument, 128 or 256), each standing for
// SCAN_BLOCK / THREADS threads of the definition above (with 128, thread h for h + 128 j, j = 0, 1: its
// lane, and warp w for warp w + 4 j): the same expression computed by fewer threads; cukern/scan.py
// `threads` picks it.
constexpr int SCAN_GROUP = 32;   // tiles a group (cukern/scan.py GROUP): one warp's lanes

enum : int { SCAN_SUM = 0, SCAN_PROD = 1 };
// A tile's status word: the launch's epoch (so the flags need no clearing between launches) and its state.
enum : unsigned { STATE_AGGREGATE = 1, STATE_PREFIX = 2 };

template <typename O> struct ScanAcc { using type = float; };
template <> struct ScanAcc<double> { using type = double; };
template <> struct ScanAcc<long long> { using type = long long; };
template <typename S> struct ScanAcc<Complex<S>> { using type = Complex<S>; };  // cumprod of complex
template <typename O> using scan_acc_t = typename ScanAcc<O>::type;

template <typename A, typename T> __device__ __forceinline__ A scan_lift(T v) { return static_cast<A>(v); }
template <typename A> __device__ __forceinline__ A scan_lift(f16 v) { return static_cast<A>(to_float(v)); }
template <typename A> __device__ __forceinline__ A scan_lift(bf16 v) { return static_cast<A>(to_float(v)); }
template <typename A> __device__ __forceinline__ A scan_lift(bool v) { return static_cast<A>(v ? 1 : 0); }

template <typename O, typename A> __device__ __forceinline__ O scan_out(A a) { return static_cast<O>(a); }
template <> __device__ __forceinline__ f16 scan_out<f16, float>(float a) { return from_float<f16>(a); }
template <> __device__ __forceinline__ bf16 scan_out<bf16, float>(float a) { return from_float<bf16>(a); }

__device__ __forceinline__ float scan_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double scan_add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ long long scan_add(long long a, long long b) {
  return static_cast<long long>(static_cast<unsigned long long>(a) + static_cast<unsigned long long>(b));
}
__device__ __forceinline__ float scan_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double scan_mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ long long scan_mul(long long a, long long b) {
  return static_cast<long long>(static_cast<unsigned long long>(a) * static_cast<unsigned long long>(b));
}
template <typename S> __device__ __forceinline__ Complex<S> scan_mul(Complex<S> a, Complex<S> b) { return mul_rn(a, b); }

template <int OP, typename A> __device__ __forceinline__ A scan_identity() {
  if constexpr (OP == SCAN_PROD || kIsComplex<A>) return A(1);
  else if constexpr (sizeof(A) == 8 && A(0.5) != A(0)) return __longlong_as_double(static_cast<long long>(0x8000000000000000ull));
  else if constexpr (A(0.5) != A(0)) return __uint_as_float(0x80000000u);
  else return A(0);
}
template <int OP, typename A> __device__ __forceinline__ A scan_op(A a, A b) {
  if constexpr (OP == SCAN_PROD) return scan_mul(a, b);
  else return scan_add(a, b);
}

// Every scalar of a launch (cukern/scan.py PARAMS, the same fields in the same order). Row r of x starts at
// (r / inner) * x_s0 + (r % inner) * x_s1 and its element i is i * x_step further on; out likewise.
struct ScanParams {
  long long inner, x_s0, x_s1, x_step, o_s0, o_s1, o_step;
  long long n;               // elements a row
  long long tiles_per_row;   // ceil(n / tile)
  long long tiles;           // rows * tiles_per_row: the grid
  unsigned epoch;            // this launch's tag in the status words, never 0
};

// A lane's value from another lane, from the lane d below, and an L2 load (common/complex.cuh: a complex
// value's, both parts).
template <typename A> __device__ __forceinline__ A lane_value(A v, int l) { return __shfl_sync(0xffffffffu, v, l); }
template <typename A> __device__ __forceinline__ A lane_up(A v, int d) { return __shfl_up_sync(0xffffffffu, v, d); }
template <typename A> __device__ __forceinline__ A load_cg(const A* p) { return __ldcg(p); }

// prefix (+) v_31 (+) v_30 ... (+) v_0 (v_l: lane l's v), a left fold in that order. The shuffles are issued
// ahead of the combines that use them (unrolled; they do not depend on the fold), so the fold costs about one
// dependent combine a lane. A lane that stands for nothing holds the identity, which leaves every bit as it
// is.
template <int OP, typename A> __device__ __forceinline__ A fold_lanes(A prefix, A v) {
  constexpr int kBatch = 4;  // shuffles in flight, in registers that stay within bounds
#pragma unroll
  for (int l0 = 32 - kBatch; l0 >= 0; l0 -= kBatch) {
    A some[kBatch];
#pragma unroll
    for (int l = 0; l < kBatch; ++l) some[l] = lane_value(v, l0 + l);
#pragma unroll
    for (int l = kBatch - 1; l >= 0; --l) prefix = scan_op<OP>(prefix, some[l]);
  }
  return prefix;
}

// The look-back's board: a 64-bit word per tile and per group, (epoch << 2 | state) in its high half. A
// 4-byte value (float accumulators) travels in the low half of the same word, so one relaxed load sees the
// state and its value together: no fence between them and no second trip to L2 while a block waits. An
// 8-byte value sits in its own array, written before a fence and the word, and read after the reader's
// fence. Words are read with ordinary (relaxed, device-scope) loads: polling with atomics would queue every
// waiting warp's 32 lanes in L2's atomic units, on the same few lines.
__device__ __forceinline__ unsigned long long load_relaxed(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

template <typename A> constexpr bool kPacked = sizeof(A) == 4;

// The state a word shows for this launch (0: nothing yet, or another launch's word).
__device__ __forceinline__ unsigned state_of(unsigned long long w, unsigned epoch) {
  const unsigned tag = static_cast<unsigned>(w >> 32);
  return (tag >> 2) == epoch ? (tag & 3u) : 0u;
}

template <typename A> __device__ __forceinline__ A value_of(unsigned long long w) {
  A v{};
  if constexpr (kPacked<A>) {
    const unsigned low = static_cast<unsigned>(w);
    memcpy(&v, &low, 4);
  }
  return v;
}

template <typename A> __device__ __forceinline__ void publish(unsigned long long* word, A* value, unsigned epoch,
                                                             unsigned state, A v) {
  unsigned long long w = static_cast<unsigned long long>((epoch << 2) | state) << 32;
  if constexpr (kPacked<A>) {
    unsigned low;
    memcpy(&low, &v, 4);
    w |= low;
  } else {
    *value = v;
    __threadfence();
  }
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(word), "l"(w) : "memory");
}

// The value behind a word this lane saw (`seen`, from the word itself when packed): every lane of the warp
// calls it, after its polling; `mine` says whether this lane wants one.
template <typename A> __device__ __forceinline__ A value_seen(bool mine, unsigned long long seen, const A* value) {
  if constexpr (kPacked<A>) {
    return mine ? value_of<A>(seen) : A{};
  } else {
    __threadfence();
    return mine ? load_cg(value) : A{};
  }
}

// Global to shared memory without registers: a 4-, 8- or 16-byte copy, then the wait for all of this thread's.
template <int kBytes> __device__ __forceinline__ void copy_async(void* dst, const void* src) {
  const unsigned to = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(to), "l"(src), "n"(kBytes) : "memory");
}
__device__ __forceinline__ void copies_done() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// Shared-memory slot of element e of a tile: one pad word every 32 words, so that the ITEMS consecutive
// elements a thread reads are spread over the banks.
template <typename S> __device__ __forceinline__ int slot(int e) {
  constexpr int kPerWord = sizeof(S) >= 4 ? 1 : 4 / static_cast<int>(sizeof(S));
  return e + e / (32 * kPerWord);
}

// The tile's own steps, shared by both kernels.

// The lanes' inclusive scan of the thread totals u by the Hillis-Steele ladder; `before` gets L_h (the lane
// before's value, the identity for lane 0). Returns the lane's inclusive value (lane 31's is the warp's U_w).
template <int OP, typename A> __device__ __forceinline__ A lane_ladder(A u, int lane, A& before) {
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const A up = lane_up(u, d);
    if (lane >= d) u = scan_op<OP>(up, u);
  }
  before = lane_up(u, 1);
  if (lane == 0) before = scan_identity<OP, A>();
  return u;
}

// The tile's aggregate A_t = W_8 from the warps' totals U_w in shared `total`, which lanes w < 8 then
// overwrite with the exclusive W_w (W_0 the identity). Warp 0 calls it; every lane gets A_t.
template <int OP, typename A> __device__ __forceinline__ A tile_aggregate(A* total, int lane) {
  A aggregate = scan_identity<OP, A>();
  A mine = scan_identity<OP, A>();
#pragma unroll
  for (int w = 0; w < SCAN_WARPS; ++w) {
    if (w == lane) mine = aggregate;
    aggregate = w == 0 ? total[0] : scan_op<OP>(aggregate, total[w]);
  }
  __syncwarp();  // every lane has read the totals before they are overwritten
  if (lane < SCAN_WARPS) total[lane] = mine;
  return aggregate;
}

// The look-back, shared by both kernels; every lane of warp 0 calls these together.

// The row's group 0 in the group arrays (groups of every row side by side).
__device__ __forceinline__ long long row_group_of(unsigned row, unsigned per_row) {
  return static_cast<long long>(row) * ((static_cast<long long>(per_row) + SCAN_GROUP - 1) / SCAN_GROUP);
}

// Q_t, the fold in order of the aggregates of the i tiles before `tile` in its group (i: its place in the
// group), lane l waiting for A_{tile-1-l} (l < i); lanes i.. hold the identity. Every lane gets Q_t.
template <int OP, typename A>
__device__ __forceinline__ A group_fold(const unsigned long long* status, const A* aggregates, unsigned tile,
                                        unsigned i, unsigned epoch, int lane) {
  A local = scan_identity<OP, A>();
  if (i > 0) {
    const bool mine = static_cast<unsigned>(lane) < i;
    unsigned long long seen = 0;
    while (true) {
      if (mine && state_of(seen, epoch) == 0) seen = load_relaxed(status + tile - 1 - lane);
      if (__all_sync(0xffffffffu, !mine || state_of(seen, epoch) != 0)) break;
    }
    const A v = value_seen<A>(mine, seen, aggregates + tile - 1 - lane);
    if (mine) local = v;
  }
  return fold_lanes<OP>(scan_identity<OP, A>(), local);
}

// S_g, the group's total (Q_t (+) A_t of its last tile), published by one lane. A 4-byte value is also
// written to `sums`, for a walk that passes this group later (read after its fence); an 8-byte value is
// written there and fenced by publish itself.
template <typename A>
__device__ __forceinline__ void publish_total(unsigned long long* group_status, A* sums, long long at, unsigned epoch,
                                              A total) {
  if constexpr (kPacked<A>) {
    sums[at] = total;
    __threadfence();
  }
  publish(group_status + at, sums + at, epoch, STATE_AGGREGATE, total);
}

// The windows newer than the one where the walk found B (all totals, read from sums after a fence), up to
// kLoads of them loaded at once: their latencies overlap. Rare (a walk more than a window back), so a call.
template <int OP, typename A>
__device__ __noinline__ A fold_windows(A b_g, const A* sums, long long row_group, unsigned g, int back, int lane) {
  constexpr int kLoads = sizeof(A) == 4 ? 4 : 2;
  __threadfence();
  for (int w0 = back - 1; w0 >= 0; w0 -= kLoads) {
    A a[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const long long at = row_group + static_cast<long long>(g) - 1 - 32ll * (w0 - u) - lane;
      a[u] = w0 - u >= 0 ? load_cg(sums + at) : scan_identity<OP, A>();
    }
#pragma unroll
    for (int u = 0; u < kLoads; ++u) b_g = fold_lanes<OP>(b_g, a[u]);
  }
  return b_g;
}

// B_g, the fold of the row's earlier group totals (the identity for g = 0), by a look-back over groups:
// lane l watches group g - 1 - 32w - l in window w; a group shows its total S (STATE_AGGREGATE) once its
// last tile has it and B_{g+1} (STATE_PREFIX) once the first tile of the next group has folded it (`first`:
// this is that tile, which publishes B_g). The nearest B found and the totals after it are combined forward,
// which is the same fold whichever B it was. Places before the row's first group stand for B_0, the
// identity, so the walk always ends within the row; it moves one window back only when a window shows 32
// totals and no B (far behind, which the one-window step covers in the common case: 32 groups are 1024
// tiles).
template <int OP, typename A>
__device__ __forceinline__ A group_base(unsigned long long* group_status, const A* sums, A* bases, long long row_group,
                                        unsigned g, bool first, unsigned epoch, int lane) {
  A b_g = scan_identity<OP, A>();
  if (g == 0) return b_g;
  unsigned found;
  unsigned long long seen;
  int back = 0;  // windows walked past
  while (true) {
    const long long gg = static_cast<long long>(g) - 1 - 32ll * back - lane;
    const bool start = gg < 0;
    seen = 0;
    bool slide = false;
    while (true) {
      if (!start && state_of(seen, epoch) != STATE_PREFIX) seen = load_relaxed(group_status + row_group + gg);
      const unsigned state = state_of(seen, epoch);
      found = __ballot_sync(0xffffffffu, start || state == STATE_PREFIX);
      const unsigned ready = __ballot_sync(0xffffffffu, start || state != 0);
      if (found != 0) {
        const int q = __ffs(found) - 1;
        if ((ready & ((2u << q) - 1u)) == ((2u << q) - 1u)) break;  // lanes 0..q all known
      } else if (ready == 0xffffffffu) {
        slide = true;
        break;
      }
    }
    if (!slide) break;
    ++back;
  }
  const int q = __ffs(found) - 1;
  const long long gg = static_cast<long long>(g) - 1 - 32ll * back - lane;
  const A v = value_seen<A>(lane <= q && gg >= 0, seen, (lane == q ? bases : sums) + row_group + gg);
  b_g = fold_lanes<OP>(scan_identity<OP, A>(), lane <= q && gg >= 0 ? v : scan_identity<OP, A>());
  if (back > 0) b_g = fold_windows<OP>(b_g, sums, row_group, g, back, lane);
  if (first && lane == 0) publish(group_status + row_group + g - 1, bases + row_group + g - 1, epoch, STATE_PREFIX, b_g);
  return b_g;
}

// Blocks and resident blocks. A tile spends much of its life in its look-back and its two passes over the
// stage, moving no data, so the scan's speed follows how many tiles are in flight at once: with 256-thread
// blocks, eight an SM (all thread slots), the memory sat half idle even with every look-back wait removed
// (docs/design/scan.md). So float32, float64 and int64 (x and the result of one size, cp.async loads) run
// 128-thread blocks: twelve float32 tiles an SM (40 registers; eight before sm_90, as many as its shared
// memory held of the 4096-element tiles float32 had before). The half types (loads through registers, slower in
// smaller blocks) and results wider than x (each thread would hold both its halves' values through the
// stage's reuse) keep 256 threads: eight blocks for 4-byte x, five for the half types (with fewer registers
// their conversions spill). 8-byte accumulators take what they need.
template <typename T, typename O, int THREADS>
__host__ __device__ constexpr int scan_min_blocks() {
  if (sizeof(scan_acc_t<O>) != 4) return 1;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  if (THREADS == 128) return 8;
#endif
  return arch_min_blocks(THREADS == 128 ? 12 : sizeof(T) == 4 ? 8 : 5);
}

template <typename T, typename O, int OP, int THREADS>
__global__ void __launch_bounds__(THREADS, scan_min_blocks<T, O, THREADS>())
    scan_tiles(O* out, const T* x, unsigned* counter, unsigned long long* status, scan_acc_t<O>* aggregates,
               unsigned long long* group_status, scan_acc_t<O>* sums, scan_acc_t<O>* bases,
               const __grid_constant__ ScanParams p) {
  using A = scan_acc_t<O>;
  static_assert(THREADS == 128 || THREADS == 256, "a warp of the launch stands for whole warps of the definition");
  constexpr int SCAN_THREADS = THREADS;
  constexpr int ITEMS = scan_items<T, O>(), TILE = SCAN_BLOCK * ITEMS;
  // A block takes a span of TILES consecutive tiles of a row, 4096 elements whatever the tile (float32's
  // tiles of 2048 one a block ran 62% -> 47% of the copy, docs/design/scan.md: the same fixed costs a block for
  // half the elements). Its definition threads d = 0 .. 256 TILES - 1 hold elements ITEMS d .. of the span,
  // tile d / 256 of it; the launch's thread h stands for d = h + THREADS r, r < RUNS.
  constexpr int TILES = 16 / ITEMS, SPAN = TILES * TILE;
  static_assert(SCAN_GROUP % TILES == 0, "a span's tiles share their group");
  constexpr int RUNS = TILES * SCAN_BLOCK / THREADS;
  constexpr int SCAN_LOADS = SPAN / THREADS;  // elements a thread moves in and out
  constexpr int kBytes = sizeof(T) > sizeof(O) ? sizeof(T) : sizeof(O);
  constexpr int kWords = (SPAN * kBytes + 3) / 4;
  constexpr int kStage = kWords + kWords / 32 + 1;
  // The stage: static shared memory up to 8-byte elements; complex128's (66 KiB, over the static limit) is
  // the launch's dynamic shared memory (cukern/scan.py `stage_bytes`).
  constexpr bool kStatic = kBytes <= 8;
  __shared__ __align__(16) unsigned static_stage[kStatic ? kStage : 1];
  extern __shared__ __align__(16) unsigned dynamic_stage[];
  unsigned* const stage_words = kStatic ? static_stage : dynamic_stage;
  // Tile j's warps at j * SCAN_WARPS. Aligned: warp 0 reads a tile's totals as 16-byte vectors, and one
  // that began a word early would read the tile before's last total as lane 7 writes it (racecheck).
  __shared__ __align__(16) A warp_total[TILES * SCAN_WARPS];
  __shared__ A tile_prefix[TILES];
  __shared__ A span_aggregate[TILES];
  __shared__ unsigned span_id;
  const int h = static_cast<int>(threadIdx.x);
  const int lane = h & 31, warp = h >> 5;

  if (h == 0) {
    span_id = atomicAdd(counter, 1u);
    if (span_id == gridDim.x - 1) *counter = 0;  // every block has drawn its span
  }
  __syncthreads();
  const unsigned per_row = static_cast<unsigned>(p.tiles_per_row);
  const unsigned spans = (per_row + TILES - 1) / TILES;
  const unsigned row = span_id / spans;
  const unsigned t0 = (span_id - row * spans) * TILES;  // the span's first tile in its row
  const unsigned inner = static_cast<unsigned>(p.inner);
  const unsigned rq = row / inner, rr = row - rq * inner;
  const T* xr = x + static_cast<long long>(rq) * p.x_s0 + static_cast<long long>(rr) * p.x_s1;
  O* orow = out + static_cast<long long>(rq) * p.o_s0 + static_cast<long long>(rr) * p.o_s1;
  const long long first = static_cast<long long>(t0) * TILE;
  const long long left = p.n - first;
  const int count = left < SPAN ? static_cast<int>(left) : SPAN;

  // Load: element k * SCAN_THREADS + h of the span (a warp reads 32 consecutive ones), into shared memory.
  // (One pointer stepped along, rather than an address formed for each element: registers.)
  T* stage_in = reinterpret_cast<T*>(stage_words);
  {
    const T* from = xr + (first + h) * p.x_step;
    const long long step = SCAN_THREADS * p.x_step;
#pragma unroll
    for (int k = 0; k < SCAN_LOADS; ++k, from += step) {
      const int e = k * SCAN_THREADS + h;
      if constexpr (sizeof(T) == 4 || sizeof(T) == 8 || sizeof(T) == 16) {
        if (e >= count) break;  // (a predicate for each copy instead takes registers that 12 blocks lack)
        copy_async<sizeof(T)>(stage_in + slot<T>(e), from);
      } else {
        if (e < count) stage_in[slot<T>(e)] = *from;  // (a break here keeps the loads from going out together)
      }
    }
    if constexpr (sizeof(T) == 4 || sizeof(T) == 8 || sizeof(T) == 16) copies_done();
  }
  __syncthreads();
  // The running combine s_k of definition thread d's ITEMS elements: formed here for its total, and formed
  // again from the stage after the look-back, so that no thread holds its values through the look-back
  // (registers that would cost resident blocks, and the scan's speed follows how many tiles are in flight).
  const auto running = [&](int d, A (&s)[ITEMS]) {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int e = d * ITEMS + k;
      const A v = e < count ? scan_lift<A>(stage_in[slot<T>(e)]) : scan_identity<OP, A>();
      s[k] = k == 0 ? v : scan_op<OP>(s[k - 1], v);
    }
  };
  // For each of this thread's definition threads: the lanes' inclusive scan of the thread totals, for the
  // warp's total (warp d / 32 of the span). L, the lane before's, is formed again with the results: held
  // through the look-back, it cost float32's spans a spill.
#pragma unroll
  for (int r = 0; r < RUNS; ++r) {
    A u, unused;
    {
      A s[ITEMS];
      running(h + SCAN_THREADS * r, s);
      u = s[ITEMS - 1];
    }
    u = lane_ladder<OP>(u, lane, unused);
    if (lane == 31) warp_total[warp + SCAN_THREADS / 32 * r] = u;
  }
  __syncthreads();

  if (warp == 0) {
    // Each tile's W_w (in order) and aggregate, published at once; then the look-back for the first tile,
    // whose prefix the others extend by the aggregates before them: Q_{t+1} = Q_t (+) A_t, the same fold.
    // (The aggregates and Q wait in shared memory, lane 0's: registers held here cost float32 a spill.)
    const unsigned g = t0 / SCAN_GROUP, i0 = t0 & (SCAN_GROUP - 1);
    const long long row_group = row_group_of(row, per_row);
#pragma unroll
    for (int j = 0; j < TILES; ++j) {
      const A aggregate = tile_aggregate<OP>(warp_total + j * SCAN_WARPS, lane);
      const unsigned t = t0 + j, tile = row * per_row + t;
      if (lane == 0) {
        span_aggregate[j] = aggregate;
        if (i0 + j < SCAN_GROUP - 1 && t + 1 < per_row) {  // a later tile of the group reads it
          publish(status + tile, aggregates + tile, p.epoch, STATE_AGGREGATE, aggregate);
        }
      }
    }
    const A q_t = group_fold<OP>(status, aggregates, row * per_row + t0, i0, p.epoch, lane);
    if (lane == 0) {
      A q = q_t;
#pragma unroll
      for (int j = 0; j < TILES; ++j) {
        tile_prefix[j] = q;
        q = scan_op<OP>(q, span_aggregate[j]);
        if (i0 + j == SCAN_GROUP - 1) {  // the group's total, S_g: it needs no other group
          publish_total(group_status, sums, row_group + g, p.epoch, q);
        }
      }
    }
    const A b_g = group_base<OP>(group_status, sums, bases, row_group, g, i0 == 0, p.epoch, lane);
    if (lane == 0) {
#pragma unroll
      for (int j = 0; j < TILES; ++j) tile_prefix[j] = scan_op<OP>(b_g, tile_prefix[j]);
    }
  }
  __syncthreads();

  // out = ((P (+) W_w) (+) L_h) (+) s_k, rounded once, through the stage back to a warp-per-32 store. Where
  // out's elements have x's size they take the same slots, each written by the thread that read it, so a
  // definition thread's results go out as soon as they are formed; otherwise every thread reads all of
  // its elements before the stage is reused.
  O* stage_out = reinterpret_cast<O*>(stage_words);
  constexpr bool kSameSlots = sizeof(O) == sizeof(T);
  A s[kSameSlots ? 1 : RUNS][ITEMS];
  A before[kSameSlots ? 1 : RUNS];
#pragma unroll
  for (int r = 0; r < RUNS; ++r) {
    const int d = h + SCAN_THREADS * r;
    A (&sr)[ITEMS] = s[kSameSlots ? 0 : r];
    running(d, sr);
    lane_ladder<OP>(sr[ITEMS - 1], lane, before[kSameSlots ? 0 : r]);
    if constexpr (!kSameSlots) {
      if (r < RUNS - 1) continue;
      __syncthreads();  // every thread has read its elements from the stage before it is reused for out
    }
#pragma unroll
    for (int i = kSameSlots ? r : 0; i <= r; ++i) {
      const int w = warp + SCAN_THREADS / 32 * i;
      const A base = scan_op<OP>(scan_op<OP>(tile_prefix[w / SCAN_WARPS], warp_total[w]), before[kSameSlots ? 0 : i]);
#pragma unroll
      for (int k = 0; k < ITEMS; ++k) {
        const int e = (h + SCAN_THREADS * i) * ITEMS + k;
        if (e < count) stage_out[slot<O>(e)] = scan_out<O>(scan_op<OP>(base, s[kSameSlots ? 0 : i][k]));
      }
    }
  }
  __syncthreads();
  O* to = orow + (first + h) * p.o_step;
  const long long step = SCAN_THREADS * p.o_step;
#pragma unroll
  for (int k = 0; k < SCAN_LOADS; ++k, to += step) {
    const int e = k * SCAN_THREADS + h;
    if (e >= count) break;
    *to = stage_out[slot<O>(e)];
  }
}

// scan_ahead: lines of unit stride whose result has x's type, float32, float16 or bfloat16 (accumulated in
// float32), their starts 16-byte aligned. scan_tiles holds a tile in shared memory from its loads through
// its look-back, whose waits (on the group's earlier tiles, drawn just before it and still loading, then on
// the group prefixes) took half a tile's life, so its speed followed how many tiles an SM could hold
// (docs/design/scan.md). Here a block stays resident and walks tiles in the order it draws them, one tile
// behind: in each round it reads the tile just drawn into registers and publishes its aggregate at once
// (phase A), then looks back for the tile of the round before, whose predecessors have by then had a round
// to publish theirs, and writes that tile's results from a second read of its elements (phase B: L1 or L2
// serves it, the first read having just passed). Phase B's loads and all stores are streaming
// (evict-first) so that they leave L2 to the tiles still to be read again: measured, plain loads and stores
// ran at 44% of the copy against 66%. The same expression as scan_tiles, thread h being definition thread
// h (256 threads), so the same bits.
// Resident blocks an SM (cukern/scan.py `ahead_blocks`): six for float32 (8 elements a thread, 40 registers;
// seven spill), five for the half types (16 elements a thread; float32's 16 ran slower at six and more,
// docs/design/scan.md).
template <typename T> __host__ __device__ constexpr int scan_ahead_blocks() { return sizeof(T) == 4 ? 6 : 5; }

// Definition thread h's ITEMS consecutive elements of a tile of `count` (e0 = ITEMS h), widened to float:
// 16-byte loads where the run lies in the tile and the tile starts 16-byte aligned, else one by one, the
// identity past the end. `again`: the second read, streaming.
template <typename T, int OP, bool again, int ITEMS>
__device__ __forceinline__ void load_run(float (&v)[ITEMS], const T* tile, int e0, int count) {
  using Run = Pack<T, ITEMS>;
  if (e0 + ITEMS <= count && (reinterpret_cast<unsigned long long>(tile) & 15) == 0) {
    Run r;
    const auto* from = reinterpret_cast<const typename Run::W*>(tile + e0);
#pragma unroll
    for (int i = 0; i < Run::kWords; ++i) r.w[i] = again ? __ldcs(from + i) : from[i];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) v[k] = to_float(r.v[k]);
  } else {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) v[k] = e0 + k < count ? to_float(tile[e0 + k]) : scan_identity<OP, float>();
  }
}

// The results of load_run's elements, each rounded once to T, written the same way (streaming).
template <typename T, int ITEMS>
__device__ __forceinline__ void store_run(T* tile, const float (&v)[ITEMS], int e0, int count) {
  using Run = Pack<T, ITEMS>;
  if (e0 + ITEMS <= count && (reinterpret_cast<unsigned long long>(tile) & 15) == 0) {
    Run r;
    round_into(r, v);
    auto* to = reinterpret_cast<typename Run::W*>(tile + e0);
#pragma unroll
    for (int i = 0; i < Run::kWords; ++i) __stcs(to + i, r.w[i]);
  } else {
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      if (e0 + k < count) tile[e0 + k] = from_float<T>(v[k]);
    }
  }
}

template <typename T, int OP>
__global__ void __launch_bounds__(SCAN_BLOCK, arch_min_blocks(scan_ahead_blocks<T>()))
    scan_ahead(T* out, const T* x, unsigned* counter, unsigned long long* status, float* aggregates,
               unsigned long long* group_status, float* sums, float* bases, const __grid_constant__ ScanParams p) {
  using A = float;
  constexpr int ITEMS = scan_items<T, T>(), TILE = SCAN_BLOCK * ITEMS;
  // By round parity: the warps' totals, then the exclusive W_w (read by the next round's phase B); the drawn
  // tile; Q_t of a group's last tile (formed in its phase A for the group's total).
  __shared__ A warp_total[2][SCAN_WARPS];
  __shared__ unsigned drawn[2];
  __shared__ A last_fold[2];
  __shared__ A tile_prefix;
  const int h = static_cast<int>(threadIdx.x);
  const int lane = h & 31, warp = h >> 5;
  const unsigned tiles = static_cast<unsigned>(p.tiles);
  const unsigned per_row = static_cast<unsigned>(p.tiles_per_row);
  const unsigned inner = static_cast<unsigned>(p.inner);
  // Tiles are drawn in order from one counter, by thread 32 (warp 0 is the one that looks back), the next
  // while phase B runs. Every block draws exactly one number past the last tile, after which it stops: the
  // launch's last draw is tiles + gridDim.x - 1, and its drawer resets the counter for the next launch.
  // A tile is drawn only by a running block, and its phase A waits on earlier tiles only, so every wait
  // ends, however many blocks are resident.
  const auto draw = [&](int at) {
    const unsigned d = atomicAdd(counter, 1u);
    drawn[at] = d;
    if (d == tiles + gridDim.x - 1) *counter = 0;
  };
  // tile -> (its row, its place t in the row, where its elements are, how many)
  const auto locate = [&](unsigned tile, unsigned& row, unsigned& t, const T*& from, T*& to, int& count) {
    row = tile / per_row;
    t = tile - row * per_row;
    const unsigned rq = row / inner, rr = row - rq * inner;
    const long long first = static_cast<long long>(t) * TILE;
    from = x + static_cast<long long>(rq) * p.x_s0 + static_cast<long long>(rr) * p.x_s1 + first;
    to = out + static_cast<long long>(rq) * p.o_s0 + static_cast<long long>(rr) * p.o_s1 + first;
    const long long left = p.n - first;
    count = left < TILE ? static_cast<int>(left) : TILE;
  };
  if (h == 32) draw(0);
  __syncthreads();
  unsigned prev = tiles;  // the tile of the round before (none yet)
  A before = scan_identity<OP, A>();  // its L_h
  for (int round = 0;; ++round) {
    const int par = round & 1;
    const unsigned cur = drawn[par];
    unsigned row, t;
    const T* from;
    T* to;
    int count;
    // Phase A: cur's thread total, lanes' ladder and warp totals.
    A before_cur = scan_identity<OP, A>();
    if (cur < tiles) {
      locate(cur, row, t, from, to, count);
      float v[ITEMS];
      load_run<T, OP, false>(v, from, ITEMS * h, count);
      A u = v[0];
#pragma unroll
      for (int k = 1; k < ITEMS; ++k) u = scan_op<OP>(u, v[k]);
      u = lane_ladder<OP>(u, lane, before_cur);
      if (lane == 31) warp_total[par][warp] = u;
    }
    __syncthreads();
    if (warp == 0) {
      // cur's aggregate, published at once, and its group's total if it is the group's last tile (whose
      // earlier tiles were all drawn before it: their phase A needs nothing of it)
      if (cur < tiles) {
        const A aggregate = tile_aggregate<OP>(warp_total[par], lane);
        const unsigned tile = cur, i = t & (SCAN_GROUP - 1);
        if (lane == 0 && i < SCAN_GROUP - 1 && t + 1 < per_row) {
          publish(status + tile, aggregates + tile, p.epoch, STATE_AGGREGATE, aggregate);
        }
        if (i == SCAN_GROUP - 1) {
          const A q_t = group_fold<OP>(status, aggregates, tile, i, p.epoch, lane);
          if (lane == 0) {
            last_fold[par] = q_t;
            publish_total(group_status, sums, row_group_of(row, per_row) + t / SCAN_GROUP, p.epoch,
                          scan_op<OP>(q_t, aggregate));
          }
        }
      }
      // prev's prefix P = B_g (+) Q_t
      if (prev < tiles) {
        const unsigned prow = prev / per_row, pt = prev - prow * per_row;
        const unsigned i = pt & (SCAN_GROUP - 1), g = pt / SCAN_GROUP;
        const A q_t = i == SCAN_GROUP - 1 ? last_fold[par ^ 1] : group_fold<OP>(status, aggregates, prev, i, p.epoch, lane);
        const A b_g = group_base<OP>(group_status, sums, bases, row_group_of(prow, per_row), g, i == 0, p.epoch, lane);
        if (lane == 0) tile_prefix = scan_op<OP>(b_g, q_t);
      }
    }
    __syncthreads();
    if (h == 32 && cur < tiles) draw(par ^ 1);
    // Phase B: prev's results, out = ((P (+) W_w) (+) L_h) (+) s_k, from its elements read again.
    if (prev < tiles) {
      locate(prev, row, t, from, to, count);
      float v[ITEMS];
      load_run<T, OP, true>(v, from, ITEMS * h, count);
      const A base = scan_op<OP>(scan_op<OP>(tile_prefix, warp_total[par ^ 1][warp]), before);
      A s = v[0];
      v[0] = scan_op<OP>(base, s);
#pragma unroll
      for (int k = 1; k < ITEMS; ++k) {
        s = scan_op<OP>(s, v[k]);
        v[k] = scan_op<OP>(base, s);
      }
      store_run(to, v, ITEMS * h, count);
    }
    if (cur >= tiles) break;
    prev = cur;
    before = before_cur;
    __syncthreads();  // tile_prefix and this round's draw, before the next round reads or writes them
  }
}


// scan_columns: lines side by side in memory (line r + 1 starts one element after line r, in x and in
// out) with a stride along their length, as the columns of a C-ordered matrix scanned along axis 0, and
// accumulated in float (float32, float16, bfloat16). scan_tiles reads such a line at its stride, a sector
// for every element a warp loads (float32 [16384, 4096] along axis 0: 7.7% of the copy, docs/design/scan.md).
// Here a warp's lanes are 32 neighbouring lines, so each load is 32 consecutive elements of x, and each
// thread evaluates its own line's expression: warp w forms the 32 run totals of definition warp w into
// shared memory, then the lanes' ladder over them in registers; the warps' totals meet in shared memory,
// and Q and B are carried from tile to tile, a block walking its lines whole (nothing waits on another
// block: no look-back, no workspace). The results read each tile a second time (L2 holds it). The same
// expression as scan_tiles, so the same bits.
// One rung of the lanes' ladder over 32 values held by one thread: x_l = x_{l-D} (+) x_l for l >= D, every l
// from the old values (so from the top down), as lane_ladder's shuffles form it.
template <int OP, int D, typename A> __device__ __forceinline__ void ladder_step(A (&u)[32]) {
#pragma unroll
  for (int l = 31; l >= D; --l) u[l] = scan_op<OP>(u[l - D], u[l]);
}

// Runs whose loads scan_columns issues together, into registers, before combining any: 64 elements a thread
// for float32, 32 for the half types. Measured on whole tiles (unchecked loads at 32-bit offsets), % of the
// copy: float32 [16384, 4096] 56% with 64 against 53% with 32 (13% with the loads left to the compiler, which
// issued them a few at a time); float16 [16384, 8192] 45% with 32 against 39% with 16 (docs/design/scan.md).
// column_tiles' launches (a block a tile, many blocks) take 16 elements a thread at two blocks an SM (48-92
// registers; float32's 32 spilled 56 B at the 128-register bound on sm_80 and sm_90), so that one block's
// loads are in flight while the other forms its ladder: the walk's one block an SM left them at about 40%
// of the copy, each batch of loads a round trip with nothing else in flight.
template <typename T, typename O, int MODE> __device__ constexpr int column_runs() {
  return (MODE == 0 ? (sizeof(T) == 4 ? 64 : 32) : 16) / scan_items<T, O>();
}
template <int MODE> __host__ __device__ constexpr int column_min_blocks() { return MODE == 0 ? 1 : 2; }

// What a scan_columns launch does. COLUMN_WALK: a block a column group, walking its tiles in order with Q
// and B carried (few long lines would leave most SMs idle). With fewer column groups than that, the lines'
// tiles spread over blocks in three launches: COLUMN_AGGREGATES (a block a column group's tile: the tile's
// aggregate A_t of each line into `tile_values`), scan_column_prefixes (a thread a line: the walk's B_g
// (+) Q_t for every tile, from the aggregates, in place), COLUMN_FINISH (a block a column group's tile
// again: its results from that prefix). The same expression, so the same bits; x is read twice.
constexpr int COLUMN_WALK = 0, COLUMN_AGGREGATES = 1, COLUMN_FINISH = 2;

template <typename T, typename O, int OP, int MODE>
__global__ void __launch_bounds__(SCAN_BLOCK, column_min_blocks<MODE>())
    scan_columns(O* out, const T* x, scan_acc_t<O>* tile_values, const __grid_constant__ ScanParams p) {
  using A = scan_acc_t<O>;
  static_assert(sizeof(A) == 4, "a block's run totals fill 32 KiB of shared memory at 4 bytes");
  constexpr int ITEMS = scan_items<T, O>(), TILE = SCAN_BLOCK * ITEMS, RUNS = column_runs<T, O, MODE>();
  __shared__ A runs[SCAN_WARPS][32][32];  // [warp][definition lane j][line]: T_j, then the ladder's values
  __shared__ A warp_total[SCAN_WARPS][32];
  const int h = static_cast<int>(threadIdx.x);
  const int lane = h & 31, warp = h >> 5;
  const unsigned inner = static_cast<unsigned>(p.inner);
  const unsigned groups = (inner + 31) / 32;
  // The walk's blocks are (outer line, group); the others' ((outer line, tile), group), so that blocks
  // running together read neighbouring memory, and block b's lines own tile_values[32 b .. 32 b + 31].
  const unsigned long long unit = blockIdx.x / groups;
  const unsigned rq = static_cast<unsigned>(MODE == COLUMN_WALK ? unit : unit / p.tiles_per_row);
  const long long t_begin = MODE == COLUMN_WALK ? 0 : static_cast<long long>(unit % p.tiles_per_row);
  const long long t_end = MODE == COLUMN_WALK ? p.tiles_per_row : t_begin + 1;
  const unsigned line = (blockIdx.x % groups) * 32 + lane;  // this thread's line among the inner ones
  const bool live = line < inner;
  const T* xl = x + static_cast<long long>(rq) * p.x_s0 + static_cast<long long>(line) * p.x_s1;
  O* ol = out + static_cast<long long>(rq) * p.o_s0 + static_cast<long long>(line) * p.o_s1;
  // Element e of the line, lifted to A; the identity past its end (and on a lane past the last line).
  const auto element = [&](long long e) {
    return live && e < p.n ? scan_lift<A>(xl[e * p.x_step]) : scan_identity<OP, A>();
  };
  // A whole tile of a live line whose steps fit in 32 bits takes unchecked loads and stores, a pointer
  // stepped from the run group's first element (an add with carry an address), the results stored in a loop
  // of their own: no 64-bit index arithmetic, no bound test and no branch an element.
  constexpr long long kNear = 1ll << 31;
  const bool near = p.x_step > -kNear && p.x_step < kNear && p.o_step > -kNear && p.o_step < kNear;
  const int xs = static_cast<int>(p.x_step), os = static_cast<int>(p.o_step);
  // Runs j0 .. j0 + RUNS - 1 of this warp's definition threads in the tile from `first`, loaded together.
  const auto load_runs = [&](A (&v)[RUNS][ITEMS], long long first, int j0, bool whole) {
    const long long e0 = first + (32ll * warp + j0) * ITEMS;
    if (whole) {
      const T* xg = xl + e0 * p.x_step;
#pragma unroll
      for (int r = 0; r < RUNS; ++r)
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
          v[r][k] = scan_lift<A>(*xg);
          xg += xs;
        }
    } else {
#pragma unroll
      for (int r = 0; r < RUNS; ++r)
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) v[r][k] = element(e0 + r * ITEMS + k);
    }
  };
  A b_g = scan_identity<OP, A>(), q_t = scan_identity<OP, A>();  // B_g and Q_t of the tile at hand
  for (long long t = t_begin; t < t_end; ++t) {
    const long long first = t * TILE;
    const bool whole = live && near && first + TILE <= p.n;
    for (int j0 = 0; j0 < 32; j0 += RUNS) {  // T_j: definition thread 32 warp + j's ITEMS elements in order
      A v[RUNS][ITEMS];
      load_runs(v, first, j0, whole);
#pragma unroll
      for (int r = 0; r < RUNS; ++r) {
        A s = v[r][0];
#pragma unroll
        for (int k = 1; k < ITEMS; ++k) s = scan_op<OP>(s, v[r][k]);
        runs[warp][j0 + r][lane] = s;
      }
    }
    {
      A u[32];  // the lanes' ladder, every lane from the old values, as lane_ladder forms it
#pragma unroll
      for (int j = 0; j < 32; ++j) u[j] = runs[warp][j][lane];
      ladder_step<OP, 1>(u);
      ladder_step<OP, 2>(u);
      ladder_step<OP, 4>(u);
      ladder_step<OP, 8>(u);
      ladder_step<OP, 16>(u);
#pragma unroll
      for (int j = 0; j < 32; ++j) runs[warp][j][lane] = u[j];
      warp_total[warp][lane] = u[31];
    }
    __syncthreads();
    // W_w, this warp's exclusive fold of the warps' totals, and the tile's aggregate A_t, in
    // tile_aggregate's order
    A aggregate = scan_identity<OP, A>(), w_before = scan_identity<OP, A>();
#pragma unroll
    for (int w = 0; w < SCAN_WARPS; ++w) {
      if (w == warp) w_before = aggregate;
      aggregate = w == 0 ? warp_total[0][lane] : scan_op<OP>(aggregate, warp_total[w][lane]);
    }
    if (MODE == COLUMN_AGGREGATES) {
      if (warp == 0) tile_values[32ull * blockIdx.x + lane] = aggregate;
      return;
    }
    __syncthreads();  // every warp has read the totals before the next tile writes them
    const unsigned i = static_cast<unsigned>(t) & (SCAN_GROUP - 1);
    if (i == 0) q_t = scan_identity<OP, A>();
    const A before = MODE == COLUMN_FINISH ? tile_values[32ull * blockIdx.x + lane] : scan_op<OP>(b_g, q_t);
    const A prefix = scan_op<OP>(before, w_before);  // P_{t-1} (+) W_w
    for (int j0 = 0; j0 < 32; j0 += RUNS) {
      A v[RUNS][ITEMS];
      load_runs(v, first, j0, whole);
#pragma unroll
      for (int r = 0; r < RUNS; ++r) {  // the results in place of the elements
        const int j = j0 + r;
        const A base = scan_op<OP>(prefix, j == 0 ? scan_identity<OP, A>() : runs[warp][j - 1][lane]);  // (+) L
        A s = v[r][0];
#pragma unroll
        for (int k = 0; k < ITEMS; ++k) {
          if (k > 0) s = scan_op<OP>(s, v[r][k]);  // s_k
          v[r][k] = scan_op<OP>(base, s);
        }
      }
      const long long e0 = first + (32ll * warp + j0) * ITEMS;  // the run group's first element
      if (whole) {
        O* og = ol + e0 * p.o_step;
#pragma unroll
        for (int r = 0; r < RUNS; ++r)
#pragma unroll
          for (int k = 0; k < ITEMS; ++k) {
            *og = scan_out<O>(v[r][k]);
            og += os;
          }
      } else {
#pragma unroll
        for (int i = 0; i < RUNS * ITEMS; ++i) {
          if (live && e0 + i < p.n) ol[(e0 + i) * p.o_step] = scan_out<O>(v[i / ITEMS][i % ITEMS]);
        }
      }
    }
    q_t = scan_op<OP>(q_t, aggregate);  // Q_{t+1}; at a group's last tile, its total S_g
    if (i == SCAN_GROUP - 1) b_g = scan_op<OP>(b_g, q_t);
  }
}

// Between COLUMN_AGGREGATES and COLUMN_FINISH: a thread a line (of every outer line, lines past the last of
// a column group too), over the aggregates of its tiles in order, as the walk carries them: each tile's A_t
// replaced by B_g (+) Q_t. A group of 32 tiles' aggregates are loaded together before they are combined.
template <int OP>
__global__ void __launch_bounds__(SCAN_BLOCK) scan_column_prefixes(float* tile_values, const __grid_constant__ ScanParams p) {
  using A = float;
  const long long slots = (p.inner + 31) / 32 * 32;  // line slots of an outer line
  const long long lines = p.tiles / p.tiles_per_row / p.inner * slots;
  const long long s = static_cast<long long>(blockIdx.x) * SCAN_BLOCK + threadIdx.x;
  if (s >= lines) return;
  const long long rq = s / slots;
  A* v = tile_values + rq * p.tiles_per_row * slots + (s - rq * slots);  // tile t's value at v[t * slots]
  A b_g = scan_identity<OP, A>();
  for (long long t0 = 0; t0 < p.tiles_per_row; t0 += SCAN_GROUP) {
    A a[SCAN_GROUP];
#pragma unroll
    for (int i = 0; i < SCAN_GROUP; ++i) a[i] = t0 + i < p.tiles_per_row ? v[(t0 + i) * slots] : scan_identity<OP, A>();
    A q_t = scan_identity<OP, A>();
#pragma unroll
    for (int i = 0; i < SCAN_GROUP; ++i) {
      if (t0 + i < p.tiles_per_row) v[(t0 + i) * slots] = scan_op<OP>(b_g, q_t);
      q_t = scan_op<OP>(q_t, a[i]);
    }
    b_g = scan_op<OP>(b_g, q_t);
  }
}

}  // namespace cukern
