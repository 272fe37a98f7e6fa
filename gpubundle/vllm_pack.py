"""vLLM for a GPU machine without network: what ``make gpu-pack`` carries of it, built here.

``build_vllm_payload(image_py, version, work)``:
1. ``image_venv.resolve``: what installing ``vllm==version`` into the image-shaped venv adds;
2. those wheels, downloaded for the image's Python and platforms (``image.PYTHON``/``PLATFORMS``);
3. the distributions the image lacks, installed unpacked into one site folder (``pip install
   --target --no-deps``), less ``DROP`` (distributions that nothing on the serving path imports)
   and ``TRIM`` (files of kept ones that serve other GPUs, other Pythons or unused kernels);
4. ``requirement_checks``: every requirement a carried distribution has on an image package
   (extras and markers as pip would evaluate them for the image), merged per package: the GPU
   side checks them there first; ``overrides``: the wheels of the image packages pip chose other
   versions of (not ``image.NEVER_CARRY``, at most ``OVERRIDE_MAX_BYTES`` each), installed there
   only where the image's version fails its check;
5. the site as ``archives`` xz-compressed tars of similar size (each unpacks on its own, as soon
   as its parts have arrived; several unpack at once there).
The result is cached in ``work`` by a digest of its inputs (``.payload.json``): the site, the
archives and the wheels are built once per vLLM version and trim lists.

Measured for vllm 0.26.0 (2026-11-28): 111 distributions the image lacks; 11 dropped; 100 carried,
619 MiB unpacked, 116 MiB as tar + xz -6.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from gpubundle import image
from gpubundle.image_venv import ImageVenvError, Need, resolve
from gpubundle.limits import MIB

# Distributions vLLM's metadata asks for that no module on the serving path imports (an import trace
# of `vllm serve` and the worker, 2026-11-28; they back other GPUs' kernels, video, JIT toolchains).
DROP = {
    "tokenspeed-triton": "Triton fork for tokenspeed's MLA kernels (MLA models only)",
    "nvidia-cutlass-dsl-libs-cu12": "CUTLASS DSL runtime for CUDA 12 (the image is CUDA 13)",
    "nvidia-cutlass-dsl-libs-cu13": "CUTLASS DSL runtime (FA4 / Blackwell kernels; Hopper uses FA3)",
    "nvidia-nvvm": "NVVM compiler (JIT toolchains)", "nvidia-cuda-nvcc": "nvcc (JIT toolchains)",
    "nvidia-cuda-nvdisasm": "disassembler", "nvidia-cuda-cccl": "CUDA C++ headers (JIT)",
    "tilelang": "TileLang kernels (sparse attention models)", "pynvvideocodec": "video decoding",
    "z3-solver": "SMT solver of tilelang", "cryptography": "TLS of optional exporters",
}
# Files of carried distributions that are not needed on an x86-64 Hopper machine under Python 3.12.
TRIM = {
    "bin": "console scripts (their shebang names this machine's interpreter)",
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": "FlashAttention 2 (Hopper runs FA3; imported in try/except)",
    "vllm/_moe_C_stable_libtorch.abi3.so": "MoE kernels (import errors suppressed; dense models)",
    "vllm/vllm-rs": "the Rust front end (only with VLLM_USE_RUST_FRONTEND)",
    "vllm/third_party/deep_gemm/include": "DeepGEMM JIT headers (FP8 block GEMMs)",
    "vllm/third_party/fmha_sm100/cutlass": "Blackwell FMHA JIT headers",
    **{f"vllm/third_party/deep_gemm/_C.cpython-3{m}-x86_64-linux-gnu.so": "DeepGEMM for another Python"
       for m in (10, 11, 13, 14)},
}
OVERRIDE_MAX_BYTES = 2 * MIB
MARKER_ENV = {"python_version": image.PYTHON, "python_full_version": image.PYTHON + ".3", "os_name": "posix",
              "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
              "platform_release": "", "platform_version": "", "implementation_name": "cpython",
              "platform_python_implementation": "CPython", "implementation_version": image.PYTHON + ".3"}
FORMAT = 1                       # of .payload.json; bump when the layout changes


@dataclass
class VllmPayload:
    files: dict[str, Path] = field(default_factory=dict)     # pack name -> file, in carry order
    meta: dict = field(default_factory=dict)                 # what the GPU side needs to know


def download(needs: list[Need], dest: Path) -> dict[str, Path]:
    """Wheels of ``needs`` (exact versions, the image's Python and platforms) in ``dest``; name -> wheel."""
    dest.mkdir(parents=True, exist_ok=True)
    plats = sum((["--platform", p] for p in image.PLATFORMS), [])
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", image.PYTHON, "--implementation", "cp", *plats, "-d", str(dest),
                    *[f"{n.name}=={n.version}" for n in needs]], check=True)
    found = {}
    for whl in dest.glob("*.whl"):
        name, ver = whl.name.split("-")[:2]
        found[(image.normalize(name), ver)] = whl
    missing = [n.name for n in needs if (n.name, n.version) not in found]
    if missing:
        raise RuntimeError(f"pip downloaded no wheel for {missing}")
    return {n.name: found[(n.name, n.version)] for n in needs}


def install_site(wheels: list[Path], site: Path) -> None:
    """The wheels unpacked into ``site`` (no dependency resolution, no compilation)."""
    shutil.rmtree(site, ignore_errors=True)
    plats = sum((["--platform", p] for p in image.PLATFORMS), [])
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--only-binary=:all:", "--python-version", image.PYTHON, "--implementation", "cp", *plats,
                    "--target", str(site), *map(str, wheels)], check=True)


def _size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def trim_site(site: Path) -> dict[str, int]:
    """Remove ``TRIM`` and byte-code caches from ``site``; bytes removed per entry."""
    removed = {}
    for rel in TRIM:
        path = site / rel
        if path.exists():
            removed[rel] = _size(path)
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    for cache in list(site.rglob("__pycache__")):
        shutil.rmtree(cache, ignore_errors=True)
    return removed


def _metadata(dist_info: Path) -> tuple[str, str, list[str]]:
    """(normalised name, version, Requires-Dist lines) of a dist-info folder."""
    name = version = ""
    requires = []
    for line in (dist_info / "METADATA").read_text(errors="replace").splitlines():
        if not line.strip():
            break                                     # the headers end at the first blank line
        key, _, value = line.partition(":")
        if key == "Name":
            name = image.normalize(value.strip())
        elif key == "Version":
            version = value.strip()
        elif key == "Requires-Dist":
            requires.append(value.strip())
    return name, version, requires


def requirement_checks(site: Path, root: str = "vllm") -> tuple[list[dict], list[str]]:
    """(checks, unmet): every requirement reachable from ``root`` through the carried distributions
    on a distribution the image ships, merged per name ({name, specifier, by}); ``unmet``: needed
    distributions neither carried nor in the image (what DROP removed, as ``name (by)``)."""
    from packaging.markers import Marker
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    carried = {}
    for d in site.glob("*.dist-info"):
        name, _, requires = _metadata(d)
        carried[name] = requires
    checks: dict[str, dict] = {}
    unmet: set[str] = set()
    seen: set[tuple[str, str]] = set()
    todo = [(image.normalize(root), "")]
    while todo:
        dist, extra = todo.pop()
        if (dist, extra) in seen:
            continue
        seen.add((dist, extra))
        for line in carried.get(dist, []):
            req = Requirement(line)
            if req.marker is not None and not Marker(str(req.marker)).evaluate({**MARKER_ENV, "extra": extra}):
                continue
            name = image.normalize(req.name)
            if name in carried:
                todo += [(name, "")] + [(name, e) for e in req.extras]
            elif image.in_image(name):
                c = checks.setdefault(name, {"name": name, "specifier": SpecifierSet(), "by": set()})
                c["specifier"] &= req.specifier
                c["by"].add(dist)
            else:
                unmet.add(f"{name} ({dist})")
    out = [{"name": c["name"], "specifier": str(c["specifier"]), "by": sorted(c["by"])}
           for c in sorted(checks.values(), key=lambda c: c["name"])]
    return out, sorted(unmet)


def _compress(job: tuple[Path, list[str], Path, int]) -> dict:
    site, names, dest, level = job
    import lzma

    with lzma.open(dest, "wb", preset=level) as raw, tarfile.open(fileobj=raw, mode="w") as tar:
        for n in names:
            tar.add(site / n, arcname=n, recursive=False)
    return {"name": dest.name, "files": len(names), "unpacked_bytes": sum((site / n).stat().st_size for n in names
                                                                          if (site / n).is_file())}


def write_archives(site: Path, dest: Path, count: int, level: int = 6) -> list[dict]:
    """``site`` as ``count`` tar.xz archives of similar unpacked size (largest files first, each to the
    lightest archive), compressed in parallel; [{name, files, unpacked_bytes}] in archive order."""
    dest.mkdir(parents=True, exist_ok=True)
    entries = sorted((p for p in site.rglob("*") if p.is_file() or (p.is_dir() and not any(p.iterdir()))),
                     key=lambda p: -(p.stat().st_size if p.is_file() else 0))
    groups: list[list[str]] = [[] for _ in range(count)]
    loads = [0] * count
    for p in entries:
        k = loads.index(min(loads))
        groups[k].append(str(p.relative_to(site)))
        loads[k] += p.stat().st_size if p.is_file() else 0
    jobs = [(site, sorted(g), dest / f"vllm-site-{k + 1}.tar.xz", level) for k, g in enumerate(groups) if g]
    with ProcessPoolExecutor(max_workers=min(len(jobs), 2)) as ex:
        return list(ex.map(_compress, jobs))


def _digest(version: str, archives: int, level: int) -> str:
    key = json.dumps({"format": FORMAT, "version": version, "drop": sorted(DROP), "trim": sorted(TRIM),
                      "archives": archives, "level": level, "python": image.PYTHON, "platforms": image.PLATFORMS})
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def build_vllm_payload(image_py: str | Path, version: str, work: str | Path, archives: int = 4,
                       level: int = 6, log=print) -> VllmPayload:
    """vLLM ``version`` for the GPU image, built in ``work`` (reused while its inputs are the same)."""
    work = Path(work)
    digest = _digest(version, archives, level)
    record = work / ".payload.json"
    if record.is_file():
        meta = json.loads(record.read_text())
        if meta.get("digest") == digest and all((work / "out" / f).is_file() for f in meta["carry"]):
            log(f"vLLM {version} payload reused from {work}")
            return VllmPayload({f: work / "out" / f for f in meta["carry"]}, meta)
    log(f"resolving vllm=={version} against the image-shaped venv ({image_py})")
    needs = resolve(image_py, f"vllm=={version}")
    lacking = [n for n in needs if not n.in_image]
    overrides = [n for n in needs if n.in_image and n.name not in image.NEVER_CARRY]
    log(f"{len(lacking)} distributions the image lacks; image packages pip would replace: "
        + (", ".join(f"{n.name} {n.installed} -> {n.version}" for n in overrides) or "none"))
    wheels = download(lacking + overrides, work / "wheels")
    carried = [wheels[n.name] for n in lacking if n.name not in DROP]
    site = work / "site"
    install_site(carried, site)
    trimmed = trim_site(site)
    checks, unmet = requirement_checks(site)
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    kept = []
    for n in overrides:
        whl = wheels[n.name]
        if whl.stat().st_size <= OVERRIDE_MAX_BYTES:
            shutil.copyfile(whl, out / whl.name)
            kept.append({"name": n.name, "version": n.version, "wheel": whl.name})
    log(f"site {_size(site) / MIB:.0f} MiB unpacked; compressing into {archives} archives (xz -{level})")
    arch = write_archives(site, out, archives, level)
    meta = {"digest": digest, "version": version, "python": image.PYTHON, "archives": arch, "overrides": kept,
            "not_carried_overrides": [f"{n.name} {n.version}" for n in overrides if n.name not in
                                      {k["name"] for k in kept}],
            "checks": checks, "dropped": {n: DROP[n] for n in sorted(DROP) if n in {m.name for m in lacking}},
            "unmet": unmet, "trimmed_bytes": trimmed, "carried": len(carried),
            "unpacked_bytes": _size(site), "carry": [k["wheel"] for k in kept] + [a["name"] for a in arch]}
    record.write_text(json.dumps(meta, indent=1))
    return VllmPayload({f: out / f for f in meta["carry"]}, meta)


def payload_for_args(args, root: Path) -> VllmPayload:
    """The payload of ``args.vllm`` for the CLI (``pack``, ``vllm-selftest``): built once per version in
    ``args.vllm_work`` (default ``<root>/.gpu-vllm/<version>``) with ``args.image_python``."""
    py = Path(args.image_python)
    if not py.is_file():
        raise ImageVenvError(f"no image-shaped Python at {py}: run `make gpu-image-venv` first "
                             "(or --vllm none to carry no vLLM)")
    work = Path(args.vllm_work or root / ".gpu-vllm" / args.vllm)
    return build_vllm_payload(py, args.vllm, work, args.vllm_archives, args.xz_level,
                              log=lambda m: print(m, file=sys.stderr))
