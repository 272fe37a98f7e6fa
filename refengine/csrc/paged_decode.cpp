// Paged decode attention on CPU: one query position per sequence, keys and values read from the
// block pool in place or one 64-key tile at a time (no gather into a padded batch of the context).
//
//   q      [B, kvh, g, d]    float32, or bfloat16 (the g query heads sharing KV head h)
//   k      [N, bs, kvh, d]   float32 or bfloat16, contiguous block pool
//   v      [N, bs, kvh, dv]  same dtype as k
//   table  [B, max_blocks]   int64 block ids; sequence b uses the first ceil(lens[b] / bs)
//   lens   [B]               int64 cache entries of sequence b (>= 1)
//   starts [B] or None       int64 first entry sequence b sees (a sliding window); None: 0
//   -> out [B, kvh, g, dv]   float32
//
// Two paths, both in paged_prefill.cpp: decode_vec reads K and V in place, 16 keys per vector
// step, when d and dv are multiples of 16 (every common head size) or, for any other widths
// (ZACK's adaptive ranks: 37, 50, 1, ...), where the build has AVX-512 masked loads for the
// rows' tails; else decode_tiles packs each 64-key tile as float32, K transposed and V
// zero-padded to whole vectors, and runs the prefill tiles with the g query heads of a KV head
// as rows (online softmax). Work is split over sequences (or sequence, KV head pairs) with
// ATen's parallel_for (OpenMP). bf16 queries over bf16 pools with d a multiple
// of 32 take decode_vec's dot-product path (q K^T by vdpbf16ps, where the CPU has it); any other
// bf16 query is widened to float32 first, which is exact.
//
// Builds with AVX2 + FMA and no AVX-512 (SWIFTSERVE_AVX2_PATHS, vec8.h) take a third path at every
// width instead: decode_avx2 (paged_decode_avx2.cpp), decode_vec's in-place reads on 8-float
// vectors. decode_vec's 16 accumulators of 16 floats are 32 AVX2 registers (it spilled on every
// key) and decode_tiles repacks every tile; on a 2-core Zen 3 decode_avx2 took 0.18-0.34x
// decode_vec's time (SmolLM2's shape, 1 thread; results/perf/README.md).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include "vec.h"
#include "vec8.h"

// paged_prefill.cpp's vectorised kernels: decode_vec (K and V read in place), decode_tiles (K and V
// packed per 64-key tile; any d and dv on any build).
template <typename T>
void decode_vec(const float* q, const T* k, const T* v, const int64_t* table, const int64_t* lens,
                const int64_t* starts, float* out, int64_t B, int64_t kvh, int64_t g, int64_t d, int64_t dv,
                int64_t bs, int64_t max_blocks, float scale, const uint16_t* qb);
bool decode_has_bf16_dot();
template <typename T>
void decode_tiles(const float* q, const T* k, const T* v, const int64_t* table, const int64_t* lens,
                  const int64_t* starts, float* out, int64_t B, int64_t kvh, int64_t g, int64_t d, int64_t dv,
                  int64_t bs, int64_t max_blocks, float scale);
#ifdef SWIFTSERVE_AVX2_PATHS
template <typename T>
void decode_avx2(const float* q, const T* k, const T* v, const int64_t* table, const int64_t* lens,
                 const int64_t* starts, float* out, int64_t B, int64_t kvh, int64_t g, int64_t d, int64_t dv,
                 int64_t bs, int64_t max_blocks, float scale);
#endif

namespace {

// One pool dtype: decode_vec when both widths are whole vectors or tails can be read masked, else
// the padded tiles. qb: the bf16 queries for decode_vec's dot-product path (q is then unused), or
// nullptr.
template <typename T>
void run(const torch::Tensor& q, const uint16_t* qb, const torch::Tensor& k, const torch::Tensor& v,
         const torch::Tensor& table, const torch::Tensor& lens, const int64_t* starts, torch::Tensor& out, float scale) {
  const int64_t B = out.size(0), kvh = out.size(1), g = out.size(2), d = k.size(3), dv = v.size(3);
  const float* qf = qb ? nullptr : q.data_ptr<float>();
#ifdef SWIFTSERVE_AVX2_PATHS
  decode_avx2<T>(qf, k.data_ptr<T>(), v.data_ptr<T>(), table.data_ptr<int64_t>(), lens.data_ptr<int64_t>(), starts,
                 out.data_ptr<float>(), B, kvh, g, d, dv, k.size(1), table.size(1), scale);
  return;
#endif
  if ((dv % 16 == 0 && d % 16 == 0) || swiftserve_vec::kMaskedTails)
    decode_vec<T>(qf, k.data_ptr<T>(), v.data_ptr<T>(), table.data_ptr<int64_t>(), lens.data_ptr<int64_t>(), starts,
                  out.data_ptr<float>(), B, kvh, g, d, dv, k.size(1), table.size(1), scale, qb);
  else
    decode_tiles<T>(qf, k.data_ptr<T>(), v.data_ptr<T>(), table.data_ptr<int64_t>(), lens.data_ptr<int64_t>(), starts,
                    out.data_ptr<float>(), B, kvh, g, d, dv, k.size(1), table.size(1), scale);
}

}  // namespace

torch::Tensor paged_decode(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor table,
                           torch::Tensor lens, double scale, c10::optional<torch::Tensor> starts) {
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(), "paged_decode: CPU tensors only");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "paged_decode: q, k, v must be 4-D");
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16,
              "paged_decode: q must be float32 or bfloat16");
  TORCH_CHECK(k.scalar_type() == v.scalar_type(), "paged_decode: k and v dtypes differ");
  TORCH_CHECK(k.is_contiguous() && v.is_contiguous(), "paged_decode: the pools must be contiguous");
  TORCH_CHECK(table.scalar_type() == at::kLong && lens.scalar_type() == at::kLong, "paged_decode: int64 indices");
  // bf16 queries over bf16 pools with whole 32-wide words keep bf16 (decode_vec's dot products);
  // any other bf16 query is widened (exact).
  const bool dot = q.scalar_type() == at::kBFloat16 && k.scalar_type() == at::kBFloat16 && q.size(3) % 32 == 0 &&
                   v.size(3) % 16 == 0 && decode_has_bf16_dot();
  q = dot ? q.contiguous() : q.to(at::kFloat).contiguous();
  const uint16_t* qb = dot ? reinterpret_cast<const uint16_t*>(q.data_ptr<at::BFloat16>()) : nullptr;
  table = table.contiguous();
  lens = lens.contiguous();
  const int64_t B = q.size(0), kvh = q.size(1), g = q.size(2), d = q.size(3);
  const int64_t bs = k.size(1), dv = v.size(3);
  TORCH_CHECK(k.size(2) == kvh && k.size(3) == d && v.size(2) == kvh && v.size(1) == bs,
              "paged_decode: pool shapes do not match q");
  TORCH_CHECK(table.dim() == 2 && table.size(0) == B && lens.numel() == B, "paged_decode: table/lens shape");
  TORCH_CHECK(d >= 1 && dv >= 1, "paged_decode: empty head dims");
  torch::Tensor lo;
  if (starts.has_value() && starts->defined()) {
    lo = starts->contiguous();
    TORCH_CHECK(lo.scalar_type() == at::kLong && lo.numel() == B, "paged_decode: starts must be int64 [B]");
  }
  const int64_t* lo_ptr = lo.defined() ? lo.data_ptr<int64_t>() : nullptr;
  auto out = torch::empty({B, kvh, g, dv}, q.options().dtype(at::kFloat));
  if (k.scalar_type() == at::kFloat) {
    run<float>(q, nullptr, k, v, table, lens, lo_ptr, out, static_cast<float>(scale));
  } else if (k.scalar_type() == at::kBFloat16) {
    run<at::BFloat16>(q, qb, k, v, table, lens, lo_ptr, out, static_cast<float>(scale));
  } else {
    TORCH_CHECK(false, "paged_decode: pools must be float32 or bfloat16");
  }
  return out;
}
