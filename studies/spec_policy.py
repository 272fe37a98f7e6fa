"""Drafting policy of suffix decoding, simulated on recorded greedy outputs with the step-cost model.

    python -m studies.spec_policy --seeds 0 1 2 3 --out results/spec/policy

Greedy verification accepts a draft's longest prefix that equals the greedy continuation, and the
greedy continuation does not depend on the drafts (``spec_greedy_identical``), so once the outputs
are known every drafting policy can be replayed without the model: at each step the drafter
(``refengine.spec.Drafter``, the engine's own code) proposes from the request's tokens so far and the
corpus of earlier outputs, the step emits the accepted drafts + one token, and costs
``T0 + c x (1 + drafted)`` ms (``results/spec/knee.md``'s least-squares line; a step without a draft
is ``T0 + c``). The modelled speedup is (decode tokens x (T0 + c)) / sum of step costs. It leaves
out what the line does not hold (the drafter's own time, the server's work per streamed token), so
it reads higher than a served run; it ranks policies, it does not replace ``swiftserve bench serve spec``.

The outputs: ``--single`` requests of ``benchmarks/lib/spec_workload.py``'s prompt-heavy set per seed
(the bench's prompt_heavy_1 rounds use seeds 0, 1, ...), generated once by the in-process engine,
greedy, float32, one request at a time; the corpus sees them in that order. Writes
``<out>.json`` / ``<out>.md`` (every policy's steps, drafts, acceptance and modelled speedup).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

from benchmarks.lib.records import command_line, write_json

# (label, min match length, most drafted tokens at one request, max_spec_factor, min_token_prob)
POLICIES = [
    ("before (bigram match, 7 tokens)", 2, 7, 1.0, 0.1),
    ("bigram match, 7 tokens, p >= 0.3", 2, 7, 1.0, 0.3),
    ("bigram match, 7 tokens, spec factor 2", 2, 7, 2.0, 0.1),
    ("bigram match, 16 tokens", 2, 16, 1.0, 0.1),
    ("bigram match, 24 tokens (now)", 2, 24, 1.0, 0.1),
    ("one-token match, 7 tokens", 1, 7, 1.0, 0.1),
    ("one-token match, 24 tokens", 1, 24, 1.0, 0.1),
    ("one-token match, 24 tokens, p >= 0.3", 1, 24, 1.0, 0.3),
    ("one-token match, 24 tokens, spec factor 2", 1, 24, 2.0, 0.1),
]


def generate(model: str, seeds: list[int], single: int, max_tokens: int) -> list[dict]:
    """Greedy outputs of the prompt-heavy set: ``{"id", "prompt", "output"}`` per request."""
    from transformers import AutoTokenizer

    from benchmarks.lib.spec_workload import prompt_heavy_set
    from refengine.config import EngineConfig
    from refengine.engine import LLMEngine
    from refengine.sampling_params import SamplingParams

    tok = AutoTokenizer.from_pretrained(model)
    eng = LLMEngine(EngineConfig(model=model, dtype="float32", max_model_len=4096, max_num_seqs=4,
                                 kv_cache_memory_gb=1.0, speculative_config={"method": "suffix"}))
    out = []
    for seed in seeds:
        for i, spec in enumerate(prompt_heavy_set(single, seed=seed, max_tokens=max_tokens)[:single]):
            text = tok.apply_chat_template(spec.messages, tokenize=False, add_generation_prompt=True)
            ids = tok.encode(text, add_special_tokens=False)
            rid = f"s{seed}-{i}"
            eng.add_request(rid, ids, SamplingParams(max_tokens=max_tokens, temperature=0))
            toks, done = [], False
            while not done:
                for o in eng.step():
                    toks += o.new_token_ids
                    done = done or o.finish_reason is not None
            out.append({"id": rid, "prompt": ids, "output": toks})
            print(f"  {rid}: {len(ids)} prompt tokens, {len(toks)} output tokens", flush=True)
    return out


def simulate(records: list[dict], min_match: int, k_max: int, factor: float, min_prob: float,
             t0: float, c: float) -> dict:
    """Replay the drafter over ``records`` (in order, one at a time); the step counts and modelled times."""
    from refengine.spec.config import SpecConfig
    from refengine.spec.drafter import Drafter

    d = Drafter(SpecConfig.parse({"method": "suffix", "suffix_decoding_max_spec_factor": factor,
                                  "suffix_decoding_min_token_prob": min_prob}))
    d.min_match = min_match
    on = off = 0.0
    steps = empty = drafted = accepted = 0
    for rec in records:
        out = rec["output"]
        toks = list(rec["prompt"]) + out[:1]                 # the first token comes from the prefill step
        req = SimpleNamespace(request_id=rec["id"], token_ids=toks, max_model_len=1 << 30,
                              params=SimpleNamespace(max_tokens=len(out) + 1))
        j = 1
        while j < len(out):
            req.num_output_tokens, req.num_tokens = j, len(toks)
            draft = d._draft(req, k_max)
            a = 0
            while a < len(draft) and j + a < len(out) and draft[a] == out[j + a]:
                a += 1
            steps += 1
            empty += not draft
            drafted += len(draft)
            accepted += a
            on += t0 + c * (1 + len(draft))
            n = min(a + 1, len(out) - j)
            toks.extend(out[j:j + n])
            j += n
        off += (t0 + c) * max(0, len(out) - 1)
        d._index.pop(rec["id"], None)
        if d.corpus is not None:
            d.corpus.add(out)
    verify = steps - empty
    return {"steps": steps, "steps_without_draft": empty, "verification_steps": verify,
            "drafted_per_verification": drafted / max(1, verify), "accepted_per_verification": accepted / max(1, verify),
            "acceptance_rate": accepted / max(1, drafted), "modelled_speedup": off / on if on else 0.0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--single", type=int, default=4, help="requests of the prompt-heavy set per seed")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--knee", default="results/spec/knee.json", help="the step-cost line (spec_knee.py's fit)")
    ap.add_argument("--outputs", default=None, help="reuse recorded outputs (JSON) instead of generating them")
    ap.add_argument("--out", default="results/spec/policy")
    args = ap.parse_args(argv)
    from modelkit.models import resolve_model

    fit = json.loads(Path(args.knee).read_text())["fit"]
    t0, c = fit["fixed_ms"], fit["ms_per_row"]
    if args.outputs:
        records = json.loads(Path(args.outputs).read_text())
    else:
        records = generate(str(resolve_model(args.model)), args.seeds, args.single, args.max_tokens)
    rows = []
    for label, mm, k, f, p in POLICIES:
        r = simulate(records, mm, k, f, p, t0, c)
        rows.append({"policy": label, "min_match": mm, "max_draft_alone": k, "max_spec_factor": f,
                     "min_token_prob": p, **{n: round(v, 4) for n, v in r.items()}})
        print(f"  {label}: modelled {r['modelled_speedup']:.3f}x", flush=True)
    tokens = sum(len(x["output"]) for x in records)
    doc = {"command": command_line(argv), "step_ms": {"fixed": t0, "per_row": c}, "requests": len(records),
           "output_tokens": tokens, "policies": rows}
    write_json(args.out + ".json", doc)
    lines = ["# Suffix-decoding drafting policies, replayed on recorded greedy outputs", "", f"`{doc['command']}`", "",
             f"{len(records)} prompt-heavy requests (seeds {' '.join(map(str, args.seeds))}), {tokens} output tokens; "
             f"a step modelled as {t0:.1f} ms + {c:.3f} ms per verified row (knee.md).", "",
             "| policy | steps | steps without a draft | drafted / verification | accepted / verification "
             "| acceptance | modelled speedup |", "|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['policy']} | {r['steps']} | {r['steps_without_draft']} | {r['drafted_per_verification']:.2f} | "
              f"{r['accepted_per_verification']:.2f} | {r['acceptance_rate']:.3f} | **{r['modelled_speedup']:.3f}** |"
              for r in rows]
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
