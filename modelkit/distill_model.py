"""Dense (unpaged) SwiftKV model for distillation: one frozen copy of the base
weights plus trainable SwiftKV projections.

Teacher and student share layers 0..l-1 exactly (SwiftKV does not change them), so
they are computed once, without grad. From the residual stream h after layer l-1:
  teacher: layers l..L-1 with their original q/k/v (no grad)   -> teacher logits
  student: K/V of every later layer from norm_swiftkv(h) through the group's
           k/v_proj_swiftkv, queries from q_proj_swiftkv          -> student logits
Only ``q/k/v_proj_swiftkv`` (+ ``norm_swiftkv``) receive gradients, as the papers
prescribe (training whole layers loses quality).

Several students with the same ``l`` and different AcrossKV group sizes ``g`` can be
trained at once: they share the trunk and the teacher, which are the costly part.

Shapes: ids [B, T]; hidden [B, T, H]; heads [B, nh, T, d].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from modelkit.swiftkv import init_swiftkv_tensors
from refengine.model_config import load_model_spec
from refengine.models.llama import rms_norm
from refengine.rope import Rope
from refengine.weights import WeightSource


class SwiftKVDistillModel(nn.Module):
    def __init__(self, base_dir, l: int, groups: list[int], dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", max_positions: int = 4096):
        super().__init__()
        spec = load_model_spec(base_dir)
        if spec.is_swiftkv_checkpoint:
            raise ValueError("distil from the plain base model directory, not a SwiftKV checkpoint")
        if spec.qk_norm or spec.sandwich_norm or spec.layer_windows or spec.norm_offset or spec.hidden_act != "silu":
            raise ValueError(f"distillation supports the Llama-shaped families (Llama, Mistral and Qwen2 without "
                             f"sliding windows), not {spec.model_type!r} (QK-norm, Gemma's norms or windows)")
        self.spec, self.l, self.L = spec, l, spec.num_layers
        self.groups = list(groups)
        if not 1 <= l < self.L or not self.groups or min(self.groups) < 1 or len(set(self.groups)) != len(self.groups):
            raise ValueError(f"need 1 <= l < {self.L} and distinct group sizes >= 1 (got l={l}, groups={groups})")
        device = torch.device(device)
        w = WeightSource(base_dir)
        frozen = lambda n: w.get(n, dtype, device)  # noqa: E731
        self.embed = frozen("model.embed_tokens.weight")
        self.final_norm = frozen("model.norm.weight")
        self.lm_head = self.embed if (spec.tie_word_embeddings or "lm_head.weight" not in w) else frozen("lm_head.weight")
        self.layers = []
        for i in range(self.L):
            p = f"model.layers.{i}."
            names = ("q_proj", "k_proj", "v_proj")
            lay = {
                "ln1": frozen(p + "input_layernorm.weight"), "ln2": frozen(p + "post_attention_layernorm.weight"),
                "qkv": torch.cat([frozen(p + f"self_attn.{n}.weight") for n in names]),
                "qkv_b": torch.cat([frozen(p + f"self_attn.{n}.bias") for n in names]) if spec.qkv_bias else None,
                "o": frozen(p + "self_attn.o_proj.weight"),
                "gate_up": torch.cat([frozen(p + "mlp.gate_proj.weight"), frozen(p + "mlp.up_proj.weight")]),
                "down": frozen(p + "mlp.down_proj.weight"),
            }
            self.layers.append(lay)
        self.rope = Rope(spec.head_dim, spec.rope_theta, spec.rope_scaling, max_positions, dtype, device)
        # Trainable parameters are kept in float32 (master weights) whatever the frozen dtype.
        self.students = nn.ModuleDict()
        for g in self.groups:
            start = init_swiftkv_tensors(lambda n: w.get(n, torch.float32), self.L, l, g, spec.qkv_bias)
            self.students[str(g)] = nn.ParameterDict(
                {k.replace(".", "__"): nn.Parameter(v.to(device)) for k, v in start.items()})
        w.close()

    # ---- parameters ------------------------------------------------------------------
    def swiftkv_state(self, g: int) -> dict[str, torch.Tensor]:
        """Student g's trainable tensors under their checkpoint names."""
        return {k.replace("__", "."): v.detach() for k, v in self.students[str(g)].items()}

    @torch.no_grad()
    def load_swiftkv(self, tensors: dict[int, dict[str, torch.Tensor]]) -> None:
        """Copy tensors (checkpoint names, any dtype) into the students' parameters, by group size."""
        for g, named in tensors.items():
            params = self.students[str(g)]
            for name, t in named.items():
                key = name.replace(".", "__")
                if key not in params or params[key].shape != t.shape:
                    raise ValueError(f"tensor {name} {tuple(t.shape)} does not fit student g={g}")
                params[key].copy_(t.to(params[key].dtype))

    def parameters_of(self, g: int) -> list[nn.Parameter]:
        return list(self.students[str(g)].values())

    def _p(self, g: int, name: str) -> torch.Tensor:
        return self.students[str(g)][name.replace(".", "__")]

    # ---- blocks ------------------------------------------------------------------------
    def _heads(self, x, n):
        B, T, _ = x.shape
        return x.view(B, T, n, self.spec.head_dim).transpose(1, 2)

    def _rot(self, x, cos, sin):  # x [B, n, T, d]; cos/sin [T, d]
        return self.rope.apply(x, cos, sin)

    def _tail(self, lay, h, a):
        B, T, _ = h.shape
        h = h + F.linear(a.transpose(1, 2).reshape(B, T, -1), lay["o"].to(a.dtype))
        gate, up = F.linear(rms_norm(h, lay["ln2"], self.spec.rms_norm_eps), lay["gate_up"]).chunk(2, -1)
        return h + F.linear(F.silu(gate) * up, lay["down"])

    def qkv(self, lay, h) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Original projections of one layer, before RoPE: q [B,T,nh*d], k and v [B,T,nkv*d]."""
        s = self.spec
        qkv = F.linear(rms_norm(h, lay["ln1"], s.rms_norm_eps), lay["qkv"], lay["qkv_b"])
        return qkv.split([s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim, s.num_kv_heads * s.head_dim], -1)

    def _layer(self, lay, h, cos, sin, qkv=None):
        """One original layer; ``qkv`` = ``self.qkv(lay, h)`` when the caller already has it."""
        s = self.spec
        q, k, v = qkv if qkv is not None else self.qkv(lay, h)
        q, k = self._rot(self._heads(q, s.num_heads), cos, sin), self._rot(self._heads(k, s.num_kv_heads), cos, sin)
        a = F.scaled_dot_product_attention(q, k, self._heads(v, s.num_kv_heads), is_causal=True, enable_gqa=True)
        return self._tail(lay, h, a)

    def _student_layer(self, g, i, h, k, v, cos, sin):
        s, lay = self.spec, self.layers[i]
        p = f"model.layers.{i}.self_attn.q_proj_swiftkv."
        x = rms_norm(h, lay["ln1"], s.rms_norm_eps)
        q = F.linear(x, self._p(g, p + "weight").to(x.dtype),
                     self._p(g, p + "bias").to(x.dtype) if s.qkv_bias else None)
        q = self._rot(self._heads(q, s.num_heads), cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self._tail(lay, h, a)

    # ---- forward -------------------------------------------------------------------------
    def positions(self, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE cos/sin of positions 0..T-1."""
        return self.rope.cos[:T], self.rope.sin[:T]

    def trunk(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Layers 0..l-1 (shared, no grad) -> (h [B,T,H], cos, sin)."""
        cos, sin = self.positions(ids.shape[1])
        with torch.no_grad():
            h = F.embedding(ids, self.embed)
            for i in range(self.l):
                h = self._layer(self.layers[i], h, cos, sin)
        return h, cos, sin

    @torch.no_grad()
    def teacher(self, h, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (logits [B,T,V], hidden before the last layer [B,T,H])."""
        penult = h
        for i in range(self.l, self.L):
            if i == self.L - 1:
                penult = h
            h = self._layer(self.layers[i], h, cos, sin)
        return self.logits(h), penult

    def student(self, h, cos, sin, g: int, grad_checkpointing: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.spec
        x = rms_norm(h, self._p(g, "model.norm_swiftkv.weight").to(h.dtype), s.rms_norm_eps)
        kv = {}
        for lead in range(self.l, self.L, g):
            p = f"model.layers.{lead}.self_attn."
            b = (lambda n: self._p(g, p + n + ".bias").to(x.dtype)) if s.qkv_bias else (lambda n: None)
            k = F.linear(x, self._p(g, p + "k_proj_swiftkv.weight").to(x.dtype), b("k_proj_swiftkv"))
            v = F.linear(x, self._p(g, p + "v_proj_swiftkv.weight").to(x.dtype), b("v_proj_swiftkv"))
            kv[lead] = (self._rot(self._heads(k, s.num_kv_heads), cos, sin), self._heads(v, s.num_kv_heads))
        penult = h
        for i in range(self.l, self.L):
            if i == self.L - 1:
                penult = h
            k, v = kv[self.l + (i - self.l) // g * g]
            if grad_checkpointing:
                h = checkpoint(self._student_layer, g, i, h, k, v, cos, sin, use_reentrant=False)
            else:
                h = self._student_layer(g, i, h, k, v, cos, sin)
        return self.logits(h), penult

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(rms_norm(h, self.final_norm, self.spec.rms_norm_eps), self.lm_head)


def distill_loss(t_logits: torch.Tensor, s_logits: torch.Tensor, temperature: float = 2.0,
                 mask: torch.Tensor | None = None) -> torch.Tensor:
    """KL(teacher || student) of softened distributions, times T^2, mean over tokens. logits [..., V]."""
    t = F.log_softmax(t_logits.float() / temperature, -1)
    s = F.log_softmax(s_logits.float() / temperature, -1)
    kl = (t.exp() * (t - s)).sum(-1)
    if mask is not None:
        return (kl * mask).sum() / mask.sum().clamp_min(1) * temperature ** 2
    return kl.mean() * temperature ** 2
