"""SwiftServe's offline, air-gapped GPU validation bundle: pack it here, check on a GPU machine
without network, self-test on CPU (make gpu-pack, gpu-check, gpu-check-selftest; run from the
repository root).

- ``pack`` (here, in the project's venv, with network): the wheels the GPU image lacks, the
  distillation windows of a corpus, the shipped SwiftKV tensors the session uses and
  SmolLM2's GGUF, split into parts that each fit one command's carry next to this working
  tree as it is on disk now (``limits.tree_bytes``; ``make gpu-park`` first takes the
  checkpoint tensors out of it). Prints the tree size and the plan; exits 3 when the parts
  cannot fit (nothing useful would travel) and says which files fill the tree.
  With ``--vllm VERSION`` (default 0.26.0) it also carries that vLLM for the image
  (``vllm_pack``, built in the image-shaped venv of ``make gpu-image-venv``).
- ``check`` (there, plain ``python3``, no network): ``session.run_check``.
- ``self-test`` (here, CPU): ``selftest.run_selftest``: every stage with tiny settings.
- ``image-venv`` (here): ``image_venv.build_image_venv`` (``make gpu-image-venv``).
- ``vllm-selftest`` (here): ``vllm_selftest.run``: the carried vLLM unpacked, checked, imported
  and every model class built on the meta device with the image-shaped venv's Python, and the
  parts sized against the carry limit (``make gpu-vllm-selftest``).
- ``merge-summary DIR`` (here, after a session): the summary keys a GPU session's output folder
  brought back (``summary.json``, written only on CUDA) merged into results/gpu/summary.json.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
from pathlib import Path

from swiftcommon import envs
from gpubundle import image, park, payloads
from gpubundle.image_venv import ImageVenvError
from gpubundle.limits import MIB, Limits, largest_tree_files
from gpubundle.pack import PackError, build_pack
from gpubundle.plan import SHIPPED, plan_parts, shipped_file, shipped_pack_name
from gpubundle.session import ORDER, SessionConfig, run_check

MIN_PART = 4 * MIB                # smaller parts: refuse (the model alone is ~94 MB)
DEFAULT_VLLM = "0.26.0"           # the newest vLLM pinned to the GPU image's torch (2.11)


def make_pack(args) -> int:
    root = Path(args.root).resolve()
    out = root / args.out if not Path(args.out).is_absolute() else Path(args.out)
    plan = plan_parts(root, args.carry_mib, args.margin_mib, args.part_mib)
    tree, part = plan["tree_bytes"], plan["part_bytes"]
    print(f"tree that travels with every command (tracked + untracked not ignored, on disk now): "
          f"{tree / MIB:.1f} MiB", file=sys.stderr)
    if plan["parkable"]:
        print(f"checkpoints NOT parked: {len(plan['parkable'])} file(s), {plan['parkable_bytes'] / MIB:.1f} MiB of "
              f"that tree are large files under {', '.join(s + '/' for s in park.SCOPES)} (`make gpu-park` moves "
              "them out)", file=sys.stderr)
    else:
        print(f"no checkpoint tensors in the tree; {len(plan['parked'])} file(s) parked in {park.PARK_DIR}/",
              file=sys.stderr)
    print(f"parts of {part / MIB:.1f} MiB = carry limit {args.carry_mib:g} MiB - tree {tree / MIB:.1f} MiB - "
          f"margin {args.margin_mib:g} MiB" + (" (--part-mib)" if args.part_mib else ""), file=sys.stderr)
    if part < MIN_PART:
        big = ", ".join(f"{n} ({b / MIB:.1f} MiB)" for n, b in largest_tree_files(root))
        first = "run `make gpu-park` first, then `make gpu-pack`; " if plan["parkable"] else ""
        print(f"cannot pack: {first}the working tree leaves {part / MIB:.1f} MiB per command (need at least "
              f"{MIN_PART / MIB:g} MiB; the model alone is ~94 MB). Largest files in the tree: {big}", file=sys.stderr)
        return 3
    staging = out.with_name(out.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    files: dict[str, Path] = {}
    if args.wheels:
        files.update({w.name: w for w in payloads.download_wheels(staging / "wheels", args.python_version)})
    from modelkit.models import resolve_model
    from modelkit.prepare import ensure_default_model

    model_dir = ensure_default_model() if args.model in ("smollm2", "none") else resolve_model(args.model)
    corpus = Path(args.corpus).expanduser()
    if not corpus.is_dir():
        print(f"no corpus at {corpus}: build one with `modelkit build-corpus --output {corpus}`", file=sys.stderr)
        return 1
    arrays = payloads.corpus_windows(corpus, model_dir, args.seq_len, args.chat_repeats, args.seed,
                                     args.train_tokens, args.heldout_windows)
    windows_files = payloads.save_windows(arrays, staging)
    shipped = SHIPPED if args.shipped is None and args.model == "smollm2" else (args.shipped or [])
    try:
        for rel in shipped:
            files[shipped_pack_name(rel)] = shipped_file(root, rel)
    except PackError as exc:
        print(f"cannot pack: {exc}", file=sys.stderr)
        return 1
    windows = {"seq_len": args.seq_len, "chat_repeats": args.chat_repeats, "seed": args.seed, "corpus": str(corpus),
               **{f"{k}_windows": len(v) for k, v in arrays.items()}}
    resume = {}
    if args.resume:
        found = sorted(Path(args.resume).expanduser().glob("swiftkv-l*-g*.safetensors"))
        if not found:
            print(f"cannot pack: no swiftkv-l*-g*.safetensors in {args.resume}", file=sys.stderr)
            return 1
        resume = {f"resume.{f.name}": f.name for f in found}
        files.update({f"resume.{f.name}": f for f in found})
    meta = {"tree_bytes": tree, "parked": not plan["parkable"], "windows": windows, "model_file": None,
            "model_name": model_dir.name,
            "shipped": {"files": {shipped_pack_name(rel): rel for rel in shipped}, "base": model_dir.name},
            "resume": {"files": resume}}
    model_files: dict[str, Path] = {}
    if args.model == "smollm2":
        gguf = payloads.smollm2_gguf(staging)
        model_files[gguf.name], meta["model_file"] = gguf, gguf.name
    elif args.model != "none":
        meta["model_file"] = f"{model_dir.name}.tar"
        model_files[meta["model_file"]] = payloads.tar_model(model_dir, staging / meta["model_file"])
    vllm_files: dict[str, Path] = {}
    if args.vllm != "none":
        from gpubundle.vllm_pack import payload_for_args

        try:
            vp = payload_for_args(args, root)
        except (ImageVenvError, RuntimeError, OSError) as exc:
            print(f"cannot pack vLLM {args.vllm}: {exc}", file=sys.stderr)
            return 1
        vllm_files, meta["vllm"] = vp.files, vp.meta
    # carry order = arrival order: vLLM right after the wheels, so its stages (the 8B benchmark needs no
    # model) run while the model's parts still travel; the model last, since the model stage places the
    # shipped tensors and windows once, when the model completes
    files = {**files, **vllm_files, **windows_files, **model_files}
    manifest = build_pack(out, files, part, meta)
    shutil.rmtree(staging, ignore_errors=True)
    n = manifest["parts"]
    rel = out.relative_to(root) if out.is_relative_to(root) else out
    print(f"{out}: {n} part(s), {sum(f['size'] for f in manifest['files'].values()) / MIB:.1f} MiB", file=sys.stderr)
    for k in range(1, n + 1):
        print(f"  command {k}: carry {rel}/part{k}, run `make gpu-check GPU_OUT=$OUT`", file=sys.stderr)
    if plan["parkable"]:
        print(f"These parts are sized for the tree as it is now, checkpoints unparked ({tree / MIB:.1f} MiB).",
              file=sys.stderr)
    else:
        print(f"Every GPU command must run with the checkpoints parked, as now (tree {tree / MIB:.1f} MiB + a part "
              f"<= {(tree + part) / MIB:.1f} MiB of the {args.carry_mib:g} MiB limit). After the session: "
              "`make gpu-unpark`.", file=sys.stderr)
    if n > args.max_calls:
        print(f"{n} commands exceed --max-calls {args.max_calls}: slim the tree or carry less "
              "(--train-tokens, --model none)", file=sys.stderr)
        return 3
    return 0


def _merge_summary(args) -> int:
    """Merge the keys of a GPU session's ``summary.json`` (CUDA runs only) into ``--into``."""
    src = Path(args.dir) / "summary.json"
    if not src.is_file():
        print(f"{src}: no summary.json (the session measured none of the vLLM keys on CUDA)", file=sys.stderr)
        return 1
    doc = json.loads(src.read_text())
    if not doc.get("device") or str(doc["device"]).startswith("cpu"):
        print(f"{src}: written on {doc.get('device')!r}, not a GPU: not merged", file=sys.stderr)
        return 1
    into = Path(args.into)
    merged = json.loads(into.read_text()) if into.is_file() else {}
    merged.update(doc["keys"])
    into.parent.mkdir(parents=True, exist_ok=True)
    into.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")
    print(json.dumps(doc["keys"], indent=1))
    return 0


def _image_venv(args) -> int:
    from gpubundle.image_venv import build_image_venv

    try:
        print(build_image_venv(args.python, args.dest, f"vllm=={args.vllm}"))
    except ImageVenvError as exc:
        print(f"gpu-image-venv: {exc}", file=sys.stderr)
        return 1
    return 0


def _vllm_selftest(args) -> int:
    from gpubundle.vllm_selftest import main

    return main(args)


def _check_config(args) -> SessionConfig:
    lim = Limits(args.carry_mib, args.out_files, args.out_file_mib, args.out_total_mib)
    return SessionConfig(root=Path(args.root), work=Path(args.work), out=Path(args.out), pack=Path(args.pack),
                         python=args.python, device=args.device, budget_s=args.budget_s, stages=args.stages,
                         redo=args.redo, tests=args.tests, bench_args=shlex.split(args.bench_args),
                         vllm_8b_args=shlex.split(args.vllm_8b_args),
                         distill_model=args.distill_model, distill_l=args.distill_l,
                         distill_groups=args.distill_groups, distill_steps=args.distill_steps,
                         distill_micro_batch=args.distill_micro_batch, distill_seq_len=args.distill_seq_len,
                         distill_init=args.distill_init, distill_dtype=args.distill_dtype,
                         distill_compile=args.compile, distill_max_s=args.distill_max_s, limits=lim)


def _self_test(args) -> int:
    from gpubundle.selftest import main

    return main(args)


def build_parser() -> argparse.ArgumentParser:
    d = SessionConfig()
    p = argparse.ArgumentParser(prog="python -m gpubundle", description=__doc__.split("\n\n")[0])
    p.add_argument("--root", default=".", help="the repository (default: the current directory)")
    p.add_argument("--carry-mib", type=float, default=Limits.carry_mib, help="tree + carry per command (MiB)")
    sub = p.add_subparsers(dest="cmd", required=True)

    pk = sub.add_parser("pack", help="write the carry folder for a GPU machine without network (here)")
    pk.add_argument("--out", default=".gpu-pack", help="pack folder, ignored by git (default: %(default)s)")
    pk.add_argument("--model", default="smollm2", help="smollm2 (its GGUF), none, or a model directory (as a tar)")
    pk.add_argument("--corpus", default=str(envs.cache_dir() / "corpus" / "smollm2-v2"),
                    help="from `modelkit build-corpus` (default: %(default)s)")
    pk.add_argument("--no-wheels", dest="wheels", action="store_false", help="carry no wheels")
    pk.add_argument("--python-version", default="3.12", help="the GPU machine's Python, for the wheels")
    for name, default in (("seq-len", 512), ("chat-repeats", 2), ("seed", 0), ("train-tokens", 4_000_000),
                          ("heldout-windows", 16), ("max-calls", 6)):
        pk.add_argument(f"--{name}", type=int, default=default, help="default: %(default)s")
    pk.add_argument("--resume", default=None, metavar="DIR",
                    help="carry the swiftkv-l*-g*.safetensors of DIR (an earlier session's output folder): "
                         "the distillation starts from them")
    pk.add_argument("--part-mib", type=float, default=None,
                    help="part size (default: the carry limit less the tree and --margin-mib)")
    pk.add_argument("--margin-mib", type=float, default=4.0,
                    help="room kept in each command for changes to the tree (default: %(default)s)")
    pk.add_argument("--shipped", nargs="*", default=None, metavar="REL",
                    help="files under checkpoints/ to carry (read from .gpu-park/ when parked; default with "
                         f"--model smollm2: {' '.join(SHIPPED)}; none otherwise)")
    pk.add_argument("--vllm", default=DEFAULT_VLLM,
                    help="the vLLM release to carry, for the image's Python and torch (default: %(default)s, the "
                         "newest pinned to its torch 2.11); none: no vLLM")
    pk.add_argument("--image-python", default=".gpu-vllm/image-venv/bin/python",
                    help="Python of the image-shaped venv (make gpu-image-venv; default: %(default)s)")
    pk.add_argument("--vllm-work", default=None, help="where vLLM's payload is built and kept "
                                                      "(default: .gpu-vllm/VERSION)")
    pk.add_argument("--vllm-archives", type=int, default=4, help="tar.xz archives of vLLM's site (default: 4)")
    pk.add_argument("--xz-level", type=int, default=6, help="xz preset of those archives (default: 6)")
    pk.set_defaults(func=make_pack)

    ck = sub.add_parser("check", help="run the GPU session's stages within a time budget (there)")
    ck.add_argument("--work", default=str(d.work), help="state kept between calls (default: %(default)s)")
    ck.add_argument("--out", default=str(d.out), help="the folder to bring back (default: %(default)s)")
    ck.add_argument("--pack", default=str(d.pack), help="the carried pack (default: %(default)s)")
    ck.add_argument("--python", default=d.python, help="interpreter for the stages (default: this one)")
    ck.add_argument("--device", default=d.device)
    ck.add_argument("--budget-s", type=float, default=d.budget_s, help="this call's time (default: %(default)s)")
    ck.add_argument("--stages", nargs="+", choices=ORDER, default=d.stages)
    ck.add_argument("--redo", nargs="+", choices=ORDER, default=[], help="run even if done (distill: afresh)")
    ck.add_argument("--tests", nargs="+", default=d.tests, help="pytest arguments (default: %(default)s)")
    ck.add_argument("--bench-args", default="", help="arguments of python -m benchmarks engine gpu, one string")
    ck.add_argument("--vllm-8b-args", default="", help="arguments of python -m benchmarks serve vllm_gpu_8b, one string")
    ck.add_argument("--distill-model", default=d.distill_model, help="auto, pack, random or a model directory")
    ck.add_argument("--distill-l", type=int, default=d.distill_l, help="SwiftKV l (default %(default)s: 50%%)")
    ck.add_argument("--distill-groups", type=int, nargs="+", default=d.distill_groups)
    for name in ("steps", "micro_batch", "seq_len"):
        ck.add_argument(f"--distill-{name.replace('_', '-')}", type=int, default=getattr(d, f"distill_{name}"),
                        help="default: %(default)s")
    ck.add_argument("--distill-init", default=d.distill_init,
                    help="modelkit distill --init: original, lstsq, a folder of swiftkv-l{l}-g{g}.safetensors, or "
                         "auto (default): the carried shipped tensors of l and the groups, else lstsq")
    ck.add_argument("--distill-dtype", default=d.distill_dtype)
    ck.add_argument("--no-compile", dest="compile", action="store_false", help="distil without torch.compile")
    ck.add_argument("--distill-max-s", type=float, default=None, help="cap one call's training seconds")
    for name, default in (("out-files", Limits.out_files), ("out-file-mib", Limits.out_file_mib),
                          ("out-total-mib", Limits.out_total_mib)):
        ck.add_argument(f"--{name}", type=type(default), default=default, help="output limit (default: %(default)s)")
    ck.set_defaults(func=lambda a: run_check(_check_config(a)))

    st = sub.add_parser("self-test", help="every stage with tiny settings on CPU (here)")
    st.add_argument("--dir", default=None, help="keep the work, pack and output here (default: a temp dir)")
    st.add_argument("--python", default=None, help="interpreter of the stages (default: this one)")
    st.add_argument("--wheels-from-pack", default=None, metavar="PACK",
                    help="carry the wheels of this `make gpu-pack` folder (e.g. .gpu-pack) in the tiny pack")
    st.set_defaults(func=_self_test)

    iv = sub.add_parser("image-venv", help="build the venv shaped like the GPU image (here; several GB)")
    iv.add_argument("--python", required=True, help=f"a Python {image.PYTHON} interpreter")
    iv.add_argument("--dest", default=".gpu-vllm/image-venv")
    iv.add_argument("--vllm", default=DEFAULT_VLLM, help="the release whose needs decide which image packages matter")
    iv.set_defaults(func=_image_venv)

    vs = sub.add_parser("vllm-selftest", help="the carried vLLM unpacked, imported and every model class built "
                                              "with the image-shaped venv (here)")
    vs.add_argument("--vllm", default=DEFAULT_VLLM)
    vs.add_argument("--image-python", default=".gpu-vllm/image-venv/bin/python")
    vs.add_argument("--vllm-work", default=None)
    vs.add_argument("--vllm-archives", type=int, default=4)
    vs.add_argument("--xz-level", type=int, default=6)
    vs.add_argument("--dir", default=None, help="keep the unpacked site here (default: a temp dir)")
    vs.set_defaults(func=_vllm_selftest)

    ms = sub.add_parser("merge-summary", help="merge a GPU session's summary.json into results/gpu/summary.json")
    ms.add_argument("dir", help="the folder the session brought back (holding summary.json)")
    ms.add_argument("--into", default="results/gpu/summary.json")
    ms.set_defaults(func=_merge_summary)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
