"""Structured outputs and tool calling: the issue-37 figures of results/api/summary.json.

1. ``json_schema_valid_rate`` ({"reference": x, "vllm": y}): every schema of
   ``schema_suite`` (66 varied schemas: nested objects, arrays, enums, bounded numbers,
   optional fields, $refs, anyOf, nullable, const, pattern) sent to a worker of each engine
   as ``response_format: json_schema`` on /v1/chat/completions (temperature 0.7, a seed per
   schema, ``max_tokens`` 400, 8 at a time); the share whose output parses and validates.
2. ``tool_call_valid_rate``: the same workers, one tool per suite schema (its parameters),
   two tools offered (its own and the next schema's); the share of
   responses whose every call names an offered tool and whose arguments validate (a response
   without calls counts as invalid, e.g. one cut by ``max_tokens`` 400 while the model kept
   adding parallel calls). The modes rotate: "required" with parallel calls, "required"
   with ``parallel_tool_calls: false``, the named tool; ``rate_by_mode`` splits the figure. Reported as the mean of the engines' rates, each also
   under ``tool_call_valid_rate_by_engine``.
3. ``structured_throughput_ratio`` (reference engine, in this process): 16 chat requests of
   the suite submitted together, each with its JSON schema, vs the same 16 unconstrained,
   each unconstrained request generating exactly as many tokens as its constrained twin did
   (``ignore_eos``, ``max_tokens`` = that length) so the two batches do the same work
   except the masks; output tokens per second, median ratio of ``--rounds`` interleaved rounds.
4. ``mask_ms_per_token_p50``: the engine's mask time per constrained row and step
   (catch-up of the matcher + bitmask, on the grammar thread, beside the forward pass)
   during those constrained rounds; ``mask_wait_ms_per_step_p50`` is what the engine thread
   waited for the masks after the forward pass.

    python -m benchmarks quality api_structured --out results/api          # both engines; vLLM from .venv-vllm
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import jsonschema


from benchmarks.lib.procs import free_port, start, stop_groups
from benchmarks.lib.records import ROOT, merge_json, write_json
from benchmarks.lib.schema_suite import suite


def _start_worker(python: str, model: str, engine: str, log_dir: Path) -> tuple[subprocess.Popen, str]:

    port = free_port()
    args = [python, "-m", "worker", "--model", model, "--served-model-name", "m",
            "--max-model-len", "2048", "--max-num-seqs", "16", "--engine", engine]
    args += ["--kv-cache-memory-gb", "0.5"]
    proc = start(args, {}, port, log_dir / f"worker-{engine}.log", 900)
    return proc, f"http://127.0.0.1:{port}"


def _chat(url: str, body: dict) -> dict:
    r = httpx.post(url + "/v1/chat/completions", json={"model": "m", **body}, timeout=900)
    r.raise_for_status()
    return r.json()


def schema_validity(url: str, cases, parallel: int) -> dict:
    def one(i_case):
        i, case = i_case
        rf = {"type": "json_schema", "json_schema": {"name": case.name, "schema": case.schema, "strict": True}}
        out = _chat(url, {"messages": [{"role": "user", "content": case.prompt}], "response_format": rf,
                          "max_tokens": 400, "temperature": 0.7, "seed": i})
        text = out["choices"][0]["message"]["content"]
        try:
            jsonschema.validate(json.loads(text), case.schema)
            return case.name, True, out["usage"]["completion_tokens"]
        except (json.JSONDecodeError, jsonschema.ValidationError, TypeError):
            return case.name, False, text[:200]

    with cf.ThreadPoolExecutor(parallel) as ex:
        results = list(ex.map(one, enumerate(cases)))
    bad = {name: detail for name, ok, detail in results if not ok}
    return {"rate": (len(results) - len(bad)) / len(results), "n": len(results), "invalid": bad}


# tool_choice "required" with parallel calls allowed, "required" with parallel_tool_calls false, a named tool.
MODES = ("required_parallel", "required_single", "named")


def _tool(case) -> dict:
    return {"type": "function", "function": {"name": f"record_{case.name}", "description": case.prompt,
                                             "parameters": case.schema}}


def tool_validity(url: str, cases, parallel: int) -> dict:
    def one(i_case):
        i, case = i_case
        other = cases[(i + 1) % len(cases)]
        tools = [_tool(case), _tool(other)]
        mode = MODES[i % len(MODES)]
        choice = {"type": "function", "function": {"name": f"record_{case.name}"}} if mode == "named" else "required"
        out = _chat(url, {"messages": [{"role": "user", "content": case.prompt + " Use a tool."}], "tools": tools,
                          "tool_choice": choice, "parallel_tool_calls": mode != "required_single",
                          "max_tokens": 400, "temperature": 0.7, "seed": i})
        choice0 = out["choices"][0]
        calls = choice0["message"].get("tool_calls") or []
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
        try:
            assert calls, f"no calls (finish_reason {choice0['finish_reason']})"
            for c in calls:
                jsonschema.validate(json.loads(c["function"]["arguments"]), schemas[c["function"]["name"]])
            return case.name, mode, None
        except (AssertionError, KeyError, json.JSONDecodeError, jsonschema.ValidationError) as exc:
            return case.name, mode, f"{type(exc).__name__}: {str(exc)[:200]}; content {str(choice0['message']['content'])[:200]}"

    with cf.ThreadPoolExecutor(parallel) as ex:
        results = list(ex.map(one, enumerate(cases)))
    bad = {name: why for name, _, why in results if why is not None}
    by_mode = {m: statistics.fmean(why is None for _, mm, why in results if mm == m)
               for m in MODES if any(mm == m for _, mm, _ in results)}
    return {"rate": (len(results) - len(bad)) / len(results), "n": len(results), "rate_by_mode": by_mode,
            "invalid": bad}


def throughput(model: str, cases, rounds: int, threads: int | None) -> dict:
    from transformers import AutoTokenizer

    from refengine.config import EngineConfig
    from refengine.engine import LLMEngine
    from refengine.sampling_params import SamplingParams
    from refengine.structured.spec import StructuredSpec

    tok = AutoTokenizer.from_pretrained(model)
    eng = LLMEngine(EngineConfig(model=model, max_model_len=2048, num_kv_blocks=1024, max_num_seqs=16,
                                 torch_threads=threads))
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": c.prompt}], tokenize=False,
                                                  add_generation_prompt=True), add_special_tokens=False)
               for c in cases]
    con = [SamplingParams(max_tokens=300, temperature=0.7, seed=i,
                          structured=StructuredSpec("json", json.dumps(c.schema)))
           for i, c in enumerate(cases)]

    def run(params) -> tuple[float, list[int]]:
        t0 = time.perf_counter()
        outs = eng.generate(prompts, params)
        return time.perf_counter() - t0, [len(o) for o in outs]

    run(con)                                                          # warm-up (compiles the grammars)
    masks = eng.runner.grammar
    ratios, con_tps, free_tps, lengths = [], [], [], None
    masks.mask_ms.clear()
    masks.wait_ms.clear()
    for _ in range(rounds):
        t_con, lengths = run(con)
        free = [SamplingParams(max_tokens=n, temperature=0.7, seed=i, ignore_eos=True) for i, n in enumerate(lengths)]
        t_free, free_lengths = run(free)
        assert free_lengths == lengths, (free_lengths, lengths)
        n = sum(lengths)
        con_tps.append(n / t_con)
        free_tps.append(n / t_free)
        ratios.append((n / t_con) / (n / t_free))
    return {"ratio": statistics.median(ratios), "ratios": ratios, "constrained_tok_s": con_tps,
            "unconstrained_tok_s": free_tps, "output_tokens": lengths,
            "mask_ms_per_token_p50": statistics.median(masks.mask_ms),
            "mask_ms_per_token_p90": statistics.quantiles(masks.mask_ms, n=10)[8],
            "mask_wait_ms_per_step_p50": statistics.median(masks.wait_ms),
            "grammars_compiled": masks.compiled, "grammar_cache_hits": masks.cache_hits}


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="default")
    ap.add_argument("--engines", nargs="*", default=["reference", "vllm"])
    ap.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm/bin/python"))
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch threads of the in-process engine")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--skip-tools", action="store_true")
    ap.add_argument("--skip-json", action="store_true", help="no json_schema_valid_rate run")
    ap.add_argument("--keep-logs", action="store_true", help="keep the workers' logs (the path is printed)")
    ap.add_argument("--limit", type=int, default=None, help="first N schemas only (a smoke run)")
    ap.add_argument("--out", default="results/api")


def main(args: argparse.Namespace) -> int:
    from modelkit.models import resolve_model

    model = str(resolve_model(args.model))
    cases = suite()[:args.limit]
    doc = {"command": args.command, "model": model, "schemas": len(cases), "loadavg_before": os.getloadavg(),
           "engines": {}}
    tmp = tempfile.mkdtemp(prefix="api-structured-")
    if args.keep_logs:
        print(f"worker logs in {tmp}", flush=True)
    try:
        for engine in args.engines:
            python = sys.executable if engine == "reference" else args.vllm_python
            t0 = time.perf_counter()
            proc, url = _start_worker(python, model, engine, Path(tmp))
            try:
                r = doc["engines"][engine] = {"start_s": time.perf_counter() - t0}
                if not args.skip_json:
                    r["json_schema"] = schema_validity(url, cases, args.parallel)
                    print(f"{engine}: json_schema_valid_rate {r['json_schema']['rate']:.3f} "
                          f"({r['json_schema']['n']} schemas)", flush=True)
                if not args.skip_tools:
                    r["tools"] = tool_validity(url, cases, args.parallel)
                    print(f"{engine}: tool_call_valid_rate {r['tools']['rate']:.3f} {r['tools']['rate_by_mode']}",
                          flush=True)
            finally:
                stop_groups([proc], 60)
    finally:
        if not args.keep_logs:
            shutil.rmtree(tmp, ignore_errors=True)
    if not args.skip_throughput:
        t = doc["throughput"] = throughput(model, suite()[:16], args.rounds, args.threads)
        print(f"reference: structured_throughput_ratio {t['ratio']:.3f} (rounds {['%.3f' % x for x in t['ratios']]}), "
              f"mask p50 {t['mask_ms_per_token_p50']:.3f} ms/token, wait p50 {t['mask_wait_ms_per_step_p50']}",
              flush=True)
    doc["loadavg_after"] = os.getloadavg()
    # Runs may measure parts (engines, tools, throughput): each merges what it measured with what
    # earlier runs left, in api_structured.json (per part) and in summary.json.
    out = Path(args.out)
    detail_path = out / "api_structured.json"
    detail = json.loads(detail_path.read_text()) if detail_path.exists() else {}
    runs = detail.get("runs", [])
    runs.append({k: doc[k] for k in ("command", "loadavg_before", "loadavg_after")})
    engines = detail.get("engines", {})
    for e, r in doc["engines"].items():
        engines[e] = {**engines.get(e, {}), **r}
    detail.update({"model": model, "schemas": len(cases), "runs": runs, "engines": engines})
    if "throughput" in doc:
        detail["throughput"] = doc["throughput"]
    write_json(detail_path, detail)
    summary = {}
    valid = {e: round(r["json_schema"]["rate"], 4) for e, r in engines.items() if "json_schema" in r}
    if valid:
        summary["json_schema_valid_rate"] = valid
    tools = {e: round(r["tools"]["rate"], 4) for e, r in engines.items() if "tools" in r}
    if tools:
        summary["tool_call_valid_rate"] = round(statistics.fmean(tools.values()), 4)
        summary["tool_call_valid_rate_by_engine"] = tools
    if "throughput" in doc:
        summary["structured_throughput_ratio"] = round(doc["throughput"]["ratio"], 4)
        summary["mask_ms_per_token_p50"] = round(doc["throughput"]["mask_ms_per_token_p50"], 4)
    merge_json(out / "summary.json", summary)
    return 0
