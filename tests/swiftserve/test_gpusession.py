"""The GPU session tooling (``make gpu-pack`` / ``make gpu-check``): parts that join back only
when complete and intact, the output-folder limits, the carried windows, a check without CUDA,
a pack refused when the tree leaves no room, and the CPU self-test of every stage."""

import json
import os

import numpy as np
import pytest
import torch

from swiftserve.gpusession import payloads
from swiftserve.gpusession.cli import main as cli_main
from swiftserve.gpusession.limits import Limits, out_problems
from swiftserve.gpusession.pack import PackError, assemble, build_pack
from swiftserve.gpusession.session import SessionConfig, run_check


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
        ["model", "tests", "bench", "distill"], "skipped")
    assert res["problems"] == [] and "environment incomplete" in (tmp_path / "out" / "summary.md").read_text()


def test_pack_refuses_when_the_tree_leaves_no_room(tmp_path, capsys):
    assert cli_main(["--carry-mib", "2", "pack", "--out", str(tmp_path / "pack")]) == 3
    err = capsys.readouterr().err
    assert "cannot pack" in err and "Largest files in the tree" in err and not (tmp_path / "pack").exists()


def test_self_test_runs_every_stage_and_resumes(tmp_path):
    from swiftserve.gpusession.selftest import run_selftest

    seen = run_selftest(tmp_path)          # raises SelfTestError on any unmet expectation
    assert seen["stages"] == dict.fromkeys(["env", "model", "tests", "bench", "distill"], "done")
    assert seen["out"] == ["logs.tar.gz", "results.json", "summary.md", "swiftkv-l2-g1.safetensors",
                           "swiftkv-l2-g2.safetensors"]
