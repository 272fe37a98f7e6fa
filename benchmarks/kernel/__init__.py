"""Kernel and GEMM benchmarks on one layer's shapes (``swiftserve bench kernel ...``)."""
