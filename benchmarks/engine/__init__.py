"""Benchmarks of one engine in process, no HTTP (``swiftserve bench engine ...``)."""
