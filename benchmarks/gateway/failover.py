"""Zero-loss failover, measured: streams in flight when a worker is killed or hangs.

    python -m benchmarks gateway failover --out results/reliability/failover.json

Starts two real workers (``python -m worker``, SmolLM2-135M-Instruct on the reference
engine unless ``--model`` / ``--worker-python`` / ``--engine`` say otherwise) and a gateway
(``--policy jsq`` so the streams split between them, ``--stall-timeout``). Each scenario
sends ``--streams`` greedy streamed completions at once (distinct prompts, ``--max-tokens``
tokens each, ``ignore_eos``), waits until every stream has its first event, then:

* ``kill``: SIGKILL of one worker's process group (a vLLM worker's engine processes too);
* ``hang``: SIGSTOP of one worker's process group (the gateway's stall timeout must
  notice), SIGCONT after.

A stream *completed correctly* when it ends with ``[DONE]``, has no error event, keeps
one ``id``, reports ``completion_tokens`` = ``--max-tokens`` and its text equals the same
request's uninterrupted greedy text (asked of a worker directly, before the scenario).
The gateway's ``swiftserve_gateway_migrations_total`` says how many streams moved. Writes
``--out`` (per scenario: streams, completed, errors, lost, migrations) with the figures
``kill_midstream_completed_pct``, ``hang_midstream_completed_pct`` and
``migrated_greedy_identical`` (true when at least one stream migrated and every stream's
text equals its uninterrupted run), which ``benchmarks/report/reliability.py`` merges into
``summary.json``.

``--mix``: the streams rotate over completions, chat, chat with a JSON schema, chat with a
required tool, chat with ``n`` = 2 and ``/v1/responses`` (``benchmarks/gateway/failover_kinds.py``:
the requests and how each is judged against the same request's uninterrupted stream, asked
of a worker directly); each scenario also counts per kind (``kinds``: streams, outcomes,
and how many had ended before the fault).

``--dtype`` is the workers' dtype, float32 unless given: with bfloat16 (the workers' ``auto``
on a CPU with native bf16) greedy tokens depend on what else is in the batch, so streams
differ from their one-at-a-time uninterrupted runs with or without a migration
(results/reliability/README.md); the identity check needs batch-independent numerics.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import httpx

from benchmarks.gateway.failover_kinds import KINDS, OUTCOMES, judge_kind, read, request
from benchmarks.lib.procs import free_port, wait_healthy
from benchmarks.lib.records import write_json

TOPICS = ["dragons", "the sea", "tea", "mountains", "robots", "gardens", "trains", "the moon", "bees", "rivers",
          "castles", "winter", "music", "cities", "forests", "ships", "clocks", "bridges", "owls", "deserts"]


class Server:
    def __init__(self, cmd: list[str], port: int) -> None:
        self.cmd, self.url = cmd, f"http://127.0.0.1:{port}"
        self.log = tempfile.TemporaryFile(mode="w+")
        # Its own process group: a vLLM worker's engine runs in child processes, and a fault (or
        # stop) must reach them all, as a pod's death or a node's hang does. Signalling the API
        # process alone left the killed worker's engine running, orphaned, beside the next scenario.
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def wait_healthy(self, timeout: float) -> "Server":
        wait_healthy(self.url, self.proc, timeout, self.log)
        return self

    def stop(self) -> None:
        self.signal(signal.SIGCONT)
        self.signal(signal.SIGKILL)
        self.proc.wait(30)


def body(i: int, max_tokens: int) -> dict:
    return request("completions", TOPICS[i % len(TOPICS)], max_tokens)[1]


def judge(data: bytes, want: str, max_tokens: int) -> str:
    """complete (correct), wrong (complete but not the uninterrupted text), error, or lost."""
    events = [e for e in data.decode(errors="replace").split("\n\n") if e]
    if not events or events[-1] != "data: [DONE]":
        return "lost"
    objs = [json.loads(e[len("data: "):]) for e in events[:-1]]
    if any("error" in o for o in objs):
        return "error"
    text = "".join(c.get("text") or "" for o in objs for c in o.get("choices", []))
    usage = objs[-1].get("usage") or {}
    ok = len({o.get("id") for o in objs}) == 1 and usage.get("completion_tokens") == max_tokens and text == want
    return "complete" if ok else "wrong"


async def stream(client, url: str, payload: dict, first: asyncio.Event) -> bytes:
    data = b""
    try:
        async with client.stream("POST", url, json=payload) as r:
            async for chunk in r.aiter_raw():
                data += chunk
                first.set()
    except httpx.HTTPError:
        first.set()
    return data


def migrations(gw: Server) -> float:
    text = httpx.get(gw.url + "/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("swiftserve_gateway_migrations_total{") and 'outcome="resumed"' in line)


async def scenario(gw: Server, victim: Server, fault: str, reqs: list, judges: list, kinds: list | None) -> dict:
    """``reqs``: (path, body) of each stream; ``judges``: its judge (bytes -> outcome); ``kinds``: per kind
    counts too."""
    before, n = migrations(gw), len(reqs)
    async with httpx.AsyncClient(timeout=600) as client:
        firsts = [asyncio.Event() for _ in range(n)]
        tasks = [asyncio.create_task(stream(client, gw.url + path, payload, firsts[i]))
                 for i, (path, payload) in enumerate(reqs)]
        for f in firsts:
            await asyncio.wait_for(f.wait(), 300)
        ended = [t.done() for t in tasks]
        victim.signal(signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
        results = await asyncio.gather(*tasks)
    if fault == "hang":
        victim.signal(signal.SIGCONT)
    outcomes = [j(d) for j, d in zip(judges, results)]
    counts = {k: outcomes.count(k) for k in OUTCOMES}
    out = {"streams": n, **counts, "migrations": migrations(gw) - before,
           "completed_pct": round(100.0 * counts["complete"] / n, 1),
           "error_messages": sorted(set(filter(None, (read(d)["error"] for d in results))))[:5]}
    if kinds:
        out["kinds"] = per_kind(kinds, outcomes, ended)
    return out


def per_kind(kinds: list, outcomes: list, ended: list) -> dict:
    """kind -> streams, each outcome's count, and how many had ended before the fault."""
    out: dict[str, dict] = {}
    for k, outcome, e in zip(kinds, outcomes, ended):
        c = out.setdefault(k, {"streams": 0, **dict.fromkeys(OUTCOMES, 0), "ended_before_fault": 0})
        c["streams"] += 1
        c[outcome] += 1
        c["ended_before_fault"] += e
    return out


def plain(url: str, streams: int, max_tokens: int) -> tuple[list, list]:
    """The default streams: (path, body) and judge of each, from the uninterrupted non-streamed texts."""
    reqs, judges = [], []
    for i in range(streams):
        r = httpx.post(url + "/v1/completions", json={**body(i, max_tokens), "stream": False, "stream_options": None},
                       timeout=600)
        reqs.append(("/v1/completions", body(i, max_tokens)))
        judges.append(lambda d, want=r.json()["choices"][0]["text"]: judge(d, want, max_tokens))
    return reqs, judges


def mixed(url: str, streams: int, max_tokens: int) -> tuple[list, list, list]:
    """``--mix``: (path, body), judge and kind of each stream, judged against its uninterrupted stream."""
    kinds = [KINDS[i % len(KINDS)] for i in range(streams)]
    reqs = [request(k, TOPICS[i % len(TOPICS)], max_tokens) for i, k in enumerate(kinds)]
    judges = []
    for k, (path, payload) in zip(kinds, reqs):
        want = read(httpx.post(url + path, json=payload, timeout=600).content)
        if not want["ended"] or want["error"] or not want["one_id"]:
            raise RuntimeError(f"the uninterrupted {k} stream is not usable: {want}")
        judges.append(lambda d, k=k, want=want: judge_kind(k, d, want, max_tokens))
    return reqs, judges, kinds


def add_cli_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", default="results/reliability/failover.json")
    ap.add_argument("--model", default=None, help="model directory (default: the prepared SmolLM2-135M-Instruct)")
    ap.add_argument("--engine", default="reference", help="worker --engine (reference or vllm)")
    ap.add_argument("--worker-python", default=sys.executable, help="interpreter that runs the workers")
    ap.add_argument("--streams", type=int, default=16, help="streams in flight when the fault happens")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--stall-timeout", type=float, default=5.0, help="the gateway's --stall-timeout (s)")
    ap.add_argument("--torch-threads", type=int, default=1)
    ap.add_argument("--dtype", default="float32",
                    help="workers' --dtype (default: float32, whose greedy tokens do not depend on what else is in "
                         "the batch, so 'equals the uninterrupted text' tests the migration; 'auto' is bfloat16 on a "
                         "CPU with native bf16, where a greedy text can change with the batch even without a fault)")
    ap.add_argument("--mix", action="store_true", help="streams of every migratable kind (failover_kinds.KINDS)")


def main(a: argparse.Namespace) -> int:
    model = a.model
    if model is None:
        from modelkit.prepare import ensure_default_model
        model = str(ensure_default_model())

    def worker(port: int | None = None) -> Server:
        port = port or free_port()
        return Server([a.worker_python, "-m", "worker", "--engine", a.engine, "--model", model, "--port", str(port),
                       "--served-model-name", "m", "--max-model-len", "512", "--torch-threads", str(a.torch_threads),
                       "--log-level", "warning", "--dtype", a.dtype], port)

    def gateway(workers: list[Server]) -> Server:
        port = free_port()
        return Server([sys.executable, "-m", "gateway", "--port", str(port), "--policy", "jsq",
                       "--workers", ",".join(w.url for w in workers), "--health-interval", "0.2",
                       "--stall-timeout", str(a.stall_timeout), "--log-level", "warning"], port)

    started: list[Server] = []
    try:
        a_w, b_w = worker(), worker()
        started += [a_w, b_w]
        for w in (a_w, b_w):
            w.wait_healthy(600)
        if a.mix:
            reqs, judges, kinds = mixed(a_w.url, a.streams, a.max_tokens)
        else:
            (reqs, judges), kinds = plain(a_w.url, a.streams, a.max_tokens), None
        gw = gateway([a_w, b_w])
        started.append(gw)
        gw.wait_healthy(60)
        kill = asyncio.run(scenario(gw, a_w, "kill", reqs, judges, kinds))
        print("kill:", kill, flush=True)
        a_w.stop()
        a2 = worker(int(a_w.url.rsplit(":", 1)[1]))          # back on its port: the gateway's static list
        started.append(a2)
        a2.wait_healthy(600)
        time.sleep(2)                                         # health checks readmit it
        hang = asyncio.run(scenario(gw, b_w, "hang", reqs, judges, kinds))
        print("hang:", hang, flush=True)
    finally:
        for s in started:
            s.stop()
    identical = (kill["migrations"] + hang["migrations"]) > 0 and kill["wrong"] == hang["wrong"] == 0
    doc = {"command": a.command, "engine": a.engine, "dtype": a.dtype,
           "streams": a.streams, "max_tokens": a.max_tokens,
           "stall_timeout_s": a.stall_timeout, **({"kinds": list(KINDS)} if a.mix else {}), "kill": kill, "hang": hang,
           "figures": {"kill_midstream_completed_pct": kill["completed_pct"],
                       "hang_midstream_completed_pct": hang["completed_pct"],
                       "migrated_greedy_identical": identical}}
    write_json(a.out, doc)
    print(json.dumps(doc["figures"]))
    return 0
