"""``gpu-check``'s CPU self-test: every stage of a GPU session, tiny, on this machine.

A tiny random Llama and random token windows are packed into parts small enough that
the model spans several; then three ``run_check`` calls play a session whose parts arrive
one command at a time:
1. only ``part1`` carried: ``env`` done, ``model`` waiting for the other parts, ``tests``
   (``tests/gpu``: skipped without CUDA) and ``bench`` (``gpu_bench.py --tiny``) done, ``distill`` waiting;
2. every part: the model is joined and checked, ``tests`` run again now that it is there,
   ``distill`` stops after its first step (a one-call training cap) with a checkpoint;
3. the same command: ``distill`` resumes from that checkpoint and finishes; the output folder
   holds the SwiftKV tensors of both group sizes and passes the size check.
Each expectation that fails raises ``SelfTestError``; ``run_selftest`` returns what each call saw.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

from swiftserve.gpusession import payloads
from swiftserve.gpusession.limits import MIB, out_problems, tree_bytes
from swiftserve.gpusession.pack import build_pack
from swiftserve.gpusession.random_model import TINY, write_random_llama
from swiftserve.gpusession.session import SessionConfig, run_check

ROOT = Path(__file__).resolve().parents[2]
BENCH = ("--tiny --device cpu --dtype float32 --repeats 1 --decode-steps 4 --prefill-tokens 64 --context 32 "
         "--batches 1 2 --cpu-kernels torch")


class SelfTestError(AssertionError):
    pass


def _expect(cond: bool, what: str, seen) -> None:
    if not cond:
        raise SelfTestError(f"{what}; saw {seen}")


def _pack(base: Path) -> dict:
    import torch

    model = write_random_llama(base / "tiny-llama", TINY, seed=0, std=0.3)
    g = torch.Generator().manual_seed(0)
    arrays = {"train": torch.randint(3, TINY["vocab_size"], (16, 32), generator=g).numpy(),
              "heldout": torch.randint(3, TINY["vocab_size"], (2, 32), generator=g).numpy()}
    files = payloads.save_windows(arrays, base / "staging")
    files["tiny-llama.tar"] = payloads.tar_model(model, base / "staging" / "tiny-llama.tar")
    meta = {"windows": {"seq_len": 32, "chat_repeats": 2, "seed": 0}, "model_file": "tiny-llama.tar",
            "model_name": "tiny-llama"}
    return build_pack(base / "pack-built", files, 256 << 10, meta)


def _stages(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())["stages"]


def run_selftest(base: Path, root: Path = ROOT) -> dict:
    manifest = _pack(base)
    _expect(manifest["parts"] >= 3, "the tiny model spans several parts", manifest["parts"])
    device_pack = base / "pack"
    shutil.copytree(base / "pack-built" / "part1", device_pack / "part1")
    cfg = SessionConfig(root=root, work=base / "work", out=base / "out", pack=device_pack, device="cpu",
                        budget_s=900, collect_reserve_s=5, bench_args=BENCH.split(), distill_l=2,
                        distill_groups=[1, 2], distill_steps=4, distill_micro_batch=2, distill_eval_every=2,
                        distill_eval_windows=2, distill_save_every=1, distill_init_windows=4,
                        distill_dtype="float32", distill_compile=False, distill_overhead_s=0)
    seen = {"parts": manifest["parts"], "tree_mib": round(tree_bytes(root) / MIB, 1)}

    seen["rc1"] = run_check(cfg)
    s = _stages(cfg.out)
    _expect(seen["rc1"] == 0 and s["env"]["status"] == "done", "call 1 runs clean", s["env"])
    _expect(s["model"]["status"] == "waiting" and s["distill"]["status"] == "waiting", "call 1 waits for parts",
            (s["model"], s["distill"]))
    _expect(s["tests"]["status"] == "done" and s["bench"]["status"] == "done", "call 1 runs tests and bench",
            (s["tests"], s["bench"]))
    _expect(s["bench"]["result"]["swiftkv_prefill_ratio"] > 0, "the benchmark measured", s["bench"])

    for part in sorted((base / "pack-built").glob("part*"))[1:]:
        shutil.copytree(part, device_pack / part.name)
    seen["rc2"] = run_check(replace(cfg, distill_max_s=1e-6))
    s = _stages(cfg.out)
    _expect(s["model"]["status"] == "done", "call 2 joins the model", s["model"])
    _expect(s["tests"]["fingerprint"] == "model", "call 2 reruns the tests with the model", s["tests"])
    _expect(s["distill"]["status"] == "partial" and s["distill"]["steps"] == 1, "call 2 stops after one step",
            s["distill"])

    seen["rc3"] = run_check(cfg)
    s = _stages(cfg.out)
    d = s["distill"]
    _expect(seen["rc3"] == 0 and d["status"] == "done" and d["steps_before"] == 1 and d["steps"] == 4,
            "call 3 resumes and finishes", d)
    from safetensors.torch import load_file

    from modelkit.swiftkv import swiftkv_tensor_names

    for g in (1, 2):
        names = set(load_file(str(cfg.out / f"swiftkv-l2-g{g}.safetensors")))
        _expect(names == set(swiftkv_tensor_names(TINY["num_hidden_layers"], 2, g)), f"g={g} tensors", names)
    problems = out_problems(cfg.out)
    _expect(not problems, "the output folder comes back whole", problems)
    seen["out"] = sorted(f.name for f in cfg.out.iterdir())
    seen["stages"] = {k: v["status"] for k, v in s.items()}
    return seen


def main(args) -> int:
    if args.dir:
        base = Path(args.dir)
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        seen = run_selftest(base)
    else:
        with tempfile.TemporaryDirectory(prefix="gpu-check-selftest-") as tmp:
            seen = run_selftest(Path(tmp))
    print(json.dumps(seen, indent=1))
    print("gpu-check self-test: every stage ran and resumed as expected")
    return 0
