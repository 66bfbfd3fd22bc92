// Storage types and their conversions to and from float, with no CUDA header needed.
//
// Half and bfloat16 are stored as raw 16-bit patterns; conversions use the PTX cvt instructions
// (round to nearest even, NaN kept) so the same source compiles under NVRTC without cuda_fp16.h or
// cuda_bf16.h on the include path, and under nvcc. cvt.rn.bf16.f32 needs sm_80 or newer.
#pragma once

namespace cukern {

struct f16 { unsigned short bits; };
struct bf16 { unsigned short bits; };

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(bf16 v) { return __uint_as_float(static_cast<unsigned>(v.bits) << 16); }
__device__ __forceinline__ float to_float(f16 v) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.bits));
  return f;
}

// The low or high 16-bit value of a 32-bit word, as a float.
template <typename T> __device__ __forceinline__ float half_to_float(unsigned w, bool high);
template <> __device__ __forceinline__ float half_to_float<bf16>(unsigned w, bool high) {
  return __uint_as_float(high ? w & 0xffff0000u : w << 16);
}
template <> __device__ __forceinline__ float half_to_float<f16>(unsigned w, bool high) {
  float f;
  if (high) {
    asm("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.f32.f16 %0, hi; }" : "=f"(f) : "r"(w));
  } else {
    asm("{ .reg .b16 lo, hi; mov.b32 {lo, hi}, %1; cvt.f32.f16 %0, lo; }" : "=f"(f) : "r"(w));
  }
  return f;
}

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16 from_float<bf16>(float v) {
  bf16 r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.bits) : "f"(v));
  return r;
}
template <> __device__ __forceinline__ f16 from_float<f16>(float v) {
  f16 r;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.bits) : "f"(v));
  return r;
}

// Two floats rounded to two 16-bit values packed in one word (lo in the low half): one cvt for the pair.
template <typename T> __device__ __forceinline__ unsigned pack2(float lo, float hi);
template <> __device__ __forceinline__ unsigned pack2<bf16>(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
template <> __device__ __forceinline__ unsigned pack2<f16>(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// The lowest and highest values of V (max's and min's identities): the infinities for the float types; for
// integers the two's complement limits (a signed V's lowest is its sign bit alone, highest its complement),
// false and true for bool.
template <typename V> struct Limits {
  __device__ __forceinline__ static V lowest() {
    return V(-1) < V(0) ? static_cast<V>(1ull << (8 * sizeof(V) - 1)) : V(0);
  }
  __device__ __forceinline__ static V highest() { return static_cast<V>(~lowest()); }
};
template <> struct Limits<float> {
  __device__ __forceinline__ static float lowest() { return __int_as_float(0xff800000); }
  __device__ __forceinline__ static float highest() { return __int_as_float(0x7f800000); }
};
template <> struct Limits<double> {
  __device__ __forceinline__ static double lowest() { return __longlong_as_double(0xfff0000000000000ll); }
  __device__ __forceinline__ static double highest() { return __longlong_as_double(0x7ff0000000000000ll); }
};
template <> struct Limits<f16> {
  __device__ __forceinline__ static f16 lowest() { return from_float<f16>(Limits<float>::lowest()); }
  __device__ __forceinline__ static f16 highest() { return from_float<f16>(Limits<float>::highest()); }
};
template <> struct Limits<bf16> {
  __device__ __forceinline__ static bf16 lowest() { return from_float<bf16>(Limits<float>::lowest()); }
  __device__ __forceinline__ static bf16 highest() { return from_float<bf16>(Limits<float>::highest()); }
};

}  // namespace cukern
