"""Helpers for engine tests that compare two engines on the same requests."""


def run_with_arrival(eng, prompts: list[list[int]], params, arrive_at: int = 4) -> dict[str, list]:
    """Every prompt but the last from the start, the last after ``arrive_at`` steps (a prefill beside
    decoding requests, so mixed and pure-decode steps alternate): ``(new tokens, new logprobs)`` of each
    step, per request id ``r<i>``."""
    for i, p in enumerate(prompts[:-1]):
        eng.add_request(f"r{i}", p, params)
    got: dict[str, list] = {}
    steps = 0
    while eng.has_unfinished():
        for o in eng.step():
            got.setdefault(o.request_id, []).append((o.new_token_ids, o.new_logprobs))
        steps += 1
        if steps == arrive_at:
            eng.add_request(f"r{len(prompts) - 1}", prompts[-1], params)
    return got


def tokens(got: dict[str, list]) -> dict[str, list]:
    """``run_with_arrival``'s result -> each request's new tokens per step."""
    return {r: [t for t, _ in steps] for r, steps in got.items()}


def logprobs(got: dict[str, list]) -> list[float]:
    """Every log-prob of ``run_with_arrival``'s result, in order: each token's, then its top ones'."""
    return [lp for steps in got.values() for _, lps in steps for e in lps for lp in [e.logprob, *(v for _, v in e.top)]]
