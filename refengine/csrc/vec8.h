// Vectors of 8 floats (one AVX2 register) for the kernels' AVX2 + FMA paths, chosen at compile time
// where the build has no AVX-512 (SWIFTSERVE_AVX2_PATHS): vec.h's 16-float vectors are split into
// register pairs there, and a kernel holding 16 of them (decode_vec's 16 key accumulators) spills
// on every step. Loads (bf16 widened), loads and stores of a row's first n < 8 elements (nothing
// past them touched), exp (vec.h's, at this width), reductions and the 8-row transpose-sum.
#pragma once

#include "vec.h"

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#define SWIFTSERVE_AVX2_PATHS 1
#include <immintrin.h>

namespace swiftserve_vec8 {

typedef float v8 __attribute__((vector_size(32)));
typedef int32_t i8 __attribute__((vector_size(32)));

inline v8 splat8(float x) { return x - v8{}; }

inline v8 load8(const float* p) {
  v8 r;
  std::memcpy(&r, p, sizeof(r));
  return r;
}

inline void store8(float* p, v8 x) { std::memcpy(p, &x, sizeof(x)); }

inline v8 loadf8(const float* p) { return load8(p); }

inline v8 loadf8(const at::BFloat16* p) {           // bf16 bits are the float's upper half
  typedef uint16_t u8 __attribute__((vector_size(16)));
  u8 h;
  std::memcpy(&h, p, sizeof(h));
  const i8 bits = __builtin_convertvector(h, i8) << 16;
  v8 r;
  std::memcpy(&r, &bits, sizeof(r));
  return r;
}

inline i8 first(int n) {                            // lanes below n set (all bits), the rest clear
  const i8 iota = {0, 1, 2, 3, 4, 5, 6, 7};
  return iota < n;
}

// The first n (0 < n < 8) elements of a row, the other lanes zero: AVX's masked load (a masked
// lane is never read, so nothing past the row faults) for float32, a copy of n bf16 for bfloat16.
inline v8 loadf8_n(const float* p, int n) { return (v8)_mm256_maskload_ps(p, (__m256i)first(n)); }

inline v8 loadf8_n(const at::BFloat16* p, int n) {
  at::BFloat16 h[8] = {};
  std::memcpy(h, p, n * sizeof(at::BFloat16));
  return loadf8(h);
}

inline void store8_n(float* p, v8 x, int n) { _mm256_maskstore_ps(p, (__m256i)first(n), (__m256)x); }

// Stores of 8 floats into float32 or bfloat16 rows (bf16 rounded to nearest even, as vec.h's storef).
inline void storef8(float* p, v8 x) { store8(p, x); }

typedef uint32_t u8x32 __attribute__((vector_size(32)));

inline u8x32 bf16_bits8(v8 x) {                     // x rounded at bf16 precision: upper 16 bits
  u8x32 b;
  std::memcpy(&b, &x, sizeof(b));
  return b + 0x7FFFu + ((b >> 16) & 1u);
}

inline void storef8(at::BFloat16* p, v8 x) {
  typedef uint16_t u8 __attribute__((vector_size(16)));
  const u8 h = __builtin_convertvector(bf16_bits8(x) >> 16, u8);
  std::memcpy(p, &h, sizeof(h));
}

// What torch's op on element type T rounds an intermediate to (vec.h's as_elem at 8 lanes).
inline v8 as_elem8(v8 x, const float*) { return x; }

inline v8 as_elem8(v8 x, const at::BFloat16*) {
  const u8x32 b = bf16_bits8(x) & 0xFFFF0000u;
  v8 r;
  std::memcpy(&r, &b, sizeof(r));
  return r;
}

inline v8 vexp8(v8 x) { return swiftserve_vec::vexp_t<v8, i8>(x); }

template <typename Op>
inline float reduce8(v8 x, Op op) {
  x = op(x, __builtin_shufflevector(x, x, 4, 5, 6, 7, 0, 1, 2, 3));
  x = op(x, __builtin_shufflevector(x, x, 2, 3, 0, 1, 6, 7, 4, 5));
  x = op(x, __builtin_shufflevector(x, x, 1, 0, 3, 2, 5, 4, 7, 6));
  return x[0];
}

inline float hmax8(v8 x) { return reduce8(x, [](v8 a, v8 b) { return a > b ? a : b; }); }

inline float hsum8(v8 x) { return reduce8(x, [](v8 a, v8 b) { return a + b; }); }

// Lane i of the result is the sum of the lanes of a[i] (vec.h's sum16 at 8 lanes: 12 shuffles, 7 adds).
inline v8 sum8(const v8* a) {
  v8 b[4], c[2];
  for (int i = 0; i < 4; ++i)
    b[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
           __builtin_shufflevector(a[2 * i], a[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15);
  for (int i = 0; i < 2; ++i)
    c[i] = __builtin_shufflevector(b[2 * i], b[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13) +
           __builtin_shufflevector(b[2 * i], b[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15);
  return __builtin_shufflevector(c[0], c[1], 0, 2, 4, 6, 8, 10, 12, 14) +
         __builtin_shufflevector(c[0], c[1], 1, 3, 5, 7, 9, 11, 13, 15);
}

}  // namespace swiftserve_vec8
#endif
