"""The GPU pack: files split into parts that each fit one command's carry, reassembled there.

A GPU machine without network gets what it needs (wheels it lacks, the distillation
windows, the model) as an ignored folder named in the command's carry. The model alone
(SmolLM2's GGUF, 94 MB) is larger than one command may carry, so ``build_pack`` writes the
files, in order, as chunks into ``part1``, ``part2``, ... of at most ``part_bytes`` each.
A command carries one part; the machine keeps ignored folders between commands while it
stays warm, so parts accumulate there. ``assemble`` joins every file whose chunks are all
present and checks its sha256; files still missing parts are reported, not guessed.

Layout: ``<pack>/partK/manifest.json`` (the same manifest in every part: files with size,
sha256 and chunk list, plus ``meta`` from the caller) and ``<pack>/partK/<file>.<NNN>``.
No torch here.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from gpubundle.park import sha256_file

MANIFEST = "manifest.json"
MANIFEST_RESERVE = 64 << 10          # bytes kept free in each part for its copy of the manifest


class PackError(RuntimeError):
    """A pack that cannot be built or trusted; the message says why."""


def build_pack(out: str | Path, files: dict[str, Path], part_bytes: int, meta: dict | None = None) -> dict:
    """Write ``files`` (name -> path, in carry order) as parts of at most ``part_bytes`` into ``out``."""
    out = Path(out)
    room = part_bytes - MANIFEST_RESERVE
    if room <= 0:
        raise PackError(f"parts of {part_bytes} bytes leave no room beside the manifest")
    if out.exists():
        shutil.rmtree(out)
    entries, part, used = {}, 1, 0
    for name, src in files.items():
        size, chunks, offset = src.stat().st_size, [], 0
        with open(src, "rb") as f:
            while offset < size or not chunks:
                if used >= room:
                    part, used = part + 1, 0
                n = min(room - used, size - offset)
                chunk = f"{name}.{len(chunks):03d}"
                (out / f"part{part}").mkdir(parents=True, exist_ok=True)
                (out / f"part{part}" / chunk).write_bytes(f.read(n))
                chunks.append({"part": f"part{part}", "file": chunk, "size": n})
                offset, used = offset + n, used + n
        entries[name] = {"size": size, "sha256": sha256_file(src), "chunks": chunks}
    manifest = {"parts": part, "part_bytes": part_bytes, "files": entries, "meta": meta or {}}
    text = json.dumps(manifest, indent=1)
    if len(text) > MANIFEST_RESERVE:
        raise PackError(f"manifest of {len(text)} bytes exceeds its reserve of {MANIFEST_RESERVE}")
    for k in range(1, part + 1):
        (out / f"part{k}").mkdir(parents=True, exist_ok=True)
        (out / f"part{k}" / MANIFEST).write_text(text)
    return manifest


@dataclass
class Assembled:
    manifest: dict | None = None
    files: dict[str, Path] = field(default_factory=dict)      # complete, verified
    missing: dict[str, list[str]] = field(default_factory=dict)  # file -> parts not present

    @property
    def meta(self) -> dict:
        return (self.manifest or {}).get("meta", {})


def read_manifest(pack: str | Path) -> dict | None:
    for m in sorted(Path(pack).glob(f"part*/{MANIFEST}")):
        return json.loads(m.read_text())
    return None


def assemble(pack: str | Path, dest: str | Path) -> Assembled:
    """Join the complete files of ``pack`` into ``dest`` (idempotent: a verified copy is kept)."""
    pack, dest = Path(pack), Path(dest)
    res = Assembled(read_manifest(pack))
    if res.manifest is None:
        return res
    dest.mkdir(parents=True, exist_ok=True)
    for name, entry in res.manifest["files"].items():
        target = dest / name
        if target.is_file() and target.stat().st_size == entry["size"] and sha256_file(target) == entry["sha256"]:
            res.files[name] = target
            continue
        absent = sorted({c["part"] for c in entry["chunks"] if not (pack / c["part"] / c["file"]).is_file()})
        if absent:
            res.missing[name] = absent
            continue
        tmp = target.with_suffix(target.suffix + ".tmp")
        with open(tmp, "wb") as f:
            for c in entry["chunks"]:
                f.write((pack / c["part"] / c["file"]).read_bytes())
        digest = sha256_file(tmp)
        if digest != entry["sha256"]:
            tmp.unlink()
            raise PackError(f"{name}: sha256 {digest} after joining its parts, expected {entry['sha256']} "
                            "(a part was changed or truncated in transit; carry it again)")
        tmp.replace(target)
        res.files[name] = target
    return res
