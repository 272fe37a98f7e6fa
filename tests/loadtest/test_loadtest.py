"""Load-test maths (synthetic timestamps), schedules, and runs against a real (fake) server."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from loadtest_fakes import FakeOpenAI  # noqa: E402

from loadtest.client import RequestRecord  # noqa: E402
from loadtest.metrics import summarize  # noqa: E402
from loadtest.schedule import arrival_times  # noqa: E402

pytestmark = pytest.mark.e2e


def rec(sent, chunks, n):
    r = RequestRecord(0.0, sent=sent, chunk_times=chunks, output_tokens=n, success=True)
    return r


def test_metric_definitions_on_synthetic_timestamps():
    a = rec(0.0, [0.5, 0.6, 0.7, 0.9], 4)            # TTFT 500, TPOT (0.9-0.5)/3, E2EL 900
    b = rec(1.0, [1.2, 1.3], 4)                      # server sent 2 tokens per chunk
    fail = RequestRecord(0.0, sent=0.0, error="HTTP 500")
    s, warnings = summarize([a, b, fail], duration=2.0, input_lens=[10, 20, 30],
                            slos_ms={"ttft": 300.0})
    assert s["completed"] == 2 and s["failed"] == 1 and s["errors"] == ["HTTP 500"]
    assert s["total_input_tokens"] == 30 and s["total_output_tokens"] == 8
    assert s["mean_ttft_ms"] == pytest.approx((500 + 200) / 2)
    assert s["mean_tpot_ms"] == pytest.approx(((0.4 / 3) + (0.1 / 3)) / 2 * 1000)
    # ITL: a's gaps 100,100,200 ms (1 token/chunk); b's gap 100 ms over 2 tokens/chunk -> 50
    assert s["median_itl_ms"] == pytest.approx(100.0)
    assert s["mean_itl_ms"] == pytest.approx((100 + 100 + 200 + 50) / 4)
    assert s["mean_e2el_ms"] == pytest.approx((900 + 300) / 2)
    assert s["request_throughput"] == 1.0 and s["output_throughput"] == 4.0
    assert s["request_goodput"] == 0.5                  # only b meets TTFT <= 300 ms
    assert any("2 token chunks" in w for w in warnings)
    assert s["p99_ttft_ms"] <= 500 and s["median_normalized_latency_ms"] > 0


def test_schedules_rate_seed_and_burstiness():
    t = arrival_times(20000, 5.0, "poisson", seed=1)
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0)
    assert (len(t) - 1) / t[-1] == pytest.approx(5.0, rel=0.03)
    assert t == arrival_times(20000, 5.0, "poisson", seed=1) and t != arrival_times(20000, 5.0, "poisson", seed=2)
    bursty = np.diff(arrival_times(20000, 5.0, "gamma", burstiness=0.25, seed=1))
    regular = np.diff(arrival_times(20000, 5.0, "gamma", burstiness=4.0, seed=1))
    assert bursty.std() > 2 * np.diff(t).std() > regular.std() * 2
    assert arrival_times(3, 2.0, "constant") == [0.0, 0.5, 1.0]
    assert arrival_times(3, math.inf) == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError):
        arrival_times(3, 1.0, "weird")


def test_run_sweep_compare_against_a_server(tmp_path):
    from loadtest.cli import main

    with FakeOpenAI() as srv:
        rc = main(["sweep", "--base-url", srv.url, "--rates", "20", "inf", "--num-requests", "12", "--input-len", "50",
                   "--output-len", "5", "--label", "fake", "--result-dir", str(tmp_path), "--slo-ttft-ms", "1000"])
        assert rc == 0
        body = srv.bodies[-1]
        assert len(body["prompt"]) == 50 and body["ignore_eos"] and body["stream_options"]["include_usage"]
    res = json.loads((tmp_path / "fake-rate20.0.json").read_text())
    assert res["completed"] == 12 and res["failed"] == 0 and res["total_output_tokens"] == 60
    assert res["total_input_tokens"] == 600 and res["model_id"] == "fake-model"
    assert res["median_ttft_ms"] >= 20 and res["median_tpot_ms"] >= 5 and not res["warnings"]
    assert res["achieved_request_rate"] > 0 and "p99_send_lag_ms" in res and len(res["requests"]) == 12
    assert res["request_goodput"] > 0
    out = tmp_path / "report"
    assert main(["compare", str(tmp_path), "--out", str(out)]) == 0
    assert (out / "report.html").is_file() and (out / "median_ttft_ms.png").is_file()
    assert "fake" in (out / "table.md").read_text()


def test_locust_headless_open_loop(tmp_path):
    with FakeOpenAI() as srv:
        cmd = [sys.executable, "-m", "locust", "-f", "loadtest/locustfile.py", "--headless", "--host", srv.url,
               "--users", "4", "--spawn-rate", "4", "--run-time", "4s", "--rate", "5", "--input-len", "20",
               "--output-len", "4", "--csv", str(tmp_path / "lc"), "--only-summary"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[2])
    stats = (tmp_path / "lc_stats.csv").read_text()
    assert "TTFT" in stats and "TPOT" in stats and "E2E" in stats and "POST completions" in stats, p.stdout + p.stderr
    n_requests = len(srv.bodies)
    assert 8 <= n_requests <= 40           # ~5 req/s over ~4 s, not users x loop speed
