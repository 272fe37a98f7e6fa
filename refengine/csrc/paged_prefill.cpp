// Causal prefill attention on CPU over a block pool: flash-style tiles with an online softmax,
// keys and values read in place from the pool (no gather of the prefix, no score matrix).
//
//   q      [n, H, d]          float32, inner [H, d] contiguous (any row stride): the chunk's queries
//   k      [N, bs, kvh, d]    float32 or bfloat16, contiguous block pool
//   v      [N, bs, kvh, dv]   same dtype as k; dv % 16 == 0
//   blocks [>= ceil(ctx/bs)]  int64 block ids of the sequence, keys 0 .. ctx-1 (ctx = start + n)
//   start  cache index of query row 0: row i sits at start + i and sees keys 0 .. start + i
//   out    [n, H, dv]         float32, inner [H, dv] contiguous (any row stride), written in place
//
// GQA: query head hq reads KV head hq / (H / kvh), as in HF's repeat_kv.
//
// Work items are (query head, tile of QT query rows), head-major, so the contiguous ranges
// ATen's parallel_for gives each thread hold the same mix of short (early) and long (late)
// causal rows. Per item and per key tile of KT keys: K is packed transposed ([d][KT]) and V
// row-major ([KT][dv]) in float32, S = (scale q) K^T is computed 6 query rows x 64 keys at a
// time (24 vector accumulators), masked on the diagonal tile, folded into the running row
// max / sum, and O += P V 6 rows x 64 value columns at a time. Everything is float32; exp is
// a vectorised Cody-Waite + degree-6 polynomial (relative error ~2e-7, like expf).
//
// The same core (attend) serves decode: decode_tiles, called by paged_decode.cpp.
//
// GCC/Clang vector extensions (16 floats) keep the tiles in registers on AVX-512 and compile
// to pairs of AVX2 (or SSE) instructions elsewhere; no intrinsics, so no ISA is assumed.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace {

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t i16 __attribute__((vector_size(64)));
constexpr int R = 6;      // query rows per micro-kernel step: 6 x 4 accumulators + 4 operands + 1 broadcast
constexpr int QT = 16 * R;  // query rows per work item
constexpr int KT = 64;    // keys per tile (4 vectors)

inline v16 splat(float x) { return x - v16{}; }        // x - 0 == x for every x, so no add is emitted

inline v16 load(const float* p) {
  v16 r;
  std::memcpy(&r, p, sizeof(r));
  return r;
}

inline void store(float* p, v16 x) { std::memcpy(p, &x, sizeof(x)); }

// exp(x) for x <= 0 (scores minus their row max); -inf and anything below -87 give 0.
inline v16 vexp(v16 x) {
  const v16 lo = splat(-87.0f);
  const i16 dead = x < lo;
  x = x < lo ? lo : x;
  const v16 t = x * splat(1.44269504088896341f);
  const v16 magic = splat(12582912.0f);                    // 1.5 * 2^23: round to nearest
  const v16 n = (t + magic) - magic;
  v16 r = x - n * splat(0.693359375f);                     // Cody-Waite: ln2 = hi + lo
  r = r - n * splat(-2.12194440e-4f);
  v16 p = splat(1.9875691500e-4f);
  p = p * r + splat(1.3981999507e-3f);
  p = p * r + splat(8.3334519073e-3f);
  p = p * r + splat(4.1665795894e-2f);
  p = p * r + splat(1.6666665459e-1f);
  p = p * r + splat(5.0000001201e-1f);
  p = p * r * r + r + splat(1.0f);
  const i16 e = (__builtin_convertvector(n, i16) + 127) << 23;
  i16 bits;
  std::memcpy(&bits, &p, sizeof(bits));
  bits = bits + e - (127 << 23);
  v16 out;
  std::memcpy(&out, &bits, sizeof(out));
  return dead ? splat(0.0f) : out;
}

inline float hmax(v16 x) {
  float m = x[0];
  for (int i = 1; i < 16; ++i) m = std::max(m, x[i]);
  return m;
}

inline float hsum(v16 x) {
  float s = 0.f;
  for (int i = 0; i < 16; ++i) s += x[i];
  return s;
}

// Scratch of one thread: nh KV heads x rowsR query rows each (rowsR a multiple of R).
struct Tiles {
  int64_t nh, rowsR;
  std::vector<float> qs, kt, vt, s, o, m, l;
  Tiles(int64_t nh_, int64_t rowsR_, int64_t d, int64_t dv)
      : nh(nh_), rowsR(rowsR_), qs(nh_ * rowsR_ * d, 0.f), kt(nh_ * d * KT), vt(nh_ * KT * dv),
        s(nh_ * rowsR_ * KT), o(nh_ * rowsR_ * dv), m(nh_ * rowsR_), l(nh_ * rowsR_) {}
};

// Attention of `rows` query rows per head for KV heads h0 .. h0+nh-1 (already scaled, in
// t.qs [nh][rowsR][d], padded rows zero) over keys 0 .. kend-1. Row i sees keys
// 0 .. limit0 + i * step - 1 (prefill: causal, step 1; decode: the whole context, step 0).
// The keys of a tile are packed for all nh heads at once: a token's rows of neighbouring
// heads are adjacent in the pool, so the pool is read front to back. Writes row i of head
// h0 + hh, normalised, to out + hh * out_head + i * out_stride.
template <typename T>
void attend(Tiles& t, int64_t rows, int64_t kend, int64_t limit0, int64_t step, const T* k, const T* v,
            const int64_t* blocks, int64_t bs, int64_t kvh, int64_t h0, int64_t d, int64_t dv, float* out,
            int64_t out_head, int64_t out_stride) {
  const int64_t nh = t.nh, rowsR = t.rowsR;
  float* kt = t.kt.data();
  float* vt = t.vt.data();
  std::fill(t.o.begin(), t.o.end(), 0.f);
  std::fill(t.m.begin(), t.m.end(), -std::numeric_limits<float>::infinity());
  std::fill(t.l.begin(), t.l.end(), 0.f);
  for (int64_t j0 = 0; j0 < kend; j0 += KT) {
    const int64_t cols = std::min<int64_t>(KT, kend - j0);
    for (int64_t jj = 0; jj < KT; ++jj) {                    // pack K^T and V per head (zero past cols)
      const int64_t tok = j0 + jj;
      const int64_t row = jj < cols ? blocks[tok / bs] * bs + tok % bs : 0;
      for (int64_t hh = 0; hh < nh; ++hh) {
        float* kth = kt + hh * d * KT;
        float* vth = vt + (hh * KT + jj) * dv;
        if (jj < cols) {
          const T* kr = k + (row * kvh + h0 + hh) * d;
          const T* vr = v + (row * kvh + h0 + hh) * dv;
          for (int64_t c = 0; c < d; ++c) kth[c * KT + jj] = static_cast<float>(kr[c]);
          for (int64_t c = 0; c < dv; ++c) vth[c] = static_cast<float>(vr[c]);
        } else {
          for (int64_t c = 0; c < d; ++c) kth[c * KT + jj] = 0.f;
          for (int64_t c = 0; c < dv; ++c) vth[c] = 0.f;
        }
      }
    }
    for (int64_t hh = 0; hh < nh; ++hh) {
      const float* kth = kt + hh * d * KT;
      const float* vth = vt + hh * KT * dv;
      const float* qs = t.qs.data() + hh * rowsR * d;
      float* s = t.s.data() + hh * rowsR * KT;
      float* o = t.o.data() + hh * rowsR * dv;
      float* m = t.m.data() + hh * rowsR;
      float* l = t.l.data() + hh * rowsR;
      // S = Qs K^T, R rows x KT keys per step
      for (int64_t i = 0; i < rowsR; i += R) {
        v16 acc[R][4] = {};
        const float* qi = qs + i * d;
        for (int64_t c = 0; c < d; ++c) {
          const float* kc = kth + c * KT;
          const v16 k0 = load(kc), k1 = load(kc + 16), k2 = load(kc + 32), k3 = load(kc + 48);
          for (int r = 0; r < R; ++r) {
            const v16 qv = splat(qi[r * d + c]);
            acc[r][0] += qv * k0;
            acc[r][1] += qv * k1;
            acc[r][2] += qv * k2;
            acc[r][3] += qv * k3;
          }
        }
        for (int r = 0; r < R; ++r)
          for (int x = 0; x < 4; ++x) store(s + (i + r) * KT + 16 * x, acc[r][x]);
      }
      // mask keys past each row's limit (and the zero padding), fold into the online softmax
      for (int64_t i = 0; i < rows; ++i) {
        float* si = s + i * KT;
        const int64_t visible = std::min<int64_t>(cols, limit0 + i * step - j0);
        for (int64_t jj = std::max<int64_t>(visible, 0); jj < KT; ++jj) si[jj] = -std::numeric_limits<float>::infinity();
        if (visible <= 0) {                                  // row sees nothing here: P = 0
          std::fill(si, si + KT, 0.f);
          continue;
        }
        v16 mx = load(si);
        for (int x = 1; x < 4; ++x) {
          const v16 y = load(si + 16 * x);
          mx = mx > y ? mx : y;
        }
        const float m_new = std::max(m[i], hmax(mx));
        const float alpha = std::exp(m[i] - m_new);          // 0 on the first tile (m = -inf)
        v16 sum = {};
        for (int x = 0; x < 4; ++x) {
          const v16 p = vexp(load(si + 16 * x) - splat(m_new));
          store(si + 16 * x, p);
          sum += p;
        }
        l[i] = l[i] * alpha + hsum(sum);
        m[i] = m_new;
        if (alpha != 1.f) {
          float* oi = o + i * dv;
          for (int64_t c = 0; c < dv; ++c) oi[c] *= alpha;
        }
      }
      for (int64_t i = rows; i < rowsR; ++i) std::fill(s + i * KT, s + (i + 1) * KT, 0.f);   // padded rows
      // O += P V, R rows x 64 (or 16) value columns per step
      const int64_t width = dv % 64 == 0 ? 64 : 16;
      const int nv = static_cast<int>(width / 16);
      for (int64_t i = 0; i < rowsR; i += R) {
        for (int64_t c0 = 0; c0 < dv; c0 += width) {
          v16 acc[R][4];
          for (int r = 0; r < R; ++r)
            for (int x = 0; x < nv; ++x) acc[r][x] = load(o + (i + r) * dv + c0 + 16 * x);
          for (int64_t jj = 0; jj < cols; ++jj) {
            const float* vr = vth + jj * dv + c0;
            if (nv == 4) {
              const v16 a = load(vr), b = load(vr + 16), c = load(vr + 32), e = load(vr + 48);
              for (int r = 0; r < R; ++r) {
                const v16 p = splat(s[(i + r) * KT + jj]);
                acc[r][0] += p * a;
                acc[r][1] += p * b;
                acc[r][2] += p * c;
                acc[r][3] += p * e;
              }
            } else {
              const v16 a = load(vr);
              for (int r = 0; r < R; ++r) acc[r][0] += splat(s[(i + r) * KT + jj]) * a;
            }
          }
          for (int r = 0; r < R; ++r)
            for (int x = 0; x < nv; ++x) store(o + (i + r) * dv + c0 + 16 * x, acc[r][x]);
        }
      }
    }
  }
  for (int64_t hh = 0; hh < nh; ++hh)
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t r = hh * rowsR + i;
      const float inv = 1.f / t.l[r];
      float* dst = out + hh * out_head + i * out_stride;
      for (int64_t c = 0; c < dv; ++c) dst[c] = t.o[r * dv + c] * inv;
    }
}

// Prefill: work items (query head, tile of QT rows), head-major.
template <typename T>
void prefill(const float* q, int64_t q_row, const T* k, const T* v, const int64_t* blocks, float* out,
             int64_t out_row, int64_t n, int64_t start, int64_t H, int64_t kvh, int64_t d, int64_t dv,
             int64_t bs, float scale) {
  const int64_t g = H / kvh;
  const int64_t ntiles = (n + QT - 1) / QT;
  at::parallel_for(0, H * ntiles, 1, [&](int64_t begin, int64_t end) {
    Tiles t(1, QT, d, dv);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t hq = item / ntiles, i0 = (item % ntiles) * QT;
      const int64_t rows = std::min<int64_t>(QT, n - i0);
      std::fill(t.qs.begin(), t.qs.end(), 0.f);              // padded rows stay zero
      for (int64_t i = 0; i < rows; ++i) {
        const float* src = q + (i0 + i) * q_row + hq * d;
        for (int64_t c = 0; c < d; ++c) t.qs[i * d + c] = src[c] * scale;
      }
      attend(t, rows, start + i0 + rows, start + i0 + 1, 1, k, v, blocks, bs, kvh, hq / g, d, dv,
             out + i0 * out_row + hq * dv, 0, out_row);
    }
  });
}

}  // namespace

// Decode through the same tiles: the g query heads of a KV head are its rows, every row seeing
// the sequence's whole context. Work items are sequences with all their KV heads (the pool read
// front to back) when there are enough of them to keep every thread busy, else (sequence, KV head).
template <typename T>
void decode_tiles(const float* q, const T* k, const T* v, const int64_t* table, const int64_t* lens, float* out,
                  int64_t B, int64_t kvh, int64_t g, int64_t d, int64_t dv, int64_t bs, int64_t max_blocks,
                  float scale) {
  const int64_t nh = B >= 4 * at::get_num_threads() ? kvh : 1;
  const int64_t per = kvh / nh, gR = (g + R - 1) / R * R;
  at::parallel_for(0, B * per, 1, [&](int64_t begin, int64_t end) {
    Tiles t(nh, gR, d, dv);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / per, h0 = (item % per) * nh;
      for (int64_t hh = 0; hh < nh; ++hh) {
        const float* src = q + ((b * kvh + h0 + hh) * g) * d;
        for (int64_t i = 0; i < g * d; ++i) t.qs[hh * gR * d + i] = src[i] * scale;
      }
      attend(t, g, lens[b], lens[b], 0, k, v, table + b * max_blocks, bs, kvh, h0, d, dv,
             out + (b * kvh + h0) * g * dv, g * dv, dv);
    }
  });
}

template void decode_tiles<float>(const float*, const float*, const float*, const int64_t*, const int64_t*,
                                  float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float);
template void decode_tiles<at::BFloat16>(const float*, const at::BFloat16*, const at::BFloat16*, const int64_t*,
                                         const int64_t*, float*, int64_t, int64_t, int64_t, int64_t, int64_t,
                                         int64_t, int64_t, float);


void paged_prefill(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor blocks, int64_t start,
                   double scale, torch::Tensor out) {
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(), "paged_prefill: CPU tensors only");
  TORCH_CHECK(q.dim() == 3 && out.dim() == 3 && k.dim() == 4 && v.dim() == 4, "paged_prefill: bad ranks");
  TORCH_CHECK(q.scalar_type() == at::kFloat && out.scalar_type() == at::kFloat, "paged_prefill: q, out float32");
  TORCH_CHECK(k.scalar_type() == v.scalar_type(), "paged_prefill: k and v dtypes differ");
  TORCH_CHECK(k.is_contiguous() && v.is_contiguous(), "paged_prefill: the pools must be contiguous");
  TORCH_CHECK(q.stride(2) == 1 && q.stride(1) == q.size(2), "paged_prefill: q rows must be [H, d] contiguous");
  TORCH_CHECK(out.stride(2) == 1 && out.stride(1) == out.size(2), "paged_prefill: out rows must be [H, dv] contiguous");
  TORCH_CHECK(blocks.scalar_type() == at::kLong && blocks.dim() == 1, "paged_prefill: int64 block ids");
  blocks = blocks.contiguous();
  const int64_t n = q.size(0), H = q.size(1), d = q.size(2);
  const int64_t bs = k.size(1), kvh = k.size(2), dv = v.size(3);
  TORCH_CHECK(k.size(3) == d && v.size(2) == kvh && v.size(1) == bs && H % kvh == 0, "paged_prefill: pool shapes");
  TORCH_CHECK(dv % 16 == 0, "paged_prefill: value head size must be a multiple of 16");
  TORCH_CHECK(out.size(0) == n && out.size(1) == H && out.size(2) == dv, "paged_prefill: out shape");
  TORCH_CHECK(start >= 0 && blocks.numel() * bs >= start + n, "paged_prefill: blocks do not cover the context");
  if (n == 0) return;
  const float sc = static_cast<float>(scale);
  if (k.scalar_type() == at::kFloat) {
    prefill<float>(q.data_ptr<float>(), q.stride(0), k.data_ptr<float>(), v.data_ptr<float>(),
                   blocks.data_ptr<int64_t>(), out.data_ptr<float>(), out.stride(0), n, start, H, kvh, d, dv, bs, sc);
  } else if (k.scalar_type() == at::kBFloat16) {
    prefill<at::BFloat16>(q.data_ptr<float>(), q.stride(0), k.data_ptr<at::BFloat16>(), v.data_ptr<at::BFloat16>(),
                          blocks.data_ptr<int64_t>(), out.data_ptr<float>(), out.stride(0), n, start, H, kvh, d, dv,
                          bs, sc);
  } else {
    TORCH_CHECK(false, "paged_prefill: pools must be float32 or bfloat16");
  }
}
