// The peak loops of benchmarks/cpu_peak.py (built by refengine.paged_kernel.load_extension):
// float32 FMAs (GCC vector extensions, the same style as refengine/csrc; -march=native picks the
// widest FMA) and, where the CPU has AVX-512-BF16, the bf16 dot-product instruction oneDNN's
// bf16 GEMMs use (vdpbf16ps: 16 float32 lanes, each += two bf16 products).
#include <torch/extension.h>
#include <omp.h>
#ifdef __AVX512BF16__
#include <immintrin.h>
#endif

typedef float v16 __attribute__((vector_size(64)));

// Returns {seconds, checksum} of `iters` iterations on `threads` threads (each iteration: one
// FMA on each of 16 chains of 16 floats); the checksum keeps the chains alive through the optimiser.
std::vector<double> fma_peak(int64_t iters, int64_t threads) {
    double sink = 0.0;
    double t0 = omp_get_wtime();
    #pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
        v16 acc[16];
        v16 x, y;
        for (int l = 0; l < 16; ++l) { x[l] = 0.999999f; y[l] = 1e-7f; }
        for (int j = 0; j < 16; ++j)
            for (int l = 0; l < 16; ++l) acc[j][l] = 1.0f + 0.001f * (j + l + omp_get_thread_num());
        for (int64_t it = 0; it < iters; ++it) {
            #pragma GCC unroll 16
            for (int j = 0; j < 16; ++j) acc[j] = acc[j] * x + y;    // one FMA per chain
        }
        for (int j = 0; j < 16; ++j)
            for (int l = 0; l < 16; ++l) sink += acc[j][l];
    }
    double dt = omp_get_wtime() - t0;
    return {dt, sink};
}

// The same shape with vdpbf16ps: 16 chains, each iteration one dot-product instruction per chain
// (16 lanes x 2 products x 2 flops = 64 flops). Returns {} where the build has no AVX-512-BF16.
std::vector<double> bf16_peak(int64_t iters, int64_t threads) {
#ifdef __AVX512BF16__
    double sink = 0.0;
    double t0 = omp_get_wtime();
    #pragma omp parallel num_threads(threads) reduction(+ : sink)
    {
        __m512 acc[16];
        const __m512bh x = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.999f), _mm512_set1_ps(0.999f));
        const __m512bh y = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-7f), _mm512_set1_ps(1e-7f));
        for (int j = 0; j < 16; ++j) acc[j] = _mm512_set1_ps(1.0f + 0.001f * (j + omp_get_thread_num()));
        for (int64_t it = 0; it < iters; ++it) {
            #pragma GCC unroll 16
            for (int j = 0; j < 16; ++j) acc[j] = _mm512_dpbf16_ps(acc[j], x, y);
        }
        for (int j = 0; j < 16; ++j) sink += _mm512_reduce_add_ps(acc[j]);
    }
    double dt = omp_get_wtime() - t0;
    return {dt, sink};
#else
    (void)iters;
    (void)threads;
    return {};
#endif
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("fma_peak", &fma_peak);
    m.def("bf16_peak", &bf16_peak);
}
