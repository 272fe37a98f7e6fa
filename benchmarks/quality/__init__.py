"""Quality benchmarks: quantized formats, scoring, structured outputs (``swiftserve bench quality ...``)."""
