"""Prefix-aware routing as pure functions with fake workers: rendering, chained block
hashes, the bounded/aged per-worker record, and the policy (affinity, bounded load,
session affinity, trust from the workers' prefix-cache counters)."""

import os
import random
import subprocess
import sys

import pytest

from gateway.cli import parse_args
from gateway.prefix import PrefixIndex, block_hashes, prompt_bytes, render_prompt
from gateway.routing import make_policy
from gateway.routing.base import RouteRequest, WorkerState
from gateway.routing.load import jsq
from gateway.routing.prefix_aware import PrefixAware, load_bound, rendezvous
from gateway.scraper import parse_metrics

pytestmark = pytest.mark.e2e

SYSTEM = ["You are assistant number %d. " % i + "Follow the house rules carefully. " * 40 for i in range(8)]


def req(text: str, session: str | None = None, block: int = 128) -> RouteRequest:
    return RouteRequest(block_hashes(text.encode(), block), len(text.encode()), session)


def workers(n: int) -> list[WorkerState]:
    return [WorkerState(f"http://w{i}") for i in range(n)]


def test_chat_rendering_is_consistent_and_prefix_preserving():
    a = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]}
    b = {"messages": [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                      {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
    ra, rb = render_prompt("/v1/chat/completions", a), render_prompt("/v1/chat/completions", b)
    assert rb.startswith(ra)                                  # a later turn extends the earlier rendering
    assert render_prompt("/v1/completions", {"prompt": [[1, 2, 3]]}) == "1 2 3"
    assert render_prompt("/v1/completions", {"prompt": ["first", "second"]}) == "first"
    assert render_prompt("/v1/completions", {"prompt": [5, 6]}) == "5 6"
    assert render_prompt("/v1/chat/completions", {"messages": ["junk", {"role": "user"}]}) == "<user>\n"
    ids = list(range(1000, 1040))
    assert prompt_bytes("/v1/completions", {"prompt": ids}) == prompt_bytes("/v1/completions", {"prompt": [ids]})
    assert len(prompt_bytes("/v1/completions", {"prompt": ids})) == 4 * 40       # 32 tokens per 128-byte block
    assert prompt_bytes("/v1/completions", {"prompt": [-1, 2]}) == b"-1 2"          # not valid ids: as text
    assert prompt_bytes("/v1/chat/completions", a) == ra.encode()


def test_block_hashes_are_chained_full_blocks_and_stable_across_processes():
    x, y = b"a" * 64 + b"b" * 64 + b"c" * 64 + b"tail", b"a" * 64 + b"b" * 64 + b"d" * 64
    hx, hy = block_hashes(x, 64), block_hashes(y, 64)
    assert len(hx) == 3 and hx[:2] == hy[:2] and hx[2] != hy[2]     # the partial tail is not hashed
    assert block_hashes(b"b" * 64 + b"b" * 64, 64)[1] != hx[1]            # same block, other history: other hash
    assert len(block_hashes(b"z" * 6400, 64, max_blocks=10)) == 10
    code = "from gateway.prefix import block_hashes; print(block_hashes(b'q' * 200)[-1])"
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    other = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert int(other.stdout) == block_hashes(b"q" * 200)[-1]


def test_index_matches_longest_prefix_ages_and_evicts_extensions_first():
    idx = PrefixIndex(max_blocks=6, ttl=10.0)
    h = block_hashes("".join(chr(65 + i) * 64 for i in range(5)).encode(), 64)
    idx.insert("w", h, now=0.0)
    assert idx.match("w", h, 1.0) == 5 and idx.match("w", h[:2] + [7], 1.0) == 2 and idx.match("v", h, 1.0) == 0
    other = block_hashes("".join(chr(97 + i) * 64 for i in range(3)).encode(), 64)
    idx.insert("w", other, now=2.0)                           # 8 blocks > 6: the oldest extensions go
    assert idx.size("w") == 6 and idx.match("w", h, 3.0) == 3 and idx.match("w", other, 3.0) == 3
    assert idx.match("w", other, 12.5) == 0                   # aged out
    idx.set_capacity("w", 2)
    idx.insert("w", other, now=13.0)
    assert idx.size("w") == 2 and idx.match("w", other, 13.0) == 2
    idx.forget("w")
    assert idx.match("w", other, 13.0) == 0


def test_prefix_affinity_beats_an_idle_worker_within_the_bound():
    ws, pol, rng = workers(4), PrefixAware(PrefixIndex()), random.Random(0)
    first = pol(ws, 0.0, 2.0, rng, req(SYSTEM[0] + "question one"))
    first.in_flight += 1                                       # still running; the others are idle
    r = req(SYSTEM[0] + "another question")
    again = pol(ws, 0.1, 2.0, rng, r)
    assert again is first and r.cached_fraction > 0.9
    assert pol(ws, 0.2, 2.0, rng, req(SYSTEM[1] + "q")) is not first    # a new prefix goes elsewhere


def test_new_prefixes_spread_evenly_and_no_prefix_is_plain_jsq():
    ws, pol, rng = workers(4), PrefixAware(PrefixIndex()), random.Random(1)
    homes = [pol(ws, float(i), 2.0, rng, req(s + "x")).url for i, s in enumerate(SYSTEM)]
    assert sorted(homes.count(w.url) for w in ws) == [2, 2, 2, 2]
    loaded = [WorkerState("a", in_flight=2), WorkerState("b", in_flight=1), WorkerState("c", in_flight=3)]
    for seed in range(10):
        assert pol(loaded, 0.0, 2.0, random.Random(seed), req("short")).url == \
            jsq(loaded, 0.0, 2.0, random.Random(seed)).url == "b"


@pytest.mark.parametrize("eps", [0.1, 0.5, 1.0])
def test_a_hot_prefix_never_pushes_a_worker_over_the_bound(eps):
    """Every request carries the same prompt; requests finish after a few arrivals."""
    ws, pol, rng = workers(4), PrefixAware(PrefixIndex(), eps=eps), random.Random(2)
    running, counts = [], {w.url: 0 for w in ws}
    for t in range(400):
        if len(running) >= 12:                                 # steady state: 12 in flight
            running.pop(rng.randrange(len(running))).in_flight -= 1
        loads = [w.in_flight for w in ws]
        w = pol(ws, float(t), 2.0, rng, req(SYSTEM[3] + "same question"))
        assert w.in_flight + 1 <= load_bound(loads, eps, floor=2)
        w.in_flight += 1
        running.append(w)
        counts[w.url] += 1
    mean = sum(counts.values()) / len(counts)
    assert max(counts.values()) / mean <= 1 + eps + 0.05


def test_session_affinity_is_shared_by_replicas_and_yields_to_the_bound():
    ws = workers(3)
    a, b = PrefixAware(PrefixIndex()), PrefixAware(PrefixIndex())
    picks = {p(ws, 0.0, 2.0, random.Random(s), req("hello", session="user-42")).url
             for p in (a, b) for s in range(5)}
    assert picks == {rendezvous("user-42", [w.url for w in ws])}
    home = next(w for w in ws if w.url in picks)
    home.in_flight = 5                                          # far above the bound: the session spills
    assert a(ws, 0.0, 2.0, random.Random(0), req("hello", session="user-42")) is not home
    assert rendezvous("user-42", [w.url for w in ws if w is not ws[0]]) in {w.url for w in ws}


def test_trust_follows_the_workers_prefix_cache_counters_and_a_restart_forgets():
    w, idle = WorkerState("http://w0"), WorkerState("http://w1")
    pol, rng = PrefixAware(PrefixIndex()), random.Random(0)
    w.prefix_queries, w.prefix_hits = 0.0, 0.0
    pol(ws := [w], 0.0, 2.0, rng, req(SYSTEM[0] + "a"))        # establishes the counters' baseline
    for i in range(1, 12):                                     # we predict hits, the worker reports none
        pol(ws, float(i), 2.0, rng, req(SYSTEM[0] + "a"))
        w.prefix_queries += 300.0
    assert pol.trust[w.url].value < 0.1
    w.in_flight = 1                                            # now an idle worker beats the untrusted prefix
    assert pol([w, idle], 20.0, 2.0, rng, req(SYSTEM[0] + "b")) is idle
    w.prefix_queries = 5.0                                     # counters went backwards: restarted
    pol([w], 21.0, 2.0, rng, RouteRequest())
    assert pol.index.match(w.url, req(SYSTEM[0]).hashes, 21.0) == 0
    w.cache_tokens = 64                                        # a tiny cache bounds the record
    pol([w], 22.0, 2.0, rng, req(SYSTEM[1] + "c"))
    assert pol.index.size(w.url) == 64 * 4 // 128


def test_scraper_reads_prefix_cache_counters_and_cache_size():
    text = """vllm:num_requests_running{model_name="m"} 1.0
vllm:num_requests_waiting{model_name="m"} 0.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 640.0
vllm:cache_config_info{block_size="16",cache_dtype="auto",num_gpu_blocks="2048"} 1.0
"""
    m = parse_metrics(text)
    assert (m["prefix_queries"], m["prefix_hits"], m["cache_tokens"]) == (1000.0, 640.0, 32768)


def test_cli_defaults_to_prefix_and_checks_its_options():
    cfg = parse_args(["--workers", "http://a"])
    assert cfg.policy == "prefix" and cfg.session_header == "x-session-id"
    assert isinstance(make_policy(cfg.policy), PrefixAware)
    cfg = parse_args(["--workers", "http://a", "--balance-eps", "0.2", "--session-header", "X-Conv"])
    assert cfg.balance_eps == 0.2 and cfg.session_header == "x-conv"
    for bad in (["--balance-eps", "-1"], ["--prefix-block-bytes", "0"], ["--prefix-ttl", "0"]):
        with pytest.raises(SystemExit):
            parse_args(["--workers", "http://a", *bad])
