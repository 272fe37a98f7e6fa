"""Our GGUF dequantization against llama.cpp's own C code, bit for bit.

    python -m studies.gguf_dequant_vs_llamacpp [--llamacpp /work/peers/llama.cpp] [--gguf FILE ...]

Loads llama.cpp's ``libggml-base`` (built by studies/llamacpp_build.sh) with ctypes and calls its
reference ``dequantize_row_{q4_0,q4_1,q5_0,q8_0,q4_K,q6_K}`` on (a) random blocks of every format (every
bit pattern of the integer fields, random fp16 scales) and (b) every quantized tensor of the given
GGUF files (default: the embedded model's own Q4_1 file); compares the float32 bits with our C++
kernel (``gguf_dequant``, csrc/quant_gguf.cpp) and the torch reference (refengine.quant.formats).
Prints one line per case and exits 1 on any difference. llama.cpp is a peer here, never a dependency.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import numpy as np
import torch

from refengine import paged_kernel
from refengine.quant import formats
from tests.refengine.quant.quant_support import random_blocks

ROOT = Path(__file__).resolve().parent.parent

NAMES = {"Q4_0": "q4_0", "Q4_1": "q4_1", "Q5_0": "q5_0", "Q8_0": "q8_0", "Q4_K": "q4_K", "Q6_K": "q6_K"}


def ggml_dequant(lib, qtype: str, raw: torch.Tensor, cols: int) -> torch.Tensor:
    fn = getattr(lib, f"dequantize_row_{NAMES[qtype]}")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    src = np.ascontiguousarray(raw.numpy())
    out = np.empty(raw.shape[0] * cols, dtype=np.float32)
    fn(src.ctypes.data, out.ctypes.data, out.size)                 # rows are contiguous blocks: one call
    return torch.from_numpy(out).reshape(raw.shape[0], cols)


def compare(lib, k, qtype: str, raw: torch.Tensor, cols: int) -> tuple[bool, bool]:
    ref = ggml_dequant(lib, qtype, raw, cols).view(torch.int32)
    ours_cpp = k.gguf_dequant(raw, formats.FORMATS[qtype].ggml_type, cols).view(torch.int32)
    ours_torch = formats.dequantize(qtype, raw, cols).view(torch.int32)
    return torch.equal(ref, ours_cpp), torch.equal(ref, ours_torch)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llamacpp", default="/work/peers/llama.cpp")
    ap.add_argument("--gguf", nargs="*", default=None)
    args = ap.parse_args()
    lib = ctypes.CDLL(str(Path(args.llamacpp) / "build" / "bin" / "libggml-base.so"))
    k = paged_kernel.build().module
    bad = 0
    for qtype in sorted(formats.FORMATS):
        cpp, tor = compare(lib, k, qtype, random_blocks(qtype, 256, 2048, seed=11), 2048)
        print(f"random {qtype:5s} 256 x 2048: kernel {'bit-equal' if cpp else 'DIFFERS'}, "
              f"torch reference {'bit-equal' if tor else 'DIFFERS'}")
        bad += (not cpp) + (not tor)
    files = args.gguf
    if files is None:
        from modelkit.prepare import ensure_default_model
        from refengine.quant import find_gguf
        files = [str(find_gguf(ensure_default_model()))]
    from gguf import GGUFReader
    for path in files:
        reader = GGUFReader(path, "r")
        seen: dict[str, list[int]] = {}
        for t in reader.tensors:
            f = formats.BY_GGML_TYPE.get(int(t.tensor_type))
            if f is None:
                continue
            cols = int(t.shape[0])
            raw = torch.from_numpy(np.array(t.data, dtype=np.uint8)).reshape(-1, formats.row_bytes(f.name, cols))
            cpp, tor = compare(lib, k, f.name, raw, cols)
            counts = seen.setdefault(f.name, [0, 0])
            counts[0] += 1
            counts[1] += cpp and tor
            bad += (not cpp) + (not tor)
        for name, (n, ok) in sorted(seen.items()):
            print(f"{Path(path).name}: {name} tensors bit-equal (kernel and torch) {ok} of {n}")
    print("all bit-equal" if bad == 0 else f"{bad} differences")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
