// Complex numbers as the products read, carry and write them (reduce.cu prod, scan.cu cumprod), and the
// correctly rounded float and double steps they are made of.
#pragma once

namespace cukern {

// Correctly rounded and never fused: the default -fmad=true would otherwise turn a product and an add into
// one FMA on some paths and not on others.
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float sub_rn(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double sub_rn(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float div_rn(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double div_rn(double a, double b) { return __ddiv_rn(a, b); }

__device__ __forceinline__ bool is_positive_zero(float a) { return __float_as_uint(a) == 0u; }
__device__ __forceinline__ bool is_positive_zero(double a) { return __double_as_longlong(a) == 0ll; }

// complex64 / complex128: both parts in one 8- or 16-byte aligned value, so that a 16-byte vector holds two
// complex64 or one complex128. Sums, means and norms never see it (they reduce or scan a complex array as a
// float view with a trailing axis of parts, each part apart); a product mixes the parts, so it multiplies
// the pairs. Complex<S>(1) is 1 + 0i, the products' identity.
template <typename S> struct alignas(2 * sizeof(S)) Complex {
  S re, im;
  Complex() = default;  // trivial, so that shared memory and vector packs can hold it
  __device__ __forceinline__ explicit Complex(S r, S i = S(0)) : re(r), im(i) {}
};

template <typename A> constexpr bool kIsComplex = false;
template <typename S> constexpr bool kIsComplex<Complex<S>> = true;

// A complex product by the textbook formula, which NumPy's complex multiply uses too: re = ar br - ai bi,
// im = ar bi + ai br, each product, difference and sum correctly rounded and none fused into an FMA.
// Commutative bit for bit, as the shuffle trees need: each product is, and so is each sum of two. An operand
// of exactly 1 + 0i (both parts' bits) returns the other one as it is, where the formula would not: x (1 + 0i)
// is (xr - xi 0, xr 0 + xi), which turns a -0 part into +0 (the real part over an imaginary part of sign -,
// the imaginary part over a real part of sign +) and spreads an infinite or NaN part to the other as a NaN.
// The identity pads chains, spans, trees and tiles wherever a split leaves a gap, so only an exact identity
// keeps the bits free of the split. An element equal to 1 + 0i multiplies the same way: it changes nothing.
template <typename S> __device__ __forceinline__ bool is_one(Complex<S> a) {
  return a.re == S(1) && is_positive_zero(a.im);
}
template <typename S> __device__ __forceinline__ Complex<S> mul_rn(Complex<S> a, Complex<S> b) {
  if (is_one(b)) return a;
  if (is_one(a)) return b;
  const S re = sub_rn(mul_rn(a.re, b.re), mul_rn(a.im, b.im));
  return Complex<S>(re, add_rn(mul_rn(a.re, b.im), mul_rn(a.im, b.re)));
}

// Shuffles and L2 loads of both parts.
template <typename S> __device__ __forceinline__ Complex<S> shuffle_xor(Complex<S> v, int m) {
  return Complex<S>(__shfl_xor_sync(0xffffffffu, v.re, m), __shfl_xor_sync(0xffffffffu, v.im, m));
}
template <typename S> __device__ __forceinline__ Complex<S> lane_value(Complex<S> v, int l) {
  return Complex<S>(__shfl_sync(0xffffffffu, v.re, l), __shfl_sync(0xffffffffu, v.im, l));
}
template <typename S> __device__ __forceinline__ Complex<S> lane_up(Complex<S> v, int d) {
  return Complex<S>(__shfl_up_sync(0xffffffffu, v.re, d), __shfl_up_sync(0xffffffffu, v.im, d));
}
template <typename S> __device__ __forceinline__ Complex<S> load_cg(const Complex<S>* p) {
  return Complex<S>(__ldcg(&p->re), __ldcg(&p->im));
}

}  // namespace cukern
