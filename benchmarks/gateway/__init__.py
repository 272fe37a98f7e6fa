"""Benchmarks of the gateway: overhead, routing, pools, failover (``swiftserve bench gateway ...``)."""
