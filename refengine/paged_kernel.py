"""The CPU paged attention kernels (``csrc/``: decode and causal prefill), compiled at first use.

``resolve_decode_kernel(name, device)`` and ``resolve_prefill_kernel(name, device)`` turn
``EngineConfig.decode_kernel`` / ``EngineConfig.prefill_kernel`` into the kernels' module or
None (the plain-PyTorch gather + SDPA paths of ``refengine.attention``):

- ``"auto"``: the kernel on CPU when it builds (a C++ compiler and ninja, the engine extra's
  pip package, are needed; the build is cached by torch under ``TORCH_EXTENSIONS_DIR``,
  ~/.cache/torch_extensions by default, and reused while the source is unchanged);
  otherwise None, with a warning;
- ``"cpp"``: the kernel, or an error saying why it cannot be had;
- ``"torch"``: None.

The kernel reads K and V in place from dense block pools: ``kernel(q [B, kvh, g, d],
k_pool [N, bs, kvh, d], v_pool [N, bs, kvh, dv], table [B, max_blocks], lens [B], scale)
-> [B, kvh, g, dv]`` in q's dtype (computed in float32); optional ``starts [B]``: the first entry
each sequence sees (a sliding window). The prefill kernel
(``prefill(q [n, H, d] float32 or bfloat16, k_pool, v_pool, blocks [nblk], start, scale, out [n, H, dv]
float32, window)``; bf16 queries over bf16 pools take AVX-512-BF16 dot products where the CPU has them,
csrc/paged_prefill_bf16.cpp)
reads them in place too and writes the chunk's causal attention into ``out`` (query row i sits
at cache index ``start + i`` and, with ``window`` W > 0, sees only the last W keys up to itself);
both take float32 or bfloat16 pools.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
from pathlib import Path

import torch

log = logging.getLogger(__name__)

CHOICES = ("auto", "cpp", "torch")
_NO_NAME = contextlib.nullcontext()


def named(name: str):
    """``torch.profiler.record_function(name)`` while a profiler runs (so the kernels have names in
    profiles), else a no-op: entering a record_function costs ~4 us even with no profiler."""
    return torch.profiler.record_function(name) if torch.autograd.profiler._is_profiler_enabled else _NO_NAME
CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = [CSRC / f for f in ("paged_decode.cpp", "paged_decode_avx2.cpp", "paged_prefill.cpp", "paged_prefill_bf16.cpp",
                               "fused_ops.cpp", "quant_gguf.cpp", "gemm_bf16.cpp", "int8_act.cpp",
                               "decode_stack.cpp", "bindings.cpp")]
# No VNNI code generation: no kernel here uses VNNI intrinsics, and GCC 12 (Debian 12's compiler)
# vectorizes a signed int8 x int8 dot-product loop into vpdpbusd, which reads one side as *unsigned*
# (wrong sums: the scalar Q8_0 GGUF dot gave -20095 for 9857 on a Zen 4 with AVX512-VNNI).
CFLAGS = ["-O3", "-march=native", "-mno-avx512vnni", "-mno-avxvnni", "-fopenmp"]


def _build_tag() -> str:
    """The build uses -march=native: key it by the CPU's feature flags, so a cache directory
    shared by different machines never loads code built for other instructions. The headers
    and the sources are in the key too: torch's rebuild check hashes only the sources, and
    checkouts of different versions sharing one cache directory would otherwise rebuild over
    each other's build at every start. So is the sources' folder: ninja's rules name the sources
    by absolute path, and two checkouts of the same version (worktrees, a CI clone) sharing one
    build directory rebuilt it over each other (minutes each time). So is the torch installation:
    the build's include and library paths are the environment's, so two venvs (``make test``'s
    .venv and .venv-vllm, whose probes run the reference engine too) sharing one build directory
    rebuilt it whenever the other had loaded it (~2 minutes each, twice per test suite)."""
    try:
        flags = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), "")
    except OSError:
        flags = ""
    h = hashlib.sha1(flags.encode())
    h.update(" ".join(CFLAGS).encode())
    h.update(str(CSRC.resolve()).encode())
    h.update(str(Path(torch.__file__).resolve().parent).encode())
    for f in sorted(CSRC.glob("*.h")) + sorted(CSRC.glob("*.cpp")):
        h.update(f.read_bytes())
    return h.hexdigest()[:8]


NAME = f"swiftserve_paged_decode_{_build_tag()}"


class PagedDecodeKernel:
    def __init__(self, module) -> None:
        self.module = module                  # also the fused element-wise ops (refengine.fused_ops)
        self._op = module.paged_decode
        self._prefill = module.paged_prefill

    def __call__(self, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, table: torch.Tensor,
                 lens: torch.Tensor, scale: float, starts: torch.Tensor | None = None) -> torch.Tensor:
        with named("swiftserve::paged_decode"):      # bf16 q stays bf16 (the kernel's dot-product path)
            qk = q if q.dtype in (torch.float32, torch.bfloat16) else q.float()
            out = self._op(qk, k_pool, v_pool, table, lens, float(scale), starts)
        return out if q.dtype == torch.float32 else out.to(q.dtype)

    def prefill(self, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, blocks: torch.Tensor,
                start: int, scale: float, out: torch.Tensor, window: int = 0) -> None:
        """Causal attention of a chunk's queries ``q [n, H, d]`` (float32 or bfloat16) into ``out [n, H, dv]``
        (float32; both views with [H, d] rows contiguous);
        ``window`` > 0: each query sees only the last ``window`` keys up to its own."""
        with named("swiftserve::paged_prefill"):
            self._prefill(q, k_pool, v_pool, blocks, int(start), float(scale), out, int(window))


def _ninja_on_path() -> None:
    """torch runs ``ninja`` from PATH; the pip package's binary sits next to this interpreter,
    which may not be on PATH when the venv is not activated."""
    if shutil.which("ninja") is None:
        try:
            import ninja
        except ImportError:
            return
        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


def load_extension(name: str, sources: list[Path]):
    """Compile (or load the cached build of) C++ ``sources`` as module ``name``, with the
    kernels' flags (``CFLAGS``); raises when it cannot be built. ``name``
    should carry ``_build_tag()`` (the build is specific to this CPU and these headers)."""
    from torch.utils import cpp_extension

    _ninja_on_path()
    build_dir = Path(cpp_extension._get_build_directory(name, False))
    build_dir.mkdir(parents=True, exist_ok=True)
    # torch guards a build with a lock *file* that a killed builder leaves behind, and every
    # later build would wait on it forever. Builders here also hold an flock (released by the
    # OS when a process dies), so while we hold it a leftover lock file is stale.
    with open(build_dir / "swiftserve.flock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        (build_dir / "lock").unlink(missing_ok=True)
        return cpp_extension.load(
            name=name, sources=[str(x) for x in sources], build_directory=str(build_dir), verbose=False,
            extra_cflags=CFLAGS, extra_ldflags=["-fopenmp"])


def build() -> PagedDecodeKernel:
    """Compile (or load the cached build of) the kernel; raises when it cannot be built."""
    return PagedDecodeKernel(load_extension(NAME, SOURCES))


def _resolve(option: str, name: str, device: torch.device) -> PagedDecodeKernel | None:
    if name not in CHOICES:
        raise ValueError(f"{option} {name!r} not in {CHOICES}")
    if name == "torch":
        return None
    if device.type != "cpu":
        if name == "cpp":
            raise ValueError(f"{option}='cpp' is a CPU kernel (here {device.type}); use 'auto' or 'torch'")
        return None
    try:
        return build()
    except Exception as exc:                  # no compiler, no ninja, a failed build: say why
        if name == "cpp":
            raise RuntimeError(f"{option}='cpp' could not be built: {exc}") from exc
        log.warning("CPU attention kernels not built (%s); %s uses gather + SDPA",
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__, option)
        return None


def resolve_decode_kernel(name: str, device: torch.device) -> PagedDecodeKernel | None:
    """``auto`` on CUDA: the Triton kernel (``refengine.triton_decode``) when triton imports and the
    kernel passes its self-check there, else gather + SDPA; on CPU the C++ kernel as ``_resolve`` says."""
    if name == "auto" and device.type == "cuda":
        try:
            from refengine import triton_decode
        except ImportError as exc:
            log.info("decode attention on CUDA: gather + SDPA (triton does not import: %s)", exc)
            return None
        return triton_decode.resolve(device)
    return _resolve("decode_kernel", name, device)


# The prefill kernel's tiles are 16-float vectors: one register on AVX-512. Built for AVX2 (GCC splits
# them, spilling), it measured 4.6x slower than SDPA at 1024 tokens on a 2-core Zen 3 (10 GFLOP/s;
# a 5,000-token prompt took 90 s), while on AVX-512 it is 2.8x faster than SDPA
# (benchmarks/kernel/attention.py; results/perf/profiles/attention_kernels*.json).
PREFILL_KERNEL_FLAG = "avx512f"


def resolve_prefill_kernel(name: str, device: torch.device, flags: set[str] | None = None) -> PagedDecodeKernel | None:
    """``auto``: the C++ kernel on CPUs with AVX-512 (``flags``: /proc/cpuinfo's when None), SDPA elsewhere;
    ``cpp`` forces the kernel on any CPU."""
    if name == "auto" and device.type == "cpu":
        from swiftcommon.cpu_dtype import cpu_flags

        if PREFILL_KERNEL_FLAG not in (cpu_flags() if flags is None else flags):
            log.info("prefill attention: gather + SDPA (this CPU has no AVX-512, where the C++ prefill kernel "
                     "is slower than SDPA; --prefill-kernel cpp forces it)")
            return None
    return _resolve("prefill_kernel", name, device)


def prebuild(say=print) -> bool:
    """Build (or find cached) the kernel before workers start, so they do not each wait on the
    compiler at start-up; says what happened. Never raises: workers fall back on their own."""
    import time

    t0 = time.monotonic()
    try:
        build()
    except Exception as exc:
        say(f"CPU attention kernels not built ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); "
            "attention will use gather + SDPA")
        return False
    say(f"CPU attention kernels ready in {time.monotonic() - t0:.1f}s")
    return True


if __name__ == "__main__":           # python -m refengine.paged_kernel (make test, image builds)
    prebuild(lambda m: print(f"refengine.paged_kernel: {m}"))
