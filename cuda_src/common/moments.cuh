// (count, mean, M2) states and Chan's merge: the one-pass moments of reduce.cu's var and std and of
// layer_norm.cu's row statistics, so that both merge states by the same steps.
#pragma once

#include "complex.cuh"

namespace cukern {

// The count is held in S as well (exact to 2^24 in float; rounded, deterministically, above). var keeps the
// values less a shift (the slice's first element), without which a float32 mean of 1e4 leaves M2 only a few
// correct digits; layer_norm's states start from classes of four elements or fewer, each centred on its own
// mean before it is merged.
template <typename S> struct Moments {
  S n, mean, m2;
};

template <typename S> __device__ __forceinline__ Moments<S> shuffle_xor(Moments<S> v, int m) {
  return Moments<S>{__shfl_xor_sync(0xffffffffu, v.n, m), __shfl_xor_sync(0xffffffffu, v.mean, m),
                    __shfl_xor_sync(0xffffffffu, v.m2, m)};
}

// Chan's merge, commutative bit for bit as the shuffle trees need: the operands are first put in a fixed
// order (the larger count first, then the larger mean), and the merge is then a fixed sequence of correctly
// rounded steps. An empty operand (the identity) returns the other one exactly, so padding and idle lanes
// change nothing. Any NaN stays in the mean.
struct Chan {
  template <typename A> __device__ __forceinline__ static A identity() { return A{0, 0, 0}; }
  template <typename A> __device__ __forceinline__ static A apply(A a, A b) {
    const bool swap = b.n > a.n || (b.n == a.n && b.mean > a.mean);
    const A hi = swap ? b : a;
    const A lo = swap ? a : b;
    if (lo.n == 0) return hi;
    const auto n = add_rn(hi.n, lo.n);
    const auto d = sub_rn(lo.mean, hi.mean);
    // Equal counts (a balanced tree's every merge): lo.n / n is 1/2 exactly, the correctly rounded quotient.
    auto f = static_cast<decltype(n)>(0.5);
    if (lo.n != hi.n) f = div_rn(lo.n, n);
    return A{n, add_rn(hi.mean, mul_rn(d, f)), add_rn(add_rn(hi.m2, lo.m2), mul_rn(mul_rn(d, d), mul_rn(hi.n, f)))};
  }
};

}  // namespace cukern
