"""benchmarks/serve/suite.py's --shape 1b: the server commands (random weights on both servers), the
workload table, what it refuses, and the per-run outputs of main (servers faked; none started)."""

import argparse
import json
from pathlib import Path

import pytest

from benchmarks import cli
from benchmarks.serve import suite

pytestmark = pytest.mark.e2e


@pytest.fixture
def tokenizer_dir(tmp_path, monkeypatch):
    """A stand-in for the default model directory (tokenizer files only); the cache in tmp_path."""
    monkeypatch.setenv("SWIFTSERVE_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "smollm2"
    src.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (src / name).write_text("{}")
    (src / "config.json").write_text(json.dumps({"vocab_size": 49152}))
    return src


def args_for(model: Path, **kw) -> argparse.Namespace:
    base = dict(model=str(model), swiftkv_model="unused", dtype="bfloat16", worker_args="", vllm_venv=".venv-vllm",
                shape="1b")
    return argparse.Namespace(**{**base, **kw})


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_1b_server_commands_load_random_weights_on_both_servers(tokenizer_dir, tmp_path):
    cmds = suite.server_commands(args_for(tokenizer_dir))
    assert set(cmds) == {"ours", "vllm_cpu"}
    model = tmp_path / "cache" / "models" / "llama-1b-shape"
    assert json.loads((model / "config.json").read_text())["hidden_size"] == 2048
    for name, (argv, _, works) in cmds.items():
        assert flag(argv, "--load-format") == "dummy", name
        assert flag(argv, "--model") == str(model) and flag(argv, "--dtype") == "bfloat16", name
        assert works == ["prefill_1024_32", "decode_128_128"], name
    assert "vllm.entrypoints.openai.api_server" in cmds["vllm_cpu"][0]


def test_smollm2_server_commands_keep_the_real_weights(monkeypatch, tmp_path):
    import modelkit.models

    monkeypatch.setattr(modelkit.models, "resolve_model", lambda name: tmp_path / name)
    cmds = suite.server_commands(args_for(Path("smol"), shape="smollm2", swiftkv_model="swift", dtype="float32"))
    assert set(cmds) == {"ours", "ours_nocache", "ours_swiftkv", "vllm_cpu"}
    assert all("--load-format" not in argv for argv, _, _ in cmds.values())
    assert flag(cmds["ours_swiftkv"][0], "--model") == str(tmp_path / "swift")


def test_1b_workloads_have_the_issues_prompt_counts():
    one_b = suite.workloads_of_shape("1b")
    assert {w: v[2] for w, v in one_b.items()} == {"prefill_1024_32": 8, "decode_128_128": 16}
    assert one_b["prefill_1024_32"][:2] == (1024, 32) and one_b["decode_128_128"][:2] == (128, 128)
    assert suite.workloads_of_shape("smollm2") is suite.SERVING


@pytest.mark.parametrize("argv, words", [
    (["--servers", "ours", "ours_swiftkv"], "not ours_swiftkv"),
    (["--servers", "ours_nocache"], "no prefix-cache variant"),
    (["--workloads", "chat_256_16"], "not chat_256_16"),
])
def test_1b_refuses_servers_and_workloads_it_has_not(argv, words, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        cli.run("serve", "suite", ["--shape", "1b", "--out", str(tmp_path), *argv])
    assert e.value.code == 2 and words in capsys.readouterr().err


def test_main_writes_its_own_files_and_merges_the_summary(tokenizer_dir, tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text(json.dumps({"vs_vllm_cpu": {"decode_128_128": 1.06},
                                                  "chat_ttft_p50_ratio": {"float32": 0.8}}))
    monkeypatch.setattr(suite, "machine_info", lambda root, venv: {"cpu": "test", "cores": 2, "loadavg": [0, 0, 0]})
    seen = {}

    def fake_run_suite(cmds, servers, workloads_of, args, out_dir, done):
        seen.update(servers=servers, workloads_of=workloads_of)
        for name, value in (("ours", 45.0), ("vllm_cpu", 50.0)):
            run = {"output_throughput": value}
            done(name, {"decode_128_128": {"median": value, "metric": "output_throughput", "runs": [run]}})

    monkeypatch.setattr(suite, "run_suite", fake_run_suite)
    assert cli.run("serve", "suite", ["--shape", "1b", "--dtype", "bfloat16", "--model", str(tokenizer_dir), "--out", str(out),
                       "--workloads", "decode_128_128"]) == 0
    assert seen == {"servers": ["ours", "vllm_cpu"],
                    "workloads_of": {"ours": ["decode_128_128"], "vllm_cpu": ["decode_128_128"]}}
    doc = json.loads((out / "suite_bf16_1b.json").read_text())
    assert (doc["dtype"], doc["shape"]) == ("bfloat16", "1b") and doc["workloads"]["decode_128_128"][2] == 16
    assert not (out / "suite.json").exists()
    assert json.loads((out / "summary.json").read_text()) == {
        "vs_vllm_cpu": {"decode_128_128": 1.06}, "chat_ttft_p50_ratio": {"float32": 0.8},
        "vs_vllm_cpu_bf16_1b": {"decode_128_128": 0.9}}


def test_settle_returns_once_the_servers_are_idle():
    """benchmarks.lib.procs.settle, which the suite runs between servers: an idle process tree settles after one quiet window; a busy one is waited for, up to the cap."""
    import subprocess
    import sys
    import time

    from benchmarks.lib.procs import settle
    from benchmarks.lib.profiling import tree_cpu_seconds

    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        assert tree_cpu_seconds([idle]) >= 0.0
        assert settle([idle], idle_s=0.1, max_s=5) < 1.0
        assert settle([busy], idle_s=0.1, max_s=0.5) >= 0.5
    finally:
        idle.kill()
        busy.kill()
