// Column sums of partial rows in a tree fixed by their count: the second stage of every deterministic
// weight gradient (rms_norm_backward.cu's dweight; any norm's dweight and dbias the same way).
//
// The first stage leaves `leaves` float32 rows of `cols` values. Column c's result is the perfect binary tree,
// neighbours paired first, over the leaves padded with -0 to a power of two. -0 is the identity of IEEE
// addition (x + -0 is x for every x, +0 and -0 included), so the padding's amount changes nothing and any
// aligned power-of-two split of the leaves computes parts of the same tree: a first stage may combine
// aligned groups of its own partial rows before writing them, and this stage pads to LANES * S leaves, S the
// least power of two with LANES * S >= leaves (cukern/rmsnorm_backward.py `leaves_per_lane`). Lane l of a
// column forms the subtree over leaves [l * S, (l + 1) * S) as common/reduce.cuh's tree_push merges pushes
// (binary-counter carries: exactly the perfect tree of S leaves), and tree_reduce combines the LANES
// subtrees, neighbours first. Nothing here depends on the grid, the block count or the GPU; the result is
// rounded once to the output's type. cukern/reference `column_tree_emulated` repeats it on the host.
//
// Tile: a block is 32 consecutive columns (a warp reads 128 contiguous bytes of a partial row) by LANES lanes;
// a lane loads its leaves kBatch at a time before pushing any, so that many loads are in flight per thread.
// Staging: each thread's tree levels in shared memory at an odd stride (no bank conflict between the 32
// threads of a warp), then the LANES subtree values of each column. No atomics: a column's tree is one block's.
#pragma once

#include "dtype.cuh"
#include "reduce.cuh"

namespace cukern {

constexpr int kPartialLanes = 16;
constexpr int kPartialCols = 32;
constexpr int kPartialBlock = kPartialLanes * kPartialCols;
// Levels of one lane's subtree, S <= 2^16 leaves (the op modules keep leaves under 2^20); each thread's levels
// kPartialLevels + 2 apart, an odd stride.
constexpr int kPartialLevels = 17;

// out[c * out_stride] = the tree over partials[k * cols + c], k < leaves, as described above; `per_lane` = S.
template <typename W>
__global__ void __launch_bounds__(kPartialBlock)
    column_tree(W* out, const float* partials, long long out_stride, int cols, unsigned leaves, unsigned per_lane) {
  constexpr int kBatch = 16;  // one round of loads for up to 256 leaves (16 lanes), where 8 took two
  __shared__ float levels[kPartialBlock * (kPartialLevels + 2)];
  __shared__ float subtree[kPartialLanes][kPartialCols];
  const int cx = static_cast<int>(threadIdx.x) % kPartialCols;
  const int lane = static_cast<int>(threadIdx.x) / kPartialCols;
  const long long col = static_cast<long long>(blockIdx.x) * kPartialCols + cx;
  const bool live = col < cols;
  float* level = levels + threadIdx.x * (kPartialLevels + 2);
  const unsigned first = static_cast<unsigned>(lane) * per_lane;
  for (unsigned k = 0; k < per_lane; k += kBatch) {
    float v[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const unsigned leaf = first + k + b;
      v[b] = live && k + b < per_lane && leaf < leaves ? partials[static_cast<long long>(leaf) * cols + col] : -0.f;
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (k + b < per_lane) tree_push<Sum, float, unsigned>(level, v[b], k + b);
    }
  }
  subtree[lane][cx] = tree_result<Sum, float, unsigned>(level, per_lane);
  __syncthreads();
  if (lane == 0 && live) {
    float all[kPartialLanes];
#pragma unroll
    for (int l = 0; l < kPartialLanes; ++l) all[l] = subtree[l][cx];
    out[col * out_stride] = from_float<W>(tree_reduce<Sum>(all));
  }
}

}  // namespace cukern
