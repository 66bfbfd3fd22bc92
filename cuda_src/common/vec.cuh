// Vector loads and stores: N elements of T moved as the widest words the size allows (16 bytes at most),
// so a Pack<bf16, 8> is one ld.global.v4.u32. The caller guarantees the pointer is aligned to the pack's
// chunk size; the Python planner checks that before it picks N > 1.
#pragma once

#include "dtype.cuh"

namespace cukern {

template <int BYTES> struct Word;
template <> struct Word<16> { using type = uint4; };
template <> struct Word<8> { using type = uint2; };
template <> struct Word<4> { using type = unsigned int; };
template <> struct Word<2> { using type = unsigned short; };
template <> struct Word<1> { using type = unsigned char; };  // float8 outputs one element at a time

template <typename T, int N> struct Pack {
  static constexpr int kBytes = static_cast<int>(sizeof(T)) * N;
  static constexpr int kChunk = kBytes < 16 ? kBytes : 16;
  static constexpr int kWords = kBytes / kChunk;
  using W = typename Word<kChunk>::type;
  union {
    W w[kWords];
    T v[N];
    unsigned u[(kBytes + 3) / 4];  // 32-bit view, for converting 16-bit values in pairs
  };
};

// Element j of a pack, as a float, read through the pack's 32-bit words (the words the loads wrote, so the
// compiler sees one type on both sides). A 16-bit element is either half of a word: a bfloat16 is the high
// half of a float, so that is one instruction (the low half shifted up, the high half masked in place), where
// reading the 16-bit element would first extract it and then shift it back. The same value either way.
template <typename T, int N> __device__ __forceinline__ float element(const Pack<T, N>& p, int j) {
  if constexpr (sizeof(T) == 4) {
    return __uint_as_float(p.u[j]);
  } else if constexpr (N % 2 == 0) {
    return half_to_float<T>(p.u[j / 2], j % 2 != 0);
  } else {
    return to_float(p.v[j]);
  }
}

template <typename T, int N> __device__ __forceinline__ void load(Pack<T, N>& p, const T* src) {
  const auto* s = reinterpret_cast<const typename Pack<T, N>::W*>(src);
#pragma unroll
  for (int i = 0; i < Pack<T, N>::kWords; ++i) p.w[i] = s[i];
}

// A hint that brings the line holding p into L1 now, with no register to hold it: for values a thread will
// load later, after work that does not need them.
__device__ __forceinline__ void prefetch_l1(const void* p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); }

template <typename T, int N> __device__ __forceinline__ void store(T* dst, const Pack<T, N>& p) {
  auto* d = reinterpret_cast<typename Pack<T, N>::W*>(dst);
#pragma unroll
  for (int i = 0; i < Pack<T, N>::kWords; ++i) d[i] = p.w[i];
}

// VEC floats rounded into a pack of T: 16-bit types two at a time (one cvt a pair), others one by one.
template <typename T, int VEC>
__device__ __forceinline__ void round_into(Pack<T, VEC>& p, const float (&f)[VEC]) {
  if constexpr (sizeof(T) == 2 && VEC % 2 == 0) {
#pragma unroll
    for (int j = 0; j < VEC / 2; ++j) p.u[j] = pack2<T>(f[2 * j], f[2 * j + 1]);
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j) p.v[j] = from_float<T>(f[j]);
  }
}

}  // namespace cukern
