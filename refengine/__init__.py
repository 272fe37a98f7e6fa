"""Reference engine: our own PyTorch LLM engine (CPU and CUDA).

Layout (one job per module):
  sampling_params, outputs   plain dataclasses shared with the HTTP edge (no torch)
  config                     EngineConfig, the one config object of an engine process
  model_config               HF config.json -> ModelSpec (incl. SwiftKV fields)
  model_families             what Qwen3 / Gemma 3 / windowed families switch on (no torch)
  block_manager, scheduler   token-count scheduling and paged-KV bookkeeping (no torch)
  block_groups               per-window block tables that free what the window left (no torch)
  kv/                        the KV cache, its storage and the KV methods
  attention, models/         paged attention (sliding windows included) and the decoder of every family
  attention_backend          the engine's one choice of attention metadata builder and kernels
  pool_sizing                KV pool block counts per table group from the budgets (no torch)
  spec/                      speculative decoding: suffix / n-gram drafts, back-off, verification
  sampler, model_runner      batch tensors, forward, sampling
  engine                     LLMEngine.step() = schedule -> run -> update
  async_engine               the engine on a background thread, asyncio streams

Importing this package does not import torch; only the modules that need
tensors do.
"""
