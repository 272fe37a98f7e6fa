"""Summary metrics with vLLM `bench serve` definitions and key names.

TTFT = first token chunk - send; TPOT = (last - first) / (N - 1); ITL = every gap
between token chunks divided by the tokens that chunk carried (N / chunks when the
server batches tokens); E2EL = last chunk - send; normalised latency = E2EL / N;
N = usage.completion_tokens. Goodput counts requests meeting every given SLO.
Failed requests are counted separately and excluded from latency statistics.
"""

from __future__ import annotations

import numpy as np

PERCENTILES = (50, 90, 95, 99)


def _stats(prefix: str, values_s: list[float], out: dict) -> None:
    arr = np.asarray(values_s, dtype=float) * 1000.0 if values_s else np.zeros(0)
    out[f"mean_{prefix}_ms"] = float(arr.mean()) if arr.size else 0.0
    out[f"median_{prefix}_ms"] = float(np.median(arr)) if arr.size else 0.0
    out[f"std_{prefix}_ms"] = float(arr.std()) if arr.size else 0.0
    for p in PERCENTILES:
        out[f"p{p}_{prefix}_ms"] = float(np.percentile(arr, p)) if arr.size else 0.0


def summarize(records, duration: float, input_lens: list[int | None], slos_ms: dict[str, float] | None = None
              ) -> tuple[dict, list[str]]:
    warnings: list[str] = []
    ttfts, tpots, itls, e2els, norm = [], [], [], [], []
    out_lens, in_lens, good = [], [], 0
    completed = 0
    for rec, il in zip(records, input_lens):
        if not rec.success:
            continue
        completed += 1
        n = rec.output_tokens if rec.output_tokens is not None else len(rec.chunk_times)
        if rec.output_tokens is None:
            warnings.append("a response had no usage; output tokens counted from chunks")
        elif rec.output_tokens != len(rec.chunk_times):
            warnings.append(f"usage says {rec.output_tokens} tokens but {len(rec.chunk_times)} token chunks arrived")
        out_lens.append(n)
        in_lens.append(il if il is not None else (rec.prompt_tokens or 0))
        ttft, e2el = rec.ttft, rec.e2el
        ttfts.append(ttft)
        e2els.append(e2el)
        norm.append(e2el / max(1, n))
        tpot = (rec.chunk_times[-1] - rec.chunk_times[0]) / (n - 1) if n > 1 else None
        if tpot is not None:
            tpots.append(tpot)
        per_chunk = n / max(1, len(rec.chunk_times))
        itls.extend((b - a) / per_chunk for a, b in zip(rec.chunk_times, rec.chunk_times[1:]))
        ok = True
        for key, limit in (slos_ms or {}).items():
            val = {"ttft": ttft, "tpot": tpot or 0.0, "e2el": e2el}[key]
            ok &= val * 1000.0 <= limit
        good += ok
    s: dict = {"duration": duration, "completed": completed, "failed": len(records) - completed,
               "total_input_tokens": int(sum(in_lens)), "total_output_tokens": int(sum(out_lens)),
               "request_throughput": completed / duration if duration else 0.0,
               "request_goodput": good / duration if duration and slos_ms else None,
               "output_throughput": sum(out_lens) / duration if duration else 0.0,
               "total_token_throughput": (sum(in_lens) + sum(out_lens)) / duration if duration else 0.0}
    _stats("ttft", ttfts, s)
    _stats("tpot", tpots, s)
    _stats("itl", itls, s)
    _stats("e2el", e2els, s)
    _stats("normalized_latency", norm, s)
    s["input_lens"], s["output_lens"] = in_lens, out_lens
    s["ttfts"] = ttfts
    s["itls"] = [[(b - a) for a, b in zip(r.chunk_times, r.chunk_times[1:])] for r in records if r.success]
    s["generated_texts"] = [r.text for r in records if r.success]
    s["errors"] = [r.error for r in records if not r.success]
    # de-duplicate warnings, keep counts
    uniq: dict[str, int] = {}
    for w in warnings:
        uniq[w] = uniq.get(w, 0) + 1
    return s, [f"{w} (x{c})" if c > 1 else w for w, c in uniq.items()]
