"""A worker serving a ZACK model (``zack_dir``, tests/conftest.py) answers and reports the real KV
bytes per token, the compression ratio and the achieved rate in /metrics."""

import httpx
import pytest
from worker_test_fakes import ServerThread

from refengine.config import EngineConfig

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.model]


def test_worker_serves_zack_and_reports_real_kv_bytes(zack_dir):
    from transformers import AutoTokenizer

    from worker.app import build_app
    from worker.backends import create_engine_client
    from worker.config import WorkerConfig

    config = WorkerConfig(engine_config=EngineConfig(model=str(zack_dir), max_model_len=256, num_kv_blocks=64),
                          served_model_name=("smol-zack",))
    app = build_app(config, create_engine_client(config), AutoTokenizer.from_pretrained(zack_dir))
    with ServerThread(app, startup_timeout=600) as srv:
        r = httpx.post(srv.url + "/v1/completions", timeout=120,
                       json={"model": "smol-zack", "prompt": "The capital of France is", "max_tokens": 4})
        assert r.status_code == 200, r.text
        metrics = {line.split("{")[0].split(" ")[0]: float(line.rsplit(" ", 1)[1])
                   for line in httpx.get(srv.url + "/metrics").text.splitlines()
                   if line.startswith("swiftserve_worker_")}
    ratio = metrics["swiftserve_worker_kv_compression_ratio"]
    assert metrics["swiftserve_worker_kv_bytes_per_token"] == pytest.approx(46080 / ratio)
    assert 1.95 <= ratio <= 2.1 and metrics["swiftserve_worker_zack_rate"] >= 0.5
