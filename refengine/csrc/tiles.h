// What the tiled attention kernels share (paged_prefill.cpp: float32 dot products;
// paged_prefill_bf16.cpp: bf16 dot products): the tile sizes and the online softmax of one group
// of R query rows against one key tile, on scores already in registers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "vec.h"

namespace swiftserve_tiles {

using namespace swiftserve_vec;

constexpr int R = 6;      // query rows per micro-kernel step: 6 x 4 accumulators + 4 operands + 1 broadcast
constexpr int QT = 8 * R;  // query rows per work item
constexpr int KT = 64;    // keys per tile (4 vectors)
constexpr int64_t NO_LOW = std::numeric_limits<int64_t>::min() / 4;   // "no window": every key is >= it

// Packed V row width: dv rounded up to whole vectors (the padding columns hold zeros).
inline int64_t padded(int64_t dv) { return (dv + 15) / 16 * 16; }

// Rows i .. i+R-1 of a work item against keys j0 .. j0+cols-1 of one tile, scores (already
// scaled) in acc [R][4 vectors of 16 keys]. Row i+r sees keys below limit0 + (i+r) * step and from
// lo0 + (i+r) * step on; rows at or past `rows` are padding. Masks what a row does not see, folds
// the tile into the running row max m and lane sums l (16 partial sums per row, added up when
// the item finishes), writes P = exp(S - m_new) to p [R][KT] (0 where masked, and for rows that
// see nothing here) and the factor alpha[r] that rescales the row's running output.
inline void online_softmax(v16 (&acc)[R][4], float* p, float (&alpha)[R], float* m, float* l, int64_t i,
                           int64_t rows, int64_t cols, int64_t j0, int64_t limit0, int64_t lo0, int64_t step) {
  const i16 iota = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  const v16 ninf = splat(-std::numeric_limits<float>::infinity());
  for (int r = 0; r < R; ++r) {
    float* pr = p + r * KT;
    alpha[r] = 1.f;
    const int64_t visible = i + r < rows ? std::min<int64_t>(cols, limit0 + (i + r) * step - j0) : 0;
    const int64_t low = lo0 + (i + r) * step - j0;       // first key of the tile the row sees (window)
    if (visible <= 0 || low >= visible) {                // padded row, or sees nothing here: P = 0
      for (int x = 0; x < 4; ++x) store(pr + 16 * x, v16{});
      continue;
    }
    if (visible < KT)                                    // diagonal or last tile: mask, lanewise
      for (int x = 0; x < 4; ++x) acc[r][x] = (iota + 16 * x) < static_cast<int32_t>(visible) ? acc[r][x] : ninf;
    if (low > 0)                                         // the window starts inside this tile
      for (int x = 0; x < 4; ++x) acc[r][x] = (iota + 16 * x) >= static_cast<int32_t>(low) ? acc[r][x] : ninf;
    v16 mx = acc[r][0];
    for (int x = 1; x < 4; ++x) mx = mx > acc[r][x] ? mx : acc[r][x];
    float& mi = m[i + r];
    const float m_new = std::max(mi, hmax(mx));
    alpha[r] = m_new == mi ? 1.f : vexp(splat(mi - m_new))[0];   // 0 on the first tile (m = -inf)
    v16 sum = {};
    for (int x = 0; x < 4; ++x) {
      const v16 e = vexp(acc[r][x] - splat(m_new));
      store(pr + 16 * x, e);
      sum += e;
    }
    store(l + (i + r) * 16, load(l + (i + r) * 16) * splat(alpha[r]) + sum);   // lane sums; added up in finish
    mi = m_new;
  }
}

}  // namespace swiftserve_tiles
