"""The harness every benchmark shares: processes and servers (``procs``), workloads, records with the
command line, and the registry of benchmarks."""
