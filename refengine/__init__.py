"""Reference engine: our own PyTorch LLM engine (CPU and CUDA).

Layout (one job per module):
  sampling_params, outputs   plain dataclasses shared with the HTTP edge (no torch)
  config                     EngineConfig, the one config object of an engine process
  model_config               HF config.json -> ModelSpec (incl. SwiftKV fields)
  block_manager, scheduler   token-count scheduling and paged-KV bookkeeping (no torch)
  kv_cache                   the KV cache interface and its storage implementations
  attention, models/         paged attention and the Llama-family model
  sampler, model_runner      batch tensors, forward, sampling
  engine                     LLMEngine.step() = schedule -> run -> update
  async_engine               the engine on a background thread, asyncio streams

Importing this package does not import torch; only the modules that need
tensors do.
"""
