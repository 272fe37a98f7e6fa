"""Worker: the OpenAI-compatible HTTP server hosting one engine (same surface as `vllm serve`)."""
