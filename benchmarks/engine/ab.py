"""A/B of two engine configurations in one process, on the serving workloads (no HTTP).

    python -m benchmarks engine ab --set packed_linear=off packed_linear=all --threads 2 \
        --workloads decode_128_128 prefill_1024_32 --rounds 3 --out results/perf/profiles/ab_packed_linear.json

Builds engine A and engine B (EngineConfig overrides ``--set A B``, each ``KEY=VALUE[,KEY=VALUE]``,
and optionally KV methods ``--kv-methods A B``, each a JSON object as the worker takes it, ``{}`` for none),
then for every round and workload runs A and B in turn on the same prompts (all submitted
at once, ``ignore_eos``, greedy), and reports per configuration the median wall time,
decode-step and prefill-step medians, and the ratio B / A. Both engines must produce the
same greedy tokens when the option is meant to be exact (``--check-tokens``).
"""

from __future__ import annotations

import argparse
import json

from benchmarks.lib.records import UsageError, write_json
from benchmarks.engine.profile import run_once
from benchmarks.lib.ab import interleaved, medians
from benchmarks.lib.workloads import ENGINE, WORKLOADS


def parse_set(text: str) -> dict:
    out = {}
    for item in filter(None, text.split(",")):
        k, _, v = item.partition("=")
        out[k] = int(v) if v.lstrip("-").isdigit() else {"true": True, "false": False}.get(v, v)
    return out


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="default")
    ap.add_argument("--set", nargs=2, default=["", ""], metavar=("A", "B"),
                    help="EngineConfig overrides of A and B, each KEY=VALUE[,KEY=VALUE] ('' for none)")
    ap.add_argument("--kv-methods", nargs=2, default=None, metavar=("A", "B"),
                    help="KV methods of A and B, each a JSON object ('{}' for none), e.g. "
                         "'{}' '{\"zack\": {\"calibration\": \"DIR\", \"rate\": 0.5}}'")
    ap.add_argument("--workloads", nargs="+", choices=sorted(ENGINE), default=["decode_128_128"])
    ap.add_argument("--prompts", type=int, default=None, help="override every workload's prompt count")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--check-tokens", action="store_true")
    ap.add_argument("--out", default=None)


def main(args: argparse.Namespace) -> int:
    from modelkit.models import resolve_model
    from refengine.config import EngineConfig
    from refengine.engine import LLMEngine

    model = str(resolve_model(args.model))
    sets = [parse_set(s) for s in args.set]
    if args.kv_methods:
        for s, text in zip(sets, args.kv_methods):
            methods = json.loads(text)
            if not isinstance(methods, dict):
                raise UsageError(f"--kv-methods takes JSON objects, not {text!r}")
            if methods:
                s["kv_methods"] = methods
    if sets[0] == sets[1]:
        raise UsageError("A and B are the same configuration: give --set and/or --kv-methods that differ")
    engines = [LLMEngine(EngineConfig(model=model, max_model_len=2048, torch_threads=args.threads, **s)) for s in sets]
    prompts = {"decode_128_128": 32, "prefill_1024_32": 16, "chat_256_16": 16, "decode_1024_128": 16}
    res: dict = {"command": args.command,
                 "A": sets[0], "B": sets[1], "workloads": {}}
    for eng in engines:                                                   # warm-up
        run_once(eng, 64, 4, 2, seed=99)
    for wl in args.workloads:
        n_in, n_out = WORKLOADS[wl][:2]
        n = args.prompts or prompts.get(wl, 16)

        def one(label: str, r: int) -> dict:
            return run_once(engines["AB".index(label)], n_in, n_out, n, seed=r)

        runs = interleaved("AB", args.rounds, one)          # A and B alternate which goes first
        summ = {label: medians(rr, ("wall_s", "decode_step_median_ms", "prefill_step_median_ms"))
                for label, rr in runs.items()}
        summ["ratio_B_over_A"] = {k: summ["B"][k] / summ["A"][k] for k in summ["A"]}
        res["workloads"][wl] = {"prompts": n, **summ}
        print(wl, json.dumps(summ), flush=True)
    if args.check_tokens:
        from refengine.sampling_params import SamplingParams

        outs = []
        for eng in engines:
            eng.add_request("check", list(range(100, 400)), SamplingParams(max_tokens=32, temperature=0))
            toks: list[int] = []
            while eng.has_unfinished():
                for o in eng.step():
                    toks += o.new_token_ids
            outs.append(toks)
        res["same_greedy_tokens"] = outs[0] == outs[1]
        print("same greedy tokens:", res["same_greedy_tokens"])
    if args.out:
        write_json(args.out, res)
    return 0
