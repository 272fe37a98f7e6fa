// bf16 GEMM for the reference engine's linear layers on CPUs with AVX-512-BF16:
//
//   bf16_gemm(x [M, K] bf16, wp [U, K2, 4, 16, 2] bf16, n, bias [n] float32 | None) -> [M, n] bf16
//
// wp is the weight W [n, K] (out x in, as nn.Linear) blocked once at load time by
// refengine.linear.pack_bf16: units of NB = 4 blocks of 16 output rows (U = ceil(n / 64)), K2 = K / 2
// pairs of input columns, element [u, p, j, i, t] = W[16 (4 u + j) + i, 2 p + t] (zero past n). One
// 64-byte vector holds 16 outputs x one pair of inputs, which is what vdpbf16ps multiplies against
// one pair of x broadcast to every lane: out[16 b .. 16 b + 15] of a row accumulate with no
// horizontal sums. A unit's 4 blocks are interleaved pair by pair, so a thread reads each unit as
// one stream front to back (4 separate streams, one per block, took 6-9% longer at 1-4 rows: the
// hardware prefetcher follows one stream better; the same finding as the Q4_K rows, results/quant).
//
// Why: a decode step reads every weight once; oneDNN's prepacked bf16 linear reads them at ~16 GB/s
// on this project's 2-core Zen 4 at one row (~48 GB/s reachable), and its results depend on the row
// count. Here every output (m, n) is the same float32 sum, in the same order (pairs p = 0 .. K2-1,
// each lane its own products, bias added last), whatever M is and whichever tile computes it: the
// kernel is batch-invariant, so a request's tokens do not depend on what else is in the batch.
// The float32 sums are rounded to bf16 to nearest-even, as torch rounds.
//
// Work: units of 4 blocks (64 outputs; one thread's unit: its weight stays in L1/L2) x tiles of up
// to MR = 6 rows (24 accumulators + 4 weight vectors + a broadcast: 29 of the 32 registers; at one
// row, 4 independent accumulators hide vdpbf16ps' latency). On the 2-core Zen 4, SmolLM2's layer
// shapes: 0.5-0.7x oneDNN's time at 1-8 rows, 0.8-0.9x at 16-64, 0.93-1.11x at 512-2048
// (benchmarks/kernel/linear.py).
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#ifdef __AVX512BF16__
#include <immintrin.h>
#endif

namespace {

#ifdef __AVX512BF16__
constexpr int MR = 6;   // rows per tile
constexpr int NB = 4;   // 16-output blocks per unit

// Rows [0, R) of x (row stride ldx, in uint32 pairs) against the B interleaved blocks of one unit at
// wb (blocks past n are zeros) over all K2 pairs; writes out[r, 0 .. cols) (cols <= 16 B).
template <int R, int B>
inline void tile(const uint32_t* x, int64_t ldx, const uint16_t* wb, int64_t k2, const float* bias,
                 uint16_t* out, int64_t ldo, int64_t cols) {
  const auto* w = reinterpret_cast<const __m512i*>(wb);
  __m512 acc[R][B];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < B; ++j) acc[r][j] = _mm512_setzero_ps();
  for (int64_t p = 0; p < k2; ++p) {
    __m512bh a[B];
    for (int j = 0; j < B; ++j) a[j] = (__m512bh)_mm512_loadu_si512(w + p * B + j);
    for (int r = 0; r < R; ++r) {
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[r * ldx + p]));
      for (int j = 0; j < B; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], a[j], xb);
    }
  }
  for (int j = 0; j < B && 16 * j < cols; ++j) {
    const int64_t c = cols - 16 * j;
    const __mmask16 mk = c >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << c) - 1);
    const __m512 bj = bias ? _mm512_maskz_loadu_ps(mk, bias + 16 * j) : _mm512_setzero_ps();
    for (int r = 0; r < R; ++r) {
      const __m256i y = (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(acc[r][j], bj));   // round to nearest even
      _mm256_mask_storeu_epi16(out + r * ldo + 16 * j, mk, y);
    }
  }
}

using TileFn = void (*)(const uint32_t*, int64_t, const uint16_t*, int64_t, const float*, uint16_t*, int64_t, int64_t);

template <int... Rs>
constexpr auto table(std::integer_sequence<int, Rs...>) {
  return std::array<TileFn, sizeof...(Rs)>{&tile<Rs + 1, NB>...};
}
#endif

}  // namespace

bool bf16_gemm_available() {
#ifdef __AVX512BF16__
  return true;
#else
  return false;
#endif
}

torch::Tensor bf16_gemm(torch::Tensor x, torch::Tensor wp, int64_t n, c10::optional<torch::Tensor> bias) {
#ifdef __AVX512BF16__
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kBFloat16 && x.is_contiguous(), "x: contiguous bf16 [M, K]");
  TORCH_CHECK(wp.dim() == 5 && wp.scalar_type() == at::kBFloat16 && wp.is_contiguous() && wp.size(2) == NB &&
              wp.size(3) == 16 && wp.size(4) == 2, "wp: contiguous bf16 [U, K2, 4, 16, 2] (refengine.linear.pack_bf16)");
  const int64_t M = x.size(0), K = x.size(1), units = wp.size(0), k2 = wp.size(1);
  TORCH_CHECK(K == 2 * k2 && n > 16 * NB * (units - 1) && n <= 16 * NB * units, "bf16_gemm: x [", M, ", ", K,
              "] against a packed weight of ", 2 * k2, " inputs and ", units, " units of 64 for ", n, " outputs");
  const bool has_bias = bias.has_value() && bias->defined();
  TORCH_CHECK(!has_bias || (bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == n),
              "bias: contiguous float32 [", n, "]");
  auto out = torch::empty({M, n}, x.options());
  if (M == 0 || n == 0) return out;
  const auto* xp = reinterpret_cast<const uint32_t*>(x.data_ptr<at::BFloat16>());
  const auto* w = reinterpret_cast<const uint16_t*>(wp.data_ptr<at::BFloat16>());
  auto* op = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  const float* bp = has_bias ? bias->data_ptr<float>() : nullptr;
  static constexpr auto tiles = table(std::make_integer_sequence<int, MR>{});
  // Threads take whole units, several at decode row counts (a unit is then ~1-4 us of work).
  const int64_t grain = std::max<int64_t>(1, 16 / (NB * ((M + MR - 1) / MR)));
  at::parallel_for(0, units, grain, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t b0 = NB * u;
      const int64_t cols = std::min<int64_t>(16 * NB, n - 16 * b0);
      for (int64_t m0 = 0; m0 < M; m0 += MR) {
        const int rows = static_cast<int>(std::min<int64_t>(MR, M - m0));
        tiles[rows - 1](xp + m0 * k2, k2, w + b0 * k2 * 32, k2, bp ? bp + 16 * b0 : nullptr,
                        op + m0 * n + 16 * b0, n, cols);
      }
    }
  });
  return out;
#else
  TORCH_CHECK(false, "bf16_gemm: these kernels were built without AVX-512-BF16");
#endif
}
