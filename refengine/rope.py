"""Rotary position embeddings (neox / HF "rotate_half" layout) with HF's scaling types.

The cos/sin table is computed the way transformers computes it (float32,
``inv_freq`` from int64 arange, cat(freqs, freqs)) so that our logits match HF's.
Supported ``rope_type``: default, linear, llama3, yarn, dynamic (identical to
default within ``max_position_embeddings``, which caps our context).
"""

from __future__ import annotations

import math

import torch


def inv_freq_and_scale(head_dim: int, theta: float, scaling: dict | None) -> tuple[torch.Tensor, float]:
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if not scaling:
        return inv, 1.0
    kind = scaling["rope_type"]
    if kind == "dynamic":
        return inv, 1.0
    if kind == "linear":
        return inv / float(scaling["factor"]), 1.0
    if kind == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling.get("low_freq_factor", 1.0)), float(scaling.get("high_freq_factor", 4.0))
        old_ctx = float(scaling["original_max_position_embeddings"])
        low_wl, high_wl = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wl, inv / factor, inv)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wl) & (wavelen <= low_wl)
        return torch.where(medium, smoothed, scaled), 1.0
    if kind == "yarn":
        factor = float(scaling["factor"])
        old_ctx = float(scaling.get("original_max_position_embeddings", 4096))
        beta_fast, beta_slow = float(scaling.get("beta_fast", 32)), float(scaling.get("beta_slow", 1))
        mscale = scaling.get("attention_factor") or (0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0)

        def dim_of(rot: float) -> float:
            return (head_dim * math.log(old_ctx / (rot * 2 * math.pi))) / (2 * math.log(theta))

        lo = max(math.floor(dim_of(beta_fast)), 0)
        hi = min(math.ceil(dim_of(beta_slow)), head_dim - 1)
        if lo == hi:
            hi += 0.001
        ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - lo) / (hi - lo)).clamp(0, 1)
        extrapolation = 1 - ramp
        inv = (inv / factor) * (1 - extrapolation) + inv * extrapolation
        return inv, float(mscale)
    raise ValueError(f"unsupported rope_type {kind!r}")


class Rope:
    def __init__(self, head_dim: int, theta: float, scaling: dict | None, max_positions: int,
                 dtype: torch.dtype, device: torch.device):
        inv, mscale = inv_freq_and_scale(head_dim, theta, scaling)
        pos = torch.arange(max_positions, dtype=torch.float32)
        freqs = pos[:, None] * inv[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = (emb.cos() * mscale).to(dtype=dtype, device=device)  # [max_pos, head_dim]
        self.sin = (emb.sin() * mscale).to(dtype=dtype, device=device)

    @staticmethod
    def _rotate_half(x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin for ``positions [T]`` shaped ``[T, 1, head_dim]`` (broadcast over heads)."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)

    @staticmethod
    def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x ``[T, heads, head_dim]``."""
        return (x * cos) + (Rope._rotate_half(x) * sin)
