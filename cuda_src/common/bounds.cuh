// Launch bounds by architecture. A kernel that states only its block size lets ptxas choose how many blocks
// to aim at; for sm_100 and sm_120 it aimed some kernels at more resident blocks than their registers allow
// and spilled (sm_90 does not: its machine code is unchanged by this header). There a kernel states one
// resident block (CUKERN_BOUNDS), and a kernel that caps its registers with a resident-block count drops
// the cap (arch_min_blocks): the rows kernel that lifts NaNs and counts took 167 registers on sm_100 where
// sm_90 fits 64, and spilled at every cap in between. Fewer resident blocks there, no spill; the occupancy
// this costs is not measured (no such GPU here). Before sm_90 (sm_80), ptxas left to choose also spilled a
// few bytes in some column kernels, aiming at the resident blocks of 48 or 64 registers: those state a count
// there (before_sm90_min_blocks), and the few kernels whose own cap spilled there relax it before sm_90
// (reduce.cu row_min_blocks); the occupancy this changes on sm_80 is not measured either.
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

// The resident blocks of a kernel that states only its block size on sm_90 but `blocks` before sm_90
// (__launch_bounds__(block, before_sm90_min_blocks(n))): n before sm_90 (0: none, ptxas chooses), none on
// sm_90 (a count of 0 states nothing: the same code as CUKERN_BOUNDS), one from sm_100 on (CUKERN_BOUNDS).
__host__ __device__ constexpr int before_sm90_min_blocks(int blocks) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
  static_cast<void>(blocks);
  return 1;
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  return blocks;
#else
  static_cast<void>(blocks);
  return 0;
#endif
}

}  // namespace cukern
