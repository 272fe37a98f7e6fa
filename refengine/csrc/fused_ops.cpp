// Fused element-wise ops of a Llama layer on CPU, float32: one pass over memory and one
// parallel loop each, where torch runs 4-6 ops (each with its own loop and a fresh tensor).
//
//   rms_norm(x [T, n], w [n], eps) -> [T, n]         w * (x * rsqrt(mean(x^2) + eps)): LlamaRMSNorm
//   add_rms_norm_(x [T, n], r [T, n], w, eps) -> [T, n]   x += r in place, then rms_norm of the sum
//   rope_(x [T, heads, d], cos [T, *, d], sin [T, *, d])  in place: x * cos + rotate_half(x) * sin
//                                                     (neox / HF layout: halves [0, d/2) and [d/2, d))
//   silu_mul(gu [T, 2m]) -> [T, m]                    silu(gu[:, :m]) * gu[:, m:]
//
// Rows may have any stride (views into a fused projection's output); a row's elements, and
// rope's heads within a token, are contiguous. Results equal torch's up to float rounding
// (summation order, fused multiply-adds): a few ulp.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

#include "vec.h"

using namespace swiftserve_vec;

namespace {

// Rows per parallel chunk: enough elements that a chunk outweighs handing it to a thread.
int64_t grain(int64_t row_elems) { return std::max<int64_t>(1, 16384 / std::max<int64_t>(row_elems, 1)); }

inline void norm_row(const float* x, const float* w, float* out, int64_t n, float eps) {
  v16 acc = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const v16 v = load(x + i);
    acc += v * v;
  }
  float ss = hsum(acc);
  for (; i < n; ++i) ss += x[i] * x[i];
  const float r = 1.f / std::sqrt(ss / static_cast<float>(n) + eps);
  const v16 rv = splat(r);
  for (i = 0; i + 16 <= n; i += 16) store(out + i, load(w + i) * (load(x + i) * rv));
  for (; i < n; ++i) out[i] = w[i] * (x[i] * r);
}

void check_rows(const torch::Tensor& x, const char* what) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat, what, ": CPU float32 only");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1, what, ": rows [T, n] with contiguous elements");
}

}  // namespace

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps) {
  check_rows(x, "rms_norm");
  w = w.contiguous();
  const int64_t T = x.size(0), n = x.size(1);
  TORCH_CHECK(w.scalar_type() == at::kFloat && w.numel() == n, "rms_norm: weight [n] float32");
  auto out = torch::empty({T, n}, x.options());
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t xs = x.stride(0);
  at::parallel_for(0, T, grain(n), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) norm_row(xp + t * xs, w.data_ptr<float>(), op + t * n, n, static_cast<float>(eps));
  });
  return out;
}

torch::Tensor add_rms_norm_(torch::Tensor x, torch::Tensor r, torch::Tensor w, double eps) {
  check_rows(x, "add_rms_norm_");
  check_rows(r, "add_rms_norm_");
  w = w.contiguous();
  const int64_t T = x.size(0), n = x.size(1);
  TORCH_CHECK(r.size(0) == T && r.size(1) == n, "add_rms_norm_: x and r shapes differ");
  TORCH_CHECK(w.scalar_type() == at::kFloat && w.numel() == n, "add_rms_norm_: weight [n] float32");
  auto out = torch::empty({T, n}, x.options());
  float* xp = x.data_ptr<float>();
  const float* rp = r.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t xs = x.stride(0), rs = r.stride(0);
  at::parallel_for(0, T, grain(n), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      float* xr = xp + t * xs;
      const float* rr = rp + t * rs;
      int64_t i = 0;
      for (; i + 16 <= n; i += 16) store(xr + i, load(xr + i) + load(rr + i));
      for (; i < n; ++i) xr[i] += rr[i];
      norm_row(xr, w.data_ptr<float>(), op + t * n, n, static_cast<float>(eps));
    }
  });
  return out;
}

void rope_(torch::Tensor x, torch::Tensor cos, torch::Tensor sin) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat, "rope_: CPU float32 only");
  TORCH_CHECK(x.dim() == 3 && x.stride(2) == 1 && x.stride(1) == x.size(2), "rope_: x [T, heads, d], heads contiguous");
  const int64_t T = x.size(0), H = x.size(1), d = x.size(2), half = d / 2;
  TORCH_CHECK(d % 2 == 0, "rope_: head size must be even");
  cos = cos.reshape({-1, d}).contiguous();
  sin = sin.reshape({-1, d}).contiguous();
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.size(0) == T &&
                  sin.size(0) == T, "rope_: cos/sin [T, d] float32");
  float* xp = x.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = sin.data_ptr<float>();
  const int64_t xs = x.stride(0);
  at::parallel_for(0, T * H, grain(d), [&](int64_t b, int64_t e) {
    for (int64_t th = b; th < e; ++th) {
      const int64_t t = th / H;
      float* lo = xp + t * xs + (th % H) * d;
      float* hi = lo + half;
      const float* c = cp + t * d;
      const float* s = sp + t * d;
      int64_t i = 0;
      for (; i + 16 <= half; i += 16) {
        const v16 a = load(lo + i), z = load(hi + i);
        store(lo + i, a * load(c + i) - z * load(s + i));
        store(hi + i, z * load(c + half + i) + a * load(s + half + i));
      }
      for (; i < half; ++i) {
        const float a = lo[i], z = hi[i];
        lo[i] = a * c[i] - z * s[i];
        hi[i] = z * c[half + i] + a * s[half + i];
      }
    }
  });
}

torch::Tensor silu_mul(torch::Tensor gu) {
  check_rows(gu, "silu_mul");
  const int64_t T = gu.size(0), m = gu.size(1) / 2;
  TORCH_CHECK(gu.size(1) % 2 == 0, "silu_mul: gate and up halves differ");
  auto out = torch::empty({T, m}, gu.options());
  const float* gp = gu.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t gs = gu.stride(0);
  at::parallel_for(0, T, grain(2 * m), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const float* g = gp + t * gs;
      const float* u = g + m;
      float* o = op + t * m;
      int64_t i = 0;
      for (; i + 16 <= m; i += 16) {               // sigmoid from exp(-|x|) <= 1: vexp's domain
        const v16 x = load(g + i);
        const v16 ax = x < splat(0.f) ? -x : x;
        const v16 ex = vexp(-ax);
        const v16 sig = (x < splat(0.f) ? ex : splat(1.f)) / (splat(1.f) + ex);
        store(o + i, x * sig * load(u + i));
      }
      for (; i < m; ++i) o[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
    }
  });
  return out;
}
