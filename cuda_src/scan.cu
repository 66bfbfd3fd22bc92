// Scans: cumsum and cumprod along an axis (cukern/scan.py).
//
//   out[r, i] = x[r, 0] (+) x[r, 1] (+) ... (+) x[r, i]          (+) = + (cumsum) or * (cumprod)
//
// One pass, decoupled look-back over FIXED tiles: a row is cut into tiles of SCAN_TILE = SCAN_BLOCK x
// SCAN_ITEMS consecutive elements, and every element's value is one fixed expression of the row's values,
// whatever the grid, the order in which blocks run or how far a look-back had to go (cukern/reference.py
// `cumsum_emulated` evaluates it):
//   * in tile t, thread h (warp w, lane l) holds elements 16h .. 16h + 15 of the tile; s_k is their running
//     combine in order (k = 0..15); T_h = s_15;
//   * the lanes' inclusive scan of T by the Hillis-Steele ladder (distance 1, 2, 4, 8, 16: x_l = x_{l-d} (+)
//     x_l); L_h is lane l - 1's value (the identity for lane 0);
//   * the warps' totals combined in order: W_w = (...(U_0 (+) U_1) ...) (+) U_{w-1} (identity for w = 0);
//     the tile's aggregate A_t = W_8, the combine of all eight;
//   * the row's prefixes in order: P_t = P_{t-1} (+) A_t (P_{-1} the identity);
//   * out = ((P_{t-1} (+) W_w) (+) L_h) (+) s_k, rounded once from the accumulator to the result dtype.
// The identity is -0.0 for float sums (so that it is exact: -0 + x is x for every x, -0 included), 0 for
// integer sums and 1 for products, so combining with it never changes a bit. The look-back finds
// P_{t-1} as the nearest predecessor's published P_j (+) the aggregates A_{j+1} .. A_{t-1}, combined from
// P_j forward, one at a time: exactly the left fold that defines P_{t-1}, whichever j it found. So the
// tile size is part of the result's definition, fixed in this file, and never a knob.
//
// The six questions (cukern/scan.py `plan` keeps the launch math as a pure plan; the card in
// cukern/lab/scan.py shows the same answers):
// 1. Output tile: one tile (SCAN_TILE elements of one row) per block, tiles numbered in the order blocks
//    start (a global counter), so every predecessor of a tile is running or done: the look-back never
//    waits on a block that cannot run.
// 2. Input traffic: x read once and out written once, both through shared memory: a warp moves 32
//    consecutive elements per load or store (coalesced for a unit-stride row), and each thread then takes
//    its 16 consecutive elements from shared memory. The look-back reads 8 + 8 bytes a predecessor from
//    L2, a few predecessors per tile.
// 3. Accumulation: in double (float64 results), float (float32, float16, bfloat16 results) or int64
//    (integer results), in the fixed order above. Products and sums are correctly rounded (__fmul_rn,
//    __fadd_rn and double forms; never contracted). Integer sums and products wrap as int64 does.
// 4. Staging: registers (16 accumulators a thread), shared memory for the tile (SCAN_TILE values of
//    max(sizeof(T), sizeof(O)) bytes, padded against bank conflicts) and the warps' totals.
// 5. Tuning: none: the tile is part of the definition of the result (above), and the grid is one block
//    a tile.
// 6. Profile: one combine an element against sizeof(T) + sizeof(O) bytes: memory-bound; the target is
//    the device-to-device copy bandwidth.
#include "common/dtype.cuh"

namespace cukern {

constexpr int SCAN_BLOCK = 256;  // cukern/scan.py BLOCK
constexpr int SCAN_ITEMS = 16;   // cukern/scan.py ITEMS
constexpr int SCAN_TILE = SCAN_BLOCK * SCAN_ITEMS;
constexpr int SCAN_WARPS = SCAN_BLOCK / 32;

enum : int { SCAN_SUM = 0, SCAN_PROD = 1 };
// A tile's status word: the launch's epoch (so the flags need no clearing between launches) and its state.
enum : unsigned { STATE_AGGREGATE = 1, STATE_PREFIX = 2 };

template <typename O> struct ScanAcc { using type = float; };
template <> struct ScanAcc<double> { using type = double; };
template <> struct ScanAcc<long long> { using type = long long; };
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

template <int OP, typename A> __device__ __forceinline__ A scan_identity() {
  if constexpr (OP == SCAN_PROD) return A(1);
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
  long long tiles_per_row;   // ceil(n / SCAN_TILE)
  long long tiles;           // rows * tiles_per_row: the grid
  unsigned epoch;            // this launch's tag in the status words, never 0
};

// Shared-memory slot of element e of a tile: one pad word every 32 words, so that the 16 consecutive
// elements a thread reads are spread over the banks.
template <typename S> __device__ __forceinline__ int slot(int e) {
  constexpr int kPerWord = sizeof(S) >= 4 ? 1 : 4 / static_cast<int>(sizeof(S));
  return e + e / (32 * kPerWord);
}

template <typename T, typename O, int OP>
__global__ void __launch_bounds__(SCAN_BLOCK)
    scan_tiles(O* out, const T* x, unsigned* counter, unsigned* status, scan_acc_t<O>* aggregates,
               scan_acc_t<O>* prefixes, const __grid_constant__ ScanParams p) {
  using A = scan_acc_t<O>;
  constexpr int kBytes = sizeof(T) > sizeof(O) ? sizeof(T) : sizeof(O);
  constexpr int kWords = (SCAN_TILE * kBytes + 3) / 4;
  __shared__ __align__(16) unsigned stage_words[kWords + kWords / 32 + 1];
  __shared__ A warp_total[SCAN_WARPS];
  __shared__ A tile_prefix;
  __shared__ unsigned tile_id;
  const int h = static_cast<int>(threadIdx.x);
  const int lane = h & 31, warp = h >> 5;

  if (h == 0) {
    tile_id = atomicAdd(counter, 1u);
    if (tile_id == static_cast<unsigned>(p.tiles) - 1) *counter = 0;  // every block has drawn its tile
  }
  __syncthreads();
  const unsigned tile = tile_id;
  const unsigned per_row = static_cast<unsigned>(p.tiles_per_row);
  const unsigned row = tile / per_row;
  const unsigned t = tile - row * per_row;
  const unsigned inner = static_cast<unsigned>(p.inner);
  const unsigned rq = row / inner, rr = row - rq * inner;
  const T* xr = x + static_cast<long long>(rq) * p.x_s0 + static_cast<long long>(rr) * p.x_s1;
  O* orow = out + static_cast<long long>(rq) * p.o_s0 + static_cast<long long>(rr) * p.o_s1;
  const long long first = static_cast<long long>(t) * SCAN_TILE;
  const long long left = p.n - first;
  const int count = left < SCAN_TILE ? static_cast<int>(left) : SCAN_TILE;

  // Load: element k * BLOCK + h of the tile (a warp reads 32 consecutive ones), into shared memory.
  T* stage_in = reinterpret_cast<T*>(stage_words);
#pragma unroll
  for (int k = 0; k < SCAN_ITEMS; ++k) {
    const int e = k * SCAN_BLOCK + h;
    if (e < count) stage_in[slot<T>(e)] = xr[(first + e) * p.x_step];
  }
  __syncthreads();
  A s[SCAN_ITEMS];
#pragma unroll
  for (int k = 0; k < SCAN_ITEMS; ++k) {
    const int e = h * SCAN_ITEMS + k;
    const A v = e < count ? scan_lift<A>(stage_in[slot<T>(e)]) : scan_identity<OP, A>();
    s[k] = k == 0 ? v : scan_op<OP>(s[k - 1], v);
  }
  // Lanes' inclusive scan of the thread totals; L: the lane before's.
  A u = s[SCAN_ITEMS - 1];
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const A up = __shfl_up_sync(0xffffffffu, u, d);
    if (lane >= d) u = scan_op<OP>(up, u);
  }
  A before = __shfl_up_sync(0xffffffffu, u, 1);
  if (lane == 0) before = scan_identity<OP, A>();
  if (lane == 31) warp_total[warp] = u;
  __syncthreads();  // also: every thread has read its elements from the stage before it is reused below

  if (warp == 0) {
    // W_w for this warp's lanes w < 8 (in order), the aggregate, then the look-back.
    A aggregate = scan_identity<OP, A>();
    A mine = scan_identity<OP, A>();
#pragma unroll
    for (int w = 0; w < SCAN_WARPS; ++w) {
      if (w == lane) mine = aggregate;
      aggregate = w == 0 ? warp_total[0] : scan_op<OP>(aggregate, warp_total[w]);
    }
    __syncwarp();  // every lane has read the totals before they are overwritten
    if (lane < SCAN_WARPS) warp_total[lane] = mine;  // now the exclusive W_w
    A prefix = scan_identity<OP, A>();
    if (t == 0) {
      if (lane == 0) {
        prefixes[tile] = aggregate;
        __threadfence();
        atomicExch(status + tile, (p.epoch << 2) | STATE_PREFIX);
      }
    } else {
      if (lane == 0) {
        aggregates[tile] = aggregate;
        __threadfence();
        atomicExch(status + tile, (p.epoch << 2) | STATE_AGGREGATE);
      }
      // Lane l watches tile - 1 - l (within the row) until it has at least an aggregate; once some lane
      // sees a prefix, the nearest one (lowest lane q) and the aggregates of lanes q-1 .. 0 are combined
      // forward. Lanes past the row's first tile stand for nothing.
      const long long j = static_cast<long long>(tile) - 1 - lane;
      const bool in_row = lane < static_cast<int>(t);
      unsigned prefix_mask;
      unsigned state = 0;
      while (true) {
        if (in_row && state != STATE_PREFIX) {
          const unsigned w = atomicAdd(status + j, 0u);
          state = (w >> 2) == p.epoch ? (w & 3u) : 0u;
        }
        prefix_mask = __ballot_sync(0xffffffffu, in_row && state == STATE_PREFIX);
        const unsigned ready = __ballot_sync(0xffffffffu, !in_row || state != 0);
        if (prefix_mask != 0) {
          const int q = __ffs(prefix_mask) - 1;
          if ((ready & ((2u << q) - 1u)) == ((2u << q) - 1u)) break;  // lanes 0..q all known
        }
      }
      __threadfence();
      const int q = __ffs(prefix_mask) - 1;
      A v = scan_identity<OP, A>();
      if (lane == q) v = __ldcg(prefixes + j);
      else if (lane < q) v = __ldcg(aggregates + j);
      prefix = __shfl_sync(0xffffffffu, v, q);
      for (int l = q - 1; l >= 0; --l) prefix = scan_op<OP>(prefix, __shfl_sync(0xffffffffu, v, l));
      if (lane == 0) {
        prefixes[tile] = scan_op<OP>(prefix, aggregate);
        __threadfence();
        atomicExch(status + tile, (p.epoch << 2) | STATE_PREFIX);
      }
    }
    if (lane == 0) tile_prefix = prefix;
  }
  __syncthreads();

  // out = ((P (+) W_w) (+) L_h) (+) s_k, rounded once, through the stage back to a warp-per-32 store.
  const A base = scan_op<OP>(scan_op<OP>(tile_prefix, warp_total[warp]), before);
  O* stage_out = reinterpret_cast<O*>(stage_words);
#pragma unroll
  for (int k = 0; k < SCAN_ITEMS; ++k) {
    const int e = h * SCAN_ITEMS + k;
    if (e < count) stage_out[slot<O>(e)] = scan_out<O>(scan_op<OP>(base, s[k]));
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < SCAN_ITEMS; ++k) {
    const int e = k * SCAN_BLOCK + h;
    if (e < count) orow[(first + e) * p.o_step] = stage_out[slot<O>(e)];
  }
}

}  // namespace cukern
