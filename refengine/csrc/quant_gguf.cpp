// GGUF weight-only quantized matrices on CPU, read as stored (raw blocks, no dequantized copy):
//
//   gguf_dequant(raw [rows, rb] u8, qtype, cols) -> [rows, cols] f32
//       bit-equal to llama.cpp's reference dequantize_row_* (refengine/quant/formats.py documents
//       the layouts): the same float32 operations in the same order, never fused into an FMA;
//   act_quant(x [M, K] f32|bf16) -> (q [M, K] i8, d [M, K/32] f32, ds [M, K/32] f32, s16 [M, K/16] i32)
//       each row's 32-value blocks as int8 with a float32 scale d (d = max|x| / 127, q = round(x / d),
//       ties to even), ds = d * sum(q) of the block and s16 the sums of q over each 16 values;
//   gguf_gemm(q, d, ds, s16, raw [N, rb], qtype, out [M, *] f32|bf16, col0, impl, group)
//       out[m, col0 + n] = sum_k x[m, k] * W[n, k] with x the quantized activations above and W the
//       blocks as stored: per weight block an exact integer dot product of the int8 activations and
//       the block's integer values, then float32 scaling (weight scale times activation scale).
//       group 4 (Q4_K, impl 2): raw's rows interleaved in groups of 4 (block i of rows 4 g .. 4 g + 3
//       adjacent: refengine.quant.qtensor.QTensor.interleaved), the same results.
//   gguf_linear(x [M, K] f32|bf16, raws, qtypes, groups, impl) -> [M, sum of rows] in x's dtype
//       act_quant once, then one gguf_gemm per run of rows into its own columns (a fused q/k/v whose
//       parts are stored in different formats): a linear layer in one call.
//
// The activations are quantized per row and every output element is computed by the same
// sequence of operations whatever M is and whichever rows share a tile, so results do not
// depend on the batch (greedy tokens of a sequence do not change with what runs beside it, and
// a prefill recomputing a decoded token gets the decode's numbers). This is how llama.cpp runs
// these formats on CPUs too (int8 activations, integer block dots), which keeps our logits close
// to its own on the same file.
//
// Integer ranges (why no saturation): maddubs multiplies unsigned weight values (Q4: 0..15,
// Q5_0: 0..31, Q6_K: 0..63, Q8_0: |w| <= 128 by the sign trick) by int8 activations (|q| <= 127) and
// adds pairs into int16: at most 2 * 128 * 127 = 32512 < 32767. Block sums stay far inside int32.
// Q4_0's -8 and Q5_0's -16 offsets and Q4_1 / Q4_K mins use the activation block sums (s16, ds); Q6_K's
// -32 is taken off the int16 pair sums (32 * x summed in pairs by the same instruction: |difference| <= 8128).
//
// impl: 0 = the AVX2 + FMA kernel (compiled where the CPU has them: AVX-512 CPUs run it too),
//       1 = the portable scalar kernel (the reference the AVX2 kernel is tested against; it is
//       also what runs where AVX2 is missing),
//       2 = the AVX-512 VNNI kernel for Q4_0 / Q4_1 / Q4_K / Q6_K (vpdpbusd: unsigned 4- or 6-bit
//       values times int8 activations summed in groups of 4 into int32 lanes, 64 values an
//       instruction; Q5_0 and Q8_0 run impl 0's code, vnni_format), where gguf_has_vnni() says so.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define SWIFTSERVE_GGUF_AVX2 1
#else
#define SWIFTSERVE_GGUF_AVX2 0
#endif
// The AVX-512 VNNI kernel (impl 2) is compiled where the build targets AVX-512 BW + DQ; VNNI itself
// only inside its functions (CFLAGS keep -mno-avx512vnni, see refengine/paged_kernel.py) and it
// runs only where the CPU reports it (gguf_has_vnni).
#if SWIFTSERVE_GGUF_AVX2 && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
#define SWIFTSERVE_GGUF_VNNI 1
#else
#define SWIFTSERVE_GGUF_VNNI 0
#endif

namespace {

enum QType : int64_t { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q8_0 = 8, Q4_K = 12, Q6_K = 14 };

struct Fmt {
  int block;        // values per block
  int bytes;        // bytes per block
};

Fmt fmt_of(int64_t t) {
  switch (t) {
    case Q4_0: return {32, 18};
    case Q4_1: return {32, 20};
    case Q5_0: return {32, 22};
    case Q8_0: return {32, 34};
    case Q4_K: return {256, 144};
    case Q6_K: return {256, 210};
  }
  TORCH_CHECK(false, "gguf: unsupported ggml type ", t, " (Q4_0=2, Q4_1=3, Q5_0=6, Q8_0=8, Q4_K=12, Q6_K=14)");
  return {0, 0};
}

inline float f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return c10::detail::fp16_ieee_to_fp32_value(h);
}

// Q5_0: the 32 fifth bits of a block (bytes 2..5, little-endian; bit j is value j's).
inline uint32_t q5_high(const uint8_t* b) {
  return static_cast<uint32_t>(b[2]) | static_cast<uint32_t>(b[3]) << 8 | static_cast<uint32_t>(b[4]) << 16 |
         static_cast<uint32_t>(b[5]) << 24;
}

// a * b rounded to float32 before anything is added to it (no FMA contraction), as C code
// compiled without FMA (llama.cpp's reference dequantization) computes it.
inline float mul_r(float a, float b) {
  float t = a * b;
  __asm__("" : "+x"(t));
  return t;
}

// Q4_K: the 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes.
inline void k4_scale_min(int j, const uint8_t* s, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Q4_K block w: each sub-block's scale d * sc and negated min -(dmin * m), as the SIMD kernels use them.
inline void k4_scales(const uint8_t* w, float d, float dmin, float* dsc, float* dm) {
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    k4_scale_min(j, w + 4, &sc, &m);
    dsc[j] = d * static_cast<float>(sc);
    dm[j] = -(dmin * static_cast<float>(m));
  }
}

// ---------------------------------------------------------------------------------------------
// Reference dequantization of one row.

void dequant_row(int64_t t, const uint8_t* b, float* y, int64_t cols) {
  const Fmt f = fmt_of(t);
  for (int64_t i = 0; i < cols / f.block; ++i, b += f.bytes, y += f.block) {
    if (t == Q4_0) {
      const float d = f16(b);
      for (int j = 0; j < 16; ++j) {
        y[j] = static_cast<float>((b[2 + j] & 0xF) - 8) * d;
        y[j + 16] = static_cast<float>((b[2 + j] >> 4) - 8) * d;
      }
    } else if (t == Q4_1) {
      const float d = f16(b), m = f16(b + 2);
      for (int j = 0; j < 16; ++j) {
        y[j] = mul_r(static_cast<float>(b[4 + j] & 0xF), d) + m;
        y[j + 16] = mul_r(static_cast<float>(b[4 + j] >> 4), d) + m;
      }
    } else if (t == Q5_0) {
      const float d = f16(b);
      const uint32_t qh = q5_high(b);
      for (int j = 0; j < 16; ++j) {
        const int32_t x0 = static_cast<int32_t>((b[6 + j] & 0xF) | (((qh >> j) & 1) << 4)) - 16;
        const int32_t x1 = static_cast<int32_t>((b[6 + j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16;
        y[j] = static_cast<float>(x0) * d;
        y[j + 16] = static_cast<float>(x1) * d;
      }
    } else if (t == Q8_0) {
      const float d = f16(b);
      for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
    } else if (t == Q4_K) {
      const float d = f16(b), dmin = f16(b + 2);
      const uint8_t* q = b + 16;
      for (int j = 0; j < 4; ++j, q += 32) {
        int sc, m;
        k4_scale_min(2 * j, b + 4, &sc, &m);
        const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
        k4_scale_min(2 * j + 1, b + 4, &sc, &m);
        const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
        for (int l = 0; l < 32; ++l) y[64 * j + l] = mul_r(d1, static_cast<float>(q[l] & 0xF)) - m1;
        for (int l = 0; l < 32; ++l) y[64 * j + 32 + l] = mul_r(d2, static_cast<float>(q[l] >> 4)) - m2;
      }
    } else {  // Q6_K
      const float d = f16(b + 208);
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
      for (int h = 0; h < 2; ++h) {
        const uint8_t* ql = b + 64 * h;
        const uint8_t* qh = b + 128 + 32 * h;
        const int8_t* s = sc + 8 * h;
        float* yh = y + 128 * h;
        for (int l = 0; l < 32; ++l) {
          const int is = l / 16;
          const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
          const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
          const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
          const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
          yh[l] = (d * static_cast<float>(s[is])) * static_cast<float>(q1);
          yh[l + 32] = (d * static_cast<float>(s[is + 2])) * static_cast<float>(q2);
          yh[l + 64] = (d * static_cast<float>(s[is + 4])) * static_cast<float>(q3);
          yh[l + 96] = (d * static_cast<float>(s[is + 6])) * static_cast<float>(q4);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Activation quantization: one row of K values (K a multiple of 32).

template <typename T>
inline float to_f(T v) { return static_cast<float>(v); }

template <typename T>
void quant_row(const T* x, int64_t K, int8_t* q, float* d, float* ds, int32_t* s16) {
  for (int64_t b = 0; b < K / 32; ++b) {
    const T* xb = x + 32 * b;
    float amax = 0.f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(to_f(xb[j])));
    const float db = amax / 127.f;
    const float id = db != 0.f ? 1.f / db : 0.f;
    int32_t sum[2] = {0, 0};
    for (int j = 0; j < 32; ++j) {
      const int v = static_cast<int>(std::nearbyint(to_f(xb[j]) * id));   // ties to even (default mode)
      q[32 * b + j] = static_cast<int8_t>(std::max(-127, std::min(127, v)));
      sum[j / 16] += q[32 * b + j];
    }
    d[b] = db;
    ds[b] = db * static_cast<float>(sum[0] + sum[1]);
    s16[2 * b] = sum[0];
    s16[2 * b + 1] = sum[1];
  }
}

// ---------------------------------------------------------------------------------------------
// Scalar kernel: one weight row against one activation row.

struct Act {
  const int8_t* q;
  const float* d;
  const float* ds;
  const int32_t* s16;
};

float dot_scalar(int64_t t, const uint8_t* w, const Act& a, int64_t K) {
  const Fmt f = fmt_of(t);
  float acc = 0.f;
  for (int64_t i = 0; i < K / f.block; ++i, w += f.bytes) {
    if (t == Q4_0 || t == Q4_1 || t == Q8_0) {
      const int8_t* x = a.q + 32 * i;
      int32_t s = 0;
      if (t == Q8_0) {
        for (int j = 0; j < 32; ++j) s += static_cast<int8_t>(w[2 + j]) * x[j];
        acc = std::fma(f16(w) * a.d[i], static_cast<float>(s), acc);
      } else {
        const uint8_t* qs = w + (t == Q4_0 ? 2 : 4);
        for (int j = 0; j < 16; ++j) s += (qs[j] & 0xF) * x[j] + (qs[j] >> 4) * x[j + 16];
        if (t == Q4_0) s -= 8 * (a.s16[2 * i] + a.s16[2 * i + 1]);
        acc = std::fma(f16(w) * a.d[i], static_cast<float>(s), acc);
        if (t == Q4_1) acc = std::fma(f16(w + 2), a.ds[i], acc);
      }
    } else if (t == Q5_0) {
      const int8_t* x = a.q + 32 * i;
      const uint32_t qh = q5_high(w);
      const uint8_t* qs = w + 6;
      int32_t s = 0;
      for (int j = 0; j < 16; ++j) {
        s += ((qs[j] & 0xF) | static_cast<int>(((qh >> j) & 1) << 4)) * x[j];
        s += ((qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4)) * x[j + 16];
      }
      s -= 16 * (a.s16[2 * i] + a.s16[2 * i + 1]);
      acc = std::fma(f16(w) * a.d[i], static_cast<float>(s), acc);
    } else if (t == Q4_K) {
      const float d = f16(w), dmin = f16(w + 2);
      for (int j = 0; j < 8; ++j) {
        int sc, m;
        k4_scale_min(j, w + 4, &sc, &m);
        const uint8_t* qs = w + 16 + 32 * (j / 2);
        const int sh = 4 * (j % 2);
        const int64_t ab = 8 * i + j;                  // activation block
        const int8_t* x = a.q + 32 * ab;
        int32_t s = 0;
        for (int l = 0; l < 32; ++l) s += ((qs[l] >> sh) & 0xF) * x[l];
        acc = std::fma((d * static_cast<float>(sc)) * a.d[ab], static_cast<float>(s), acc);
        acc = std::fma(-(dmin * static_cast<float>(m)), a.ds[ab], acc);
      }
    } else {  // Q6_K
      const float d = f16(w + 208);
      const int8_t* sc = reinterpret_cast<const int8_t*>(w + 192);
      for (int h = 0; h < 2; ++h) {
        const uint8_t* ql = w + 64 * h;
        const uint8_t* qh = w + 128 + 32 * h;
        for (int g = 0; g < 4; ++g) {
          const int64_t ab = 8 * i + 4 * h + g;
          const int8_t* x = a.q + 32 * ab;
          const uint8_t* lo = ql + (g % 2) * 32;
          const int sh = (g / 2) * 4;
          int32_t s = 0;
          for (int l = 0; l < 32; ++l) {
            const int q = ((lo[l] >> sh) & 0xF) | (((qh[l] >> (2 * g)) & 3) << 4);
            s += sc[8 * h + 2 * g + l / 16] * (q - 32) * x[l];
          }
          acc = std::fma(d * a.d[ab], static_cast<float>(s), acc);
        }
      }
    }
  }
  return acc;
}

#if SWIFTSERVE_GGUF_AVX2
// ---------------------------------------------------------------------------------------------
// AVX2 kernel: one weight row against R activation rows (the weight block is unpacked once).

inline __m256i nibbles32(const uint8_t* qs16) {          // 16 bytes -> 32 values: low nibbles, then high
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs16));
  const __m128i m = _mm_set1_epi8(0xF);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}

// Q5_0: the 32 bits of qh as a byte mask (byte j 0xFF where bit j is set): byte j / 8 of qh copied
// to bytes 8 (j / 8) .. 8 (j / 8) + 7, each ORed with every bit but its own (bit j % 8) set.
inline __m256i bits_to_bytes(uint32_t qh) {
  const __m256i spread = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)),
      _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL));
  const __m256i others = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfeLL);                 // ~(1 << k) in byte k
  return _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi8(-1));
}

inline __m256i dot_u8s8(__m256i u, __m256i s) {          // 8 int32 lanes, each the sum of 4 products
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

inline __m256i load32(const int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

inline float h2f(const uint8_t* p) {                    // fp16 -> float32 in one F16C instruction
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

inline float hsum8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

template <int R>
void dot_avx2(int64_t t, const uint8_t* w, const Act* a, int64_t K, float* out) {
  const Fmt f = fmt_of(t);
  __m256 acc[R];
  float side[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm256_setzero_ps();
    side[r] = 0.f;
  }
  const __m256i m4 = _mm256_set1_epi8(0xF);
  for (int64_t i = 0; i < K / f.block; ++i, w += f.bytes) {
    if (t == Q4_0 || t == Q4_1) {
      const __m256i wq = nibbles32(w + (t == Q4_0 ? 2 : 4));
      const float dw = h2f(w);
      const float mw = t == Q4_1 ? h2f(w + 2) : 0.f;
      for (int r = 0; r < R; ++r) {
        __m256i p = dot_u8s8(wq, load32(a[r].q + 32 * i));
        if (t == Q4_0) p = _mm256_sub_epi32(p, _mm256_set1_epi32(a[r].s16[2 * i] + a[r].s16[2 * i + 1]));
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * a[r].d[i]), _mm256_cvtepi32_ps(p), acc[r]);
        if (t == Q4_1) side[r] = std::fma(mw, a[r].ds[i], side[r]);
      }
    } else if (t == Q5_0) {
      const __m256i hb = _mm256_and_si256(bits_to_bytes(q5_high(w)), _mm256_set1_epi8(0x10));
      const __m256i wq = _mm256_or_si256(nibbles32(w + 6), hb);                  // 0..31
      const float dw = h2f(w);
      for (int r = 0; r < R; ++r) {
        __m256i p = dot_u8s8(wq, load32(a[r].q + 32 * i));
        // -16 * (block sum): 2 * sum off each of the 8 lanes
        p = _mm256_sub_epi32(p, _mm256_set1_epi32(2 * (a[r].s16[2 * i] + a[r].s16[2 * i + 1])));
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * a[r].d[i]), _mm256_cvtepi32_ps(p), acc[r]);
      }
    } else if (t == Q8_0) {
      const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 2));
      const __m256i wa = _mm256_sign_epi8(wv, wv);
      const float dw = h2f(w);
      for (int r = 0; r < R; ++r) {
        const __m256i p = dot_u8s8(wa, _mm256_sign_epi8(load32(a[r].q + 32 * i), wv));
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * a[r].d[i]), _mm256_cvtepi32_ps(p), acc[r]);
      }
    } else if (t == Q4_K) {
      const float d = h2f(w), dmin = h2f(w + 2);
      float dsc[8], dm[8];
      k4_scales(w, d, dmin, dsc, dm);
      for (int j2 = 0; j2 < 4; ++j2) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16 + 32 * j2));
        const __m256i wq[2] = {_mm256_and_si256(raw, m4), _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4)};
        for (int h = 0; h < 2; ++h) {
          const int j = 2 * j2 + h;
          const int64_t ab = 8 * i + j;
          for (int r = 0; r < R; ++r) {
            const __m256i p = dot_u8s8(wq[h], load32(a[r].q + 32 * ab));
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dsc[j] * a[r].d[ab]), _mm256_cvtepi32_ps(p), acc[r]);
            side[r] = std::fma(dm[j], a[r].ds[ab], side[r]);
          }
        }
      }
    } else {  // Q6_K
      const float d = h2f(w + 208);
      const int8_t* sc = reinterpret_cast<const int8_t*>(w + 192);
      const __m256i three = _mm256_set1_epi8(3), m32 = _mm256_set1_epi8(32);
      for (int h = 0; h < 2; ++h) {
        const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 64 * h));
        const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 64 * h + 32));
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 128 + 32 * h));
        for (int g = 0; g < 4; ++g) {
          const __m256i src = (g % 2) ? hi : lo;
          const __m256i low4 = (g / 2) ? _mm256_and_si256(_mm256_srli_epi16(src, 4), m4) : _mm256_and_si256(src, m4);
          const __m256i top2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), three), 4);
          const __m256i wq = _mm256_or_si256(low4, top2);                   // 0..63
          const __m256i scv = _mm256_set_m128i(_mm_set1_epi16(sc[8 * h + 2 * g + 1]), _mm_set1_epi16(sc[8 * h + 2 * g]));
          const int64_t ab = 8 * i + 4 * h + g;
          for (int r = 0; r < R; ++r) {
            const __m256i x = load32(a[r].q + 32 * ab);
            // (q - 32) * x summed in pairs: both int16 pair sums stay within +-16002, their difference too
            const __m256i p16 = _mm256_sub_epi16(_mm256_maddubs_epi16(wq, x), _mm256_maddubs_epi16(m32, x));
            const __m256i p = _mm256_madd_epi16(p16, scv);
            acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d * a[r].d[ab]), _mm256_cvtepi32_ps(p), acc[r]);
          }
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum8(acc[r]) + side[r];
}

#if SWIFTSERVE_GGUF_VNNI
// ---------------------------------------------------------------------------------------------
// AVX-512 VNNI kernel (Q4_0, Q4_1, Q4_K, Q6_K): one weight row against R activation rows, two 32-value
// blocks a step. Lanes 0-7 of a step's int32 sums are the first block's, 8-15 the second's; each
// half is scaled by its own weight scale x activation scale. Minimums (Q4_1, Q4_K) and Q4_0's -8
// go through the activation block sums as in the AVX2 kernel. Every row runs the same operations
// whatever R is (batch-invariant).

__attribute__((target("avx512vnni"))) inline __m512i dot_u8s8_512(__m512i u, __m512i s) {
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
}

inline __m512 halves(float lo, float hi) {               // lanes 0-7 lo, 8-15 hi
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_set1_ps(lo)), _mm256_castps_pd(_mm256_set1_ps(hi)), 1));
}

inline __m512i join(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }

// Permute indices: lanes 0-7 = element j, 8-15 = j + 1 (pair_index); lanes 4 s .. 4 s + 3 = element
// j + s for s < 4 (quad_index).
inline __m512i pair_index(int j) {
  return _mm512_set_epi32(j + 1, j + 1, j + 1, j + 1, j + 1, j + 1, j + 1, j + 1, j, j, j, j, j, j, j, j);
}
inline __m512i quad_index(int j) {
  return _mm512_set_epi32(j + 3, j + 3, j + 3, j + 3, j + 2, j + 2, j + 2, j + 2,
                          j + 1, j + 1, j + 1, j + 1, j, j, j, j);
}

// Q4_K block w's 8 scales (int32 lanes 0-7) and 8 mins (lanes 8-15), decoded with vector ops from its
// 12 packed bytes (k4_scale_min's layout: scales 0-3 / mins 0-3 the low 6 bits of bytes 0-3 / 4-7;
// scales 4-7 / mins 4-7 the low / high nibbles of bytes 8-11 with the top 2 bits of bytes 0-3 / 4-7
// above them). The 4 bytes loaded after the 12 are ignored.
inline __m512i k4_scales_512(const uint8_t* w) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 4));          // words u0 u1 u2 (u3 unused)
  const __m128i lo = _mm_and_si128(v, _mm_set1_epi8(0x3f));                            // words 0, 1: sc 0-3, m 0-3
  const __m128i nib = _mm_and_si128(_mm_srlv_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(2, 2, 2, 2)),
                                                   _mm_set_epi32(4, 0, 0, 0)), _mm_set1_epi8(0x0f));
  const __m128i top = _mm_and_si128(_mm_srli_epi32(_mm_shuffle_epi32(v, _MM_SHUFFLE(1, 0, 0, 0)), 2),
                                    _mm_set1_epi8(0x30));                             // (u >> 6 & 3) << 4 a byte
  const __m128i all = _mm_blend_epi32(lo, _mm_or_si128(nib, top), 0xC);                // sc 0-3, m 0-3, sc 4-7, m 4-7
  return _mm512_cvtepu8_epi32(_mm_shuffle_epi32(all, _MM_SHUFFLE(3, 1, 2, 0)));
}

// Weight rows far enough ahead for the memory to deliver them in time: used where several activation
// rows make a step compute-bound (R > 1); one row streams best on the hardware's own prefetch.
template <int R>
inline void prefetch_ahead(const uint8_t* w) {
  if constexpr (R > 1) {
    for (int c = 0; c < 256; c += 64) _mm_prefetch(reinterpret_cast<const char*>(w + 2048 + c), _MM_HINT_T0);
  }
}

// Activation scales d[i], d[i + 1] as lanes 0-7 and 8-15 (one 8-byte load and a permute).
inline __m512 scale_pair(const float* d) {
  const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(d)))));
}

// Q4_K on VNNI: NR weight rows against R activation rows, block i of weight row n at
// w0 + n * rs + i * bs (rows as stored: bs = 144; rows interleaved in groups of 4: rs = 144, bs = 576).
// Per block and weight row: the 8 sub-block scales d * sc (lanes 0-7) and negated mins -(dmin * m)
// (8-15) in one vector, times the activation scales (0-7) and block sums (8-15) of each activation
// row: comb. Each 64-value step (sub-blocks 2 j2, 2 j2 + 1: the low and high nibbles of 32 bytes) picks
// its two scales (lanes 0-7, 8-15) with one permute; the mins' term accumulates in lanes 8-15 of side.
// Every (weight row, activation row) pair runs the same operations in the same order whatever NR and
// R are (batch-invariant; k4_vnni<1, 4> on interleaved rows gives the bits of k4_vnni<1, 1> on stored
// ones). out[n * R + r].
template <int R, int NR>
__attribute__((target("avx512vnni"))) void k4_vnni(const uint8_t* w0, int64_t rs, int64_t bs, const Act* a,
                                                    int64_t nblk, float* out) {
  const __m512i m4 = _mm512_set1_epi8(0xF);
  const __m512i hi_nibbles = _mm512_set_epi64(0x0004000400040004LL, 0x0004000400040004LL, 0x0004000400040004LL,
                                              0x0004000400040004LL, 0, 0, 0, 0);   // 16-bit shifts: 0 low, 4 high
  const __m512 neg_hi = _mm512_castsi512_ps(_mm512_set_epi32(INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN, INT32_MIN,
      INT32_MIN, INT32_MIN, INT32_MIN, 0, 0, 0, 0, 0, 0, 0, 0));
  const __m512i dd_index = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  __m512 acc[NR][R], side[NR][R];
  for (int n = 0; n < NR; ++n)
    for (int r = 0; r < R; ++r) acc[n][r] = side[n][r] = _mm512_setzero_ps();
  for (int64_t i = 0; i < nblk; ++i) {
    __m512 act[R];
    for (int r = 0; r < R; ++r)
      act[r] = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(a[r].d + 8 * i)),
                                  _mm256_loadu_ps(a[r].ds + 8 * i), 1);
    __m512 comb[NR][R];
    for (int n = 0; n < NR; ++n) {
      const uint8_t* w = w0 + n * rs + i * bs;
      prefetch_ahead<R>(w);
      uint32_t dpair;                                  // d and dmin: one conversion of 4 bytes
      std::memcpy(&dpair, w, 4);
      const __m512 dd = _mm512_xor_ps(_mm512_permutexvar_ps(dd_index, _mm512_castps128_ps512(
          _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(dpair))))), neg_hi);
      const __m512 scm = _mm512_mul_ps(dd, _mm512_cvtepi32_ps(k4_scales_512(w)));
      for (int r = 0; r < R; ++r) {
        comb[n][r] = _mm512_mul_ps(scm, act[r]);
        side[n][r] = _mm512_mask3_fmadd_ps(scm, act[r], side[n][r], 0xFF00);
      }
    }
    for (int j2 = 0; j2 < 4; ++j2) {
      const __m512i pick = pair_index(2 * j2);
      __m512i x[R];
      for (int r = 0; r < R; ++r) x[r] = _mm512_loadu_si512(a[r].q + 32 * (8 * i + 2 * j2));
      for (int n = 0; n < NR; ++n) {
        // the 32 bytes in both halves; 16-bit lanes of the high half shifted by 4: the high nibbles
        const __m512i raw = _mm512_broadcast_i64x4(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w0 + n * rs + i * bs + 16 + 32 * j2)));
        const __m512i wq = _mm512_and_si512(_mm512_srlv_epi16(raw, hi_nibbles), m4);
        for (int r = 0; r < R; ++r) {
          const __m512i p = dot_u8s8_512(wq, x[r]);
          acc[n][r] = _mm512_fmadd_ps(_mm512_permutexvar_ps(pick, comb[n][r]), _mm512_cvtepi32_ps(p), acc[n][r]);
        }
      }
    }
  }
  for (int n = 0; n < NR; ++n)
    for (int r = 0; r < R; ++r)
      out[n * R + r] = _mm512_reduce_add_ps(acc[n][r]) + hsum8(_mm512_extractf32x8_ps(side[n][r], 1));
}

template <int R>
__attribute__((target("avx512vnni"))) void dot_vnni(int64_t t, const uint8_t* w, const Act* a, int64_t K, float* out) {
  const Fmt f = fmt_of(t);
  const int64_t nblk = K / f.block;
  __m512 acc[R];
  float side[R];
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm512_setzero_ps();
    side[r] = 0.f;
  }
  if (t == Q4_0 || t == Q4_1) {
    const int off = t == Q4_0 ? 2 : 4;
    // A step's two blocks A, B: their 16 quant bytes as 128-bit lanes A, A, B, B with the 16-bit words of
    // lanes 1 and 3 shifted by 4, masked: A's low nibbles, A's high, B's low, B's high (nibbles32's order).
    // Their fp16 d (and Q4_1's m) converted in one instruction: [dA, mA, dB, mB].
    const __m512i m4 = _mm512_set1_epi8(0xF);
    const __m512i nib_shift = _mm512_set_epi64(0x0004000400040004LL, 0x0004000400040004LL, 0, 0,
                                               0x0004000400040004LL, 0x0004000400040004LL, 0, 0);
    const __m512i d_lanes = _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0);
    int64_t i = 0;
    for (; i + 2 <= nblk; i += 2, w += 2 * f.bytes) {
      const __m512i ab = _mm512_castsi256_si512(_mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(w + f.bytes + off),
                                                                    reinterpret_cast<const __m128i*>(w + off)));
      const __m512i wq = _mm512_and_si512(_mm512_srlv_epi16(_mm512_shuffle_i64x2(ab, ab, 0x50), nib_shift), m4);
      uint32_t ua, ub;
      std::memcpy(&ua, w, 4);
      std::memcpy(&ub, w + f.bytes, 4);
      const __m128 dm = _mm_cvtph_ps(_mm_set_epi32(0, 0, static_cast<int>(ub), static_cast<int>(ua)));
      const __m512 ws = _mm512_permutexvar_ps(d_lanes, _mm512_castps128_ps512(dm));
      const float mw0 = t == Q4_1 ? _mm_cvtss_f32(_mm_movehdup_ps(dm)) : 0.f;
      const float mw1 = t == Q4_1 ? _mm_cvtss_f32(_mm_shuffle_ps(dm, dm, 3)) : 0.f;
      for (int r = 0; r < R; ++r) {
        __m512i p = dot_u8s8_512(wq, _mm512_loadu_si512(a[r].q + 32 * i));
        if (t == Q4_0)
          p = _mm512_sub_epi32(p, join(_mm256_set1_epi32(a[r].s16[2 * i] + a[r].s16[2 * i + 1]),
                                       _mm256_set1_epi32(a[r].s16[2 * i + 2] + a[r].s16[2 * i + 3])));
        acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(ws, scale_pair(a[r].d + i)), _mm512_cvtepi32_ps(p), acc[r]);
        if (t == Q4_1) {
          side[r] = std::fma(mw0, a[r].ds[i], side[r]);
          side[r] = std::fma(mw1, a[r].ds[i + 1], side[r]);
        }
      }
    }
    if (i < nblk) {                                      // an odd count ends on one block (low half)
      const __m512i wq = join(nibbles32(w + off), _mm256_setzero_si256());
      const __m512 ws = halves(h2f(w), 0.f);
      const float mw0 = t == Q4_1 ? h2f(w + 2) : 0.f;
      for (int r = 0; r < R; ++r) {
        __m512i p = dot_u8s8_512(wq, _mm512_maskz_loadu_epi8(0xFFFFFFFFULL, a[r].q + 32 * i));
        if (t == Q4_0) p = _mm512_sub_epi32(p, join(_mm256_set1_epi32(a[r].s16[2 * i] + a[r].s16[2 * i + 1]),
                                                      _mm256_setzero_si256()));
        acc[r] = _mm512_fmadd_ps(_mm512_mul_ps(ws, halves(a[r].d[i], 0.f)), _mm512_cvtepi32_ps(p), acc[r]);
        if (t == Q4_1) side[r] = std::fma(mw0, a[r].ds[i], side[r]);
      }
    }
  } else if (t == Q4_K) {
    k4_vnni<R, 1>(w, 0, f.bytes, a, nblk, out);
    return;
  } else {  // Q6_K
    // 16 sub-blocks of 16 values with int8 scales; a step's 64 values are two activation blocks and
    // four sub-blocks (int32 lanes 4 s' .. 4 s' + 3 are sub-block s' of the four). Per block and row:
    // comb[s] = d * sc[s] * (activation scale of sub-block s), one vector of 16; a step picks its four
    // with one permute. The -32 offset: -32 * sum_s comb[s] * (sum of the activations of sub-block s).
    const __m256i m4 = _mm256_set1_epi8(0xF), three = _mm256_set1_epi8(3);
    const __m512i pick[4] = {quad_index(0), quad_index(4), quad_index(8), quad_index(12)};
    const __m512i act_of_sub = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    __m512 off[R];
    for (int r = 0; r < R; ++r) off[r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nblk; ++i, w += f.bytes) {
      prefetch_ahead<R>(w);
      const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 192));
      const __m512 dsc = _mm512_mul_ps(_mm512_set1_ps(h2f(w + 208)), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc8)));
      __m512 comb[R];
      for (int r = 0; r < R; ++r) {
        const __m512 ad = _mm512_permutexvar_ps(act_of_sub, _mm512_castps256_ps512(_mm256_loadu_ps(a[r].d + 8 * i)));
        comb[r] = _mm512_mul_ps(dsc, ad);
        off[r] = _mm512_fmadd_ps(comb[r], _mm512_cvtepi32_ps(_mm512_loadu_si512(a[r].s16 + 16 * i)), off[r]);
      }
      for (int h = 0; h < 2; ++h) {
        const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 64 * h));
        const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 64 * h + 32));
        const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 128 + 32 * h));
        for (int gp = 0; gp < 2; ++gp) {            // values 32 g .. 32 g + 31 of the half, g = 2 gp, 2 gp + 1
          const __m256i l0 = gp ? _mm256_and_si256(_mm256_srli_epi16(lo, 4), m4) : _mm256_and_si256(lo, m4);
          const __m256i l1 = gp ? _mm256_and_si256(_mm256_srli_epi16(hi, 4), m4) : _mm256_and_si256(hi, m4);
          const __m256i t0 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4 * gp), three), 4);
          const __m256i t1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4 * gp + 2), three), 4);
          const __m512i wq = join(_mm256_or_si256(l0, t0), _mm256_or_si256(l1, t1));     // 0..63
          const int64_t ab = 8 * i + 4 * h + 2 * gp;
          for (int r = 0; r < R; ++r) {
            const __m512i p = dot_u8s8_512(wq, _mm512_loadu_si512(a[r].q + 32 * ab));
            acc[r] = _mm512_fmadd_ps(_mm512_permutexvar_ps(pick[2 * h + gp], comb[r]), _mm512_cvtepi32_ps(p), acc[r]);
          }
        }
      }
    }
    for (int r = 0; r < R; ++r) side[r] = -32.f * _mm512_reduce_add_ps(off[r]);
  }
  for (int r = 0; r < R; ++r) out[r] = _mm512_reduce_add_ps(acc[r]) + side[r];
}

// The formats dot_vnni runs; the others (Q5_0, Q8_0) take impl 0's dot_avx2 under impl 2.
bool vnni_format(int64_t t) { return t == Q4_0 || t == Q4_1 || t == Q4_K || t == Q6_K; }
#endif

template <typename T>
void quant_row_avx2(const T* x, int64_t K, int8_t* q, float* d, float* ds, int32_t* s16) {
  const __m256 sign = _mm256_set1_ps(-0.f);
  for (int64_t b = 0; b < K / 32; ++b) {
    __m256 v[4];
    for (int k = 0; k < 4; ++k) {
      if constexpr (std::is_same_v<T, float>) {
        v[k] = _mm256_loadu_ps(x + 32 * b + 8 * k);
      } else {                                            // bf16: the high half of a float32
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + 32 * b + 8 * k));
        v[k] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
      }
    }
    __m256 mx = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                              _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
    __m128 m1 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m1 = _mm_max_ps(m1, _mm_movehl_ps(m1, m1));
    m1 = _mm_max_ss(m1, _mm_movehdup_ps(m1));
    const float amax = _mm_cvtss_f32(m1);
    const float db = amax / 127.f;
    const float id = db != 0.f ? 1.f / db : 0.f;
    const __m256 idv = _mm256_set1_ps(id);
    __m256i iv[4];
    for (int k = 0; k < 4; ++k)
      iv[k] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[k], idv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    // |x * id| <= 127 up to rounding of id: clamp so that a value never leaves int8's symmetric range
    const __m256i lim = _mm256_set1_epi32(127), nlim = _mm256_set1_epi32(-127);
    for (int k = 0; k < 4; ++k) iv[k] = _mm256_max_epi32(_mm256_min_epi32(iv[k], lim), nlim);
    auto hsum_i = [](__m256i a, __m256i b2) {
      const __m256i s = _mm256_add_epi32(a, b2);
      __m128i t = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
      t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
      t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
      return _mm_cvtsi128_si32(t);
    };
    const int32_t s0 = hsum_i(iv[0], iv[1]), s1 = hsum_i(iv[2], iv[3]);
    // pack 32 int32 -> 32 int8 in order (packs work per 128-bit lane: fix the order with a permute)
    const __m256i p01 = _mm256_packs_epi32(iv[0], iv[1]);
    const __m256i p23 = _mm256_packs_epi32(iv[2], iv[3]);
    const __m256i p = _mm256_packs_epi16(p01, p23);
    const __m256i ordered = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 32 * b), ordered);
    d[b] = db;
    ds[b] = db * static_cast<float>(s0 + s1);
    s16[2 * b] = s0;
    s16[2 * b + 1] = s1;
  }
}
#endif

template <typename T>
inline void store_out(T* p, float v) { *p = static_cast<T>(v); }

// Output rows of one task: a tile of weight rows (kept in cache) against every activation row.
int64_t rows_per_tile(int64_t row_bytes) { return std::max<int64_t>(4, std::min<int64_t>(64, 65536 / row_bytes)); }

}  // namespace

torch::Tensor gguf_dequant(torch::Tensor raw, int64_t qtype, int64_t cols) {
  const Fmt f = fmt_of(qtype);
  TORCH_CHECK(raw.device().is_cpu() && raw.scalar_type() == at::kByte && raw.dim() == 2, "gguf_dequant: raw u8 [rows, bytes]");
  TORCH_CHECK(cols % f.block == 0 && raw.size(1) == cols / f.block * f.bytes, "gguf_dequant: ", cols,
              " columns do not match rows of ", raw.size(1), " bytes");
  raw = raw.contiguous();
  const int64_t rows = raw.size(0), rb = raw.size(1);
  auto out = torch::empty({rows, cols}, raw.options().dtype(at::kFloat));
  const uint8_t* src = raw.data_ptr<uint8_t>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, rows, std::max<int64_t>(1, 4096 / cols), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) dequant_row(qtype, src + r * rb, dst + r * cols, cols);
  });
  return out;
}

bool gguf_has_vnni();

std::vector<torch::Tensor> act_quant(torch::Tensor x, int64_t impl) {
  TORCH_CHECK(x.device().is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "act_quant: CPU float32 or bfloat16");
  TORCH_CHECK(x.dim() == 2 && x.size(1) % 32 == 0, "act_quant: x [M, K] with K a multiple of 32");
  x = x.contiguous();
  const int64_t M = x.size(0), K = x.size(1), nb = K / 32;
  auto q = torch::empty({M, K}, x.options().dtype(at::kChar));
  auto d = torch::empty({M, nb}, x.options().dtype(at::kFloat));
  auto ds = torch::empty({M, nb}, x.options().dtype(at::kFloat));
  auto s16 = torch::empty({M, 2 * nb}, x.options().dtype(at::kInt));
  auto run = [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xp = reinterpret_cast<const T*>(x.data_ptr());
    at::parallel_for(0, M, std::max<int64_t>(1, 8192 / K), [&](int64_t m0, int64_t m1) {
      for (int64_t m = m0; m < m1; ++m) {
        int8_t* qm = q.data_ptr<int8_t>() + m * K;
        float* dm = d.data_ptr<float>() + m * nb;
        float* dsm = ds.data_ptr<float>() + m * nb;
        int32_t* sm = s16.data_ptr<int32_t>() + m * 2 * nb;
#if SWIFTSERVE_GGUF_AVX2
        if (impl == 0 || impl == 2) {
          quant_row_avx2(xp + m * K, K, qm, dm, dsm, sm);
          continue;
        }
#endif
        quant_row(xp + m * K, K, qm, dm, dsm, sm);
      }
    });
  };
  if (x.scalar_type() == at::kBFloat16) {
    run(static_cast<at::BFloat16*>(nullptr));
  } else {
    run(static_cast<float*>(nullptr));
  }
  return {q, d, ds, s16};
}

void gguf_gemm(torch::Tensor q, torch::Tensor d, torch::Tensor ds, torch::Tensor s16, torch::Tensor raw,
               int64_t qtype, torch::Tensor out, int64_t col0, int64_t impl, int64_t group) {
  const Fmt f = fmt_of(qtype);
  TORCH_CHECK(q.scalar_type() == at::kChar && q.dim() == 2 && q.is_contiguous(), "gguf_gemm: q i8 [M, K] (act_quant)");
  const int64_t M = q.size(0), K = q.size(1), N = raw.size(0);
  TORCH_CHECK(raw.scalar_type() == at::kByte && raw.dim() == 2 && raw.is_contiguous(), "gguf_gemm: raw u8 [N, bytes]");
  TORCH_CHECK(K % f.block == 0 && raw.size(1) == K / f.block * f.bytes, "gguf_gemm: weight rows of ", raw.size(1),
              " bytes do not hold K=", K, " values of ggml type ", qtype);
  TORCH_CHECK(d.is_contiguous() && ds.is_contiguous() && s16.is_contiguous() && d.size(0) == M && d.size(1) == K / 32,
              "gguf_gemm: activation scales from act_quant");
  TORCH_CHECK(out.dim() == 2 && out.size(0) == M && out.stride(1) == 1 && col0 >= 0 && col0 + N <= out.size(1) &&
              (out.scalar_type() == at::kFloat || out.scalar_type() == at::kBFloat16), "gguf_gemm: out [M, >= col0 + N] "
              "float32 or bfloat16 with contiguous rows");
  TORCH_CHECK(impl != 2 || gguf_has_vnni(), "gguf_gemm: impl 2 (AVX-512 VNNI) is not available here");
  TORCH_CHECK(group == 1 || (group == 4 && qtype == Q4_K && impl == 2 && N % 4 == 0), "gguf_gemm: rows interleaved in "
              "groups of ", group, " (QTensor.interleaved) are run for Q4_K by impl 2 only, with rows a multiple of 4");
  if (M == 0 || N == 0) return;
  const int64_t rb = raw.size(1), ld = out.stride(0), nb = K / 32;
  const uint8_t* wp = raw.data_ptr<uint8_t>();
  const Act base{q.data_ptr<int8_t>(), d.data_ptr<float>(), ds.data_ptr<float>(), s16.data_ptr<int32_t>()};
  auto act = [&](int64_t m) { return Act{base.q + m * K, base.d + m * nb, base.ds + m * nb, base.s16 + m * 2 * nb}; };
  // Small M (decode): at least ~8 tiles per thread, so that 2 threads split rows evenly.
  // (a multiple of 4 rows: an interleaved group stays in one tile)
  const int64_t tile = std::max<int64_t>(4, std::min(rows_per_tile(rb), N / (8 * at::get_num_threads())) / 4 * 4);
  auto run = [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    T* op = reinterpret_cast<T*>(out.data_ptr()) + col0;
    at::parallel_for(0, (N + tile - 1) / tile, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t n0 = t0 * tile; n0 < std::min(N, t1 * tile); n0 += tile) {
        const int64_t n1 = std::min(N, n0 + tile);
        int64_t m = 0;
#if SWIFTSERVE_GGUF_AVX2
        // 4-row tiles, then single rows: the same per-row operations either way (dot4 and dot1 are
        // one template at R = 4 and R = 1).
        auto tiles = [&](auto dot4, auto dot1) {
          for (; m + 4 <= M; m += 4) {
            const Act a[4] = {act(m), act(m + 1), act(m + 2), act(m + 3)};
            for (int64_t n = n0; n < n1; ++n) {
              float r[4];
              dot4(qtype, wp + n * rb, a, K, r);
              for (int k = 0; k < 4; ++k) store_out(op + (m + k) * ld + n, r[k]);
            }
          }
          for (; m < M; ++m) {
            const Act a[1] = {act(m)};
            for (int64_t n = n0; n < n1; ++n) {
              float r[1];
              dot1(qtype, wp + n * rb, a, K, r);
              store_out(op + m * ld + n, r[0]);
            }
          }
        };
#if SWIFTSERVE_GGUF_VNNI
        if (group == 4) {
          // Q4_K rows interleaved in 4s: block i of rows 4 g .. 4 g + 3 adjacent (576 bytes). Activation
          // rows in 4s run one weight row at a time (k4_vnni<4, 1>, reading every 4th block); single
          // rows run a group at once (k4_vnni<1, 4>: one sequential stream for 4 independent dots).
          const int64_t bb = f.bytes;
          for (; m + 4 <= M; m += 4) {
            const Act a[4] = {act(m), act(m + 1), act(m + 2), act(m + 3)};
            for (int64_t n = n0; n < n1; ++n) {
              float r[4];
              k4_vnni<4, 1>(wp + (n / 4) * 4 * rb + (n % 4) * bb, 0, 4 * bb, a, K / f.block, r);
              for (int k = 0; k < 4; ++k) store_out(op + (m + k) * ld + n, r[k]);
            }
          }
          for (; m < M; ++m) {
            const Act a[1] = {act(m)};
            for (int64_t n = n0; n < n1; n += 4) {
              float r[4];
              k4_vnni<1, 4>(wp + n * rb, bb, 4 * bb, a, K / f.block, r);
              for (int k = 0; k < 4; ++k) store_out(op + m * ld + n + k, r[k]);
            }
          }
        }
        if (impl == 2 && vnni_format(qtype)) tiles(dot_vnni<4>, dot_vnni<1>);
#endif
        if (impl == 0 || impl == 2) tiles(dot_avx2<4>, dot_avx2<1>);
#endif
        for (; m < M; ++m) {
          const Act a = act(m);
          for (int64_t n = n0; n < n1; ++n) store_out(op + m * ld + n, dot_scalar(qtype, wp + n * rb, a, K));
        }
      }
    });
  };
  if (out.scalar_type() == at::kBFloat16) {
    run(static_cast<at::BFloat16*>(nullptr));
  } else {
    run(static_cast<float*>(nullptr));
  }
}

torch::Tensor gguf_linear(torch::Tensor x, const std::vector<torch::Tensor>& raws, const std::vector<int64_t>& qtypes,
                          const std::vector<int64_t>& groups, int64_t impl) {
  TORCH_CHECK(!raws.empty() && raws.size() == qtypes.size() && raws.size() == groups.size(),
              "gguf_linear: one format and one grouping per run of rows");
  int64_t n_out = 0;
  for (const auto& r : raws) n_out += r.size(0);
  TORCH_CHECK(x.dim() == 2, "gguf_linear: x [M, K]");
  auto out = torch::empty({x.size(0), n_out}, x.options());
  if (x.size(0) == 0) return out;
  const auto acts = act_quant(x, 0);
  int64_t col = 0;
  for (size_t i = 0; i < raws.size(); ++i) {
    gguf_gemm(acts[0], acts[1], acts[2], acts[3], raws[i], qtypes[i], out, col, impl, groups[i]);
    col += raws[i].size(0);
  }
  return out;
}

bool gguf_has_avx2() { return SWIFTSERVE_GGUF_AVX2 != 0; }

bool gguf_has_vnni() {
#if SWIFTSERVE_GGUF_VNNI
  return __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}
