"""benchmarks/report/perf.py: the ratio keys of each dtype and shape, the merge into summary.json,
and the per-run output names (fabricated suite documents; no servers)."""

import json

from benchmarks.report import perf as report

# server -> workload -> (median, [(p50_ttft_ms, p50_tpot_ms) per round])
SMOLLM2 = {
    "ours": {"chat_256_16": (30.0, [(100.0, 20.0), (300.0, 40.0), (200.0, 30.0)]),
             "prefill_1024_32": (600.0, []), "decode_128_128": (150.0, []), "prefix_1024_64": (300.0, [])},
    "ours_nocache": {"prefix_1024_64": (1500.0, [])},
    "ours_swiftkv": {"prefill_1024_32": (900.0, [])},
    "vllm_cpu": {"chat_256_16": (25.0, [(100.0, 10.0), (400.0, 20.0), (100.0, 30.0)]),
                 "prefill_1024_32": (500.0, []), "decode_128_128": (200.0, [])},
}
ONE_B = {"ours": {"prefill_1024_32": (300.0, []), "decode_128_128": (40.0, [])},
         "vllm_cpu": {"prefill_1024_32": (400.0, []), "decode_128_128": (50.0, [])}}


def make_doc(results: dict, dtype: str | None = None, shape: str | None = None) -> dict:
    doc = {"command": "python -m benchmarks serve suite", "repeats": 3, "scale": 1.0,
           "machine_start": {"cpu": "test", "cores": 2, "loadavg": [0.0, 0.0, 0.0]},
           "servers": {s: {"results": {w: {"median": m, "metric": "output_throughput",
                                           "runs": [{"output_throughput": m, "p50_ttft_ms": a, "p50_tpot_ms": b}
                                                    for a, b in rounds] or [{"output_throughput": m}]}
                                       for w, (m, rounds) in ws.items()}}
                           for s, ws in results.items()}}
    if dtype:
        doc["dtype"] = dtype
    if shape:
        doc["shape"] = shape
    return doc


def test_float32_keys():
    s = report.summary(make_doc(SMOLLM2, "float32", "smollm2"))
    # chat p50 TTFT: ours median(100, 300, 200) = 200 / vllm median(100, 400, 100) = 100; TPOT 30 / 20
    assert s == {"vs_vllm_cpu": {"chat_256_16": 1.2, "prefill_1024_32": 1.2, "decode_128_128": 0.75},
                 "swiftkv_vs_vllm_cpu_prefill_1024_32": 1.8, "prefix_cache_ttft_ratio": 0.2,
                 "chat_ttft_p50_ratio": {"float32": 2.0}, "chat_tpot_p50_ratio": {"float32": 1.5}}
    assert report.summary(make_doc(SMOLLM2)) == s            # documents from before the fields: float32 smollm2
    numbers = [*s["vs_vllm_cpu"].values(), s["chat_ttft_p50_ratio"]["float32"], s["prefix_cache_ttft_ratio"]]
    assert all(type(v) is float for v in numbers)


def test_bfloat16_keys_leave_the_float32_ones_alone():
    s = report.summary(make_doc(SMOLLM2, "bfloat16", "smollm2"))
    assert s == {"vs_vllm_cpu_bf16": {"prefill_1024_32": 1.2, "decode_128_128": 0.75},
                 "swiftkv_vs_vllm_cpu_bf16_prefill_1024_32": 1.8,
                 "chat_ttft_p50_ratio": {"bfloat16": 2.0}, "chat_tpot_p50_ratio": {"bfloat16": 1.5}}


def test_1b_keys():
    assert report.summary(make_doc(ONE_B, "bfloat16", "1b")) == {
        "vs_vllm_cpu_bf16_1b": {"prefill_1024_32": 0.75, "decode_128_128": 0.8}}
    assert report.summary(make_doc(ONE_B, "float32", "1b")) == {
        "vs_vllm_cpu_1b": {"prefill_1024_32": 0.75, "decode_128_128": 0.8}}


def test_latency_ratio_needs_the_field_in_every_run_of_both_servers():
    results = {s: dict(ws) for s, ws in SMOLLM2.items()}
    results["vllm_cpu"]["chat_256_16"] = (25.0, [])         # runs without p50 fields
    s = report.summary(make_doc(results, "float32", "smollm2"))
    assert "chat_ttft_p50_ratio" not in s and "chat_tpot_p50_ratio" not in s
    assert s["vs_vllm_cpu"]["chat_256_16"] == 1.2


def test_merge_keeps_other_keys_and_merges_per_dtype_dicts():
    f32 = report.summary(make_doc(SMOLLM2, "float32", "smollm2"))
    bf16 = report.summary(make_doc(SMOLLM2, "bfloat16", "smollm2"))
    old = {**f32, "some_other_key": 7}
    merged = report.merge_summary(old, bf16)
    assert merged["vs_vllm_cpu"] == f32["vs_vllm_cpu"] and merged["vs_vllm_cpu_bf16"] == bf16["vs_vllm_cpu_bf16"]
    assert merged["some_other_key"] == 7 and merged["prefix_cache_ttft_ratio"] == 0.2
    assert merged["chat_ttft_p50_ratio"] == {"float32": 2.0, "bfloat16": 2.0}
    assert merged["chat_tpot_p50_ratio"] == {"float32": 1.5, "bfloat16": 1.5}
    assert old["chat_ttft_p50_ratio"] == {"float32": 2.0}                     # inputs left as they were
    # a later float32 run replaces its own keys and its own entries only
    later = {"vs_vllm_cpu": {"decode_128_128": 1.1}, "chat_ttft_p50_ratio": {"float32": 0.9}}
    again = report.merge_summary(merged, later)
    assert again["vs_vllm_cpu"] == {"decode_128_128": 1.1}
    assert again["chat_ttft_p50_ratio"] == {"float32": 0.9, "bfloat16": 2.0}
    assert again["vs_vllm_cpu_bf16"] == bf16["vs_vllm_cpu_bf16"]


def test_output_names_per_run():
    assert [report.output_stem(d, s) for d, s in [("float32", "smollm2"), ("bfloat16", "smollm2"),
                                                  ("bfloat16", "1b"), ("float32", "1b")]] == \
        ["suite", "suite_bf16", "suite_bf16_1b", "suite_1b"]


def test_write_outputs_one_summary_for_every_run(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"from_before": 1.0}))
    report.write_outputs(make_doc(SMOLLM2, "float32", "smollm2"), tmp_path)
    first = (tmp_path / "suite.json").read_text()
    report.write_outputs(make_doc(SMOLLM2, "bfloat16", "smollm2"), tmp_path)
    report.write_outputs(make_doc(ONE_B, "bfloat16", "1b"), tmp_path)
    for stem in ("suite", "suite_bf16", "suite_bf16_1b"):
        assert all((tmp_path / f"{stem}.{ext}").is_file() for ext in ("json", "md", "png")), stem
    assert (tmp_path / "suite.json").read_text() == first                    # not overwritten by the others
    assert json.loads((tmp_path / "suite_bf16_1b.json").read_text())["summary"] == {
        "vs_vllm_cpu_bf16_1b": {"prefill_1024_32": 0.75, "decode_128_128": 0.8}}
    summ = json.loads((tmp_path / "summary.json").read_text())
    assert set(summ) == {"from_before", "vs_vllm_cpu", "swiftkv_vs_vllm_cpu_prefill_1024_32", "prefix_cache_ttft_ratio",
                         "chat_ttft_p50_ratio", "chat_tpot_p50_ratio", "vs_vllm_cpu_bf16",
                         "swiftkv_vs_vllm_cpu_bf16_prefill_1024_32", "vs_vllm_cpu_bf16_1b"}
    assert summ["chat_tpot_p50_ratio"] == {"float32": 1.5, "bfloat16": 1.5}
    md = (tmp_path / "suite_bf16.md").read_text()
    assert "bfloat16, shape smollm2" in md and "## Chat latency" in md
    assert "| ours | 200.0 | 30.00 |" in md and "| ours / vllm_cpu | **2.000** | **1.500** |" in md
    assert "Chat latency" not in (tmp_path / "suite_bf16_1b.md").read_text()
