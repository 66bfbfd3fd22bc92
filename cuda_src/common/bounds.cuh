// Launch bounds by architecture. A kernel that states only its block size lets ptxas choose how many blocks
// to aim at; for sm_100 and sm_120 it aimed some kernels at more resident blocks than their registers allow
// and spilled (sm_80 and sm_90 do not: their machine code is unchanged by this header). There a kernel
// states one resident block (CUKERN_BOUNDS), and a kernel that caps its registers with a resident-block
// count drops the cap (arch_min_blocks): the rows kernel that lifts NaNs and counts took 167 registers on
// sm_100 where sm_90 fits 64, and spilled at every cap in between. Fewer resident blocks there, no spill;
// the occupancy this costs is not measured (no such GPU here).
#pragma once

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
#define CUKERN_BOUNDS(block) __launch_bounds__(block, 1)
#else
#define CUKERN_BOUNDS(block) __launch_bounds__(block)
#endif

namespace cukern {

__host__ __device__ constexpr int arch_min_blocks(int blocks) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
  static_cast<void>(blocks);  // one block: no register cap
  return 1;
#else
  return blocks;
#endif
}

}  // namespace cukern
