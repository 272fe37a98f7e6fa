"""SwiftServe's maintained benchmarks, run as ``swiftserve bench <concern> <name>`` (or ``python -m
benchmarks``): ``serve``, ``engine``, ``kernel``, ``gateway``, ``quality`` and ``report`` hold one
module a benchmark; ``lib`` is the harness they share (processes and servers, workloads, records
with the command line, the registry). The one-off studies live in ``studies/``, outside the wheel.
"""
