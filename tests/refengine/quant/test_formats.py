"""GGUF block formats in torch (refengine.quant.formats): the reference dequantization equals
gguf-py's (llama.cpp's Python port) bit for bit on random blocks of every served format, the
llama.cpp reference quantizers (Q4_0, Q4_1, Q5_0, Q8_0) equal gguf-py's byte for byte, and our own
K-quant quantizers round-trip within the format's error; Q5_0 also against a plain decoding of its layout."""

import numpy as np
import pytest
import torch

from refengine.quant import formats
from refengine.quant.qtensor import QTensor
from tests.refengine.quant.quant_support import random_blocks

gq = pytest.importorskip("gguf.quants")
from gguf import GGMLQuantizationType as GT  # noqa: E402


@pytest.mark.parametrize("qtype", sorted(formats.FORMATS))
def test_dequantize_matches_gguf_py_bit_for_bit(qtype):
    raw = random_blocks(qtype, 48, 512, seed=1)
    ours = formats.dequantize(qtype, raw, 512)
    theirs = torch.from_numpy(gq.dequantize(raw.numpy(), GT[qtype]).astype(np.float32)).reshape(48, 512)
    assert torch.equal(ours.view(torch.int32), theirs.view(torch.int32))      # bits, NaN-proof


def test_q5_0_dequantize_matches_a_plain_decoding_of_the_layout():
    """Q5_0 read byte by byte as ggml-common.h lays it out: d fp16, qh a little-endian uint32 whose bit j is
    value j's 5th bit, qs[16] with value j's low 4 bits in byte j's low nibble and value j + 16's in its high."""
    raw = random_blocks("Q5_0", 6, 96, seed=13)
    blocks = raw.numpy().reshape(-1, 22)
    want = np.empty((blocks.shape[0], 32), dtype=np.float32)
    for n, b in enumerate(blocks):
        d = np.float32(b[0:2].view(np.float16)[0])
        qh = int(b[2]) | int(b[3]) << 8 | int(b[4]) << 16 | int(b[5]) << 24
        for j in range(32):
            low = (int(b[6 + j % 16]) >> (4 * (j // 16))) & 0xF
            want[n, j] = np.float32((low | ((qh >> j) & 1) << 4) - 16) * d
    got = formats.dequantize("Q5_0", raw, 96)
    assert torch.equal(got.view(torch.int32), torch.from_numpy(want.reshape(6, 96)).view(torch.int32))


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q5_0", "Q8_0"])
def test_reference_quantizers_match_llama_cpp_port(qtype):
    w = torch.randn(16, 256, generator=torch.Generator().manual_seed(2)) * 0.05
    w[0, :32] = 0                                    # an all-zero block (scale 0)
    assert np.array_equal(formats.quantize(qtype, w).numpy(), gq.quantize(w.numpy(), GT[qtype]))


@pytest.mark.parametrize("qtype,bound", [("Q4_K", 0.1), ("Q6_K", 0.03), ("Q8_0", 0.01), ("Q4_0", 0.12),
                                         ("Q5_0", 0.06)])
def test_quantize_round_trip(qtype, bound):
    w = torch.randn(32, 512, generator=torch.Generator().manual_seed(3)) * 0.05
    q = QTensor.quantize(w, qtype)
    err = (q.dequantize() - w).norm() / w.norm()
    assert err < bound
    assert q.shape == (32, 512) and q.nbytes == 32 * formats.row_bytes(qtype, 512)


def test_rows_concatenate_and_permute_exactly():
    a, b = QTensor.quantize(torch.randn(8, 64), "Q4_1"), QTensor.quantize(torch.randn(4, 64), "Q4_1")
    both = QTensor.cat([a, b])
    assert torch.equal(both.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
    idx = torch.tensor([3, 0, 11])
    assert torch.equal(both.index_rows(idx).dequantize(), both.dequantize()[idx])
    with pytest.raises(ValueError):
        QTensor.cat([a, QTensor.quantize(torch.randn(4, 64), "Q8_0")])
    with pytest.raises(ValueError, match="whole number"):
        formats.row_bytes("Q4_K", 576)
