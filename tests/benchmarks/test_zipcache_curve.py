"""benchmarks/report/zipcache_curve.py: rows keyed by the block size the engine served with (ZipCache's
default 32 when none was given), the window counted from the method's own reservation, and the
summary merge that keeps other keys."""

import json

import pytest
from test_perf_tools import load

from benchmarks import cli

from refengine.kv import registry
from refengine.kv.methods.zipcache.layout import ZipLayout


def result(model, methods, block_size=None, ppl=3.0, tasks=None):
    ov = {"kv_methods": methods, **({"block_size": block_size} if block_size else {})}
    bs = block_size or registry.default_block_size(methods)
    opts = methods["zipcache"]
    lay = ZipLayout(4, 2, round(opts.get("salient_ratio", 0.375) * bs), bs)
    per_tok = 30 * 3 * (lay.block_bytes(64, bs, "k") + lay.block_bytes(64, bs, "v")) / bs
    return {"model": str(model), "overrides": ov, "kv_bytes_per_token_16bit": per_tok,
            "setup": {"prefix_tokens": 256}, "ppl_increase_pct": ppl, "ppl_increase_pct_ci": [ppl - 1, ppl + 1],
            "top1_agreement": 0.9, "task_accuracy": tasks, "task_accuracy_ci": [0.8, 0.95],
            "task_accuracy_relative": 1.0, "tasks_total": 727}


def test_rows_window_and_summary(tmp_path, smollm2_dir):
    zc = load("report.zipcache_curve")
    short = tmp_path / "s.json"
    short.write_text(json.dumps({"command": "modelkit eval ...", "results": {
        "a": result(smollm2_dir, {"zipcache": {"salient_ratio": 0.25}}, block_size=16, ppl=3.7),
        "b": result(smollm2_dir, {"zipcache": {}}, ppl=3.6)}}))          # no block size: served at 32
    tasks = tmp_path / "t.json"
    tasks.write_text(json.dumps({"results": {"b": result(smollm2_dir, {"zipcache": {}}, tasks=0.9)}}))
    rows = zc.build([str(short)], [], [str(tasks)], [256, 2048], 64, 2048)
    by = {(r["block_size"], r["salient_ratio"]): r for r in rows}
    assert set(by) == {(16, 0.25), (32, 0.375)}
    assert by[(16, 0.25)]["pool_ratio"] == pytest.approx(0.26953125)
    assert by[(32, 0.375)]["pool_ratio"] == pytest.approx(0.23828125)
    for r in rows:                                  # the staging area adds more per token at short contexts
        assert r["with_window"]["256"] > r["with_window"]["2048"] > r["pool_ratio"]
    assert by[(32, 0.375)]["task_accuracy_kept"] == 0.9 and "task_accuracy_kept" not in by[(16, 0.25)]
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"methods": {"kcache": {"x": 1}, "zipcache": {"host_bytes_per_token_ratio": 0.0}},
                                   "other": 2}))
    cli.run("report", "zipcache_curve", ["--short", str(short), "--tasks", str(tasks), "--out", str(tmp_path / "curve"),
             "--summary", str(summary), "--pick", "32,0.375"])
    doc = json.loads(summary.read_text())
    assert doc["other"] == 2 and doc["methods"]["kcache"] == {"x": 1}
    assert doc["methods"]["zipcache"] == {"host_bytes_per_token_ratio": 0.0,
                                         "device_bytes_per_token_ratio": pytest.approx(0.23828125),
                                         "device_bytes_ratio_with_window_2048": by[(32, 0.375)]["with_window"]["2048"],
                                         "ppl_increase_pct": 3.6, "task_accuracy_kept": 0.9}
    assert (tmp_path / "curve.md").exists() and (tmp_path / "curve.png").exists()
    with pytest.raises(SystemExit):
        cli.run("report", "zipcache_curve", ["--short", str(short), "--out", str(tmp_path / "c2"), "--summary", str(summary), "--pick", "64,0.5"])
