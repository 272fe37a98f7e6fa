"""The whole stack as a user starts it: ``swiftserve up`` (gateway + 2 real workers on SmolLM2),
called with httpx and the official openai SDK, streaming and not, then stopped with SIGTERM."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from benchmarks.lib.procs import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.model]


def start_stack(model: str, port: int, wport: int, extra=(), workers: int = 2, name: str = "smol"):
    cmd = [sys.executable, "-m", "swiftserve", "up", "--model", model, "--workers", str(workers), "--port", str(port),
           "--worker-base-port", str(wport), "--served-model-name", name,
           "--worker-arg=--max-model-len=1024", "--worker-arg=--kv-cache-memory-gb=0.1", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    lines = []
    deadline = time.time() + 300
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                break
            continue
        lines.append(line)
        if "Gateway ready" in line:
            # Keep draining: a full pipe would block the children's logging.
            proc.lines = lines
            threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
            return proc
    proc.kill()
    raise AssertionError("stack did not start:\n" + "".join(lines[-40:]))


def stop_stack(proc) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def stack_proc(smollm2_dir):
    port, wport = free_port(), free_port(2)
    proc = start_stack(str(smollm2_dir), port, wport)
    yield proc, f"http://127.0.0.1:{port}", [f"http://127.0.0.1:{wport + i}" for i in range(2)]
    assert stop_stack(proc) == 0


@pytest.fixture
def stack(stack_proc):
    return stack_proc[1:]


def test_completions_through_gateway(stack):
    base, workers = stack
    body = {"model": "smol", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
    r = httpx.post(base + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    out = r.json()
    assert "Paris" in out["choices"][0]["text"]
    assert out["usage"]["completion_tokens"] == 8


def test_streaming_chat_through_gateway(stack):
    base, _ = stack
    body = {"model": "smol", "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 16, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    chunks = []
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                chunks.append(line[6:])
    assert chunks[-1] == "[DONE]"
    objs = [json.loads(c) for c in chunks[:-1]]
    text = "".join(o["choices"][0]["delta"].get("content", "") for o in objs if o["choices"])
    assert "Paris" in text and objs[-1]["usage"]["completion_tokens"] >= 1


def test_openai_sdk_and_both_workers_used(stack):
    from openai import OpenAI

    base, workers = stack
    client = OpenAI(base_url=base + "/v1", api_key="unused")
    assert [m.id for m in client.models.list().data] == ["smol"]
    # Concurrent, so the spread is the policy's (load), not a coin: these prompts are shorter
    # than one prefix block, and one request at a time would tie every time (random pick).
    start = threading.Barrier(4)

    def chat(_):
        start.wait()
        return client.chat.completions.create(model="smol", max_tokens=16, temperature=0,
                                              messages=[{"role": "user", "content": "Say hi"}])

    with ThreadPoolExecutor(4) as pool:
        for reply in pool.map(chat, range(4)):
            assert reply.choices[0].message.content
    text = "".join(c.choices[0].text for c in client.completions.create(
        model="smol", prompt="Once upon a time", max_tokens=6, stream=True) if c.choices)
    assert text
    served = []
    for w in workers:
        metrics = httpx.get(w + "/metrics").text
        served.append(sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                          if line.startswith("vllm:request_success_total{")))
    assert all(n >= 1 for n in served), served


def test_swiftkv_checkpoint_beside_the_original_in_one_stack(smollm2_dir, tmp_path):
    """``up --model A:1 --model B:1`` with an alias: a SwiftKV checkpoint (served as "smol") and the
    original ("orig") each on its own worker; every request lands on its model's worker and the
    alias splits over both, the answer naming the variant."""
    from modelkit.swiftkv import write_swiftkv_checkpoint

    ckpt = write_swiftkv_checkpoint(smollm2_dir, tmp_path / "swiftkv-l15-g2", 15, 2)
    port, wport = free_port(), free_port(2)
    proc = start_stack(f"{ckpt}:1", port, wport, extra=["--model", f"{smollm2_dir}:1", "--served-model-name", "orig",
                                                         "--alias=split=smol:1,orig:1"])
    base = f"http://127.0.0.1:{port}"
    try:
        for model in ("smol", "orig", "smol"):
            r = httpx.post(base + "/v1/completions", timeout=120,
                           json={"model": model, "prompt": "Hello", "max_tokens": 5, "temperature": 0})
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5
            assert r.json()["model"] == model
        m = httpx.get(f"http://127.0.0.1:{wport}/metrics").text          # the first worker: the checkpoint
        assert "swiftserve_worker_kv_bytes_per_token" in m and " 35328.0" in m
        assert 'finished_reason="length",model_name="smol"} 2.0' in m
        assert [d["id"] for d in httpx.get(base + "/v1/models").json()["data"]] == ["orig", "smol", "split"]
        answered = {httpx.post(base + "/v1/completions", timeout=120, json={
            "model": "split", "prompt": "Hi", "max_tokens": 1, "user": f"u{i}"}).json()["model"] for i in range(12)}
        assert answered == {"smol", "orig"}
    finally:
        assert stop_stack(proc) == 0


def _worker_metrics(url: str) -> dict[str, float]:
    return {line.split("{")[0].split(" ")[0]: float(line.rsplit(" ", 1)[1])
            for line in httpx.get(url + "/metrics", timeout=30).text.splitlines()
            if line.startswith("swiftserve_worker_")}


def test_zack_model_serves_through_the_stack_with_a_smaller_pool(zack_dir):
    """A ZACK directory re-planned at rate 0.25 by ``swiftserve up --kv-methods``: the gateway answers,
    and with the same pool bytes the workers hold more tokens (blocks) than the uncompressed model."""
    port, wport = free_port(), free_port(2)
    proc = start_stack(str(zack_dir), port, wport, ["--kv-methods", '{"zack": {"rate": 0.25}}'])
    try:
        body = {"model": "smol", "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 6}
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=120, json=body)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1, r.text
        m = _worker_metrics(f"http://127.0.0.1:{wport}")
    finally:
        assert stop_stack(proc) == 0
    assert m["swiftserve_worker_zack_rate"] >= 0.25
    assert m["swiftserve_worker_kv_bytes_per_token"] <= 0.75 * 46080 + 1
    # Same --kv-cache-memory-gb as an uncompressed SmolLM2 worker (46080 B/token): the pool holds more blocks.
    plain_blocks = m["swiftserve_worker_kv_bytes_total"] // (46080 * m["swiftserve_worker_kv_block_size"])
    assert m["swiftserve_worker_kv_blocks_total"] >= 1.3 * plain_blocks


def test_short_loadtest_against_the_stack(stack, tmp_path):
    from loadtest.cli import main

    base, _ = stack
    assert main(["run", "--base-url", base, "--rate", "4", "--num-requests", "6", "--input-len", "64",
                 "--output-len", "8", "--label", "e2e", "--result-dir", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "e2e-rate4.0.json").read_text())
    assert res["completed"] == 6 and res["failed"] == 0 and res["total_output_tokens"] == 48
    assert not res["warnings"] and res["median_ttft_ms"] > 0 and res["median_tpot_ms"] > 0


def test_short_soak_against_the_stack(stack_proc, tmp_path):
    """The soak's short version: Poisson load at 80% of the measured capacity for 20 s, every
    process sampled; nothing lost, KV blocks and in-flight counts back to 0, no growth."""
    import argparse

    from loadtest.soak import add_arguments, soak_stack, stack_processes

    proc, base, workers = stack_proc
    p = argparse.ArgumentParser()
    add_arguments(p)
    a = p.parse_args(["--duration", "20", "--capacity-seconds", "8", "--sample-interval", "1", "--input-len", "64",
                      "--output-len", "8", "--result-dir", str(tmp_path)])
    wport = int(workers[0].rsplit(":", 1)[1])
    doc = soak_stack(a, base, workers, stack_processes(proc.pid, wport))
    v = doc["verdict"]
    assert v["requests"] >= 3 and v["requests_lost"] == 0, v
    assert set(v["rss"]) == {"swiftserve-up", "gateway", "worker1", "worker2"}
    assert v["checks"]["kv_blocks_released"] and v["checks"]["in_flight_zero"], v["idle"]
    assert v["passed"], (v["checks"], v["fds"], v["sockets"], v["peak_in_flight"])

def test_a_killed_worker_is_restarted_while_the_rest_serves(stack_proc, reliability_log):
    """The issue's scenario: SIGKILL one worker during 8 streamed requests. Its streams migrate to
    the other worker (gateway.failover) and every stream completes with the same greedy text, the
    stack keeps serving, the supervisor restarts the worker and the gateway re-admits it; only
    SIGTERM stops the stack (the fixture checks)."""
    import asyncio

    import psutil

    proc, base, workers = stack_proc
    port = workers[0].rsplit(":", 1)[1]
    (victim,) = [p for p in psutil.Process(proc.pid).children()
                 if "worker" in p.cmdline() and port in p.cmdline()[p.cmdline().index("--port") + 1:][:1]]
    body = {"model": "smol", "prompt": "Tell me a long story.", "max_tokens": 200, "ignore_eos": True,
            "stream": True, "temperature": 0}

    async def streams():
        async with httpx.AsyncClient(timeout=300) as c:
            started = []

            async def one():
                data = b""
                try:
                    async with c.stream("POST", base + "/v1/completions", json=body) as r:
                        async for chunk in r.aiter_raw():
                            if not data:
                                started.append(1)
                            data += chunk
                        return r.status_code, data
                except httpx.HTTPError as exc:
                    return None, data + repr(exc).encode()

            tasks = [asyncio.create_task(one()) for _ in range(8)]
            while len(started) < 8:        # every stream has its first bytes: nothing can be retried
                await asyncio.sleep(0.05)
            assert all(httpx.get(w + "/load").json()["running"] for w in workers)
            victim.kill()
            return await asyncio.gather(*tasks)

    results = asyncio.run(streams())
    kinds, texts = [], set()
    for status, data in results:
        assert status == 200 and data.endswith(b"data: [DONE]\n\n"), data[-200:]   # never a broken transfer
        kinds.append("error" if b'"error"' in data else "complete")
        events = [json.loads(e[6:]) for e in data.decode().split("\n\n") if e and e != "data: [DONE]"]
        texts.add("".join(c["text"] for e in events for c in e["choices"]))
    assert kinds == ["complete"] * 8, kinds                 # the killed worker's streams migrated
    assert len(texts) == 1                                  # greedy: migrated or not, the same text
    later = [httpx.post(base + "/v1/completions", json={**body, "stream": False, "max_tokens": 4}, timeout=120)
             for _ in range(4)]
    assert [r.status_code for r in later] == [200] * 4                # still serving, on the other worker
    deadline = time.time() + 240
    while httpx.get(base + "/health").json()["routable_workers"] < 2:
        assert time.time() < deadline, "the killed worker was not restarted and re-admitted"
        time.sleep(1)
    after = [httpx.post(base + "/v1/completions", json={**body, "stream": False, "max_tokens": 4}, timeout=120)
             for _ in range(8)]
    assert [r.status_code for r in after] == [200] * 8
    assert any("restarting in" in line for line in proc.lines) and proc.poll() is None
    reliability_log.fault("stack_worker_sigkill", kinds + ["complete"] * 12)
