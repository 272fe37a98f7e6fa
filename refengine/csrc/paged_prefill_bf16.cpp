// Causal prefill attention for bf16 queries over bf16 block pools with AVX-512-BF16 dot products
// (vdpbf16ps: each float32 lane adds two bf16 products), the same flash-style tiles and online
// softmax as paged_prefill.cpp's float32 kernel (tiles.h), half its multiply-add instructions.
//
//   q      [n, H, d]          bfloat16, inner [H, d] contiguous (any row stride); d even
//   k, v   [N, bs, kvh, d|dv] bfloat16 contiguous block pools; any dv >= 1
//   blocks, start, window     as paged_prefill (paged_prefill.cpp)
//   out    [n, H, dv]         float32, inner [H, dv] contiguous (any row stride), written in place
//
// Numerics: S = q K^T is exact products of bf16 values summed in float32, scaled afterwards (the
// float32 kernel scales q first); the softmax runs in float32; P is rounded to bf16 for P V (as
// GPU flash attention does), V products summed in float32, normalised by the float32 row sum
// of the unrounded P. Against float32 attention of the same bf16 inputs the output differs by
// about P's rounding, 2^-9 relative per term (tests/refengine/test_paged_kernel.py states the bound).
//
// Packed layouts (uint32 words, each two bf16): a key tile as kt [d/2][KT] (word = K[key][2c],
// K[key][2c+1]: 16 keys' words of one column pair are one vector, the dot product's right
// operand against a broadcast query pair), a value tile as vt [KT/2][dvp] (word = V[2j][c],
// V[2j+1][c]: 16 columns' words of one key pair, against a broadcast pair of P). Keys past the
// context and columns past dv are zero. Work items, key grouping and the diagonal are as in the
// float32 kernel.
//
// Returns false (the caller takes the float32 kernel) when d is odd or the build has no AVX-512-BF16.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <atomic>
#include <cstring>
#include <vector>

#include "tiles.h"

#ifdef __AVX512BF16__
#include <immintrin.h>

using namespace swiftserve_tiles;

namespace {

// Keys j0 .. j0+cols-1 of KV head h into kt [d/2][KT] and vt [KT/2][dvp] (layouts above).
void pack(uint32_t* kt, uint32_t* vt, int64_t j0, int64_t cols, const uint16_t* k, const uint16_t* v,
          const int64_t* blocks, int64_t bs, int64_t kvh, int64_t h, int64_t d, int64_t dv) {
  const int64_t d2 = d / 2, dvp = padded(dv);
  uint16_t* vh = reinterpret_cast<uint16_t*>(vt);
  for (int64_t jj = 0; jj < KT; ++jj) {
    uint16_t* vcol = vh + (jj / 2) * dvp * 2 + (jj & 1);    // V[jj][c] at vcol[2 c]
    int64_t c = 0;
    if (jj < cols) {
      const int64_t tok = j0 + jj, row = blocks[tok / bs] * bs + tok % bs;
      const uint16_t* kr = k + (row * kvh + h) * d;
      const uint16_t* vr = v + (row * kvh + h) * dv;
      for (int64_t c2 = 0; c2 < d2; ++c2) std::memcpy(kt + c2 * KT + jj, kr + 2 * c2, 4);
      for (; c < dv; ++c) vcol[2 * c] = vr[c];
    } else {
      for (int64_t c2 = 0; c2 < d2; ++c2) kt[c2 * KT + jj] = 0;
    }
    for (; c < dvp; ++c) vcol[2 * c] = 0;
  }
}

// acc[r][x] += (R query rows qw [R][d2] of word pairs) . (keys 16x .. 16x+15 of kt [d2][KT]).
template <int NV>
inline void scores(const uint32_t* kt, const uint32_t* qw, int64_t d2, v16 (&acc)[R][4]) {
  for (int64_t c2 = 0; c2 < d2; ++c2) {
    const uint32_t* kc = kt + c2 * KT;
    w16 kv[NV];
    for (int x = 0; x < NV; ++x) kv[x] = loadw(kc + 16 * x);
    for (int r = 0; r < R; ++r) {
      const w16 qv = splatw(qw[r * d2 + c2]);
      for (int x = 0; x < NV; ++x) acc[r][x] = dot2(acc[r][x], qv, kv[x]);
    }
  }
}

// One head's rows (qw [rowsU][d2], rows past `rows` zero) against one packed tile; o [rowsU][dvp],
// m, l: the running output, max and lane sums (as paged_prefill.cpp's tile).
void tile(const uint32_t* kt, const uint32_t* vt, const uint32_t* qw, float* o, float* m, float* l, int64_t rows,
          int64_t cols, int64_t j0, int64_t limit0, int64_t lo0, int64_t step, int64_t d2, int64_t dvp, float scale) {
  const int64_t width = dvp % 64 == 0 ? 64 : 16;
  const int nv = static_cast<int>(width / 16);
  alignas(64) float p[R * KT];
  alignas(64) uint32_t pw[R * KT / 2];                    // P rounded to bf16, key pairs per word
  const v16 sc = splat(scale);
  for (int64_t i = 0; i < rows; i += R) {
    v16 acc[R][4] = {};
    const int64_t last = std::min<int64_t>(i + R, rows) - 1;
    const int64_t seen = std::min<int64_t>(cols, limit0 + last * step - j0);
    if (seen <= 0) continue;                               // the group lies before this tile
    if (lo0 + i * step - j0 >= cols) continue;             // its window starts after this tile
    const uint32_t* qi = qw + i * d2;
    switch ((seen + 15) / 16) {
      case 1: scores<1>(kt, qi, d2, acc); break;
      case 2: scores<2>(kt, qi, d2, acc); break;
      case 3: scores<3>(kt, qi, d2, acc); break;
      default: scores<4>(kt, qi, d2, acc);
    }
    for (int r = 0; r < R; ++r)
      for (int x = 0; x < 4; ++x) acc[r][x] *= sc;
    float alpha[R];
    online_softmax(acc, p, alpha, m, l, i, rows, cols, j0, limit0, lo0, step);
    for (int r = 0; r < R; ++r)
      for (int x = 0; x < 2; ++x) {                        // keys 32x .. 32x+31 -> 16 words
        const __m512bh b = _mm512_cvtne2ps_pbh((__m512)load(p + r * KT + 32 * x + 16), (__m512)load(p + r * KT + 32 * x));
        std::memcpy(pw + r * (KT / 2) + 16 * x, &b, 64);
      }
    const int64_t pairs = (seen + 1) / 2;                  // P past `seen` is 0 for every row
    for (int64_t c0 = 0; c0 < dvp; c0 += width) {
      v16 out[R][4];
      for (int r = 0; r < R; ++r) {
        const v16 a = splat(alpha[r]);
        for (int x = 0; x < nv; ++x) out[r][x] = load(o + (i + r) * dvp + c0 + 16 * x) * a;
      }
      for (int64_t jp = 0; jp < pairs; ++jp) {
        const uint32_t* vr = vt + jp * dvp + c0;
        if (nv == 4) {
          const w16 a = loadw(vr), b = loadw(vr + 16), c = loadw(vr + 32), e = loadw(vr + 48);
          for (int r = 0; r < R; ++r) {
            const w16 pv = splatw(pw[r * (KT / 2) + jp]);
            out[r][0] = dot2(out[r][0], pv, a);
            out[r][1] = dot2(out[r][1], pv, b);
            out[r][2] = dot2(out[r][2], pv, c);
            out[r][3] = dot2(out[r][3], pv, e);
          }
        } else {
          const w16 a = loadw(vr);
          for (int r = 0; r < R; ++r) out[r][0] = dot2(out[r][0], splatw(pw[r * (KT / 2) + jp]), a);
        }
      }
      for (int r = 0; r < R; ++r)
        for (int x = 0; x < nv; ++x) store(o + (i + r) * dvp + c0 + 16 * x, out[r][x]);
    }
  }
}

}  // namespace

bool prefill_bf16(const at::BFloat16* q, int64_t q_row, const at::BFloat16* k, const at::BFloat16* v,
                  const int64_t* blocks, float* out, int64_t out_row, int64_t n, int64_t start, int64_t H, int64_t kvh,
                  int64_t d, int64_t dv, int64_t bs, float scale, int64_t window) {
  if (d % 2 != 0) return false;
  const auto* qh = reinterpret_cast<const uint16_t*>(q);
  const auto* kh16 = reinterpret_cast<const uint16_t*>(k);
  const auto* vh16 = reinterpret_cast<const uint16_t*>(v);
  const int64_t g = H / kvh, d2 = d / 2, dvp = padded(dv);
  const int64_t ntiles = (n + QT - 1) / QT, ctx = start + n, ntk = (ctx + KT - 1) / KT;
  const int64_t tile_words = d2 * KT + (KT / 2) * dvp, head_words = ntk * tile_words;
  const int64_t hg = std::max<int64_t>(1, std::min<int64_t>(kvh, (int64_t{4} << 20) / head_words));
  std::vector<uint32_t> packed(hg * head_words);
  for (int64_t h0 = 0; h0 < kvh; h0 += hg) {
    const int64_t nh = std::min(hg, kvh - h0);
    at::parallel_for(0, nh * ntk, 1, [&](int64_t begin, int64_t end) {
      for (int64_t item = begin; item < end; ++item) {
        const int64_t hh = item / ntk, j0 = (item % ntk) * KT;
        uint32_t* kt = packed.data() + (hh * ntk + item % ntk) * tile_words;
        pack(kt, kt + d2 * KT, j0, std::min<int64_t>(KT, ctx - j0), kh16, vh16, blocks, bs, kvh, h0 + hh, d, dv);
      }
    });
    const int64_t heads = nh * g, items = heads * ntiles;
    std::atomic<int64_t> next{0};
    at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
      std::vector<uint32_t> qw(QT * d2);
      std::vector<float> o(QT * dvp), m(QT), l(QT * 16);
      for (int64_t item; (item = next.fetch_add(1)) < items;) {
        const int64_t i0 = (ntiles - 1 - item / heads) * QT, hq = h0 * g + item % heads;
        const int64_t rows = std::min<int64_t>(QT, n - i0), kend = start + i0 + rows;
        std::fill(qw.begin(), qw.end(), 0u);               // padded rows stay zero
        for (int64_t i = 0; i < rows; ++i) std::memcpy(qw.data() + i * d2, qh + (i0 + i) * q_row + hq * d, 2 * d);
        std::fill(o.begin(), o.end(), 0.f);
        std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
        std::fill(l.begin(), l.end(), 0.f);
        const uint32_t* kh = packed.data() + (hq / g - h0) * head_words;
        const int64_t lo0 = window > 0 ? start + i0 + 1 - window : NO_LOW;
        for (int64_t j0 = std::max<int64_t>(0, lo0) / KT * KT; j0 < kend; j0 += KT) {
          const uint32_t* kt = kh + (j0 / KT) * tile_words;
          tile(kt, kt + d2 * KT, qw.data(), o.data(), m.data(), l.data(), rows, std::min<int64_t>(KT, kend - j0), j0,
               start + i0 + 1, lo0, 1, d2, dvp, scale);
        }
        for (int64_t i = 0; i < rows; ++i) {
          const float inv = 1.f / hsum(load(&l[i * 16]));
          float* dst = out + (i0 + i) * out_row + hq * dv;
          for (int64_t c = 0; c < dv; ++c) dst[c] = o[i * dvp + c] * inv;
        }
      }
    });
  }
  return true;
}

#else  // no AVX-512-BF16 in this build: the float32 kernel serves bf16 queries

bool prefill_bf16(const at::BFloat16*, int64_t, const at::BFloat16*, const at::BFloat16*, const int64_t*, float*,
                  int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, int64_t) {
  return false;
}

#endif
