"""The GPU session's vLLM parts that run here without vLLM: which image packages the carried
distributions need (extras and markers as pip evaluates them for the image), the site's archives
unpacked once each and resumably, the plugin's entry point declared by a written dist-info, the
stage plan, the summary keys taken from CUDA runs only, the parity rules, and the merge of a
session's summary. (The stage itself on a stub vLLM runs in the GPU self-test,
test_gpubundle.py; on the real one in `make gpu-vllm-selftest`.)"""

import json
import os
import subprocess
import sys
from pathlib import Path

from gpubundle import vllm_env, vllm_pack, vllm_results
from gpubundle.cli import main as cli_main
from gpubundle.pack import build_pack
from gpubundle.registry import plan_lines
from gpubundle.session import SessionConfig
from gpubundle.stages import Context
from gpubundle.vllm_stages import gpu_summary
import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def _dist(site: Path, name: str, version: str, *requires: str) -> None:
    d = site / f"{name.replace('-', '_')}-{version}.dist-info"
    d.mkdir(parents=True)
    head = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    (d / "METADATA").write_text(head + "\nRequires-Dist: not-a-header (the body)\n")


def test_requirement_checks_follow_extras_and_markers_into_the_image(tmp_path):
    site = tmp_path / "site"
    _dist(site, "vllm", "0.26.0", "fastapi[standard]>=0.1", "numpy", "protobuf>=5.29; python_version > '3.11'",
          "setuptools<81; python_version < '3.10'", "aiohttp>=3.13.3", "windows-only; sys_platform == 'win32'",
          "dropped-thing")
    _dist(site, "fastapi", "0.136", "starlette>=1", "uvicorn; extra == 'standard'", "typer; extra == 'cli'")
    _dist(site, "starlette", "1.0", "aiohttp>=3.10")
    _dist(site, "uvicorn", "0.54", "PyYAML>=6")
    _dist(site, "unreached", "1.0", "grpcio>=99")
    checks, unmet = vllm_pack.requirement_checks(site)
    by = {c["name"]: c for c in checks}
    # typer: an extra nobody asked for; setuptools: a marker false on the image's Python; grpcio: unreached
    assert set(by) == {"numpy", "protobuf", "aiohttp", "pyyaml"}
    assert by["aiohttp"]["by"] == ["starlette", "vllm"]
    assert set(by["aiohttp"]["specifier"].split(",")) == {">=3.13.3", ">=3.10"}
    assert by["numpy"]["specifier"] == "" and by["pyyaml"]["by"] == ["uvicorn"]
    assert unmet == ["dropped-thing (vllm)"]


def _site(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def test_vllm_archives_unpack_once_each_and_again_when_changed(tmp_path):
    files = {"pkg/big.bin": os.urandom(60_000), "pkg/__init__.py": b"x = 1\n", "other/a.txt": b"a", "top.py": b"t"}
    arch = vllm_pack.write_archives(_site(tmp_path / "site", files), tmp_path / "arch", 2, level=1)
    assert len(arch) == 2 and sum(a["files"] for a in arch) == 4
    paths = {a["name"]: tmp_path / "arch" / a["name"] for a in arch}
    first, second = list(paths)
    out = tmp_path / "out"
    assert vllm_env.unpack({first: paths[first]}, out) == [first]          # the parts of the other are missing
    assert vllm_env.unpack(paths, out) == [second]
    assert vllm_env.unpack(paths, out) == []
    assert {rel: (out / rel).read_bytes() for rel in files} == files
    vllm_pack.write_archives(_site(tmp_path / "site2", {**files, "pkg/big.bin": b"new"}), tmp_path / "arch", 2, 1)
    assert first in vllm_env.unpack(paths, out) and (out / "pkg/big.bin").read_bytes() == b"new"


def test_the_written_dist_info_declares_the_plugin_vllm_loads(tmp_path):
    info = vllm_env.write_plugin_dist(ROOT, tmp_path)
    assert info.name.startswith("swiftserve_vllm_plugin-") and (info / "RECORD").is_file()
    # -S: no site-packages (this venv's editable install declares the same entry point); only PYTHONPATH
    code = "import importlib.metadata as m; print([(e.name, e.value) for e in m.entry_points(group='vllm.general_plugins')])"
    # cwd: not the checkout, whose own *.egg-info (from the editable install) is on sys.path as ''
    out = subprocess.run([sys.executable, "-S", "-c", code], env={**os.environ, "PYTHONPATH": str(tmp_path)},
                         capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert out.strip() == "[('swiftserve', 'swiftserve_vllm:register')]"
    assert vllm_env.write_plugin_dist(ROOT, tmp_path) == info                  # idempotent


def test_image_checks_and_carried_replacements(tmp_path):
    checks = [{"name": "pytest", "specifier": ">=1", "by": ["x"]}, {"name": "pytest", "specifier": "<1", "by": ["y"]},
              {"name": "surely-not-installed-here", "specifier": ">=2", "by": ["z"]}]
    res = vllm_env.check_requirements(sys.executable, checks)
    assert [r["ok"] for r in res] == [True, False, False] and res[2]["installed"] is None
    assert vllm_env.install_overrides(sys.executable, res, {}, tmp_path / "o") == []      # nothing carried
    env = vllm_env.vllm_environ({"PYTHONPATH": "/a"}, ["/o", "/s"])
    assert env["PYTHONPATH"] == os.pathsep.join(["/o", "/s", "/a"]) and env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"


def _run(tokens, ref=None, eager=None, graphs=3, device="cuda"):
    r = {"device": device, "enforce_eager": False, "graphs": {"num_cudagraph_captured": graphs}, "tokens": tokens}
    if ref is not None:
        r["reference_tokens"] = ref
    if eager is not None:
        r["eager_tokens"] = eager
    return r


def test_parity_rules_and_the_summary_they_give():
    a = [[1, 2, 3, 4, 5, 6, 7], [9, 8, 7, 6, 5, 4, 3]]
    late = [[1, 2, 3, 4, 0, 0, 0], [9, 8, 7, 6, 5, 4, 3]]         # parts after the 4th token
    assert vllm_results.agree(a, late, 4) and not vllm_results.agree(a, late, 5)
    assert vllm_results.compiled_parity(_run(a, ref=late, eager=a))
    assert not vllm_results.compiled_parity(_run(a, ref=a, eager=late))      # eager must agree on 6
    zack = {**_run(a, ref=[[0]] * 2), "torch_reference_tokens": a}            # ZACK: the torch reference decides
    assert vllm_results.compiled_parity(zack)
    # with each position's two likeliest tokens: equal until a near-tie, where the other may take the second
    top2 = [[[[t, -0.1], [t + 100, -0.2]] for t in a[0]], [[[t, -0.1], [t + 100, -0.9]] for t in a[1]]]
    early = [[1, 102, 0, 0, 0, 0, 0], [9, 8, 7, 6, 5, 4, 3]]                # parts at a 0.1-nat tie
    assert vllm_results.parity({"tokens": a, "top2": top2}, early, 99)
    assert not vllm_results.parity({"tokens": a, "top2": top2}, [[1, 2, 3, 4, 5, 6, 7], [9, 108, 0, 0, 0, 0, 0]], 99)
    assert not vllm_results.parity({"tokens": a, "top2": top2}, [[1, 55, 0, 0, 0, 0, 0], a[1]], 99)  # not its second
    assert not vllm_results.parity({"tokens": a}, early, 4)                  # no top2: the first 4 must agree
    assert vllm_results.summary({"g": [_run(a, ref=a)]}) == {"vllm_gpu_runs": True,
                                                              "vllm_cuda_graph_greedy_parity": True}
    assert vllm_results.summary({"g": [_run(a, ref=a), _run(a, ref=[[5] * 7] * 2)]})[
        "vllm_cuda_graph_greedy_parity"] is False
    assert vllm_results.summary({"g": [_run(a, ref=a, graphs=0), _run(a, ref=a, device="cpu")]}) == {}
    fp8 = [{**_run(a, ref=[[5] * 7] * 2), "kv_cache_dtype": "fp8_e4m3"}, {**_run(a, ref=[[5] * 7] * 2),
                                                                           "quantization": "fp8"}]
    assert vllm_results.summary({"g": [_run(a, ref=a)], "fp8": fp8})["vllm_cuda_graph_greedy_parity"] is True
    assert vllm_results.summary({"fp8": fp8}) == {"vllm_gpu_runs": True}      # FP8 runs: not bf16 parity runs


def test_summary_keys_come_only_from_a_cuda_session(tmp_path):
    (tmp_path / "vllm-results.json").write_text(json.dumps({"g": [_run([[1, 2, 3, 4]], ref=[[1, 2, 3, 4]])]}))
    ratios = {"prefill_throughput": 1.7, "ttft_mean": 0.55, "decode_tpot": 1.02, "ttft_median": 0.5}
    state = {"env": {"cuda": True}, "vllm": {"status": "done", "import": {"vllm": "0.26.0"}},
             "vllm-8b": {"status": "done", "result": {"ratios": ratios}}}
    assert gpu_summary(state, tmp_path) == {
        "vllm_gpu_version": "0.26.0", "vllm_gpu_runs": True, "vllm_cuda_graph_greedy_parity": True,
        "vllm_swiftkv_prefill_throughput_ratio_8b": 1.7, "vllm_swiftkv_ttft_ratio_8b": 0.55,
        "vllm_swiftkv_decode_tpot_ratio_8b": 1.02}
    assert gpu_summary({**state, "env": {"cuda": False}}, tmp_path) == {}
    bench = {"cuda_graphs": True, "decode_vs_limit_b1": 1.23456, "decode_vs_limit_b64": 2.5, "decode_vs_limit_b4": 9}
    got = gpu_summary({**state, "bench": {"status": "done", "result": bench}}, tmp_path)
    assert (got["ref_decode_step_vs_bandwidth_limit_b1"], got["ref_decode_step_vs_bandwidth_limit_b64"]) == (1.235, 2.5)
    eager = gpu_summary({**state, "bench": {"status": "done", "result": {**bench, "cuda_graphs": False}}}, tmp_path)
    assert "ref_decode_step_vs_bandwidth_limit_b1" not in eager      # the issue's figure is the graphs' step
    by = {"plain": 9.5, "kcache": 20.25}
    got = gpu_summary({**state, "bench": {"status": "done", "result": {
        **bench, "decode_ms_by_method": by, "methods_batch": 64, "context": 1024}}}, tmp_path)
    assert got["ref_decode_ms_by_method"] == by
    small = gpu_summary({**state, "bench": {"status": "done", "result": {
        **bench, "decode_ms_by_method": by, "methods_batch": 4, "context": 64}}}, tmp_path)
    assert "ref_decode_ms_by_method" not in small                    # only batch 64 at context 1024


def test_merge_summary_takes_keys_a_gpu_measured_and_keeps_the_rest(tmp_path, capsys):
    into = tmp_path / "summary.json"
    into.write_text(json.dumps({"gpu_swiftkv_prefill_ratio": 0.54}))
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "summary.json").write_text(json.dumps({"device": "cpu x86_64", "keys": {"vllm_gpu_runs": True}}))
    assert cli_main(["merge-summary", str(tmp_path / "cpu"), "--into", str(into)]) == 1
    (tmp_path / "gpu").mkdir()
    (tmp_path / "gpu" / "summary.json").write_text(json.dumps({"device": "NVIDIA H200",
                                                                "keys": {"vllm_gpu_runs": True}}))
    assert cli_main(["merge-summary", str(tmp_path / "gpu"), "--into", str(into)]) == 0
    assert json.loads(into.read_text()) == {"gpu_swiftkv_prefill_ratio": 0.54, "vllm_gpu_runs": True}


def test_the_plan_names_estimates_and_the_parts_each_stage_waits_for(tmp_path):
    files = {n: tmp_path / n for n in ("m.gguf", "vllm-site-1.tar.xz")}
    for f in files.values():
        f.write_bytes(os.urandom(100_000))
    meta = {"model_file": "m.gguf", "vllm": {"archives": [{"name": "vllm-site-1.tar.xz"}], "overrides": [],
                                             "digest": "d"}}
    build_pack(tmp_path / "pack", files, 100_000 + (64 << 10), meta)           # one file per part
    cfg = SessionConfig(root=tmp_path, work=tmp_path / "w", pack=tmp_path / "pack").resolved()
    lines = plan_lines(Context(cfg, {"bench": {"status": "done", "fingerprint": ""}}), 540)
    text = "\n".join(lines)
    assert "part1, part2 here of 2" in lines[0]
    (tmp_path / "pack" / "part2").rename(tmp_path / "later")
    lines = plan_lines(Context(cfg, {"bench": {"status": "done", "fingerprint": ""}}), 540)
    by = {ln.split()[0]: ln for ln in lines[1:-1]}
    assert "waits for part2" in by["vllm"] and "waits for" not in by["model"]
    assert "after vllm, model" in by["vllm-tests"] and "done in an earlier call" in by["bench"]
    assert "(estimate)" in by["vllm-tests"] and "(estimate)" not in by["tests"]
    assert "vllm-8b" in text and lines[-1].startswith("estimated device time")


RECORD = """
import sys
from gpubundle import vllm_results
for i in range(20):
    vllm_results.record(f"{sys.argv[1]}-{i}", [{"tokens": [[i]]}])
"""


def test_probe_records_of_groups_finishing_at_once_are_all_kept(tmp_path, monkeypatch):
    # six xdist workers record into one file: an unlocked read-modify-write lost groups
    path = tmp_path / "vllm-results.json"
    env = {**os.environ, vllm_results.RESULTS_ENV: str(path), "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", RECORD, f"g{k}"], env=env) for k in range(4)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    assert len(json.loads(path.read_text())) == 80
    monkeypatch.setenv(vllm_results.RESULTS_ENV, str(path))
    assert vllm_results.probe_dir() == tmp_path / "vllm-probes" and (tmp_path / "vllm-probes").is_dir()
    monkeypatch.delenv(vllm_results.RESULTS_ENV)
    assert vllm_results.probe_dir() is None


def test_the_output_folder_carries_each_probe_log_even_of_a_stopped_stage(tmp_path):
    # the first GPU run's vllm-tests stage was stopped by its time limit and brought back no probe output
    import tarfile

    from gpubundle.collect import collect

    work = tmp_path / "work"
    (work / "vllm-probes").mkdir(parents=True)
    (work / "vllm-probes" / "g1.log").write_text("Capturing CUDA graphs ...\n")
    (work / "vllm-probes" / "g1.json").write_text("[]")
    cfg = SessionConfig(root=tmp_path, work=work, out=tmp_path / "out", pack=tmp_path / "pack").resolved()
    collect(cfg, {"vllm-tests": {"status": "timeout"}}, {}, 1, 1.0)
    with tarfile.open(tmp_path / "out" / "logs.tar.gz") as t:
        names = t.getnames()
    assert {"gpu-check/vllm-probes/g1.log", "gpu-check/vllm-probes/g1.json"} <= set(names)
