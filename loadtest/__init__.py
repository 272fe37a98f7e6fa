"""Load tests: open-loop (Poisson/gamma) streaming load generator with vLLM `bench serve`
metric definitions, rate sweeps, comparison reports with plots, and a Locust file."""
