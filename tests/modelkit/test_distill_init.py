"""Least-squares initialisation of the SwiftKV K/V projections: the solver recovers an
exact linear map (AcrossKV: the group mean), and on the real SmolLM2 a fit on a few
text windows brings the student closer to the teacher than the papers' initialisation."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from modelkit.distill_init import fit_swiftkv_kv, solve_kv
from modelkit.distill_model import SwiftKVDistillModel, distill_loss


def _fake(l, L, groups, hidden=6, kv=4, bias=False):
    spec = SimpleNamespace(hidden_size=hidden, num_kv_heads=1, head_dim=kv, qkv_bias=bias)
    return SimpleNamespace(spec=spec, l=l, L=L, groups=groups)


@pytest.mark.parametrize("bias", [False, True])
def test_solver_recovers_a_linear_map_and_group_means(bias):
    torch.manual_seed(0)
    m = _fake(2, 5, [1, 2], bias=bias)
    D = 6 + int(bias)
    x = torch.randn(500, 6, dtype=torch.float64)
    if bias:
        x = torch.cat([x, torch.ones(500, 1, dtype=torch.float64)], -1)
    maps = {i: (torch.randn(4, D, dtype=torch.float64), torch.randn(4, D, dtype=torch.float64)) for i in range(2, 5)}
    xty = {i: (x.T @ (x @ wk.T), x.T @ (x @ wv.T)) for i, (wk, wv) in maps.items()}
    out = solve_kv(m, x.T @ x, xty, ridge=0.0)
    w = out[1]["model.layers.3.self_attn.k_proj_swiftkv.weight"]
    assert torch.allclose(w.double(), maps[3][0][:, :6], atol=1e-4)
    if bias:
        assert torch.allclose(out[1]["model.layers.3.self_attn.k_proj_swiftkv.bias"].double(), maps[3][0][:, 6],
                              atol=1e-4)
    # g=2: layers 2,3 share one projection fitted to their mean; layer 4 is a group of one.
    shared = out[2]["model.layers.2.self_attn.v_proj_swiftkv.weight"].double()
    assert torch.allclose(shared, ((maps[2][1] + maps[3][1]) / 2)[:, :6], atol=1e-4)
    assert torch.allclose(out[2]["model.layers.4.self_attn.v_proj_swiftkv.weight"].double(), maps[4][1][:, :6],
                          atol=1e-4)
    assert "model.layers.3.self_attn.k_proj_swiftkv.weight" not in out[2]


@pytest.mark.slow
@pytest.mark.model
def test_lstsq_init_beats_the_papers_init_on_unseen_text(smollm2_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    docs = sorted((Path(__file__).resolve().parents[2] / "docs").glob("*.md"))
    text = "\n\n".join(p.read_text() for p in docs)
    # 2 048 fitting tokens (a few per regressor: 577 inputs), 256 later ones held out.
    ids = torch.tensor(tok(text)["input_ids"][:18 * 128]).view(18, 128)
    fit, held = ids[:16], ids[16:]
    model = SwiftKVDistillModel(smollm2_dir, 15, [1, 2], max_positions=128)

    def kl(g):
        with torch.no_grad():
            h, cos, sin = model.trunk(held)
            t, _ = model.teacher(h, cos, sin)
            s, _ = model.student(h, cos, sin, g)
            return float(distill_loss(t, s, 1.0))

    before = {g: kl(g) for g in (1, 2)}
    tensors, tokens = fit_swiftkv_kv(model, fit, micro_batch=4, progress=False)
    assert tokens == 16 * 128 and set(tensors) == {1, 2}
    model.load_swiftkv(tensors)
    after = {g: kl(g) for g in (1, 2)}
    assert after[1] < 0.7 * before[1] and after[2] < 0.7 * before[2], (before, after)
    with pytest.raises(ValueError):
        model.load_swiftkv({1: {"model.layers.15.self_attn.k_proj_swiftkv.weight": torch.zeros(3, 3)}})
