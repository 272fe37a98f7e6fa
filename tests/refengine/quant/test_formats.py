"""GGUF block formats in torch (refengine.quant.formats): the reference dequantization equals
gguf-py's (llama.cpp's Python port) bit for bit on random blocks of every served format, the
llama.cpp reference quantizers (Q4_0, Q4_1, Q8_0) equal gguf-py's byte for byte, and our own
K-quant quantizers round-trip within the format's error."""

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


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
def test_reference_quantizers_match_llama_cpp_port(qtype):
    w = torch.randn(16, 256, generator=torch.Generator().manual_seed(2)) * 0.05
    w[0, :32] = 0                                    # an all-zero block (scale 0)
    assert np.array_equal(formats.quantize(qtype, w).numpy(), gq.quantize(w.numpy(), GT[qtype]))


@pytest.mark.parametrize("qtype,bound", [("Q4_K", 0.1), ("Q6_K", 0.03), ("Q8_0", 0.01), ("Q4_0", 0.12)])
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
