"""Benchmarks of the served stack over HTTP (``swiftserve bench serve ...``)."""
