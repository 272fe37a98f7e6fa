"""``modelkit eval``: compare a transformed model with its original on the same inputs.

Everything runs through the reference engine, so KV methods are measured where they
act: in the cache.
  ppl           perplexity of held-out continuations scored *through the cache*: the
                prefix is prefilled, each continuation token is a decode step
  top1          teacher-forced next-token argmax agreement with the original
  kl            mean KL(original || model) of next-token distributions (same positions)
  greedy        greedy generation from held-out chat prompts vs the original's:
                position-wise token agreement, mean common-prefix fraction, exact match
  tasks         task suite with exact answers (modelkit.tasks: arithmetic, copy, sequence,
                capital, reading comprehension; ``--task-items`` per kind, the default 25
                keeps the earlier suite's items and cost), two figures:
                ``task_accuracy``: share of the items the original solves that the model
                still solves (strict: a model's own extra solves do not count);
                ``task_accuracy_relative``: the model's accuracy over all items divided
                by the original's (accuracy relative to the original's, as papers report)
  needle        needle-in-a-haystack retrieval at ``--needle-context`` tokens
                (modelkit.needle), on the items the original answers correctly
Base models (a tokenizer without a chat template, e.g. Gemma 3 270M) get the same items as
completion prompts: a task is ``Question: <prompt>\nAnswer:``, and greedy generation starts from
the first 64 tokens of held-out documents (held-out chats are skipped in scoring too).
95% intervals (modelkit.eval_stats): bootstrap over scored sequences for ppl increase,
KL and top-1 agreement (``*_ci``); Wilson for task accuracy; a paired bootstrap over
items for the relative task accuracy.
KV methods (``--kv-methods``) apply to the evaluated models and are validated before
anything loads; an option given as a JSON list is swept (one evaluation per combination),
and a JSON list of method objects evaluates each in turn (``{}`` = no method).
``--join-docs`` builds long prompts RAG-style, by joining held-out passages.
``--metrics`` picks what runs (sweeps that only need perplexity skip the rest).
Each result also carries the KV bytes per token a 16-bit cache of the same
configuration would store (planned, torch-free), for ratios against a 16-bit cache.
Writes a JSON file and a markdown table; prints the table.
"""

from __future__ import annotations

import math
from pathlib import Path

from modelkit.corpus import chat_ids, iter_chat, iter_docs


def _engine(model_dir: Path, overrides: dict, max_model_len: int):
    from refengine.config import EngineConfig
    from refengine.engine import LLMEngine

    kw = dict(max_model_len=max_model_len, kv_cache_memory_gb=3.0, max_num_seqs=32)
    kw.update(overrides)
    return LLMEngine(EngineConfig(model=str(model_dir), **kw))


def scoring_items(corpus: Path, tok, n: int, prefix: int, cont: int, seed: int,
                  join_docs: bool = False) -> list[tuple[list[int], list[int]]]:
    """Held-out (prefix, continuation) pairs from documents and teacher chats.

    ``join_docs``: each sequence is held-out passages joined by blank lines until it is long
    enough (a multi-passage, RAG-style context), so prompts longer than one document exist.
    """
    import random

    seqs = []
    for d in iter_docs(corpus, "heldout"):
        seqs.append(tok(d["text"])["input_ids"])
    if join_docs:
        rng, sep = random.Random(seed), tok("\n\n", add_special_tokens=False)["input_ids"]
        rng.shuffle(seqs)
        joined, cur = [], []
        for s in seqs:
            cur = cur + sep + s if cur else list(s)
            if len(cur) >= prefix + cont:
                joined.append(cur)
                cur = []
        seqs = joined
    elif tok.chat_template:
        for c in iter_chat(corpus, "heldout"):
            seqs.append(chat_ids(tok, c["messages"]))
    seqs = [s for s in seqs if len(s) >= prefix + cont]
    random.Random(seed).shuffle(seqs)
    if len(seqs) < n:
        raise SystemExit(f"only {len(seqs)} held-out sequences of >= {prefix + cont} tokens in {corpus}")
    return [(s[:prefix], s[prefix:prefix + cont]) for s in seqs[:n]]


def chat_prompts(corpus: Path, tok, n: int, max_prompt: int) -> list[list[int]]:
    out: list[list[int]] = []
    if n <= 0:
        return out
    if not tok.chat_template:                   # a base model: openings of held-out documents
        for d in iter_docs(corpus, "heldout"):
            ids = tok(d["text"])["input_ids"]
            if len(ids) >= 64:
                out.append(ids[:64])
            if len(out) == n:
                break
        return out
    for c in iter_chat(corpus, "heldout"):
        t = chat_ids(tok, c["messages"][:1], add_generation_prompt=True)
        if len(t) <= max_prompt:
            out.append(t)
        if len(out) == n:
            break
    return out


def score_metrics(base_scores, model_scores) -> dict:
    import torch

    from modelkit.eval_stats import bootstrap, per_sequence

    s = per_sequence(base_scores, model_scores)
    n = float(s["n"].sum())
    ppl_b, ppl_m = math.exp(float(s["nll_b"].sum()) / n), math.exp(float(s["nll_m"].sum()) / n)
    kl_n = float(s["kl_n"].sum())
    out = {"ppl_baseline": ppl_b, "ppl": ppl_m, "ppl_increase_pct": 100 * (ppl_m / ppl_b - 1),
           "top1_agreement": float(s["agree"].sum()) / n, "kl": float(s["kl"].sum()) / kl_n if kl_n else None,
           "positions": int(n), "sequences": len(s["n"]), "torch": torch.__version__}
    out.update({f"{k}_ci": v for k, v in bootstrap(s).items()})
    return out


def greedy_metrics(base_out, model_out) -> dict:
    if not base_out:
        return {"greedy_token_agreement": None, "greedy_prefix_agreement": None, "greedy_exact_match": None}
    pos = tot = 0
    prefix_frac, exact = [], 0
    for a, b in zip(base_out, model_out):
        n = max(len(a), len(b))
        pos += sum(x == y for x, y in zip(a, b))
        tot += n
        common = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        prefix_frac.append(common / n if n else 1.0)
        exact += a == b
    return {"greedy_token_agreement": pos / tot, "greedy_prefix_agreement": sum(prefix_frac) / len(prefix_frac),
            "greedy_exact_match": exact / len(base_out)}


def run_tasks(engine, tok, tasks, max_tokens: int = 24) -> list[bool]:
    from refengine.sampling_params import SamplingParams

    prompts = [chat_ids(tok, [{"role": "user", "content": t.prompt}], add_generation_prompt=True)
               if tok.chat_template else tok(f"Question: {t.prompt}\nAnswer:")["input_ids"] for t in tasks]
    outs = engine.generate(prompts, SamplingParams(max_tokens=max_tokens, temperature=0))
    return [t.correct(tok.decode(o, skip_special_tokens=True)) for t, o in zip(tasks, outs)]


METRICS = ("ppl", "greedy", "tasks", "needle")


def bytes_16bit(model: Path, overrides: dict) -> tuple[float, float]:
    """(device, host) KV bytes per token the same configuration plans with a 16-bit compute dtype."""
    from refengine.kv import registry

    bs = overrides.get("block_size") or registry.default_block_size(overrides.get("kv_methods"))
    facts = registry.facts_for(model, overrides.get("swiftkv", True), elem_bytes=2, block_size=bs)
    spec = registry.validate(overrides.get("kv_methods") or {}, facts, overrides.get("kv_cache_dtype", "auto")).spec
    return spec.device_bytes_per_token, spec.host_bytes_per_token


class Evaluation:
    """Baseline figures computed once; ``compare(model)`` runs one transformed model against them."""

    def __init__(self, baseline: Path, corpus: Path, n_score: int = 64, prefix: int = 256, cont: int = 64,
                 n_gen: int = 32, gen_tokens: int = 64, seed: int = 0, baseline_overrides: dict | None = None,
                 join_docs: bool = False, metrics: tuple[str, ...] = ("ppl", "greedy", "tasks"),
                 n_needle: int = 0, needle_context: int = 2048,
                 task_items: int = 25):
        from transformers import AutoTokenizer

        from modelkit.tasks import make_tasks
        from refengine.sampling_params import SamplingParams

        self.baseline = baseline
        self.metrics = tuple(metrics)
        self.tok = AutoTokenizer.from_pretrained(baseline)
        self.items = scoring_items(corpus, self.tok, n_score, prefix, cont, seed, join_docs) \
            if "ppl" in metrics else []
        self.prompts = chat_prompts(corpus, self.tok, n_gen, 900) if "greedy" in metrics else []
        self.greedy = SamplingParams(max_tokens=gen_tokens, temperature=0)
        self.max_len = max(prefix + cont + gen_tokens + 1024, needle_context + 64 if n_needle else 0)
        self.setup = {"score_items": n_score, "prefix_tokens": prefix, "continuation_tokens": cont,
                      "join_docs": join_docs, "metrics": list(self.metrics),
                      "greedy_prompts": len(self.prompts), "greedy_tokens": gen_tokens, "seed": seed}
        base = _engine(baseline, baseline_overrides or {}, self.max_len)
        self.scores = self._score(base) if self.items else []
        self.gen = base.generate(self.prompts, self.greedy) if self.prompts else []
        self.tasks_total, self.tasks, self.all_tasks, self.base_oks = 0, [], [], []
        if "tasks" in metrics:
            self.setup["task_items_per_kind"] = task_items
            self.all_tasks = make_tasks(task_items, seed=seed)
            self.tasks_total = len(self.all_tasks)
            self.base_oks = run_tasks(base, self.tok, self.all_tasks)
            self.tasks = [t for t, ok in zip(self.all_tasks, self.base_oks) if ok]
        self.needles, self.needles_total = [], 0
        if "needle" in metrics and n_needle:
            from modelkit import needle

            items = needle.make_items(corpus, self.tok, n_needle, needle_context, seed)
            self.needles_total = len(items)
            self.needles = [it for it, ok in zip(items, needle.correct(base, self.tok, items)) if ok]
            self.setup.update({"needle_items": n_needle, "needle_context": needle_context,
                               "needle_baseline_accuracy": len(self.needles) / n_needle})
        self.kv_bytes = base.stats().kv_bytes_per_token

    def _score(self, engine) -> list:
        out = []
        for i in range(0, len(self.items), 16):          # full logprob rows: keep batches small
            out += engine.score(self.items[i:i + 16], want_dist=True)
        return out

    def compare(self, model: Path, overrides: dict) -> dict:
        eng = _engine(model, overrides, self.max_len)
        result: dict = {"model": str(model), "baseline": str(self.baseline), "overrides": overrides}
        if self.items:
            result.update(score_metrics(self.scores, self._score(eng)))
        result.update(greedy_metrics(self.gen, eng.generate(self.prompts, self.greedy) if self.gen else []))
        # Every item runs, so the model's solves of items the original misses count in the
        # relative figure; the strict figure reads the original's solved items only.
        oks_all = run_tasks(eng, self.tok, self.all_tasks) if self.tasks else []
        oks = [ok for ok, b in zip(oks_all, self.base_oks) if b]
        by_kind: dict[str, list[bool]] = {}
        for t, ok in zip(self.tasks, oks):
            by_kind.setdefault(t.kind, []).append(ok)
        from modelkit.eval_stats import paired_ratio, wilson

        rel, rel_ci = paired_ratio(self.base_oks, oks_all) if oks_all else (None, None)
        result.update({"tasks_kept": len(self.tasks), "tasks_total": self.tasks_total,
                       "task_accuracy": sum(oks) / len(oks) if oks else None,
                       "task_accuracy_ci": wilson(sum(oks), len(oks)),
                       "task_accuracy_relative": rel, "task_accuracy_relative_ci": rel_ci,
                       "tasks_solved_model": sum(oks_all) if oks_all else None,
                       "tasks_solved_only_by_model": sum(o and not b for o, b in zip(oks_all, self.base_oks)),
                       "tasks_kept_by_kind": {k: len(v) for k, v in by_kind.items()},
                       "task_accuracy_by_kind": {k: sum(v) / len(v) for k, v in by_kind.items()}})
        if self.needles:
            from modelkit import needle

            hits = needle.correct(eng, self.tok, self.needles)
            result.update({"needles_kept": len(self.needles), "needle_accuracy": sum(hits) / len(hits)})
        stats = eng.stats()
        dev16, host16 = bytes_16bit(model, overrides)
        result.update({"kv_bytes_per_token": stats.kv_bytes_per_token,
                       "kv_host_bytes_per_token": stats.extra.get("kv_host_bytes_per_token", 0.0),
                       "kv_bytes_per_token_baseline": self.kv_bytes,
                       "kv_bytes_per_token_16bit": dev16, "kv_host_bytes_per_token_16bit": host16,
                       "kv_method_stats": {k: v for k, v in stats.extra.items() if not k.startswith(("kv_", "swiftkv"))},
                       "setup": self.setup})
        return result


ROWS = [("ppl through cache", "ppl", "{:.3f}"), ("ppl increase vs original", "ppl_increase_pct", "{:+.2f}%"),
        ("top-1 agreement (teacher-forced)", "top1_agreement", "{:.1%}"), ("KL(original || model)", "kl", "{:.4f}"),
        ("greedy token agreement", "greedy_token_agreement", "{:.1%}"),
        ("greedy common-prefix agreement", "greedy_prefix_agreement", "{:.1%}"),
        ("greedy exact match", "greedy_exact_match", "{:.1%}"),
        ("task accuracy (items the original solves)", "task_accuracy", "{:.1%}"),
        ("task accuracy relative to the original's (all items)", "task_accuracy_relative", "{:.1%}"),
        ("task items the original solves", "tasks_kept", "{:d}"),
        ("task items the model solves (all items)", "tasks_solved_model", "{:d}"),
        ("  of them items the original fails", "tasks_solved_only_by_model", "{:d}"),
        ("needle retrieval (items the original solves)", "needle_accuracy", "{:.1%}"),
        ("KV bytes per token", "kv_bytes_per_token", "{:.0f}")]


def markdown_table(results: dict[str, dict]) -> str:
    names = list(results)
    lines = ["| metric | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for label, key, fmt in ROWS:
        cells = []
        for n in names:
            v, ci = results[n].get(key), results[n].get(key + "_ci")
            cells.append("n/a" if v is None else fmt.format(v) if not ci else
                         f"{fmt.format(v)} [{fmt.format(ci[0])}, {fmt.format(ci[1])}]")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
