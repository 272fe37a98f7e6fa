"""The harness every benchmark shares (and the tests with them): ``procs`` (ports, starting, waiting
for and stopping servers, ``settle``), ``workloads`` (the one ``WORKLOADS`` table), ``records`` (the
command line, JSON files, ``summary.json`` merges, timers), ``ab`` (interleaved rounds, paired
ratios), ``profiling`` (CPU seconds, py-spy, torch's operator profiler), ``registry`` (every
benchmark by concern), and the data some share: ``lm_eval``, ``fuzz``, ``stub_worker``,
``model_shapes``, ``schema_suite``, ``spec_workload``."""
