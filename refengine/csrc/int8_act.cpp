// The per-row work around oneDNN's u8 x s8 GEMM for W8A8 layers (refengine/quant/int8.py), one
// pass each where torch took six (quantize) and three (rescale) over [M, K] / [M, N] float32:
//
//   int8_quant_rows(x [M, K] f32|bf16, qmax) -> (u [M, K] u8, s [M] f32)
//       s = max(max|x_row|, 1e-12) / qmax and u = clamp(round(x / s), -qmax, qmax) + qmax + 1
//       (round half to even): the float32 operations of Int8Kernels.quant_rows, bit-equal, with
//       the GEMM's zero point added (u8 in 1 .. 2 qmax + 1);
//   int8_rescale(y [M, N] f32, s [M] f32, bias [N] f32 or empty, out [M, N] f32|bf16)
//       out = y * s[m] (+ bias), the product rounded to float32 before the bias is added (as
//       torch's mul_ then add), then once to out's dtype (nearest even, as torch's .to()).
// Rows run in parallel (at::parallel_for); every row's result is independent of the others.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "vec.h"

namespace {

using namespace swiftserve_vec;
typedef uint8_t u8x16 __attribute__((vector_size(16)));

inline float widen(float v) { return v; }
inline float widen(at::BFloat16 v) { return static_cast<float>(v); }

inline v16 round_even(v16 x) {            // to the nearest integer, ties to even (the default mode)
#if defined(__AVX512F__)
  return (v16)_mm512_roundscale_ps((__m512)x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#else
  for (int i = 0; i < 16; ++i) x[i] = std::nearbyint(x[i]);
  return x;
#endif
}

// a * b as a float32 value the compiler may not fuse into a following add (torch's mul_, then add)
inline v16 product(v16 a, v16 b) {
  v16 t = a * b;
  __asm__("" : "+m"(t));              // through memory: any vector width (a register class would not)
  return t;
}
inline float product(float a, float b) {
  float t = a * b;
  __asm__("" : "+x"(t));
  return t;
}

template <typename T>
void quant_row(const T* x, int64_t K, int qmax, uint8_t* u, float* s) {
  int64_t k = 0;
  v16 mv = splat(0.f);
  for (; k + 16 <= K; k += 16) {
    const v16 a = loadf(x + k);
    const v16 b = a < splat(0.f) ? -a : a;
    mv = b > mv ? b : mv;
  }
  float m = hmax(mv);
  for (; k < K; ++k) m = std::max(m, std::fabs(widen(x[k])));
  const float sc = std::max(m, 1e-12f) / static_cast<float>(qmax);
  *s = sc;
  const float lo = static_cast<float>(-qmax), hi = static_cast<float>(qmax);
  const int zp = qmax + 1;
  for (k = 0; k + 16 <= K; k += 16) {
    v16 q = round_even(loadf(x + k) / splat(sc));
    q = q < splat(lo) ? splat(lo) : q;
    q = q > splat(hi) ? splat(hi) : q;
    const i16 n = __builtin_convertvector(q, i16) + zp;       // integral already: exact
    const u8x16 b = __builtin_convertvector(n, u8x16);
    std::memcpy(u + k, &b, sizeof(b));
  }
  for (; k < K; ++k) {
    const float q = std::min(std::max(std::nearbyint(widen(x[k]) / sc), lo), hi);
    u[k] = static_cast<uint8_t>(static_cast<int>(q) + zp);
  }
}

template <typename O>
void rescale_row(const float* y, float s, const float* bias, O* out, int64_t N) {
  int64_t n = 0;
  for (; n + 16 <= N; n += 16) {
    v16 v = product(load(y + n), splat(s));
    if (bias) v = v + load(bias + n);
    storef(out + n, v);
  }
  for (; n < N; ++n) {
    float v = product(y[n], s);
    if (bias) v = v + bias[n];
    out[n] = static_cast<O>(v);
  }
}

}  // namespace

std::tuple<torch::Tensor, torch::Tensor> int8_quant_rows(torch::Tensor x, int64_t qmax) {
  TORCH_CHECK(x.device().is_cpu() && x.dim() == 2 && x.is_contiguous() &&
              (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "int8_quant_rows: contiguous CPU float32 or bfloat16 rows [M, K]");
  TORCH_CHECK(qmax >= 1 && qmax <= 127, "int8_quant_rows: qmax in 1 .. 127");
  const int64_t M = x.size(0), K = x.size(1);
  auto u = torch::empty({M, K}, x.options().dtype(at::kByte));
  auto s = torch::empty({M}, x.options().dtype(at::kFloat));
  uint8_t* up = u.data_ptr<uint8_t>();
  float* sp = s.data_ptr<float>();
  const int q = static_cast<int>(qmax);
  at::parallel_for(0, M, 1, [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) {
      if (x.scalar_type() == at::kBFloat16)
        quant_row(x.data_ptr<at::BFloat16>() + m * K, K, q, up + m * K, sp + m);
      else
        quant_row(x.data_ptr<float>() + m * K, K, q, up + m * K, sp + m);
    }
  });
  return {u, s};
}

void int8_rescale(torch::Tensor y, torch::Tensor s, torch::Tensor bias, torch::Tensor out) {
  TORCH_CHECK(y.device().is_cpu() && y.dim() == 2 && y.is_contiguous() && y.scalar_type() == at::kFloat,
              "int8_rescale: y contiguous CPU float32 [M, N]");
  const int64_t M = y.size(0), N = y.size(1);
  TORCH_CHECK(s.scalar_type() == at::kFloat && s.is_contiguous() && s.numel() == M, "int8_rescale: s float32 [M]");
  TORCH_CHECK(bias.numel() == 0 || (bias.scalar_type() == at::kFloat && bias.is_contiguous() && bias.numel() == N),
              "int8_rescale: bias float32 [N] or empty");
  TORCH_CHECK(out.is_contiguous() && out.dim() == 2 && out.size(0) == M && out.size(1) == N &&
              (out.scalar_type() == at::kFloat || out.scalar_type() == at::kBFloat16),
              "int8_rescale: out contiguous float32 or bfloat16 [M, N]");
  const float* yp = y.data_ptr<float>();
  const float* sp = s.data_ptr<float>();
  const float* bp = bias.numel() ? bias.data_ptr<float>() : nullptr;
  at::parallel_for(0, M, 1, [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) {
      if (out.scalar_type() == at::kBFloat16)
        rescale_row(yp + m * N, sp[m], bp, out.data_ptr<at::BFloat16>() + m * N, N);
      else
        rescale_row(yp + m * N, sp[m], bp, out.data_ptr<float>() + m * N, N);
    }
  });
}
