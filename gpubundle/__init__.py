"""An offline, air-gapped GPU validation bundle for SwiftServe: a maintainer's tool beside the
product, not part of it (not in the wheel; no product package imports it). Run from the
repository root: ``python -m gpubundle {pack,check,self-test,...}`` (``python -m`` puts the root on
``sys.path``; ``make gpu-check`` sets ``PYTHONPATH=.``).

The GPU machine it is made for has CUDA, torch, triton and transformers but no network and no
vLLM, and takes files in only as a copy of the working tree plus a size-limited carry per
command. Here: ``make gpu-park`` (the checkpoint tensors out of the tree) and ``make gpu-pack``
(wheels, windows, the model and vLLM in parts that fit the carry); there: ``make gpu-check``, once
per part, runs the reference engine's CUDA tests (``tests/gpu``), ``python -m benchmarks engine gpu``,
vLLM with the plugin and a time-boxed, resumable SwiftKV distillation, and writes a small output
folder (results, logs, the distilled tensors); here again: ``make gpu-unpark``.

Modules: ``limits`` (what may travel and come back), ``park`` (the checkpoint tensors moved out
of the tree while a session runs, and back), ``pack`` (files in parts that fit a
command's carry; joined and verified there), ``payloads`` (what the pack carries: wheels,
windows, the model), ``random_model`` (random-weights checkpoints), ``stages`` and
``distill_stage`` (the work), ``session`` (order, budget, state), ``collect`` (the output
folder), ``cli`` and ``selftest`` (the CPU self-test of all of it). Importing this package
imports no torch; the stages run torch in subprocesses.
"""
