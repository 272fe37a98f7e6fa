"""``swiftserve up --model gemma-3-270m``: the real Gemma 3 270M served through the gateway on the
reference engine (opt-in like its preparation: skipped unless ``modelkit prepare --model
gemma-3-270m --accept-license`` has been run). A completion answers with the continuation the
engine computes (greedy), streaming works, and ``/v1/models`` lists the model."""

import httpx
import pytest
from benchmarks.lib.procs import free_port
from test_stack_e2e import start_stack, stop_stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_swiftserve_up_serves_gemma3_270m():
    from modelkit import prepare_gemma
    from swiftcommon import envs

    if not prepare_gemma.is_prepared(envs.cache_dir()):
        pytest.skip("Gemma 3 270M is not prepared (opt-in: modelkit prepare --model gemma-3-270m --accept-license)")
    port, wport = free_port(), free_port()
    proc = start_stack("gemma-3-270m", port, wport, workers=1, name="gemma-3-270m",
                       extra=["--worker-arg=--kv-cache-memory-gb=0.25"])
    try:
        url = f"http://127.0.0.1:{port}"
        models = httpx.get(f"{url}/v1/models", timeout=30).json()
        assert [m["id"] for m in models["data"]] == ["gemma-3-270m"]
        r = httpx.post(f"{url}/v1/completions", timeout=120, json={
            "model": "gemma-3-270m", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0})
        assert r.status_code == 200, r.text
        body = r.json()
        assert "Paris" in body["choices"][0]["text"] or body["usage"]["completion_tokens"] == 8
        assert body["usage"]["completion_tokens"] > 0
        with httpx.stream("POST", f"{url}/v1/completions", timeout=120, json={
                "model": "gemma-3-270m", "prompt": "One, two, three,", "max_tokens": 6, "temperature": 0,
                "stream": True}) as s:
            events = [ln for ln in s.iter_lines() if ln.startswith("data: ")]
        assert events[-1] == "data: [DONE]" and len(events) > 2
    finally:
        assert stop_stack(proc) == 0
