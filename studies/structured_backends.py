"""Grammar libraries side by side: llguidance, xgrammar, outlines-core on the schema suite.

For every schema of ``schema_suite`` and every library: compile it (time; a failure or a
refused keyword counts against coverage), then feed one valid instance (compact JSON,
properties in schema order) token by token: at each position compute the next-token mask
(timed) and check that the instance's token is allowed, then advance. A schema is
*covered* when it compiles, every token of the instance is allowed and the matcher accepts
at the end. The mask time is per token (median and p90 over every position of every
covered schema); outlines-core also pays a one-off index build over the vocabulary per
schema, reported as its compile time. Prints one line per library and the ratios to
llguidance; writes ``results/api/structured_backends.json``.

    python -m studies.structured_backends            # after `make install` (dev extra)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from benchmarks.lib.records import command_line, write_json
from benchmarks.lib.schema_suite import instance, suite


def _bitmask(vocab: int) -> torch.Tensor:
    return torch.full((1, (vocab + 31) // 32), -1, dtype=torch.int32)


def _allowed(mask: torch.Tensor, token: int) -> bool:
    return bool((int(mask[0, token // 32]) >> (token % 32)) & 1)


class Llguidance:
    name = "llguidance"

    def __init__(self, tok, vocab: int) -> None:
        import llguidance
        import llguidance.hf

        self.ll = llguidance
        self.tokenizer = llguidance.hf.from_tokenizer(tok, n_vocab=vocab)

    def compile(self, schema: dict):
        grammar = self.ll.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False})
        m = self.ll.LLMatcher(self.tokenizer, grammar, log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        return m

    def fill(self, m, mask) -> None:
        m.unsafe_compute_mask_ptr(mask.data_ptr(), mask.numel() * 4)

    def advance(self, m, token: int) -> bool:
        return m.consume_token(token)

    def accepting(self, m) -> bool:
        return m.is_accepting()


class Xgrammar:
    name = "xgrammar"

    def __init__(self, tok, vocab: int) -> None:
        import xgrammar as xgr

        self.compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tok, vocab_size=vocab),
                                            max_threads=1, cache_enabled=False)
        self.xgr = xgr

    def compile(self, schema: dict):
        return self.xgr.GrammarMatcher(self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False,
                                                                          separators=(",", ":")))

    def fill(self, m, mask) -> None:
        m.fill_next_token_bitmask(mask, 0)

    def advance(self, m, token: int) -> bool:
        return m.accept_token(token)

    def accepting(self, m) -> bool:
        return m.is_terminated() or m.is_completed()


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, tok, vocab: int) -> None:
        import outlines_core as oc
        from outlines_core.kernels.torch import fill_next_token_bitmask

        self.oc, self.fill_kernel = oc, fill_next_token_bitmask
        # Byte-level BPE strings -> bytes (GPT-2's printable mapping of the 256 byte values).
        printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
        extra = [b for b in range(256) if b not in printable]
        char_to_byte = {chr(b): b for b in printable} | {chr(256 + i): b for i, b in enumerate(extra)}
        tokens: dict[bytes, list[int]] = {}
        special = set(tok.all_special_ids)
        for text, tid in tok.get_vocab().items():
            if tid in special or tid >= vocab:
                continue
            try:
                key = bytes(char_to_byte[c] for c in text)
            except KeyError:
                continue
            tokens.setdefault(key, []).append(tid)
        self.vocab = oc.Vocabulary(tok.eos_token_id, tokens)

    def compile(self, schema: dict):
        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(schema))
        return self.oc.Guide(self.oc.Index(regex, self.vocab))

    def fill(self, g, mask) -> None:
        self.fill_kernel(g, mask)

    def advance(self, g, token: int) -> bool:
        if token not in g.get_tokens():
            return False
        g.advance(token)
        return True

    def accepting(self, g) -> bool:
        return g.is_finished()


def run_library(lib, tok, cases, vocab: int) -> dict:
    mask = _bitmask(vocab)
    per_token, compile_ms, failures, covered = [], [], {}, 0
    for case in cases:
        ids = tok.encode(json.dumps(instance(case.schema), separators=(",", ":")), add_special_tokens=False)
        t0 = time.perf_counter()
        try:
            m = lib.compile(case.schema)
        except Exception as exc:  # noqa: BLE001 - a library's refusal is a coverage figure
            failures[case.name] = f"compile: {str(exc).splitlines()[0][:160]}"
            continue
        compile_ms.append(1e3 * (time.perf_counter() - t0))
        times, ok = [], True
        for t in ids:
            t0 = time.perf_counter()
            lib.fill(m, mask)
            times.append(1e3 * (time.perf_counter() - t0))
            if not _allowed(mask, t) or not lib.advance(m, t):
                failures[case.name] = f"token {tok.decode([t])!r} refused"
                ok = False
                break
        if ok and not lib.accepting(m):
            failures[case.name] = "instance complete but not accepted"
            ok = False
        if ok:
            covered += 1
            per_token.extend(times)
    q = statistics.quantiles(per_token, n=10) if len(per_token) > 1 else [float("nan")] * 9
    return {"covered": covered, "schemas": len(cases), "mask_ms_p50": statistics.median(per_token),
            "mask_ms_p90": q[8], "mask_ms_mean": statistics.fmean(per_token), "tokens": len(per_token),
            "compile_ms_p50": statistics.median(compile_ms) if compile_ms else None,
            "compile_ms_max": max(compile_ms) if compile_ms else None, "failures": failures}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="default", help="whose tokenizer (modelkit name or directory)")
    ap.add_argument("--libraries", nargs="+", default=["llguidance", "xgrammar", "outlines-core"])
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the masks run on one core)")
    ap.add_argument("--out", default="results/api")
    args = ap.parse_args(argv)
    from transformers import AutoTokenizer

    from modelkit.models import resolve_model
    from refengine.model_config import load_model_spec

    torch.set_num_threads(args.threads)
    model = resolve_model(args.model)
    tok = AutoTokenizer.from_pretrained(model)
    vocab = load_model_spec(str(model)).vocab_size
    cases = suite()
    classes = {c.name: c for c in (Llguidance, Xgrammar, OutlinesCore)}
    doc = {"command": command_line(argv), "model": str(model), "schemas": len(cases),
           "loadavg_before": os.getloadavg(), "libraries": {}}
    for name in args.libraries:
        t0 = time.perf_counter()
        lib = classes[name](tok, vocab)
        setup = 1e3 * (time.perf_counter() - t0)
        r = doc["libraries"][name] = {"setup_ms": setup, **run_library(lib, tok, cases, vocab)}
        print(f"{name:14s} covered {r['covered']}/{r['schemas']}  mask p50 {r['mask_ms_p50']:.3f} ms  "
              f"p90 {r['mask_ms_p90']:.3f} ms/token  compile p50 {r['compile_ms_p50']:.1f} ms "
              f"max {r['compile_ms_max']:.1f} ms  tokenizer setup {setup:.0f} ms", flush=True)
    base = doc["libraries"].get("llguidance")
    if base:
        for name, r in doc["libraries"].items():
            print(f"{name} / llguidance: mask p50 {r['mask_ms_p50'] / base['mask_ms_p50']:.2f}x, "
                  f"compile p50 {r['compile_ms_p50'] / base['compile_ms_p50']:.2f}x")
    doc["loadavg_after"] = os.getloadavg()
    write_json(Path(args.out) / "structured_backends.json", doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
