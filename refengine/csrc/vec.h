// Vectors of 16 floats for the CPU kernels (GCC/Clang vector extensions, no intrinsics: one
// register on AVX-512, pairs of AVX2 or SSE instructions elsewhere) and the few operations on
// them that the kernels share: loads and stores (bf16 widened), exp, horizontal reductions.
#pragma once

#include <torch/extension.h>

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) || defined(__AVX512BF16__)
#include <immintrin.h>
#endif

namespace swiftserve_vec {

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t i16 __attribute__((vector_size(64)));

inline v16 splat(float x) { return x - v16{}; }        // x - 0 == x for every x, so no add is emitted

inline v16 load(const float* p) {
  v16 r;
  std::memcpy(&r, p, sizeof(r));
  return r;
}

inline void store(float* p, v16 x) { std::memcpy(p, &x, sizeof(x)); }

// exp(x) for x <= 0 (scores minus their row max); -inf and anything below -87 give 0. Any width:
// V a float vector, I the int32 vector of as many lanes (v16 / i16 here, vec8.h's 8-float one).
template <typename V, typename I>
inline V vexp_t(V x) {
  const auto sp = [](float c) { return c - V{}; };
  const V lo = sp(-87.0f);
  const I dead = x < lo;
  x = x < lo ? lo : x;
  const V t = x * sp(1.44269504088896341f);
  const V magic = sp(12582912.0f);                         // 1.5 * 2^23: round to nearest
  const V n = (t + magic) - magic;
  V r = x - n * sp(0.693359375f);                          // Cody-Waite: ln2 = hi + lo
  r = r - n * sp(-2.12194440e-4f);
  V p = sp(1.9875691500e-4f);
  p = p * r + sp(1.3981999507e-3f);
  p = p * r + sp(8.3334519073e-3f);
  p = p * r + sp(4.1665795894e-2f);
  p = p * r + sp(1.6666665459e-1f);
  p = p * r + sp(5.0000001201e-1f);
  p = p * r * r + r + sp(1.0f);
  const I e = (__builtin_convertvector(n, I) + 127) << 23;
  I bits;
  std::memcpy(&bits, &p, sizeof(bits));
  bits = bits + e - (127 << 23);
  V out;
  std::memcpy(&out, &bits, sizeof(out));
  return dead ? sp(0.0f) : out;
}

inline v16 vexp(v16 x) { return vexp_t<v16, i16>(x); }

// Horizontal max / sum: halve the vector four times (log-depth shuffles, no scalar loop).
template <typename Op>
inline float reduce(v16 x, Op op) {
  x = op(x, __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
  x = op(x, __builtin_shufflevector(x, x, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11));
  x = op(x, __builtin_shufflevector(x, x, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13));
  x = op(x, __builtin_shufflevector(x, x, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14));
  return x[0];
}

inline float hmax(v16 x) { return reduce(x, [](v16 a, v16 b) { return a > b ? a : b; }); }

inline float hsum(v16 x) { return reduce(x, [](v16 a, v16 b) { return a + b; }); }

// 16 floats from a pool row (bf16 widened: its bits are the float's upper half).
inline v16 loadf(const float* p) { return load(p); }

inline v16 loadf(const at::BFloat16* p) {
  typedef uint16_t u16 __attribute__((vector_size(32)));
  u16 h;
  std::memcpy(&h, p, sizeof(h));
  const i16 bits = __builtin_convertvector(h, i16) << 16;
  v16 r;
  std::memcpy(&r, &bits, sizeof(r));
  return r;
}

// The first n (0 < n <= 16) elements of a row, the other lanes zero, and the store of the first n
// lanes: the tails of rows whose width is not a whole number of vectors (ZACK's ragged ranks).
// Nothing past element n is read or written. AVX-512 masked moves where the build has them.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
constexpr bool kMaskedTails = true;
inline __mmask16 lanes(int n) { return static_cast<__mmask16>((1u << n) - 1u); }
inline v16 loadf_n(const float* p, int n) { return (v16)_mm512_maskz_loadu_ps(lanes(n), p); }
inline v16 loadf_n(const at::BFloat16* p, int n) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(lanes(n), p));
  return (v16)_mm512_slli_epi32(w, 16);
}
inline void store_n(float* p, v16 x, int n) { _mm512_mask_storeu_ps(p, lanes(n), (__m512)x); }
#else
constexpr bool kMaskedTails = false;
#endif

// Stores of 16 floats into float32 or bfloat16 rows; bf16 rounds to nearest even, as torch's
// float -> bfloat16 conversion does (finite values; the kernels never make NaNs of their own).
typedef uint32_t u16x32 __attribute__((vector_size(64)));       // 16 lanes of 32 bits

// The bits of x rounded to nearest even at bf16 precision: the upper 16 bits of each lane.
inline u16x32 bf16_bits(v16 x) {
  u16x32 b;
  std::memcpy(&b, &x, sizeof(b));
  return b + 0x7FFFu + ((b >> 16) & 1u);
}

inline v16 round_bf16(v16 x) {              // x rounded to bf16 precision, kept as float
  const u16x32 b = bf16_bits(x) & 0xFFFF0000u;
  v16 r;
  std::memcpy(&r, &b, sizeof(r));
  return r;
}

inline void storef(float* p, v16 x) { store(p, x); }

inline void storef(at::BFloat16* p, v16 x) {
  typedef uint16_t u16 __attribute__((vector_size(32)));
  const u16 h = __builtin_convertvector(bf16_bits(x) >> 16, u16);
  std::memcpy(p, &h, sizeof(h));
}

// What torch's op on element type T rounds an intermediate to: nothing for float, bf16 for bf16.
inline v16 as_elem(v16 x, const float*) { return x; }
inline v16 as_elem(v16 x, const at::BFloat16*) { return round_bf16(x); }
inline float as_elem(float x, const float*) { return x; }
inline float as_elem(float x, const at::BFloat16*) { return static_cast<float>(static_cast<at::BFloat16>(x)); }

// Lane i of the result is the sum of the lanes of a[i]: a transpose folded into the adds
// (30 two-vector shuffles and 15 adds for 16 dot products).
inline v16 sum16(const v16* a) {
  v16 b[8], c[4], e[2];
  for (int i = 0; i < 8; ++i)
    b[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           __builtin_shufflevector(a[2 * i], a[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  for (int i = 0; i < 4; ++i)
    c[i] = __builtin_shufflevector(b[2 * i], b[2 * i + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           __builtin_shufflevector(b[2 * i], b[2 * i + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  for (int i = 0; i < 2; ++i)
    e[i] = __builtin_shufflevector(c[2 * i], c[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
           __builtin_shufflevector(c[2 * i], c[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  return __builtin_shufflevector(e[0], e[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         __builtin_shufflevector(e[0], e[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

#ifdef __AVX512BF16__
// Words of two bf16 each (element 2i in the low half, as in memory) and the AVX-512-BF16 dot
// product: lane i of dot2(acc, a, b) is acc[i] + a[2i] b[2i] + a[2i+1] b[2i+1], the products exact
// and summed in float32 (denormals flushed).
typedef uint32_t w16 __attribute__((vector_size(64)));

inline w16 loadw(const uint32_t* p) {
  w16 r;
  std::memcpy(&r, p, sizeof(r));
  return r;
}

inline w16 splatw(uint32_t x) { return x - w16{}; }

inline v16 dot2(v16 acc, w16 a, w16 b) { return (v16)_mm512_dpbf16_ps((__m512)acc, (__m512bh)a, (__m512bh)b); }
#endif

}  // namespace swiftserve_vec
