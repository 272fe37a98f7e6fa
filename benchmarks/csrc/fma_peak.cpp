// The float32 FMA peak loop of benchmarks/cpu_peak.py (built by refengine.paged_kernel.load_extension).
// GCC vector extensions, the same style as refengine/csrc; -march=native picks the widest FMA.
#include <torch/extension.h>
#include <omp.h>

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

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("fma_peak", &fma_peak); }
