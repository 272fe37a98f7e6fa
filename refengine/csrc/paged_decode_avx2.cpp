// Paged decode attention for AVX2 + FMA builds (no AVX-512; paged_decode.cpp calls it there instead
// of decode_vec / decode_tiles): K and V read in place from the pool, 8-float vectors (vec8.h) so
// that every accumulator of a loop fits the 16 AVX2 registers. Shapes and meaning: paged_decode.cpp.
//
// decode_vec's algorithm at half the width: a work item is a sequence with all its KV heads when
// there are enough sequences to keep every thread busy, else (sequence, KV head), taken from a
// shared counter. Per item, with L = len rounded up to 8: scores s [head][g][L], 8 keys at a time
// per query row (8 accumulators over d, then sum8), an exact softmax per row, then out = P V with
// up to 3 rows x 32 value columns in registers (12 accumulators, 3 broadcasts, 1 V vector), each
// V row read once per row group and pass. Any d and dv: a row's last n < 8 elements are read
// masked (nothing past the row is touched) and the zero-padded queries make the tail products
// zero; the output's last columns are stored masked.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <type_traits>
#include <vector>

#include "vec8.h"

#ifdef SWIFTSERVE_AVX2_PATHS
using namespace swiftserve_vec8;

namespace {

// out rows [R][dv] += ... : P V for R query rows (p: their probabilities, rows L apart) over the
// tokens lo .. len-1, value columns c0 .. c0 + 8 NV - 1, the last vector's n columns only when TAIL.
template <int R, int NV, bool TAIL, typename T>
void pv_pass(const float* p, int64_t L, const T* vh, const int64_t* prow, int64_t kvh, int64_t dv, int64_t c0,
             int n, int64_t lo, int64_t len, float* o) {
  v8 acc[R][NV] = {};
  for (int64_t t = lo; t < len; ++t) {
    const T* vr = vh + prow[t] * kvh * dv + c0;
    const char* pv = reinterpret_cast<const char*>(vh + prow[std::min(t + 8, len - 1)] * kvh * dv + c0);
    for (int64_t x = 0; x < static_cast<int64_t>(NV * 8 * sizeof(T)); x += 64) __builtin_prefetch(pv + x);
    v8 pr[R];
    for (int r = 0; r < R; ++r) pr[r] = splat8(p[r * L + t]);
    for (int i = 0; i < NV; ++i) {
      const v8 x = TAIL && i == NV - 1 ? loadf8_n(vr + 8 * i, n) : loadf8(vr + 8 * i);
      for (int r = 0; r < R; ++r) acc[r][i] += pr[r] * x;
    }
  }
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < NV; ++i) {
      if (TAIL && i == NV - 1) store8_n(o + r * dv + c0 + 8 * i, acc[r][i], n);
      else store8(o + r * dv + c0 + 8 * i, acc[r][i]);
    }
}

// pv_pass with R (1-3) and NV (1-4) picked at run time.
template <int R, typename T>
void pv_rows(int nv, bool tail, const float* p, int64_t L, const T* vh, const int64_t* prow, int64_t kvh,
             int64_t dv, int64_t c0, int n, int64_t lo, int64_t len, float* o) {
#define SWIFTSERVE_PV(NV)                                                                          \
  case NV:                                                                                         \
    return tail ? pv_pass<R, NV, true>(p, L, vh, prow, kvh, dv, c0, n, lo, len, o)                 \
                : pv_pass<R, NV, false>(p, L, vh, prow, kvh, dv, c0, n, lo, len, o);
  switch (nv) {
    SWIFTSERVE_PV(1)
    SWIFTSERVE_PV(2)
    SWIFTSERVE_PV(3)
    SWIFTSERVE_PV(4)
  }
#undef SWIFTSERVE_PV
}

}  // namespace

template <typename T>
void decode_avx2(const float* q, const T* k, const T* v, const int64_t* table, const int64_t* lens,
                 const int64_t* starts, float* out, int64_t B, int64_t kvh, int64_t g, int64_t d, int64_t dv,
                 int64_t bs, int64_t max_blocks, float scale) {
  const int64_t nh = B >= 4 * at::get_num_threads() ? kvh : 1, per = kvh / nh, items = B * per;
  const int64_t dp = (d + 7) / 8 * 8;                       // query rows zero-padded to whole vectors
  const float ninf = -std::numeric_limits<float>::infinity();
  std::atomic<int64_t> next{0};
  at::parallel_for(0, at::get_num_threads(), 1, [&](int64_t, int64_t) {
    std::vector<float> qs(nh * g * dp, 0.f), s;
    std::vector<int64_t> prow;
    int64_t row[8];
    for (int64_t item; (item = next.fetch_add(1)) < items;) {
      const int64_t b = item / per, h0 = (item % per) * nh, len = lens[b], L = (len + 7) / 8 * 8;
      const int64_t lo = starts ? starts[b] : 0;            // first key the rows see (a window)
      const int64_t* blocks = table + b * max_blocks;
      prow.resize(len);                                     // pool row of every token, once per item
      for (int64_t t = 0, blk = 0; t < len; ++blk)
        for (int64_t i = 0; i < bs && t < len; ++i, ++t) prow[t] = blocks[blk] * bs + i;
      const float* qf = q + (b * kvh + h0) * g * d;
      for (int64_t r = 0; r < nh * g; ++r)
        for (int64_t c = 0; c < d; ++c) qs[r * dp + c] = qf[r * d + c] * scale;
      s.assign(nh * g * L, 0.f);
      // S = (scale q) K^T, 8 keys per step; keys from the window's first group only.
      for (int64_t t0 = lo / 8 * 8; t0 < L; t0 += 8) {
        for (int kk = 0; kk < 8; ++kk) {                    // past len: repeat the last key, masked below
          row[kk] = prow[std::min(t0 + kk, len - 1)] * kvh;
          const char* pk = reinterpret_cast<const char*>(k + (prow[std::min(t0 + 8 + kk, len - 1)] * kvh + h0) * d);
          for (int64_t x = 0; x < static_cast<int64_t>(nh * d * sizeof(T)); x += 64) __builtin_prefetch(pk + x);
        }
        for (int64_t hh = 0; hh < nh; ++hh) {
          const T* kh = k + (h0 + hh) * d;
          for (int64_t j = 0; j < g; ++j) {
            const float* qj = qs.data() + (hh * g + j) * dp;
            v8 acc[8] = {};
            int64_t c = 0;
            for (; c + 8 <= d; c += 8) {
              const v8 qc = load8(qj + c);
              for (int kk = 0; kk < 8; ++kk) acc[kk] += qc * loadf8(kh + row[kk] * d + c);
            }
            if (c < d) {                                    // a ragged width's tail
              const v8 qc = load8(qj + c);
              const int n = static_cast<int>(d - c);
              for (int kk = 0; kk < 8; ++kk) acc[kk] += qc * loadf8_n(kh + row[kk] * d + c, n);
            }
            store8(s.data() + (hh * g + j) * L + t0, sum8(acc));
          }
        }
      }
      for (int64_t r = 0; r < nh * g; ++r) {                // exact softmax of each row over lo .. len-1
        float* sr = s.data() + r * L;
        std::fill(sr, sr + lo, ninf);
        std::fill(sr + len, sr + L, ninf);
        v8 mx = load8(sr);
        for (int64_t t = 8; t < L; t += 8) {
          const v8 y = load8(sr + t);
          mx = mx > y ? mx : y;
        }
        const v8 m = splat8(hmax8(mx));
        v8 sum = {};
        for (int64_t t = 0; t < L; t += 8) {
          const v8 e = vexp8(load8(sr + t) - m);
          store8(sr + t, e);
          sum += e;
        }
        const v8 inv = splat8(1.f / hsum8(sum));
        for (int64_t t = 0; t < L; t += 8) store8(sr + t, load8(sr + t) * inv);
      }
      // O = P V: rows in groups of up to 3, value columns in passes of up to 32.
      for (int64_t hh = 0; hh < nh; ++hh)
        for (int64_t j0 = 0; j0 < g; j0 += 3) {
          const float* p = s.data() + (hh * g + j0) * L;
          const T* vh = v + (h0 + hh) * dv;
          float* o = out + ((b * kvh + h0 + hh) * g + j0) * dv;
          const int rows = static_cast<int>(std::min<int64_t>(3, g - j0));
          for (int64_t c0 = 0; c0 < dv; c0 += 32) {
            const int64_t rem = std::min<int64_t>(32, dv - c0);
            const int nv = static_cast<int>((rem + 7) / 8), n = static_cast<int>(rem - 8 * (nv - 1));
            const bool tail = n < 8;
            if (rows == 3) pv_rows<3>(nv, tail, p, L, vh, prow.data(), kvh, dv, c0, n, lo, len, o);
            else if (rows == 2) pv_rows<2>(nv, tail, p, L, vh, prow.data(), kvh, dv, c0, n, lo, len, o);
            else pv_rows<1>(nv, tail, p, L, vh, prow.data(), kvh, dv, c0, n, lo, len, o);
          }
        }
    }
  });
}

template void decode_avx2<float>(const float*, const float*, const float*, const int64_t*, const int64_t*,
                                 const int64_t*, float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                                 int64_t, float);
template void decode_avx2<at::BFloat16>(const float*, const at::BFloat16*, const at::BFloat16*, const int64_t*,
                                        const int64_t*, const int64_t*, float*, int64_t, int64_t, int64_t, int64_t,
                                        int64_t, int64_t, int64_t, float);
#endif
