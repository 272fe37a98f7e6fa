"""Closed-form initialisation of the SwiftKV K/V projections (least squares).

The papers initialise ``k/v_proj_swiftkv`` of layer i with layer i's own ``k/v_proj``,
applied to the residual stream of layer l instead of layer i. Among all linear maps
from ``x = norm_swiftkv(h_l)`` that is an arbitrary one; the linear map that best
reproduces the original model's keys and values is the ridge regression

    W_i = argmin_W  sum_t || W x_t - y_{i,t} ||^2 + ridge * tr(X^T X)/d * ||W||^2

with y_{i,t} the original pre-RoPE key (or value) of layer i at token t. (RoPE is a
rotation per position, so fitting before or after it is the same problem.) For an
AcrossKV group, the shared projection is fitted to the mean of the group's targets,
which minimises the summed squared error over the group's layers.

Only sufficient statistics are accumulated: X^T X [H+1, H+1] and X^T Y per layer, in
float64, over a few hundred teacher-forward windows (no backward), so the fit costs
less than one percent of a distillation run and needs no extra memory.

``fit_swiftkv_kv(model, windows, ...)`` -> ``{g: {checkpoint name: tensor}}`` for the
K/V tensors of every student of ``model`` (load them with ``model.load_swiftkv``);
queries and ``norm_swiftkv`` keep their initialisation (distillation trains them).
"""

from __future__ import annotations

import torch

from refengine.models.llama import rms_norm


@torch.no_grad()
def kv_statistics(model, windows: torch.Tensor, micro_batch: int = 2, device=None, progress: bool = True):
    """-> (XtX [D, D], {layer: (XtY_k [D, kv], XtY_v [D, kv])}, tokens) with D = H (+1 with biases)."""
    from tqdm import tqdm

    s, l = model.spec, model.l
    device = device or model.embed.device
    norm_w = model.students[str(model.groups[0])]["model__norm_swiftkv__weight"].detach()
    bias = s.qkv_bias
    D = s.hidden_size + int(bias)
    kvd = s.num_kv_heads * s.head_dim
    xtx = torch.zeros(D, D, dtype=torch.float64, device=device)
    xty = {i: (torch.zeros(D, kvd, dtype=torch.float64, device=device),
               torch.zeros(D, kvd, dtype=torch.float64, device=device)) for i in range(l, model.L)}
    tokens = 0
    for a in tqdm(range(0, len(windows), micro_batch), desc="least-squares K/V init", unit="batch",
                  disable=not progress):
        ids = windows[a:a + micro_batch].to(device)
        h, cos, sin = model.trunk(ids)
        x = rms_norm(h, norm_w.to(h.dtype), s.rms_norm_eps).reshape(-1, s.hidden_size).double()
        if bias:
            x = torch.cat([x, torch.ones_like(x[:, :1])], -1)
        xtx += x.T @ x
        for i in range(l, model.L):
            qkv = model.qkv(model.layers[i], h)
            xty[i][0].add_(x.T @ qkv[1].reshape(-1, kvd).double())
            xty[i][1].add_(x.T @ qkv[2].reshape(-1, kvd).double())
            h = model._layer(model.layers[i], h, cos, sin, qkv)
        tokens += ids.numel()
    return xtx, xty, tokens


def solve_kv(model, xtx: torch.Tensor, xty: dict, ridge: float = 1e-4) -> dict[int, dict[str, torch.Tensor]]:
    """Ridge solutions for every student group size of ``model`` (float32, checkpoint names)."""
    s, D = model.spec, xtx.shape[0]
    reg = xtx + ridge * torch.trace(xtx) / D * torch.eye(D, dtype=xtx.dtype, device=xtx.device)
    chol = torch.linalg.cholesky(reg)
    out: dict[int, dict[str, torch.Tensor]] = {}
    for g in model.groups:
        tensors = {}
        for lead in range(model.l, model.L, g):
            group = range(lead, min(lead + g, model.L))
            for j, name in enumerate(("k_proj_swiftkv", "v_proj_swiftkv")):
                target = torch.stack([xty[i][j] for i in group]).mean(0)       # [D, kv]
                w = torch.cholesky_solve(target, chol).T.float()              # [kv, D]
                p = f"model.layers.{lead}.self_attn.{name}."
                tensors[p + "weight"] = w[:, :s.hidden_size].contiguous()
                if s.qkv_bias:
                    tensors[p + "bias"] = w[:, s.hidden_size].contiguous()
        out[g] = tensors
    return out


def fit_swiftkv_kv(model, windows: torch.Tensor, micro_batch: int = 2, ridge: float = 1e-4,
                   progress: bool = True) -> tuple[dict[int, dict[str, torch.Tensor]], int]:
    """Least-squares K/V projections for every student of ``model`` -> (tensors by g, tokens used)."""
    xtx, xty, tokens = kv_statistics(model, windows, micro_batch, progress=progress)
    return solve_kv(model, xtx, xty, ridge), tokens

