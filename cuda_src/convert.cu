// Element-wise steps the op modules would otherwise leave to CuPy (not an op, so no six-question card).
//
// CuPy compiles its element-wise kernels with -ftz=true (cupy.cuda.compiler), so there a float32 result or
// operand below 2^-126 becomes 0, where NumPy and cukern's own kernels keep it (cukern/_compile.py). These
// are the steps cukern takes on its results that would meet it: a float64 value rounded to float32 and a
// float32 value widened to float64 (each part of a complex value likewise), a float32, float64 or integer
// value rounded to bfloat16 and a bfloat16 value widened, and, where a reduction has one element, that
// element's square (sum_of_squares), absolute value (norm) and test against zero (count_nonzero), of float32
// or bfloat16 values. Each is correctly rounded, as NumPy's (a bfloat16 square: the float32 product, rounded
// to bfloat16).
//
// Layout: element i of the launch is the C-order index (i0, i1, i2, i3) over up to four axes (collapsed by
// cukern/_convert.py: most calls have one), read through x's strides and written through out's (elements,
// signed), so no temporary is made and any view can be read or written. One thread an element, a
// grid-stride loop; these arrays are results, small next to the reductions' inputs.
#include "common/dtype.cuh"

namespace cukern {

enum : int { CONVERT_VALUE = 0, CONVERT_SQUARE = 1, CONVERT_ABS = 2, CONVERT_NONZERO = 3 };

// cukern/_convert.py PARAMS, the same fields in the same order: n elements over sizes (d0,) d1, d2, d3.
struct ConvertParams {
  long long n, d1, d2, d3;
  long long x0, x1, x2, x3;
  long long o0, o1, o2, o3;
};

// One value of T as O: rounded to nearest even, subnormal values kept.
__device__ __forceinline__ void store_value(float* o, double v) { *o = __double2float_rn(v); }
__device__ __forceinline__ void store_value(double* o, float v) { *o = static_cast<double>(v); }
__device__ __forceinline__ void store_value(bf16* o, float v) { *o = from_float<bf16>(v); }
__device__ __forceinline__ void store_value(float* o, bf16 v) { *o = to_float(v); }
__device__ __forceinline__ void store_value(double* o, bf16 v) { *o = static_cast<double>(to_float(v)); }
// double to bfloat16 rounded once, as NumPy's: to float toward zero with an inexact result's last bit set
// (round to odd: float's 24 bits hold bfloat16's 8 and two more, so the second rounding is the only one), then
// to nearest even. Past float's range toward zero gives FLT_MAX, odd, which rounds to infinity as it should.
__device__ __forceinline__ void store_value(bf16* o, double v) {
  float f = __double2float_rz(v);
  if (static_cast<double>(f) != v && v == v) f = __int_as_float(__float_as_int(f) | 1);
  *o = from_float<bf16>(f);
}
// An integer to bfloat16 rounded once the same way, to float toward zero first (not through double, which
// would round a 64-bit value past 2^53 once already: 2^60 + 2^52 + 1 became the midpoint 2^60 + 2^52).
template <typename I> __device__ __forceinline__ void store_value(bf16* o, I v) {
  float f;
  if constexpr (I(-1) < I(0)) f = __ll2float_rz(v); else f = __ull2float_rz(v);
  if (static_cast<I>(f) != v) f = __int_as_float(__float_as_int(f) | 1);
  *o = from_float<bf16>(f);
}

template <typename T, typename O, int MODE>
__global__ void convert_values(O* out, const T* x, const __grid_constant__ ConvertParams p) {
  const long long step = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n; i += step) {
    long long r = i;
    const long long i3 = r % p.d3;
    r /= p.d3;
    const long long i2 = r % p.d2;
    r /= p.d2;
    const long long i1 = r % p.d1;
    const long long i0 = r / p.d1;
    const T v = x[i0 * p.x0 + i1 * p.x1 + i2 * p.x2 + i3 * p.x3];
    O* o = out + i0 * p.o0 + i1 * p.o1 + i2 * p.o2 + i3 * p.o3;
    if constexpr (MODE == CONVERT_VALUE) {
      store_value(o, v);
    } else if constexpr (MODE == CONVERT_SQUARE) {
      *o = from_float<O>(__fmul_rn(to_float(v), to_float(v)));
    } else if constexpr (MODE == CONVERT_ABS) {
      *o = from_float<O>(fabsf(to_float(v)));
    } else {
      *o = to_float(v) != 0.f;
    }
  }
}

}  // namespace cukern
