"""The serving benchmark's ratio arithmetic and the GPU benchmark (tiny shape, on CPU), through
``python -m benchmarks`` as a user runs them."""

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import cli

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def load(name):
    """``benchmarks.<name>``, e.g. ``load("engine.ab")``."""
    return importlib.import_module(f"benchmarks.{name}")


def doc_with(results: dict) -> dict:
    return {"servers": {s: {"results": {w: {"median": v, "metric": "m", "runs": []} for w, v in ws.items()}}
                        for s, ws in results.items()}}


def test_summary_ratios_come_only_from_measured_figures():
    report = load("report.perf")
    doc = doc_with({"ours": {"chat_256_16": 30.0, "prefill_1024_32": 600.0, "decode_128_128": 150.0,
                             "prefix_1024_64": 300.0},
                    "ours_nocache": {"prefix_1024_64": 1500.0},
                    "ours_swiftkv": {"prefill_1024_32": 900.0},
                    "vllm_cpu": {"chat_256_16": 25.0, "prefill_1024_32": 500.0, "decode_128_128": 200.0}})
    s = report.summary(doc)
    assert s == {"vs_vllm_cpu": {"chat_256_16": 1.2, "prefill_1024_32": 1.2, "decode_128_128": 0.75},
                 "swiftkv_vs_vllm_cpu_prefill_1024_32": 1.8, "prefix_cache_ttft_ratio": 0.2}
    assert all(isinstance(v, float) for v in s["vs_vllm_cpu"].values())
    # a server that did not run leaves its ratios out instead of inventing them
    partial = report.summary(doc_with({"ours": {"chat_256_16": 30.0}, "ours_swiftkv": {"prefill_1024_32": 9.0}}))
    assert partial == {}


@pytest.mark.slow
def test_gpu_benchmark_script_runs_on_cpu_with_a_tiny_shape(tmp_path):
    out = tmp_path / "tiny.json"
    subprocess.run([sys.executable, "-m", "benchmarks", "engine", "gpu", "--tiny", "--device", "cpu",
                    "--dtype", "float32", "--batches", "1", "4", "--decode-steps", "4", "--repeats", "1",
                    "--out", str(out)], check=True, cwd=ROOT, timeout=600)
    res = json.loads(out.read_text())
    for key in ("prefill_ms_baseline", "prefill_ms_swiftkv", "swiftkv_prefill_ratio", "decode_ms_b1",
                "decode_ms_b4", "decode_vs_limit_b4", "copy_bandwidth_gbs", "weight_bytes"):
        assert res[key] > 0, key
    assert res["shape"] == "tiny" and res["device"] == "cpu"
    assert set(res["decode_ms_by_method"]) == {"plain", "fp8", "kcache", "zipcache", "eviction"}
    assert all(v > 0 for v in res["decode_ms_by_method"].values()) and res["methods_batch"] == 4
    assert not any(res["cuda_graphs_by_method"].values())               # CPU: no graphs


@pytest.mark.model
def test_linear_bench_checks_and_records_every_projection(smollm2_dir, tmp_path):
    out = tmp_path / "linear.json"
    r = subprocess.run([sys.executable, "-m", "benchmarks", "kernel", "linear", "--rows", "3", "--repeats", "1",
                        "--threads", "1", "--out", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    if "prepacking unavailable" in r.stdout + r.stderr:
        pytest.skip("oneDNN prepacking unavailable in this torch build")
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert {x["gemm"] for x in doc["rows"]} == {"qkv", "o", "gate_up", "down", "lm_head"}
    assert all(x["rows"] == 3 and x["plain_ms"] > 0 and x["packed_ms"] > 0 and x["of_peak"] > 0 for x in doc["rows"])
    assert doc["command"].startswith("python -m benchmarks kernel linear ")
    assert set(doc["layer_share_of_peak"]) == {"3"} and doc["layer_share_of_peak"]["3"] > 0
    from refengine.linear import bf16_gemm_kernels

    if bf16_gemm_kernels() is not None:      # bf16 rows where the project's GEMM is built (AVX-512-BF16)
        r = subprocess.run([sys.executable, "-m", "benchmarks", "kernel", "linear", "--rows", "3", "--repeats", "1",
                            "--threads", "1", "--dtype", "bfloat16", "--out", str(out)], capture_output=True,
                           text=True, cwd=ROOT, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        rows = json.loads(out.read_text())["rows"]
        assert all(x["bf16_gemm_ms"] > 0 and x["bf16_gemm_vs_onednn"] > 0 for x in rows) and "bf16 GEMM" in r.stdout


def test_engine_ab_parses_config_overrides():
    ab = load("engine.ab")
    assert ab.parse_set("packed_linear=off,max_num_seqs=8,swiftkv=false") == {
        "packed_linear": "off", "max_num_seqs": 8, "swiftkv": False}


@pytest.mark.parametrize("argv", [["--kv-methods", "{}", "{}"], ["--kv-methods", "{}", "[1]"], []])
def test_engine_ab_refuses_same_or_bad_configurations(argv, capsys):
    # Refused before any model loads: A == B measures nothing, and KV methods are JSON objects.
    with pytest.raises(SystemExit) as e:
        cli.run("engine", "ab", argv)
    assert e.value.code == 2 and ("same configuration" in capsys.readouterr().err or argv[-1] == "[1]")


def test_served_profile_shares_per_thread(tmp_path):
    prof = load("serve.profile")
    raw = tmp_path / "spy.txt"
    raw.write_text("thread (11): refengine;run (a.py:1);step (b.py:2) 60\n"
                   "thread (11): refengine;run (a.py:1);kernel (c.py:3) 10\n"
                   "thread (12): MainThread;loop (d.py:4) 5\n\n")
    s = prof.summarise(raw, samples=100)
    assert list(s) == ["refengine", "MainThread"]
    assert s["refengine"]["active_share"] == 0.7 and s["MainThread"]["active_share"] == 0.05
    assert s["refengine"]["top_frames"] == {"step (b.py:2)": 60, "kernel (c.py:3)": 10}


def test_served_ab_variants_and_report():
    ab = load("serve.ab")
    assert ab.parse_variant("a=ours") == ("a", "ours", {})
    assert ab.parse_variant("b=vllm_cpu:GOMP_SPINCOUNT=,X=1") == ("b", "vllm_cpu", {"GOMP_SPINCOUNT": "", "X": "1"})
    for bad in ("ours", "=ours", "a=", "a=ours:NOEQUALS"):
        with pytest.raises(Exception):
            ab.parse_variant(bad)
    run = {"output_throughput": 100.0, "cpu_s": {"1 python": 0.5, "2 python": 50.0, "client": 0.7}}
    doc = {"workload": "decode_128_128", "command": "python -m benchmarks serve ab",
           "paired_ratio_to_first": {"a": 1.0, "b": 1.25},
           "variants": {"a": {"env": {}, "metric": "output_throughput", "median": 100.0, "runs": [run]},
                        "b": {"env": {"K": "v"}, "metric": "output_throughput", "median": 125.0,
                              "runs": [{**run, "output_throughput": 125.0}]}}}
    md = ab.markdown(doc)
    assert "| b | K=v | 125.0 output_throughput | 125.0 | 1.250 | 0.5 + 50.0 / 0.7 |" in md


def test_perf_suite_start_unsets_empty_env(tmp_path, monkeypatch):
    suite = load("serve.suite")
    monkeypatch.setenv("SWIFTSERVE_TEST_UNSET", "1")
    log = tmp_path / "env.log"
    with pytest.raises(RuntimeError, match="exited"):
        suite.start([sys.executable, "-c", "import os,sys; print(sorted(k for k in os.environ if k.startswith("
                     "'SWIFTSERVE_TEST'))); sys.exit(3)"],
                    {"SWIFTSERVE_TEST_UNSET": "", "SWIFTSERVE_TEST_SET": "x"}, 1, log, timeout=30)
    assert log.read_text().strip() == "['SWIFTSERVE_TEST_SET']"


def test_attention_kernels_bench_compares_both_paths(tmp_path):
    out = tmp_path / "att.json"
    r = subprocess.run([sys.executable, "-m", "benchmarks", "kernel", "attention", "--prefill-len", "70",
                        "--batch", "3", "--context", "37", "--repeats", "1", "--threads", "1", "--out", str(out)],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["prefill"]["tokens"] == 70 and doc["decode"]["batch"] == 3
    for part in ("prefill", "decode"):
        assert doc[part]["kernel_ms"] > 0 and doc[part]["max_abs_diff"] < 1e-4, part
    assert doc["fma_peak_gflops"] > 0 and doc["prefill"]["kernel_of_fma_peak"] > 0
    bf16 = doc["prefill_bf16"]                 # bf16 dot products vs the float32 kernel on the same values
    assert bf16["bf16_dot_ms"] > 0 and bf16["float32_kernel_ms"] > 0 and bf16["max_abs_diff"] < 2e-2


def test_cpu_peak_measures_a_rate_and_refuses_bad_options(capsys):
    peak = load("kernel.cpu_peak")
    one = peak.measure(1, seconds=0.02, trials=1)
    assert one > 0
    assert cli.run("kernel", "cpu_peak", ["--threads", "1", "--seconds", "0.02", "--trials", "1"]) == 0
    assert "GFLOP/s" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.run("kernel", "cpu_peak", ["--trials", "0"])


def test_cpu_peak_bf16_dot_products_run_where_the_cpu_has_them(capsys):
    peak = load("kernel.cpu_peak")
    rc = cli.run("kernel", "cpu_peak", ["--threads", "1", "--seconds", "0.02", "--trials", "1", "--dtype", "bfloat16"])
    out = capsys.readouterr()
    has_bf16 = "avx512_bf16" in open("/proc/cpuinfo").read()
    if not has_bf16:
        assert rc == 2 and "AVX-512-BF16" in out.err
        return
    assert rc == 0 and "vdpbf16ps" in out.out
    assert peak.measure(1, 0.02, 1, "bfloat16") > 0


def test_cpu_peak_reads_a_memory_bandwidth():
    assert load("kernel.cpu_peak").read_bandwidth(1, trials=1, gib=0.01) > 0


def test_profile_vs_vllm_groups_operators():
    prof = load("engine.profile_vs_vllm")
    assert prof.family("_C::onednn_mm") == prof.family("mkldnn::_linear_pointwise") == "gemm"
    assert prof.family("swiftserve::bf16_gemm") == "gemm"
    assert prof.family("swiftserve::paged_prefill") == prof.family("_C::cpu_attention_with_kv_cache") == "attention"
    assert prof.family("aten::silu") == "elementwise" and prof.family("aten::index_select") == "other"


@pytest.mark.parametrize("script", ["suite", "ab"])
def test_server_commands_get_every_option_they_read(script, monkeypatch, tmp_path):
    """serve suite and serve ab build their servers with serve.suite.server_commands: both
    parsers must give it every option it reads (a missing one fails only when servers start)."""
    import ast
    import inspect

    mod = load(f"serve.{script}")
    tree = ast.parse(inspect.getsource(load("serve.suite").server_commands))     # before it is patched below
    captured = {}

    def fake(args):
        captured["args"] = args
        raise SystemExit(0)

    monkeypatch.setattr(mod, "server_commands", fake)
    argv = ["--dtype", "bfloat16", "--out", str(tmp_path / "out")]
    with pytest.raises(SystemExit):
        cli.run("serve", script, argv + (["--variant", "a=ours"] if script == "ab" else []))
    read = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and getattr(n.value, "id", "") == "args"}
    assert "dtype" in read and all(hasattr(captured["args"], a) for a in read), read
    assert captured["args"].dtype == "bfloat16"


@pytest.mark.slow
@pytest.mark.model
def test_api_scoring_measures_both_prefills(smollm2_dir):
    """benchmarks/quality/api_scoring.py's prefill half on a short prompt: both kinds run, and the
    echo kind really returns prompt logprobs (asserted inside)."""
    out = load("quality.api_scoring").prefill_times(str(smollm2_dir), 48, 1)
    assert out["plain_ms"] > 0 and out["echo_ms"] > 0 and out["ratio"] == out["echo_ms"] / out["plain_ms"]
    assert len(out["runs_ms"]["plain"]) == len(out["runs_ms"]["echo"]) == 1
