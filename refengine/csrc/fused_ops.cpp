// Fused element-wise ops of a Llama layer on CPU, float32 or bfloat16: one pass over memory and
// one parallel loop each, where torch runs 4-6 ops (each with its own loop and a fresh tensor).
//
//   rms_norm(x [T, n], w [n], eps) -> [T, n]         w * (x * rsqrt(mean(x^2) + eps)): LlamaRMSNorm
//   add_rms_norm_(x [T, n], r [T, n], w, eps) -> [T, n]   x += r in place, then rms_norm of the sum
//   rope_(x [T, heads, d], cos [T, *, d], sin [T, *, d])  in place: x * cos + rotate_half(x) * sin
//                                                     (neox / HF layout: halves [0, d/2) and [d/2, d))
//   silu_mul(gu [T, 2m]) -> [T, m]                    silu(gu[:, :m]) * gu[:, m:]
//
// Every tensor of one call has one element type, float32 or bfloat16 (x, r, w, cos, sin, gu).
// Arithmetic is float32 (bf16 elements widened on load). In bf16 each op rounds where torch's
// bf16 ops round: rms_norm rounds x * rsqrt(...) to bf16 before the weight multiplies it (as
// LlamaRMSNorm's `weight * h.to(dtype)`), add_rms_norm_ stores the rounded sum and normalises
// that, silu_mul rounds silu(gate) before multiplying by up; rope rounds once (torch rounds its
// two products and their sum: a difference of one bf16 ulp at most).
//
// AVX2 + FMA builds without AVX-512 (vec8.h's SWIFTSERVE_AVX2_PATHS) run rms_norm, the residual add
// and silu_mul on 8-float vectors (silu_mul bit-identical to the 16-float loop; 3-5x faster there).
//
// Rows may have any stride (views into a fused projection's output); a row's elements, and
// rope's heads within a token, are contiguous. Results equal torch's up to float rounding
// (summation order, fused multiply-adds): a few float32 ulp, or one bf16 ulp.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

#include "vec.h"
#include "vec8.h"

using namespace swiftserve_vec;

namespace {

#ifdef SWIFTSERVE_AVX2_PATHS
// AVX2 builds: norm_row on 8-float vectors (the 16-float ones split into register pairs there ran
// 2-4x slower at 32 rows). Same arithmetic; the sum of squares is added in another order.
template <typename T>
inline void norm_row8(const T* x, const T* w, T* out, int64_t n, float eps) {
  using namespace swiftserve_vec8;
  v8 acc = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const v8 v = loadf8(x + i);
    acc += v * v;
  }
  float ss = hsum8(acc);
  for (; i < n; ++i) ss += static_cast<float>(x[i]) * static_cast<float>(x[i]);
  const float r = 1.f / std::sqrt(ss / static_cast<float>(n) + eps);
  const v8 rv = splat8(r);
  for (i = 0; i + 8 <= n; i += 8) storef8(out + i, loadf8(w + i) * as_elem8(loadf8(x + i) * rv, x));
  for (; i < n; ++i) out[i] = static_cast<T>(static_cast<float>(w[i]) * as_elem(static_cast<float>(x[i]) * r, x));
}
#endif

// Rows per parallel chunk: enough elements that a chunk outweighs handing it to a thread.
int64_t grain(int64_t row_elems) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(row_elems, 1)); }

template <typename T>
inline void norm_row(const T* x, const T* w, T* out, int64_t n, float eps) {
#ifdef SWIFTSERVE_AVX2_PATHS
  return norm_row8(x, w, out, n, eps);
#endif
  v16 acc = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const v16 v = loadf(x + i);
    acc += v * v;
  }
  float ss = hsum(acc);
  for (; i < n; ++i) ss += static_cast<float>(x[i]) * static_cast<float>(x[i]);
  const float r = 1.f / std::sqrt(ss / static_cast<float>(n) + eps);
  const v16 rv = splat(r);
  for (i = 0; i + 16 <= n; i += 16) storef(out + i, loadf(w + i) * as_elem(loadf(x + i) * rv, x));
  for (; i < n; ++i) out[i] = static_cast<T>(static_cast<float>(w[i]) * as_elem(static_cast<float>(x[i]) * r, x));
}

void check_rows(const torch::Tensor& x, const char* what) {
  TORCH_CHECK(x.device().is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16), what,
              ": CPU float32 or bfloat16 only");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, what, ": rows [T, n] with contiguous elements");
}

void check_same(const torch::Tensor& x, const torch::Tensor& y, const char* what) {
  TORCH_CHECK(x.scalar_type() == y.scalar_type(), what, ": every tensor of a call has one dtype");
}

// Runs f.template operator()<T>() with T the element type of x (float or at::BFloat16).
template <typename F>
void dispatch(const torch::Tensor& x, F&& f) {
  if (x.scalar_type() == at::kBFloat16) {
    f(static_cast<at::BFloat16*>(nullptr));
  } else {
    f(static_cast<float*>(nullptr));
  }
}

}  // namespace

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps) {
  check_rows(x, "rms_norm");
  check_same(x, w, "rms_norm");
  w = w.contiguous();
  const int64_t T = x.size(0), n = x.size(1);
  TORCH_CHECK(w.numel() == n, "rms_norm: weight [n]");
  auto out = torch::empty({T, n}, x.options());
  dispatch(x, [&](auto* tag) {
    using E = std::remove_pointer_t<decltype(tag)>;
    const E* xp = x.data_ptr<E>();
    const E* wp = w.data_ptr<E>();
    E* op = out.data_ptr<E>();
    const int64_t xs = x.stride(0);
    at::parallel_for(0, T, grain(n), [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) norm_row(xp + t * xs, wp, op + t * n, n, static_cast<float>(eps));
    });
  });
  return out;
}

torch::Tensor add_rms_norm_(torch::Tensor x, torch::Tensor r, torch::Tensor w, double eps) {
  check_rows(x, "add_rms_norm_");
  check_rows(r, "add_rms_norm_");
  check_same(x, r, "add_rms_norm_");
  check_same(x, w, "add_rms_norm_");
  w = w.contiguous();
  const int64_t T = x.size(0), n = x.size(1);
  TORCH_CHECK(r.size(0) == T && r.size(1) == n, "add_rms_norm_: x and r shapes differ");
  TORCH_CHECK(w.numel() == n, "add_rms_norm_: weight [n]");
  auto out = torch::empty({T, n}, x.options());
  dispatch(x, [&](auto* tag) {
    using E = std::remove_pointer_t<decltype(tag)>;
    E* xp = x.data_ptr<E>();
    const E* rp = r.data_ptr<E>();
    const E* wp = w.data_ptr<E>();
    E* op = out.data_ptr<E>();
    const int64_t xs = x.stride(0), rs = r.stride(0);
    at::parallel_for(0, T, grain(n), [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        E* xr = xp + t * xs;
        const E* rr = rp + t * rs;
        int64_t i = 0;
#ifdef SWIFTSERVE_AVX2_PATHS
        for (; i + 8 <= n; i += 8)
          swiftserve_vec8::storef8(xr + i, swiftserve_vec8::loadf8(xr + i) + swiftserve_vec8::loadf8(rr + i));
#endif
        for (; i + 16 <= n; i += 16) storef(xr + i, loadf(xr + i) + loadf(rr + i));
        for (; i < n; ++i) xr[i] = static_cast<E>(static_cast<float>(xr[i]) + static_cast<float>(rr[i]));
        norm_row(xr, wp, op + t * n, n, static_cast<float>(eps));
      }
    });
  });
  return out;
}

void rope_(torch::Tensor x, torch::Tensor cos, torch::Tensor sin) {
  TORCH_CHECK(x.device().is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "rope_: CPU float32 or bfloat16 only");
  check_same(x, cos, "rope_");
  check_same(x, sin, "rope_");
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1 && x.stride(1) == x.size(2), "rope_: x [T, heads, d], heads contiguous");
  const int64_t T = x.size(0), H = x.size(1), d = x.size(2), half = d / 2;
  TORCH_CHECK(d % 2 == 0, "rope_: head size must be even");
  cos = cos.reshape({-1, d}).contiguous();
  sin = sin.reshape({-1, d}).contiguous();
  TORCH_CHECK(cos.size(0) == T && sin.size(0) == T, "rope_: cos/sin [T, d]");
  dispatch(x, [&](auto* tag) {
    using E = std::remove_pointer_t<decltype(tag)>;
    E* xp = x.data_ptr<E>();
    const E* cp = cos.data_ptr<E>();
    const E* sp = sin.data_ptr<E>();
    const int64_t xs = x.stride(0);
    at::parallel_for(0, T * H, grain(d), [&](int64_t b, int64_t e) {
      for (int64_t th = b; th < e; ++th) {
        const int64_t t = th / H;
        E* lo = xp + t * xs + (th % H) * d;
        E* hi = lo + half;
        const E* c = cp + t * d;
        const E* s = sp + t * d;
        int64_t i = 0;
        for (; i + 16 <= half; i += 16) {
          const v16 a = loadf(lo + i), z = loadf(hi + i);
          storef(lo + i, a * loadf(c + i) - z * loadf(s + i));
          storef(hi + i, z * loadf(c + half + i) + a * loadf(s + half + i));
        }
        for (; i < half; ++i) {
          const float a = static_cast<float>(lo[i]), z = static_cast<float>(hi[i]);
          lo[i] = static_cast<E>(a * static_cast<float>(c[i]) - z * static_cast<float>(s[i]));
          hi[i] = static_cast<E>(z * static_cast<float>(c[half + i]) + a * static_cast<float>(s[half + i]));
        }
      }
    });
  });
}

torch::Tensor silu_mul(torch::Tensor gu) {
  check_rows(gu, "silu_mul");
  const int64_t T = gu.size(0), m = gu.size(1) / 2;
  TORCH_CHECK(gu.size(1) % 2 == 0, "silu_mul: gate and up halves differ");
  auto out = torch::empty({T, m}, gu.options());
  dispatch(gu, [&](auto* tag) {
    using E = std::remove_pointer_t<decltype(tag)>;
    const E* gp = gu.data_ptr<E>();
    E* op = out.data_ptr<E>();
    const int64_t gs = gu.stride(0);
    at::parallel_for(0, T, grain(2 * m), [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const E* g = gp + t * gs;
        const E* u = g + m;
        E* o = op + t * m;
        int64_t i = 0;
#ifdef SWIFTSERVE_AVX2_PATHS
        using namespace swiftserve_vec8;           // 8-float vectors: 16-float ones ran 3-5x slower on AVX2
        for (; i + 8 <= m; i += 8) {
          const v8 x = loadf8(g + i);
          const v8 ax = x < splat8(0.f) ? -x : x;
          const v8 ex = vexp8(-ax);
          const v8 sig = (x < splat8(0.f) ? ex : splat8(1.f)) / (splat8(1.f) + ex);
          storef8(o + i, as_elem8(x * sig, g) * loadf8(u + i));
        }
#endif
        for (; i + 16 <= m; i += 16) {             // sigmoid from exp(-|x|) <= 1: vexp's domain
          const v16 x = loadf(g + i);
          const v16 ax = x < splat(0.f) ? -x : x;
          const v16 ex = vexp(-ax);
          const v16 sig = (x < splat(0.f) ? ex : splat(1.f)) / (splat(1.f) + ex);
          storef(o + i, as_elem(x * sig, g) * loadf(u + i));
        }
        for (; i < m; ++i) {
          const float x = static_cast<float>(g[i]);
          o[i] = static_cast<E>(as_elem(x / (1.f + std::exp(-x)), g) * static_cast<float>(u[i]));
        }
      }
    });
  });
  return out;
}
