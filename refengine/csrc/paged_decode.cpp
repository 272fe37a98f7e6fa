// Paged decode attention on CPU: one query position per sequence, keys and values read in
// place from the block pool (no gather into a padded batch, no copy of the context).
//
//   q      [B, kvh, g, d]    float32, contiguous (the g query heads sharing KV head h)
//   k      [N, bs, kvh, d]   float32 or bfloat16, contiguous block pool
//   v      [N, bs, kvh, dv]  same dtype as k
//   table  [B, max_blocks]   int64 block ids; sequence b uses the first ceil(lens[b] / bs)
//   lens   [B]               int64 cache entries of sequence b (>= 1)
//   starts [B] or None       int64 first entry sequence b sees (a sliding window); None: 0
//   -> out [B, kvh, g, dv]   float32
//
// Work is split over (sequence, KV head) pairs with ATen's parallel_for (OpenMP). When dv is
// a multiple of 16 (every common head size) the pair runs through paged_prefill.cpp's tiles
// (the g query heads as rows, vectorised over 64-key tiles, online softmax). Otherwise, per pair:
// scores s[j, t] = scale * q_j . k_t for every cached entry t, an exact softmax per query
// row (max-subtracted, float accumulation), then out_j = sum_t p[j, t] v_t. Each K and V row
// is read once per pair, and all g query rows use it while it is in cache.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

// paged_prefill.cpp's vectorised kernels: decode_vec when d and dv are multiples of 16 (K and V
// read in place), else decode_tiles when dv is (K packed transposed per 64-key tile).
template <typename T>
void decode_vec(const float* q, const T* k, const T* v, const int64_t* table, const int64_t* lens,
                const int64_t* starts, float* out, int64_t B, int64_t kvh, int64_t g, int64_t d, int64_t dv,
                int64_t bs, int64_t max_blocks, float scale);
template <typename T>
void decode_tiles(const float* q, const T* k, const T* v, const int64_t* table, const int64_t* lens,
                  const int64_t* starts, float* out, int64_t B, int64_t kvh, int64_t g, int64_t d, int64_t dv,
                  int64_t bs, int64_t max_blocks, float scale);

namespace {

template <typename T>
inline float dot(const float* __restrict a, const T* __restrict b, int64_t n) {
  float acc = 0.f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * static_cast<float>(b[i]);
  return acc;
}

template <typename T>
inline void axpy(float w, const T* __restrict x, float* __restrict y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += w * static_cast<float>(x[i]);
}

template <typename T>
void decode(const float* q, const T* k, const T* v, const int64_t* table, const int64_t* lens,
            const int64_t* starts, float* out, int64_t B, int64_t kvh, int64_t g, int64_t d, int64_t dv, int64_t bs,
            int64_t max_blocks, float scale) {
  at::parallel_for(0, B * kvh, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> s;
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / kvh, h = bh % kvh;
      const int64_t len = lens[b], lo = starts ? starts[b] : 0;   // keys lo .. len-1 (a window)
      const int64_t* blocks = table + b * max_blocks;
      const float* qb = q + bh * g * d;
      float* ob = out + bh * g * dv;
      s.assign(g * len, 0.f);
      for (int64_t t = lo; t < len; ++t) {
        const int64_t row = blocks[t / bs] * bs + t % bs;          // flat cache entry
        const T* kt = k + (row * kvh + h) * d;
        for (int64_t j = 0; j < g; ++j) s[j * len + t] = scale * dot(qb + j * d, kt, d);
      }
      for (int64_t j = 0; j < g; ++j) {
        float* sj = s.data() + j * len;
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t t = lo; t < len; ++t) m = std::max(m, sj[t]);
        float sum = 0.f;
        for (int64_t t = lo; t < len; ++t) {
          sj[t] = std::exp(sj[t] - m);
          sum += sj[t];
        }
        const float inv = 1.f / sum;
        for (int64_t t = lo; t < len; ++t) sj[t] *= inv;
      }
      std::fill(ob, ob + g * dv, 0.f);
      for (int64_t t = lo; t < len; ++t) {
        const int64_t row = blocks[t / bs] * bs + t % bs;
        const T* vt = v + (row * kvh + h) * dv;
        for (int64_t j = 0; j < g; ++j) axpy(s[j * len + t], vt, ob + j * dv, dv);
      }
    }
  });
}

// One pool dtype: paged_prefill.cpp's tiles when dv is a multiple of 16, else the loop above.
template <typename T>
void run(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& table,
         const torch::Tensor& lens, const int64_t* starts, torch::Tensor& out, float scale) {
  const bool wide = v.size(3) % 16 == 0;
  const auto kernel = wide && q.size(3) % 16 == 0 ? &decode_vec<T> : wide ? &decode_tiles<T> : &decode<T>;
  kernel(q.data_ptr<float>(), k.data_ptr<T>(), v.data_ptr<T>(), table.data_ptr<int64_t>(), lens.data_ptr<int64_t>(),
         starts, out.data_ptr<float>(), q.size(0), q.size(1), q.size(2), q.size(3), v.size(3), k.size(1), table.size(1), scale);
}

}  // namespace

torch::Tensor paged_decode(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor table,
                           torch::Tensor lens, double scale, c10::optional<torch::Tensor> starts) {
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(), "paged_decode: CPU tensors only");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "paged_decode: q, k, v must be 4-D");
  TORCH_CHECK(q.scalar_type() == at::kFloat, "paged_decode: q must be float32");
  TORCH_CHECK(k.scalar_type() == v.scalar_type(), "paged_decode: k and v dtypes differ");
  TORCH_CHECK(k.is_contiguous() && v.is_contiguous(), "paged_decode: the pools must be contiguous");
  TORCH_CHECK(table.scalar_type() == at::kLong && lens.scalar_type() == at::kLong, "paged_decode: int64 indices");
  q = q.contiguous();
  table = table.contiguous();
  lens = lens.contiguous();
  const int64_t B = q.size(0), kvh = q.size(1), g = q.size(2), d = q.size(3);
  const int64_t bs = k.size(1), dv = v.size(3);
  TORCH_CHECK(k.size(2) == kvh && k.size(3) == d && v.size(2) == kvh && v.size(1) == bs,
              "paged_decode: pool shapes do not match q");
  TORCH_CHECK(table.dim() == 2 && table.size(0) == B && lens.numel() == B, "paged_decode: table/lens shape");
  torch::Tensor lo;
  if (starts.has_value() && starts->defined()) {
    lo = starts->contiguous();
    TORCH_CHECK(lo.scalar_type() == at::kLong && lo.numel() == B, "paged_decode: starts must be int64 [B]");
  }
  const int64_t* lo_ptr = lo.defined() ? lo.data_ptr<int64_t>() : nullptr;
  auto out = torch::empty({B, kvh, g, dv}, q.options());
  if (k.scalar_type() == at::kFloat) {
    run<float>(q, k, v, table, lens, lo_ptr, out, static_cast<float>(scale));
  } else if (k.scalar_type() == at::kBFloat16) {
    run<at::BFloat16>(q, k, v, table, lens, lo_ptr, out, static_cast<float>(scale));
  } else {
    TORCH_CHECK(false, "paged_decode: pools must be float32 or bfloat16");
  }
  return out;
}
