"""Gateway: an OpenAI-compatible front door that routes each request to the worker with
the shortest queue. Works with our workers and with stock `vllm serve` (same metric names).
It never imports torch."""
