"""``python -m swiftserve_vllm.devcheck``: is every tensor of the plugin's model on the model's device?

Registers the plugin as vLLM does (``swiftserve_vllm.register``: version check, config type,
model classes), then builds ``SwiftServeLlamaForCausalLM`` for each ``--model`` inside ``torch.device(DEVICE)``
(default ``meta``: no memory, no weights, any machine), in this process, with a one-rank
gloo group, and lists every tensor that is not on that device:
- parameters and buffers of any module (vLLM's layers included);
- plain tensor attributes (also inside lists, tuples and dicts) of the plugin's own modules,
  which ``model.to(device)`` would not move and which vLLM's loader does not place.
A tensor created on the host while the model is built on a GPU fails here on ``meta`` too,
so the check needs no GPU. Prints JSON ``{"model", "device", "vllm", "tensors", "stray": [...]}`` per
model and exits 1 when anything is stray. Each record also says whether vLLM would run the model
on its V1 runner because of the plugin (``v1_runner_for_plugin``: the plugin's reason is among those
vLLM asks before picking Model Runner V2; ``compat.prefer_v1_model_runner``).

With vLLM's CUDA wheel on a machine without a GPU, ``--platform cpu`` (``make vllm-wheel-check``)
sets vLLM's CPU platform before any vLLM module reads it (0.32+ also honour
``VLLM_TARGET_DEVICE=cpu``; 0.26 does not and would fall back to an unspecified platform), and gives
the ``_C`` operators that layer constructors look up (e.g. ``silu_and_mul``) a schema when the CUDA
kernels cannot load (they need the GPU driver's ``libcuda.so.1``); nothing here runs them.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys

import torch
from torch import nn

_OWN = "swiftserve_vllm"


def _plain_tensors(value, path: str):
    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _plain_tensors(v, f"{path}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _plain_tensors(v, f"{path}[{k!r}]")


def stray_tensors(model: nn.Module, device: str) -> tuple[int, list[str]]:
    """(tensors checked, descriptions of those not on ``device`` or not registered)."""
    want = torch.device(device).type
    checked, stray = 0, []
    for mname, mod in model.named_modules():
        for kind, items in (("parameter", mod.named_parameters(recurse=False)),
                            ("buffer", mod.named_buffers(recurse=False))):
            for n, t in items:
                checked += 1
                if t.device.type != want:
                    stray.append(f"{mname}.{n} ({kind} on {t.device})")
        if not type(mod).__module__.startswith(_OWN):
            continue
        for k, v in vars(mod).items():
            if k in ("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"):
                continue
            for path, t in _plain_tensors(v, k):
                checked += 1
                stray.append(f"{mname}.{path} (plain tensor attribute on {t.device}: not moved with the model)")
    return checked, stray


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Operators vLLM's layer constructors look up in ``torch.ops._C`` (their schemas, from vLLM's csrc).
_C_SCHEMAS = {"silu_and_mul": "silu_and_mul(Tensor! result, Tensor input) -> ()"}


def use_cpu_platform() -> list[str]:
    """vLLM's CPU platform for a CUDA build on a machine without a GPU driver (see the module
    docstring); returns what it had to stand in for. Must run before any other vLLM import."""
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    done = []
    current = platforms._current_platform          # `import vllm` may have resolved it already
    if current is None or not getattr(current, "device_type", ""):
        platforms._current_platform = CpuPlatform()
        done.append("CpuPlatform")
    for ext in ("vllm._C", "vllm._C_stable_libtorch"):
        try:
            __import__(ext)
        except ImportError:
            continue
    missing = [name for name in _C_SCHEMAS if not hasattr(torch.ops._C, name)]
    if missing:
        lib = torch.library.Library("_C", "FRAGMENT")
        for name in missing:
            lib.define(_C_SCHEMAS[name])
        _KEEP.append(lib)
        done += [f"_C.{n} schema" for n in missing]
    return done


_KEEP: list = []        # the fragment library must outlive the call (its definitions go with it)


def runner_check(cfg) -> bool | None:
    """True when the plugin's reason keeps vLLM off its Model Runner V2 for this config (None: this
    vLLM has no such choice)."""
    from swiftserve_vllm import V2_RUNNER_REASON

    ask = getattr(cfg, "_get_v2_model_runner_unsupported_features", None)
    return None if ask is None else V2_RUNNER_REASON in ask()


def build(model_dir: str, device: str, dtype: str = "float32"):
    """(model, vLLM config): the plugin's model for ``model_dir`` built under ``torch.device(device)``
    (no weights loaded)."""
    from swiftserve_vllm import compat as V
    from swiftserve_vllm.layout import load_layout
    from swiftserve_vllm.model import SwiftServeLlamaForCausalLM

    lay = load_layout(model_dir)
    args = V.EngineArgs(model=model_dir, dtype=dtype, enforce_eager=True, max_model_len=512,
                        kv_sharing_fast_prefill=lay.swiftkv,
                        hf_overrides={"architectures": ["SwiftServeLlamaForCausalLM"]})
    cfg = args.create_engine_config()
    with V.building_model(cfg, f"tcp://127.0.0.1:{_free_port()}"), torch.device(device):
        return SwiftServeLlamaForCausalLM(vllm_config=cfg, prefix=""), cfg


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m swiftserve_vllm.devcheck", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", action="append", required=True, help="model directory or shipped name (repeatable)")
    p.add_argument("--device", default="meta", help="device to build on (meta, cpu, cuda, ...)")
    p.add_argument("--out", default=None, help="write the JSON list here too")
    p.add_argument("--platform", choices=["auto", "cpu"], default="auto",
                   help="cpu: vLLM's CPU platform for a CUDA build on a machine without a GPU (see above)")
    args = p.parse_args(argv)
    shims = use_cpu_platform() if args.platform == "cpu" else []
    from modelkit.models import resolve_model
    from swiftserve_vllm import ARCHITECTURES, register, version

    register()
    from vllm import ModelRegistry

    missing = [a for a in ARCHITECTURES if a not in ModelRegistry.get_supported_archs()]
    if missing:
        raise SystemExit(f"the plugin did not register {missing}")
    dist, ver = version.installed()
    results = []
    for name in args.model:
        model_dir = str(resolve_model(name))
        model, cfg = build(model_dir, args.device)
        checked, stray = stray_tensors(model, args.device)
        results.append({"model": model_dir, "device": args.device, "vllm": f"{dist} {ver}", "tensors": checked,
                        "stray": stray, "v1_runner_for_plugin": runner_check(cfg), "shims": shims})
        print(json.dumps(results[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if any(r["stray"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
