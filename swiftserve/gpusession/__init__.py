"""One command for a GPU session: ``make gpu-park`` and ``make gpu-pack`` here, ``make gpu-check``
there, ``make gpu-unpark`` here again.

For a machine with CUDA, torch, triton and transformers but no network and no vLLM (a lent
GPU machine with a copy of the working tree): ``gpu-check`` runs the reference engine's
CUDA tests (``tests/gpu``), ``benchmarks/gpu_bench.py`` and a time-boxed, resumable SwiftKV
distillation, and writes a small output folder (results, logs, the distilled tensors).

Modules: ``limits`` (what may travel and come back), ``park`` (the checkpoint tensors moved out
of the tree while a session runs, and back), ``pack`` (files in parts that fit a
command's carry; joined and verified there), ``payloads`` (what the pack carries: wheels,
windows, the model), ``random_model`` (random-weights checkpoints), ``stages`` and
``distill_stage`` (the work), ``session`` (order, budget, state), ``collect`` (the output
folder), ``cli`` and ``selftest`` (the CPU self-test of all of it). Importing this package
imports no torch; the stages run torch in subprocesses.
"""
