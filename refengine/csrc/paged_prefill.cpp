// Causal prefill attention on CPU over a block pool: flash-style tiles with an online softmax,
// keys and values read from the pool once per call (no padded gather, no score matrix).
//
//   q      [n, H, d]          float32, inner [H, d] contiguous (any row stride): the chunk's queries
//   k      [N, bs, kvh, d]    float32 or bfloat16, contiguous block pool
//   v      [N, bs, kvh, dv]   same dtype as k; any d and dv >= 1 (ZACK's ragged per-head ranks)
//   blocks [>= ceil(ctx/bs)]  int64 block ids of the sequence, keys 0 .. ctx-1 (ctx = start + n)
//   start  cache index of query row 0: row i sits at start + i and sees keys 0 .. start + i
//   out    [n, H, dv]         float32, inner [H, dv] contiguous (any row stride), written in place
//   window sliding window W (0: none): row i sees only keys start + i - W + 1 .. start + i
//
// GQA: query head hq reads KV head hq / (H / kvh), as in HF's repeat_kv.
//
// The context's keys are packed once per call and KV head, as float32 tiles of KT keys: K
// transposed ([d][KT]), V row-major ([KT][dvp]) with dvp = dv rounded up to 16 and the columns
// past dv zero. So every vector loop below runs over whole vectors whatever dv is: the padded
// columns of the running output stay zero (0 * p summed) and are never written out. K needs no
// padding: its scores loop broadcasts one query element per column c < d. Work items are (query head, tile of QT query
// rows), taken from a shared counter latest (longest) rows first. Per item and key tile,
// S = (scale q) K^T is computed 6 query rows x 64 keys at a time (24 vector accumulators, only
// the key vectors some row of the 6 sees), masked on the diagonal tile, folded into the running
// row max / sum while still in registers, and O = alpha O + P V 6 rows x 64 value columns at a
// time over the keys the rows see. Everything is float32; exp is vec.h's vectorised Cody-Waite +
// degree-6 polynomial (relative error ~2e-7, like expf).
//
// Windows: every row also has a first visible key (`lo0 + i * step`; far below 0 without a
// window, so the checks below never fire and cost one compare per row and tile). Key tiles
// wholly before a work item's first visible key are skipped, rows mask the keys before theirs.
//
// Decode kernels live here too (called by paged_decode.cpp): decode_vec (d and dv multiples of
// 16: K and V read in place, 16 dot products per sum16) and decode_tiles (the tiles above,
// K and V packed per item; any d and dv).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "tiles.h"
#include "vec.h"

using namespace swiftserve_vec;
using namespace swiftserve_tiles;

namespace {

// Scratch of one thread: nh KV heads x rowsR query rows each (rowsR a multiple of R), and one
// packed key tile of the nh heads (kt, vt: see pack). Per row: the running output o [dvp]
// (dvp = padded(dv)), max m and sum l, the sum kept as 16 lane partial sums (added up once,
// in finish).
struct Tiles {
  int64_t nh, rowsR, dvp;
  std::vector<float> qs, kt, vt, o, m, l;
  Tiles(int64_t nh_, int64_t rowsR_, int64_t d, int64_t dv, bool keys = true)
      : nh(nh_), rowsR(rowsR_), dvp(padded(dv)), qs(nh_ * rowsR_ * d, 0.f), kt(keys ? nh_ * d * KT : 0),
        vt(keys ? nh_ * KT * padded(dv) : 0), o(nh_ * rowsR_ * padded(dv)), m(nh_ * rowsR_), l(nh_ * rowsR_ * 16) {}

  void reset() {
    std::fill(o.begin(), o.end(), 0.f);
    std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
    std::fill(l.begin(), l.end(), 0.f);
  }

  // Row i of head hh, normalised, to out + hh * out_head + i * out_stride (its dv real columns).
  void finish(int64_t rows, int64_t dv, float* out, int64_t out_head, int64_t out_stride) const {
    for (int64_t hh = 0; hh < nh; ++hh)
      for (int64_t i = 0; i < rows; ++i) {
        const int64_t r = hh * rowsR + i;
        const float inv = 1.f / hsum(load(&l[r * 16]));
        float* dst = out + hh * out_head + i * out_stride;
        for (int64_t c = 0; c < dv; ++c) dst[c] = o[r * dvp + c] * inv;
      }
  }
};

// Packs keys j0 .. j0+cols-1 (cols <= KT) of KV heads h0 .. h0+nh-1 as float32: K transposed
// into kt [nh][d][KT], V row-major into vt [nh][KT][padded(dv)], zero past cols and past dv.
// A token's rows of neighbouring heads are adjacent in the pool, so the pool is read front to back.
template <typename T>
void pack(float* kt, float* vt, int64_t nh, int64_t j0, int64_t cols, const T* k, const T* v, const int64_t* blocks,
          int64_t bs, int64_t kvh, int64_t h0, int64_t d, int64_t dv) {
  const int64_t dvp = padded(dv);
  for (int64_t jj = 0; jj < KT; ++jj) {
    const int64_t tok = j0 + jj;
    const int64_t row = jj < cols ? blocks[tok / bs] * bs + tok % bs : 0;
    for (int64_t hh = 0; hh < nh; ++hh) {
      float* kth = kt + hh * d * KT;
      float* vth = vt + (hh * KT + jj) * dvp;
      int64_t c = 0;
      if (jj < cols) {
        const T* kr = k + (row * kvh + h0 + hh) * d;
        const T* vr = v + (row * kvh + h0 + hh) * dv;
        for (int64_t x = 0; x < d; ++x) kth[x * KT + jj] = static_cast<float>(kr[x]);
        for (; c < dv; ++c) vth[c] = static_cast<float>(vr[c]);
      } else {
        for (int64_t x = 0; x < d; ++x) kth[x * KT + jj] = 0.f;
      }
      for (; c < dvp; ++c) vth[c] = 0.f;                   // past cols: whole row; else the padding
    }
  }
}

// acc[r][x] += (R query rows qi [R][d]) . (keys 16x .. 16x+15 of the packed tile kth [d][KT]),
// for the first NV key vectors: R x NV vector accumulators, one K load per vector and column.
template <int NV>
inline void scores(const float* kth, const float* qi, int64_t d, v16 (&acc)[R][4]) {
  for (int64_t c = 0; c < d; ++c) {
    const float* kc = kth + c * KT;
    v16 kv[NV];
    for (int x = 0; x < NV; ++x) kv[x] = load(kc + 16 * x);
    for (int r = 0; r < R; ++r) {
      const v16 qv = splat(qi[r * d + c]);
      for (int x = 0; x < NV; ++x) acc[r][x] += qv * kv[x];
    }
  }
}

// One head's query rows against one packed key tile (kth [d][KT], vth [KT][dv]; keys j0 ..
// j0+cols-1). qs [rowsU][d] scaled queries with rows past `rows` zero, o [rowsU][dv] the running
// output, m and l the running row max and sum; rowsU is rows rounded up to R. Row i sees keys
// below limit0 + i * step (prefill: causal, step 1; decode: the whole context, step 0) and from
// lo0 + i * step on (a sliding window; NO_LOW without one). Per
// group of R rows: S = qs K^T, 6 rows x 64 keys in 24 vector accumulators; masked, folded into
// the online softmax and exponentiated while still in registers (P to a 6 x 64 scratch on the
// stack); then o = alpha o + P V, 6 rows x 64 (or 16) value columns at a time, the rescale by
// alpha folded into loading o. Here dv is the packed (padded) width: a multiple of 16.
inline void tile(const float* kth, const float* vth, const float* qs, float* o, float* m, float* l, int64_t rows,
                 int64_t cols, int64_t j0, int64_t limit0, int64_t lo0, int64_t step, int64_t d, int64_t dv) {
  const int64_t width = dv % 64 == 0 ? 64 : 16;
  const int nv = static_cast<int>(width / 16);
  alignas(64) float p[R * KT];
  for (int64_t i = 0; i < rows; i += R) {
    v16 acc[R][4] = {};
    const float* qi = qs + i * d;
    // Row i sees at least as many keys as row i - 1 (step >= 0), so the group's last real row
    // sees the most: `seen` keys. Only their key vectors are computed (the rest stay zero and
    // are masked below), and P past them is 0.
    const int64_t last = std::min<int64_t>(i + R, rows) - 1;
    const int64_t seen = std::min<int64_t>(cols, limit0 + last * step - j0);
    if (seen <= 0) continue;                               // the whole group lies before this tile: o, m, l unchanged
    if (lo0 + i * step - j0 >= cols) continue;             // its window starts after this tile: unchanged too
    switch ((seen + 15) / 16) {
      case 1: scores<1>(kth, qi, d, acc); break;
      case 2: scores<2>(kth, qi, d, acc); break;
      case 3: scores<3>(kth, qi, d, acc); break;
      default: scores<4>(kth, qi, d, acc);
    }
    float alpha[R];
    online_softmax(acc, p, alpha, m, l, i, rows, cols, j0, limit0, lo0, step);
    for (int64_t c0 = 0; c0 < dv; c0 += width) {
      v16 out[R][4];
      for (int r = 0; r < R; ++r) {
        const v16 a = splat(alpha[r]);
        for (int x = 0; x < nv; ++x) out[r][x] = load(o + (i + r) * dv + c0 + 16 * x) * a;
      }
      for (int64_t jj = 0; jj < seen; ++jj) {
        const float* vr = vth + jj * dv + c0;
        if (nv == 4) {
          const v16 a = load(vr), b = load(vr + 16), c = load(vr + 32), e = load(vr + 48);
          for (int r = 0; r < R; ++r) {
            const v16 pv = splat(p[r * KT + jj]);
            out[r][0] += pv * a;
            out[r][1] += pv * b;
            out[r][2] += pv * c;
            out[r][3] += pv * e;
          }
        } else {
          const v16 a = load(vr);
          for (int r = 0; r < R; ++r) out[r][0] += splat(p[r * KT + jj]) * a;
        }
      }
      for (int r = 0; r < R; ++r)
        for (int x = 0; x < nv; ++x) store(o + (i + r) * dv + c0 + 16 * x, out[r][x]);
    }
  }
}

// Attention of `rows` query rows per head for KV heads h0 .. h0+nh-1 (already scaled, in
// t.qs [nh][rowsR][d], padded rows zero) over keys 0 .. kend-1, each key tile packed once for
// the nh heads; row i sees keys below limit0 + i * step, from lo0 + i * step on. Writes row i of head h0 + hh,
// normalised, to out + hh * out_head + i * out_stride.
template <typename T>
void attend(Tiles& t, int64_t rows, int64_t kend, int64_t limit0, int64_t lo0, int64_t step, const T* k, const T* v,
            const int64_t* blocks, int64_t bs, int64_t kvh, int64_t h0, int64_t d, int64_t dv, float* out,
            int64_t out_head, int64_t out_stride) {
  const int64_t nh = t.nh, rowsR = t.rowsR;
  t.reset();
  for (int64_t j0 = std::max<int64_t>(0, lo0) / KT * KT; j0 < kend; j0 += KT) {
    const int64_t cols = std::min<int64_t>(KT, kend - j0);
    pack(t.kt.data(), t.vt.data(), nh, j0, cols, k, v, blocks, bs, kvh, h0, d, dv);
    for (int64_t hh = 0; hh < nh; ++hh)
      tile(t.kt.data() + hh * d * KT, t.vt.data() + hh * KT * t.dvp, t.qs.data() + hh * rowsR * d,
           t.o.data() + hh * rowsR * t.dvp, t.m.data() + hh * rowsR,
           t.l.data() + hh * rowsR * 16, rows, cols, j0, limit0, lo0, step, d, t.dvp);
  }
  t.finish(rows, dv, out, out_head, out_stride);
}

// Prefill. The context's key tiles are packed once per KV head (in groups of KV heads whose
// packed keys fit in ~16 MiB) and shared by every query tile of the group's query heads.
// Work items are (query head, tile of QT query rows), handed out from a shared counter,
// longest (latest) row tiles first so the threads finish together.
template <typename T>
void prefill(const float* q, int64_t q_row, const T* k, const T* v, const int64_t* blocks, float* out,
             int64_t out_row, int64_t n, int64_t start, int64_t H, int64_t kvh, int64_t d, int64_t dv,
             int64_t bs, float scale, int64_t window) {
  const int64_t g = H / kvh;
  const int64_t ntiles = (n + QT - 1) / QT;
  const int64_t ctx = start + n, ntk = (ctx + KT - 1) / KT;
  const int64_t dvp = padded(dv);                          // packed V width (zero columns past dv)
  const int64_t tile_floats = d * KT + KT * dvp, head_floats = ntk * tile_floats;
  const int64_t hg = std::max<int64_t>(1, std::min<int64_t>(kvh, (int64_t{4} << 20) / head_floats));
  std::vector<float> packed(hg * head_floats);
  for (int64_t h0 = 0; h0 < kvh; h0 += hg) {
    const int64_t nh = std::min(hg, kvh - h0);
    at::parallel_for(0, nh * ntk, 1, [&](int64_t begin, int64_t end) {
      for (int64_t item = begin; item < end; ++item) {
        const int64_t hh = item / ntk, j0 = (item % ntk) * KT;
        float* kt = packed.data() + (hh * ntk + item % ntk) * tile_floats;
        pack(kt, kt + d * KT, 1, j0, std::min<int64_t>(KT, ctx - j0), k, v, blocks, bs, kvh, h0 + hh, d, dv);
      }
    });
    const int64_t heads = nh * g, items = heads * ntiles;
    std::atomic<int64_t> next{0};
    at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
      Tiles t(1, QT, d, dv, false);
      for (int64_t item; (item = next.fetch_add(1)) < items;) {
        const int64_t i0 = (ntiles - 1 - item / heads) * QT, hq = h0 * g + item % heads;
        const int64_t rows = std::min<int64_t>(QT, n - i0), kend = start + i0 + rows;
        std::fill(t.qs.begin(), t.qs.end(), 0.f);            // padded rows stay zero
        for (int64_t i = 0; i < rows; ++i) {
          const float* src = q + (i0 + i) * q_row + hq * d;
          for (int64_t c = 0; c < d; ++c) t.qs[i * d + c] = src[c] * scale;
        }
        t.reset();
        const float* kh = packed.data() + (hq / g - h0) * head_floats;
        // Row i sees keys from lo0 + i on: with a window, tiles before the item's first row's are skipped.
        const int64_t lo0 = window > 0 ? start + i0 + 1 - window : NO_LOW;
        for (int64_t j0 = std::max<int64_t>(0, lo0) / KT * KT; j0 < kend; j0 += KT) {
          const float* kt = kh + (j0 / KT) * tile_floats;
          tile(kt, kt + d * KT, t.qs.data(), t.o.data(), t.m.data(), t.l.data(), rows,
               std::min<int64_t>(KT, kend - j0), j0, start + i0 + 1, lo0, 1, d, dvp);
        }
        t.finish(rows, dv, out + i0 * out_row + hq * dv, 0, out_row);
      }
    });
  }
}

}  // namespace

// Decode through the same tiles: the g query heads of a KV head are its rows, every row seeing
// the sequence's whole context. Work items are sequences with all their KV heads (the pool read
// front to back) when there are enough of them to keep every thread busy, else (sequence, KV head).
template <typename T>
void decode_tiles(const float* q, const T* k, const T* v, const int64_t* table, const int64_t* lens,
                  const int64_t* starts, float* out, int64_t B, int64_t kvh, int64_t g, int64_t d, int64_t dv,
                  int64_t bs, int64_t max_blocks, float scale) {
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
      attend(t, g, lens[b], lens[b], starts ? starts[b] : NO_LOW, 0, k, v, table + b * max_blocks, bs, kvh, h0, d,
             dv, out + (b * kvh + h0) * g * dv, g * dv, dv);
    }
  });
}

// Decode with K and V read in place, nothing packed: d and dv multiples of 16, or any widths
// where the build has AVX-512 masked moves (kMaskedTails; the rows' tails are read masked). A work item
// is a sequence with all its KV heads when there are enough sequences to keep every thread
// busy (the pool's token rows read front to back), else (sequence, KV head); items are taken
// from a shared counter (ragged lengths). Per item, with L = len rounded up to 16: scores
// s [head][g][L], 16 keys at a time per query row (one vector accumulator per key over d,
// then sum16), an exact softmax per row, then out += P V with up to 4 rows x 64 value columns
// in registers, each V row loaded once per row group.
//
// qb (bf16 pools only, d a multiple of 32, built with AVX-512-BF16; else nullptr): the queries as
// bf16 [B, kvh, g, d], used instead of q: q K^T by vdpbf16ps (32 products per instruction, exact,
// summed in float32), scaled afterwards, so no query is widened and no key either.
template <typename T>
void decode_vec(const float* q, const T* k, const T* v, const int64_t* table, const int64_t* lens,
                const int64_t* starts, float* out, int64_t B, int64_t kvh, int64_t g, int64_t d, int64_t dv,
                int64_t bs, int64_t max_blocks, float scale, const uint16_t* qb) {
  const int64_t nh = B >= 4 * at::get_num_threads() ? kvh : 1, per = kvh / nh, items = B * per;
  const int64_t gP = (g + 3) / 4 * 4;                        // rows padded to 4 (their P stays zero)
  const int64_t dp = padded(d);
  std::atomic<int64_t> next{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    std::vector<float> qs(nh * g * dp, 0.f), s;            // rows of dp floats, zeros past d
    std::vector<int64_t> row(16), prow;
    for (int64_t item; (item = next.fetch_add(1)) < items;) {
      const int64_t b = item / per, h0 = (item % per) * nh, len = lens[b], L = (len + 15) / 16 * 16;
      const int64_t lo = starts ? starts[b] : 0;            // first key the row sees (a window), masked below
      const int64_t* blocks = table + b * max_blocks;
      // Pool row of every token, once per item: the loops below would otherwise divide by bs
      // (a run-time value: an integer division) several times per key.
      prow.resize(len);
      for (int64_t t = 0, blk = 0; t < len; ++blk)
        for (int64_t i = 0; i < bs && t < len; ++i, ++t) prow[t] = blocks[blk] * bs + i;
      if (!qb) {
        const float* qf = q + (b * kvh + h0) * g * d;
        for (int64_t r = 0; r < nh * g; ++r)
          for (int64_t c = 0; c < d; ++c) qs[r * dp + c] = qf[r * d + c] * scale;
      }
      s.assign(nh * gP * L, 0.f);
      for (int64_t t0 = 0; t0 < L; t0 += 16) {
        for (int kk = 0; kk < 16; ++kk) {                    // past len: repeat the last key, masked below
          row[kk] = prow[std::min(t0 + kk, len - 1)] * kvh;
          const int64_t ahead = std::min(t0 + 16 + kk, len - 1);   // the next group's keys, into cache
          const char* pk = reinterpret_cast<const char*>(k + (prow[ahead] * kvh + h0) * d);
          for (int64_t x = 0; x < static_cast<int64_t>(nh * d * sizeof(T)); x += 64) __builtin_prefetch(pk + x);
        }
        for (int64_t hh = 0; hh < nh; ++hh)
          for (int64_t j = 0; j < g; ++j) {
            float* sj = s.data() + (hh * gP + j) * L + t0;
            v16 acc[16] = {};
#ifdef __AVX512BF16__
            if constexpr (std::is_same<T, at::BFloat16>::value) {
              if (qb) {                                       // words of two bf16: d / 2 per row
                const uint32_t* qj = reinterpret_cast<const uint32_t*>(qb + ((b * kvh + h0 + hh) * g + j) * d);
                const uint32_t* kh = reinterpret_cast<const uint32_t*>(k + (h0 + hh) * d);
                for (int64_t c = 0; c < d / 2; c += 16) {
                  const w16 qc = loadw(qj + c);
                  for (int kk = 0; kk < 16; ++kk) acc[kk] = dot2(acc[kk], qc, loadw(kh + row[kk] * d / 2 + c));
                }
                store(sj, sum16(acc) * splat(scale));
                continue;
              }
            }
#endif
            const float* qj = qs.data() + (hh * g + j) * dp;
            const T* kh = k + (h0 + hh) * d;
            int64_t c = 0;
            for (; c + 16 <= d; c += 16) {
              const v16 qc = load(qj + c);
              for (int kk = 0; kk < 16; ++kk) acc[kk] += qc * loadf(kh + row[kk] * d + c);
            }
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
            if (c < d) {                                      // a ragged width's tail: the rest of the row only
              const v16 qc = load(qj + c);
              const int n = static_cast<int>(d - c);
              for (int kk = 0; kk < 16; ++kk) acc[kk] += qc * loadf_n(kh + row[kk] * d + c, n);
            }
#endif
            store(sj, sum16(acc));
          }
      }
      for (int64_t hh = 0; hh < nh; ++hh)
        for (int64_t j = 0; j < g; ++j) {                    // exact softmax of each row
          float* sj = s.data() + (hh * gP + j) * L;
          std::fill(sj + len, sj + L, -std::numeric_limits<float>::infinity());
          std::fill(sj, sj + lo, -std::numeric_limits<float>::infinity());
          v16 mx = load(sj);
          for (int64_t t = 16; t < L; t += 16) {
            const v16 y = load(sj + t);
            mx = mx > y ? mx : y;
          }
          const v16 m = splat(hmax(mx));
          v16 sum = {};
          for (int64_t t = 0; t < L; t += 16) {
            const v16 p = vexp(load(sj + t) - m);
            store(sj + t, p);
            sum += p;
          }
          const v16 inv = splat(1.f / hsum(sum));
          for (int64_t t = 0; t < L; t += 16) store(sj + t, load(sj + t) * inv);
        }
      // P V in passes of up to 64 value columns (4 vectors) over the tokens; a ragged dv's last
      // pass has its last vector's n < 16 columns read and written masked (nothing past the row
      // is touched), so any dv <= 64 (ZACK's ranks) is one pass over the context.
      for (int64_t hh = 0; hh < nh; ++hh)
        for (int64_t j0 = 0; j0 < g; j0 += 4) {
          const float* p = s.data() + (hh * gP + j0) * L;
          float* o = out + ((b * kvh + h0 + hh) * g + j0) * dv;
          const int rows = static_cast<int>(std::min<int64_t>(4, g - j0));
          // nvec vectors from column c0, the last of n columns; tail (std::true_type) when n < 16:
          // a compile-time flag, so a whole pass's loop is the plain one.
          const auto pass = [&](int64_t c0, int nvec, int n, auto tail) {
            constexpr bool kTail = decltype(tail)::value;
            const int full = kTail ? nvec - 1 : nvec;
            v16 acc[4][4] = {};
            for (int64_t t = lo; t < len; ++t) {
              const T* vr = v + (prow[t] * kvh + h0 + hh) * dv + c0;
              const int64_t ahead = std::min(t + 8, len - 1);      // V rows 8 tokens ahead, into cache
              const char* pv = reinterpret_cast<const char*>(v + (prow[ahead] * kvh + h0 + hh) * dv + c0);
              for (int64_t x = 0; x < static_cast<int64_t>(nvec * 16 * sizeof(T)); x += 64) __builtin_prefetch(pv + x);
              v16 x[4];
              for (int i = 0; i < full; ++i) x[i] = loadf(vr + 16 * i);
              if constexpr (kTail) {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
                x[full] = loadf_n(vr + 16 * full, n);
#endif
              }
              for (int r = 0; r < 4; ++r) {
                const v16 pr = splat(p[r * L + t]);
                for (int i = 0; i < nvec; ++i) acc[r][i] += pr * x[i];
              }
            }
            for (int r = 0; r < rows; ++r) {
              for (int i = 0; i < full; ++i) store(o + r * dv + c0 + 16 * i, acc[r][i]);
              if constexpr (kTail) {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
                store_n(o + r * dv + c0 + 16 * full, acc[r][full], n);
#endif
              }
            }
          };
          int64_t c0 = 0;
          for (; c0 + 64 <= dv; c0 += 64) pass(c0, 4, 16, std::false_type{});
          if (c0 < dv) {
            const int rem = static_cast<int>(dv - c0), nvec = (rem + 15) / 16, n = rem - 16 * (nvec - 1);
            if (n == 16) pass(c0, nvec, 16, std::false_type{});
            else pass(c0, nvec, n, std::true_type{});              // only where masked tails exist
          }
        }
    }
  });
}

// Whether decode_vec's bf16 query path (qb) was built (AVX-512-BF16 at compile time).
bool decode_has_bf16_dot() {
#ifdef __AVX512BF16__
  return true;
#else
  return false;
#endif
}

#define SWIFTSERVE_DECODE(NAME, T, EXTRA)                                                                      \
  template void NAME<T>(const float*, const T*, const T*, const int64_t*, const int64_t*, const int64_t*, float*, \
                        int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float EXTRA);
#define SWIFTSERVE_QB , const uint16_t*
SWIFTSERVE_DECODE(decode_vec, float, SWIFTSERVE_QB)
SWIFTSERVE_DECODE(decode_vec, at::BFloat16, SWIFTSERVE_QB)
SWIFTSERVE_DECODE(decode_tiles, float, )
SWIFTSERVE_DECODE(decode_tiles, at::BFloat16, )
#undef SWIFTSERVE_QB
#undef SWIFTSERVE_DECODE


bool prefill_bf16(const at::BFloat16* q, int64_t q_row, const at::BFloat16* k, const at::BFloat16* v,
                  const int64_t* blocks, float* out, int64_t out_row, int64_t n, int64_t start, int64_t H, int64_t kvh,
                  int64_t d, int64_t dv, int64_t bs, float scale, int64_t window);   // paged_prefill_bf16.cpp

// q float32, or bfloat16 over bfloat16 pools (bf16 dot products where the CPU has them, else q
// widened to float32 here); bfloat16 q over float32 pools is widened too.
void paged_prefill(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor blocks, int64_t start,
                   double scale, torch::Tensor out, int64_t window) {
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(), "paged_prefill: CPU tensors only");
  TORCH_CHECK(q.dim() == 3 && out.dim() == 3 && k.dim() == 4 && v.dim() == 4, "paged_prefill: bad ranks");
  TORCH_CHECK((q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16) && out.scalar_type() == at::kFloat,
              "paged_prefill: q float32 or bfloat16, out float32");
  TORCH_CHECK(k.scalar_type() == v.scalar_type(), "paged_prefill: k and v dtypes differ");
  TORCH_CHECK(k.is_contiguous() && v.is_contiguous(), "paged_prefill: the pools must be contiguous");
  TORCH_CHECK(q.stride(2) == 1 && q.stride(1) == q.size(2), "paged_prefill: q rows must be [H, d] contiguous");
  TORCH_CHECK(out.stride(2) == 1 && out.stride(1) == out.size(2), "paged_prefill: out rows must be [H, dv] contiguous");
  TORCH_CHECK(blocks.scalar_type() == at::kLong && blocks.dim() == 1, "paged_prefill: int64 block ids");
  blocks = blocks.contiguous();
  const int64_t n = q.size(0), H = q.size(1), d = q.size(2);
  const int64_t bs = k.size(1), kvh = k.size(2), dv = v.size(3);
  TORCH_CHECK(k.size(3) == d && v.size(2) == kvh && v.size(1) == bs && H % kvh == 0, "paged_prefill: pool shapes");
  TORCH_CHECK(d >= 1 && dv >= 1, "paged_prefill: empty head dims");
  TORCH_CHECK(out.size(0) == n && out.size(1) == H && out.size(2) == dv, "paged_prefill: out shape");
  TORCH_CHECK(start >= 0 && blocks.numel() * bs >= start + n, "paged_prefill: blocks do not cover the context");
  TORCH_CHECK(window >= 0, "paged_prefill: window must be >= 0 (0: none)");
  if (n == 0) return;
  const float sc = static_cast<float>(scale);
  if (q.scalar_type() == at::kBFloat16) {
    if (k.scalar_type() == at::kBFloat16 &&
        prefill_bf16(q.data_ptr<at::BFloat16>(), q.stride(0), k.data_ptr<at::BFloat16>(), v.data_ptr<at::BFloat16>(),
                     blocks.data_ptr<int64_t>(), out.data_ptr<float>(), out.stride(0), n, start, H, kvh, d, dv, bs, sc,
                     window))
      return;
    q = q.to(at::kFloat);
  }
  if (k.scalar_type() == at::kFloat) {
    prefill<float>(q.data_ptr<float>(), q.stride(0), k.data_ptr<float>(), v.data_ptr<float>(),
                   blocks.data_ptr<int64_t>(), out.data_ptr<float>(), out.stride(0), n, start, H, kvh, d, dv, bs, sc,
                   window);
  } else if (k.scalar_type() == at::kBFloat16) {
    prefill<at::BFloat16>(q.data_ptr<float>(), q.stride(0), k.data_ptr<at::BFloat16>(), v.data_ptr<at::BFloat16>(),
                          blocks.data_ptr<int64_t>(), out.data_ptr<float>(), out.stride(0), n, start, H, kvh, d, dv,
                          bs, sc, window);
  } else {
    TORCH_CHECK(false, "paged_prefill: pools must be float32 or bfloat16");
  }
}
