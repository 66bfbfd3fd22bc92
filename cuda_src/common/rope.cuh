// The rotation arithmetic every RoPE kernel shares (rotary.cu, qk_norm_rope.cu): one definition of how a
// pair is turned, so that every kernel rotating a pair gives the bits of cukern/reference.py's
// `rotary_embedding_emulated`, and of how a position is read.
#pragma once

#include "dtype.cuh"
#include "vec.cuh"

namespace cukern {

template <typename T> struct IsBf16 { static constexpr bool value = false; };
template <> struct IsBf16<bf16> { static constexpr bool value = true; };

// A pack of T as VEC floats: bfloat16 two at a time from 32-bit words (a shift and a mask), others one by
// one.
template <typename T, int VEC>
__device__ __forceinline__ void widen(float (&f)[VEC], const Pack<T, VEC>& p) {
  if constexpr (IsBf16<T>::value && VEC % 2 == 0) {
#pragma unroll
    for (int j = 0; j < VEC / 2; ++j) {
      f[2 * j] = __uint_as_float(p.u[j] << 16);
      f[2 * j + 1] = __uint_as_float(p.u[j] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j) f[j] = to_float(p.v[j]);
  }
}

// The pair (x, y) turned by (c, s): x c - y s and y c + x s, every product and sum rounded once, in this
// one order on every path. Left to itself the compiler contracts `x * c - y * s` into a fused multiply-add
// where it likes, and it liked different places in the 16-byte and the element-wise instantiations, so a
// token's last bit depended on its address in a buffer; explicitly rounded operations are never
// contracted. `sin_mask` 0x80000000 negates sin (the inverse rotation): flipping the sign of the sin
// products gives the same bits (rounding is symmetric) without holding a negated copy of the token's sin
// in registers, which the 64-register launch bound has no room for.
__device__ __forceinline__ float flip_sign(float v, unsigned mask) {
  return __uint_as_float(__float_as_uint(v) ^ mask);
}

__device__ __forceinline__ void turn(float x, float y, float c, float s, unsigned sin_mask, float& x_out,
                                     float& y_out) {
  // The sin products first: in this order ptxas fits every instantiation in 64 registers without spills.
  const float ys = flip_sign(__fmul_rn(y, s), sin_mask), xs = flip_sign(__fmul_rn(x, s), sin_mask);
  x_out = __fsub_rn(__fmul_rn(x, c), ys);
  y_out = __fadd_rn(__fmul_rn(y, c), xs);
}

// One of turn's two outputs, for a thread that holds only one element of the pair: `own` c - `other` s
// when it holds x (`second` false), `own` c + `other` s when it holds y. The same operations in the same
// order as turn, hence the same bits.
__device__ __forceinline__ float turn_one(float own, float other, float c, float s, bool second) {
  const float os = __fmul_rn(other, s);
  const float oc = __fmul_rn(own, c);
  return second ? __fadd_rn(oc, os) : __fsub_rn(oc, os);
}

__device__ __forceinline__ long long read_position(const void* positions, int pos64, long long at) {
  return pos64 ? __ldg(static_cast<const long long*>(positions) + at)
               : static_cast<long long>(__ldg(static_cast<const int*>(positions) + at));
}

}  // namespace cukern
