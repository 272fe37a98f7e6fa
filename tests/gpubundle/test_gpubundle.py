"""The offline GPU validation bundle (``make gpu-park`` / ``gpu-pack`` / ``gpu-check`` / ``gpu-unpark``):
parking round trips (idempotent, never overwriting, sha256-checked) in a throwaway repository,
``make gpu-park-guard``, parts that join back only when complete and intact, the output-folder limits, the
carried windows, a check without CUDA, a pack refused when the tree leaves no room, and the CPU
self-test of all of it (on a copy of the tree, never the checkout itself)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gpubundle import park, payloads
from gpubundle.cli import main as cli_main
from gpubundle.limits import Limits, out_problems
from gpubundle.pack import PackError, assemble, build_pack
from gpubundle.selftest import commit_all
from gpubundle.session import SessionConfig, run_check

pytestmark = pytest.mark.e2e


ROOT = Path(__file__).resolve().parents[2]


def _repo(path: Path) -> dict[str, bytes]:
    """A repository with two tensors over the threshold, one under it and one outside the parked scopes."""
    files = {"checkpoints/a/big.safetensors": os.urandom(park.THRESHOLD + 1),
             "checkpoints/b/big2.safetensors": os.urandom(park.THRESHOLD + 7),
             "checkpoints/a/small.json": b"{}", "docs/big.bin": os.urandom(park.THRESHOLD + 3),
             ".gitignore": b"/.gpu-park/\n"}
    for name, data in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(data)
    commit_all(path)
    return files


def _status(path: Path) -> str:
    return subprocess.run(["git", "-C", str(path), "status", "--porcelain"], capture_output=True, text=True,
                          check=True).stdout


def test_park_and_unpark_round_trip(tmp_path):
    files = _repo(tmp_path)
    big = ["checkpoints/a/big.safetensors", "checkpoints/b/big2.safetensors"]
    mtime = (tmp_path / big[0]).stat().st_mtime_ns
    assert park.parkable(tmp_path) == big and park.guard(tmp_path) is None
    res = park.park(tmp_path)
    assert res == {"moved": big, "already": [], "bytes": sum(len(files[n]) for n in big)}
    assert not any((tmp_path / n).exists() for n in big) and (tmp_path / "checkpoints/a/small.json").is_file()
    assert {n: e["sha256"] for n, e in park.read_manifest(tmp_path)["files"].items()} == {
        n: park.sha256_file(tmp_path / ".gpu-park" / n) for n in big}
    assert _status(tmp_path).count(" D ") == 2            # deleted as far as git knows; .gpu-park/ is ignored
    assert "2 file(s)" in park.guard(tmp_path) and "make gpu-unpark" in park.guard(tmp_path)
    assert park.park(tmp_path) == {"moved": [], "already": big, "bytes": res["bytes"]}
    (tmp_path / "checkpoints" / "b").rmdir()                 # emptied by parking (git keeps no folders)

    restored = park.unpark(tmp_path)
    assert restored["restored"] == big and _status(tmp_path) == "" and not (tmp_path / ".gpu-park").exists()
    assert (tmp_path / big[0]).stat().st_mtime_ns == mtime and park.guard(tmp_path) is None
    assert park.unpark(tmp_path) == {"restored": [], "already": [], "bytes": 0}


def test_park_never_overwrites_and_unpark_checks_sha256(tmp_path):
    files = _repo(tmp_path)
    name = "checkpoints/a/big.safetensors"
    park.park(tmp_path)
    subprocess.run(["git", "-C", str(tmp_path), "checkout", "--", name], check=True)   # the same bytes again
    assert park.park(tmp_path)["moved"] == [name] and not (tmp_path / name).exists()     # identical: one copy kept
    (tmp_path / name).write_bytes(os.urandom(park.THRESHOLD + 1))          # a different file of its name
    with pytest.raises(park.ParkError, match="refusing to overwrite"):
        park.park(tmp_path)
    with pytest.raises(park.ParkError, match="refusing to overwrite"):
        park.unpark(tmp_path)
    assert (tmp_path / ".gpu-park" / name).read_bytes() == files[name]
    (tmp_path / name).unlink()
    held = tmp_path / ".gpu-park" / name
    held.write_bytes(b"\0" + held.read_bytes()[1:])
    with pytest.raises(park.ParkError, match="nothing moved: .*has sha256"):
        park.unpark(tmp_path)
    assert not (tmp_path / "checkpoints/b/big2.safetensors").exists()      # nothing moved
    held.write_bytes(files[name])
    assert len(park.unpark(tmp_path)["restored"]) == 2 and _status(tmp_path) == ""


def test_park_guard_names_gpu_unpark(tmp_path):
    _repo(tmp_path)
    guard = [sys.executable, "-m", "gpubundle.park", "guard", "--root", str(tmp_path)]
    assert subprocess.run(guard, cwd=ROOT, capture_output=True).returncode == 0
    park.park(tmp_path)
    res = subprocess.run(guard, cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 1 and "make gpu-unpark" in res.stderr


# Project dependencies a bare GPU image (python3 with torch, triton, transformers, pytest) lacks; the pack
# carries the first four groups as wheels, but the session's own process must run before they are installed.
BARE_LACKS = ["pydantic", "pydantic_core", "gguf", "accelerate", "psutil", "hypothesis", "schemathesis", "fastapi",
              "uvicorn", "httpx", "aiohttp", "orjson", "prometheus_client", "openai", "matplotlib", "locust",
              "kubernetes", "vllm"]
BLOCK = f"""import importlib.abc, runpy, sys
class Bare(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {BARE_LACKS!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (bare GPU image)")
sys.meta_path.insert(0, Bare())
"""


def test_gpu_session_process_and_gpu_tests_import_only_what_a_bare_image_has():
    driver = BLOCK + ("import gpubundle.cli, gpubundle.selftest, modelkit.distill_train, "
                      "modelkit.shipped\nsys.argv = ['gpu-check', 'check', '--help']\n"
                      "runpy.run_module('gpubundle', run_name='__main__')")
    res = subprocess.run([sys.executable, "-c", driver], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0 and "--distill-init" in res.stdout, res.stderr[-2000:]
    collect = BLOCK + ("sys.argv = ['pytest', 'tests/gpu', '--collect-only', '-q', '-p', 'no:cacheprovider']\n"
                       "runpy.run_module('pytest', run_name='__main__')")
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    res = subprocess.run([sys.executable, "-c", collect], cwd=ROOT, capture_output=True, text=True, env=env)
    assert res.returncode == 0 and "tests collected" in res.stdout, (res.stdout + res.stderr)[-2000:]


def test_distillation_starts_from_carried_tensors_resumed_ones_first(tmp_path):
    from dataclasses import replace

    from gpubundle.distill_stage import init_choice
    from gpubundle.stages import Context

    cfg = SessionConfig(work=tmp_path, distill_l=15, distill_groups=[1])
    model = {"pack": {"model_name": "M", "shipped": {"base": "M"}},
             "shipped": ["s/swiftkv-l15-g1.safetensors", "s/swiftkv-l15-g2.safetensors"]}
    ctx, src = Context(cfg, {"model": model}), {"kind": "pack"}
    assert init_choice(ctx, src) == "lstsq"                                   # not placed (yet)
    (tmp_path / "checkpoints" / "s").mkdir(parents=True)
    (tmp_path / "checkpoints" / "s" / "swiftkv-l15-g1.safetensors").write_bytes(b"x")
    assert init_choice(ctx, src) == str(tmp_path / "checkpoints" / "s")
    assert init_choice(Context(replace(cfg, distill_groups=[1, 2]), {"model": model}), src) == "lstsq"
    assert init_choice(Context(replace(cfg, distill_l=22), {"model": model}), src) == "lstsq"
    assert init_choice(ctx, {"kind": "random"}) == "lstsq"
    model["pack"]["shipped"]["base"] = "another model"
    assert init_choice(ctx, src) == "lstsq"
    model["resume"] = ["swiftkv-l15-g1.safetensors"]
    (tmp_path / "resume").mkdir()
    (tmp_path / "resume" / "swiftkv-l15-g1.safetensors").write_bytes(b"y")
    assert init_choice(ctx, src) == str(tmp_path / "resume")
    assert init_choice(Context(replace(cfg, distill_init="original"), {"model": model}), src) == "original"


def test_parts_join_only_when_complete_and_intact(tmp_path):
    src = {"a.bin": os.urandom(70_000), "b.bin": b"", "c.bin": os.urandom(300_000)}   # c spans all 3 parts
    for name, data in src.items():
        (tmp_path / name).write_bytes(data)
    m = build_pack(tmp_path / "pack", {n: tmp_path / n for n in src}, 200 << 10, {"note": "x"})
    assert m["parts"] == 3 and all(c["size"] <= (200 << 10) for f in m["files"].values() for c in f["chunks"])
    assert all((tmp_path / "pack" / f"part{k}" / "manifest.json").is_file() for k in (1, 2, 3))

    (tmp_path / "pack" / "part3").rename(tmp_path / "later")
    got = assemble(tmp_path / "pack", tmp_path / "joined")
    assert got.meta == {"note": "x"} and got.missing == {"c.bin": ["part3"]}
    assert {n: p.read_bytes() for n, p in got.files.items()} == {n: src[n] for n in ("a.bin", "b.bin")}

    (tmp_path / "later").rename(tmp_path / "pack" / "part3")
    chunk = next((tmp_path / "pack" / "part3").glob("c.bin.*"))
    chunk.write_bytes(b"\0" + chunk.read_bytes()[1:])
    with pytest.raises(PackError, match="c.bin: sha256"):
        assemble(tmp_path / "pack", tmp_path / "joined")


def test_out_problems_counts_files_sizes_and_depth(tmp_path):
    lim = Limits(out_files=2, out_file_mib=1 / 1024, out_total_mib=1.5 / 1024, out_depth=1)
    (tmp_path / "a").write_bytes(b"x" * 1000)
    assert out_problems(tmp_path, lim) == []
    (tmp_path / "b").write_bytes(b"x" * 1100)
    (tmp_path / "d1" / "d2").mkdir(parents=True)
    (tmp_path / "d1" / "d2" / "c").write_bytes(b"x")
    problems = " | ".join(out_problems(tmp_path, lim))
    assert "3 files" in problems and "b is" in problems and "in all" in problems and "folders deep" in problems


def test_carried_windows_are_what_modelkit_distill_reads(tmp_path):
    arrays = {"train": np.arange(40_000, 40_064).reshape(2, 32), "heldout": np.arange(64).reshape(2, 32)}
    npy = payloads.save_windows(arrays, tmp_path / "npy")
    assert np.load(npy["windows-train.npy"]).dtype == np.uint16
    corpus = payloads.load_windows_into({"train": npy["windows-train.npy"], "heldout": npy["windows-heldout.npy"]},
                                        tmp_path / "corpus", 32, 2, 0)
    from modelkit.distill_data import load_windows

    train = load_windows(corpus, tmp_path / "no-tokenizer-needed", "train", 32, 2, 0)
    assert train.dtype == torch.long and torch.equal(train, torch.from_numpy(arrays["train"]))
    assert torch.equal(load_windows(corpus, tmp_path, "heldout", 32, 1, 0), torch.from_numpy(arrays["heldout"]))


def test_check_without_cuda_says_so_and_still_writes_the_folder(tmp_path):
    cfg = SessionConfig(work=tmp_path / "work", out=tmp_path / "out", pack=tmp_path / "none", device="cuda")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert run_check(cfg) == 1
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert res["stages"]["env"]["status"] == "failed" and "a CUDA device" in res["stages"]["env"]["missing"]
    assert {k: v["status"] for k, v in res["stages"].items() if k != "env"} == dict.fromkeys(
        ["model", "tests", "bench", "vllm", "vllm-tests", "vllm-8b", "distill"], "skipped")
    assert res["problems"] == [] and "environment incomplete" in (tmp_path / "out" / "summary.md").read_text()


def test_pack_refuses_when_the_tree_leaves_no_room(tmp_path, capsys):
    _repo(tmp_path)
    args = ["--root", str(tmp_path), "--carry-mib", "5", "pack", "--out", str(tmp_path / "pack"), "--margin-mib", "2"]
    assert cli_main(args) == 3
    err = capsys.readouterr().err
    assert "tree that travels with every command (tracked + untracked not ignored, on disk now): 2.9 MiB" in err
    assert "checkpoints NOT parked: 2 file(s), 1.9 MiB" in err and "parts of 0.1 MiB" in err
    assert "cannot pack: run `make gpu-park` first" in err and "Largest files in the tree" in err
    park.park(tmp_path)
    (tmp_path / "untracked.bin").write_bytes(os.urandom(100_000))           # travels too: counted
    assert cli_main(args) == 3
    err = capsys.readouterr().err
    assert "on disk now): 1.0 MiB" in err and "no checkpoint tensors in the tree; 2 file(s) parked" in err
    assert "parts of 2.0 MiB" in err and "make gpu-park" not in err and not (tmp_path / "pack").exists()


def test_pack_of_a_parked_tree_carries_the_parked_shipped_file(tmp_path, capsys):
    from gpubundle.random_model import TINY, write_random_llama

    repo, corpus = tmp_path / "repo", tmp_path / "corpus"
    repo.mkdir()
    files = _repo(repo)
    park.park(repo)
    model = write_random_llama(tmp_path / "tiny", TINY)
    corpus.mkdir()
    for split, repeats in (("train", 2), ("heldout", 1)):
        torch.save(torch.randint(3, TINY["vocab_size"], (8, 32)), corpus / payloads.windows_name(split, 32, repeats, 0))
    args = ["--root", str(repo), "--carry-mib", "6", "pack", "--out", str(tmp_path / "pack"), "--margin-mib", "1",
            "--no-wheels", "--vllm", "none", "--model", str(model), "--corpus", str(corpus), "--seq-len", "32",
            "--shipped", "a/big.safetensors", "--resume", str(tmp_path / "out")]
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "swiftkv-l2-g1.safetensors").write_bytes(b"tensors")
    assert cli_main(args) == 0
    err = capsys.readouterr().err
    m = json.loads((tmp_path / "pack" / "part1" / "manifest.json").read_text())
    tree = len(files["docs/big.bin"]) + len(files["checkpoints/a/small.json"]) + len(files[".gitignore"])
    assert m["meta"]["tree_bytes"] == tree and m["part_bytes"] == (6 << 20) - tree - (1 << 20)
    assert m["meta"]["parked"] is True
    name = "shipped.a~big.safetensors"
    assert m["meta"]["shipped"] == {"files": {name: "a/big.safetensors"}, "base": "tiny"}
    assert m["meta"]["resume"] == {"files": {"resume.swiftkv-l2-g1.safetensors": "swiftkv-l2-g1.safetensors"}}
    assert m["files"][name]["sha256"] == park.read_manifest(repo)["files"]["checkpoints/a/big.safetensors"]["sha256"]
    assert "Every GPU command must run with the checkpoints parked" in err and "make gpu-unpark" in err
    got = assemble(tmp_path / "pack", tmp_path / "joined")
    assert got.missing == {} and got.files[name].read_bytes() == files["checkpoints/a/big.safetensors"]


def test_self_test_runs_every_stage_and_resumes(tmp_path):
    from gpubundle.selftest import run_selftest

    seen = run_selftest(tmp_path)          # raises SelfTestError on any unmet expectation
    assert seen["parked_files"] >= 1 and seen["parked_tree_mib"] < seen["tree_mib"]
    assert abs(seen["part_mib"] - (64 - 4 - seen["parked_tree_mib"])) <= 0.01
    assert seen["stages"] == {**dict.fromkeys(["env", "model", "tests", "bench", "distill"], "done"),
                              **dict.fromkeys(["vllm", "vllm-tests", "vllm-8b"], "skipped")}     # no vLLM packed
    assert seen["vllm_stub"]["status"] == "failed" and "did not register" in seen["vllm_stub"]["error"]
    assert seen["out"] == ["logs.tar.gz", "results.json", "summary.md", "swiftkv-l2-g1.safetensors",
                           "swiftkv-l2-g2.safetensors"]
