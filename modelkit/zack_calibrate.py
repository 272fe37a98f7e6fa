"""ZACK calibration: per cache slot and KV head, the rotations ``R_qk`` and ``R_vo`` (zack.txt §4.3).

Text: documents of the training split of the corpus sources (``modelkit.corpus``;
never the held-out split the evaluation scores), shuffled with a seed, cut into
sequences of ``seq_len`` tokens until ``tokens`` are reached.

Capture: the model runs in the reference engine; each cache slot is wrapped so that
every key written (after RoPE), every value written and every query attending
(after RoPE; all query heads of a KV head, all layers sharing the slot: GQA and
AcrossKV) is accumulated into per-head Gram matrices in float64. With SwiftKV on,
later layers compute queries only for tokens that need logits, so the text is
teacher-forced token by token (``LLMEngine.score``); without SwiftKV a prefill
sees every token.

SVD without storing the stacked matrices: for ``X = [Q; K]`` (rows = vectors) the
right singular vectors are the eigenvectors of ``X^T X = Q^T Q + K^T K`` and the
singular values the square roots of its eigenvalues. ``R_vo`` stacks V with the
rows of every ``W_o`` slice reading the head (``W_o[:, q*d:(q+1)*d]``, [hidden, d]).
``weighting="balanced"`` scales each stacked block to unit trace first (so neither
the many Q rows nor the many V rows drown the other block); ``"plain"`` is the
paper's plain stacking.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

import torch


class GramCapture:
    """Stands in for one cache slot: accumulates Gram matrices, then forwards to the slot."""

    def __init__(self, inner, kv_heads: int, q_per_kv: int, head_dim: int):
        self.inner = inner
        self.kvh, self.G, self.d = kv_heads, q_per_kv, head_dim
        z = lambda: torch.zeros(kv_heads, head_dim, head_dim, dtype=torch.float64)  # noqa: E731
        self.k, self.q, self.v = z(), z(), z()
        self.rows = {"k": 0, "q": 0, "v": 0}

    def write(self, slots, k, v):
        T = k.shape[0]
        kk = k.double()
        vv = v.double().reshape(T, self.kvh, self.d)
        self.k += torch.einsum("thd,the->hde", kk, kk).cpu()
        self.v += torch.einsum("thd,the->hde", vv, vv).cpu()
        self.rows["k"] += T
        self.rows["v"] += T
        return self.inner.write(slots, k, v)

    def attend(self, q, batch, scale):
        T = q.shape[0]
        qq = q.double().reshape(T, self.kvh, self.G, self.d)
        self.q += torch.einsum("thgd,thge->hde", qq, qq).cpu()
        self.rows["q"] += T * self.G
        return self.inner.attend(q, batch, scale)


def calibration_sequences(tok, tokens: int, seq_len: int, seed: int, corpus: Path | None = None) -> list[list[int]]:
    """Token sequences of ``seq_len`` from training-split documents until ``tokens`` are collected."""
    from modelkit.corpus import collect, iter_docs

    with tempfile.TemporaryDirectory() as tmp:
        if corpus is None:
            corpus = Path(tmp)
            collect(corpus)
        docs = [d["text"] for d in iter_docs(corpus, "train")]
    random.Random(seed).shuffle(docs)
    out: list[list[int]] = []
    have = 0
    for text in docs:
        ids = tok(text)["input_ids"]
        for i in range(0, len(ids) - 15, seq_len):         # drop tails shorter than 16 tokens
            out.append(ids[i:i + seq_len])
            have += len(out[-1])
            if have >= tokens:
                return out
    raise ValueError(f"the calibration sources hold only {have} tokens (< {tokens} asked)")


def _rotation(gram: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[h, d, d]`` Gram -> (R [h, d, d] columns by descending singular value, s [h, d])."""
    evals, evecs = torch.linalg.eigh(gram)
    evals, evecs = evals.flip(-1), evecs.flip(-1)
    return evecs, evals.clamp_min(0).sqrt()


def _unit_trace(g: torch.Tensor) -> torch.Tensor:
    tr = g.diagonal(dim1=-2, dim2=-1).sum(-1)
    return g / tr.clamp_min(1e-30)[:, None, None]


def _sqrt_pair(c: torch.Tensor, rel_floor: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """``C^(1/2)`` and ``C^(-1/2)`` of symmetric PSD ``[h, d, d]`` (eigenvalues floored for stability)."""
    evals, evecs = torch.linalg.eigh(c)
    floor = rel_floor * evals.clamp_min(0).mean(-1, keepdim=True).clamp_min(1e-30)
    evals = evals.clamp_min(0) + floor
    root = evecs * evals.sqrt()[..., None, :]
    inv = evecs * evals.rsqrt()[..., None, :]
    return root @ evecs.transpose(-1, -2), inv @ evecs.transpose(-1, -2)


def stacked_maps(g_k, g_q, g_v, g_wo, weighting: str) -> dict[str, torch.Tensor]:
    """The paper's bases: one rotation for Q and K, one for V and O (SVD of the stacked rows)."""
    if weighting == "balanced":
        g_qk, g_vo = _unit_trace(g_k) + _unit_trace(g_q), _unit_trace(g_v) + _unit_trace(g_wo)
    else:
        g_qk, g_vo = g_k + g_q, g_v + g_wo
    r_qk, s_qk = _rotation(g_qk)
    r_vo, s_vo = _rotation(g_vo)
    return {"r_qk": r_qk, "r_vo": r_vo, "s_qk": s_qk, "s_vo": s_vo}


def whitened_maps(c_k, c_q, c_v, g_wo) -> dict[str, torch.Tensor]:
    """Output-aware bases (second-moment optimal rank-r factorisations, still no decompression).

    Scores: E[(q^T (I - A B^T) k)^2] = ||C_q^(1/2) (I - A B^T) C_k^(1/2)||_F^2 is minimised at rank r by the
    SVD ``C_q^(1/2) C_k^(1/2) = U S V^T``: queries map with ``A = C_q^(-1/2) U S^(1/2)``, keys with
    ``B = C_k^(-1/2) V S^(1/2)``. Values: E||v (I - A B^T) W_o^T||^2 is minimised by the SVD of
    ``C_v^(1/2) W_o^T`` (left vectors U, from ``C_v^(1/2) G_wo C_v^(1/2)``): V maps with ``C_v^(-1/2) U``
    (folded into W_v), O with ``C_v^(1/2) U`` (folded into W_o). Columns rank by singular value.
    """
    q_half, q_inv = _sqrt_pair(c_q)
    k_half, k_inv = _sqrt_pair(c_k)
    u, s_qk, vh = torch.linalg.svd(q_half @ k_half)
    root_s = s_qk.sqrt()[..., None, :]
    v_half, v_inv = _sqrt_pair(c_v)
    evals, u_v = torch.linalg.eigh(v_half @ g_wo @ v_half)
    evals, u_v = evals.flip(-1), u_v.flip(-1)
    return {"r_q": q_inv @ u * root_s, "r_qk": k_inv @ vh.transpose(-1, -2) * root_s,
            "r_vo": v_inv @ u_v, "r_o": v_half @ u_v, "s_qk": s_qk, "s_vo": evals.clamp_min(0).sqrt()}


def calibrate(model_dir: Path, tokens: int = 32768, seq_len: int = 512, seed: int = 0, swiftkv: bool = True,
              basis: str = "whitened", weighting: str = "plain", corpus: Path | None = None, batch: int = 32,
              progress: bool = True) -> tuple[dict, dict[str, torch.Tensor]]:
    """Returns (calibration record for zack.json, tensors for zack.safetensors)."""
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from refengine.config import EngineConfig
    from refengine.engine import LLMEngine
    from refengine.kv.methods.zack.format import FORMAT, FORMAT_VERSION, swiftkv_record, tensor_name
    from refengine.kv.registry import facts_from_spec
    from refengine.kv.spec import CacheSpec
    from refengine.sampling_params import SamplingParams
    from refengine.weights import WeightSource

    if weighting not in ("plain", "balanced") or basis not in ("stacked", "whitened"):
        raise ValueError("basis must be 'stacked' or 'whitened', weighting 'plain' or 'balanced'")
    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(model_dir)
    seqs = calibration_sequences(tok, tokens, seq_len, seed, corpus)
    eng = LLMEngine(EngineConfig(model=str(model_dir), dtype="float32", swiftkv=swiftkv, seed=seed,
                                 kv_methods={"zack": False},          # calibrate the uncompressed model
                                 max_model_len=seq_len + 2, max_num_seqs=batch,
                                 num_kv_blocks=batch * (-(-(seq_len + 2) // 16)) + 8))
    spec, runner = eng.spec, eng.runner
    facts = facts_from_spec(spec, str(model_dir), swiftkv, 4)
    layout = CacheSpec.for_model(facts)
    kvh, d, G = spec.num_kv_heads, spec.head_dim, spec.num_heads // spec.num_kv_heads
    caps = [GramCapture(s, kvh, G, d) for s in runner.kv.slots]
    runner.kv.layers = [caps[s] for s in layout.layer_slot]
    teacher_force = runner.model.use_swiftkv
    for i in tqdm(range(0, len(seqs), batch), desc="zack calibration", unit="batch", disable=not progress):
        chunk = seqs[i:i + batch]
        if teacher_force:
            eng.score([(s[:1], s[1:]) for s in chunk])
        else:
            eng.generate(chunk, SamplingParams(max_tokens=1, temperature=0))
    w = WeightSource(model_dir)
    tensors: dict[str, torch.Tensor] = {}
    slots = []
    for group, cap in zip(layout.groups, caps):
        w_o = torch.zeros_like(cap.k)
        for layer in group.layers:
            o = w.get(f"model.layers.{layer}.self_attn.o_proj.weight", torch.float64)   # [hidden, heads*d]
            for h in range(kvh):
                for q in range(h * G, (h + 1) * G):
                    sl = o[:, q * d:(q + 1) * d]
                    w_o[h] += sl.T @ sl
        if basis == "whitened":
            maps = whitened_maps(cap.k / cap.rows["k"], cap.q / cap.rows["q"], cap.v / cap.rows["v"], w_o)
        else:
            maps = stacked_maps(cap.k, cap.q, cap.v, w_o, weighting)
        for layer in group.layers:
            for what, t in maps.items():
                tensors[tensor_name(layer, what)] = t.float().contiguous()
        slots.append({"layers": list(group.layers), "rows": dict(cap.rows),
                      "s_qk": [[round(float(x), 6) for x in row] for row in maps["s_qk"]],
                      "s_vo": [[round(float(x), 6) for x in row] for row in maps["s_vo"]]})
    w.close()
    record = {"format": FORMAT, "format_version": FORMAT_VERSION, "model": Path(model_dir).name,
              "num_layers": spec.num_layers, "num_kv_heads": kvh, "head_dim": d, "num_heads": spec.num_heads,
              "swiftkv": swiftkv_record(facts.swiftkv_layers, facts.group_size),
              "calibration": {"tokens": sum(len(s) for s in seqs), "sequences": len(seqs), "seq_len": seq_len,
                              "seed": seed, "basis": basis, "weighting": weighting, "teacher_forced": teacher_force,
                              "source": str(corpus) if corpus else "modelkit.corpus sources, train split"},
              "slots": slots}
    return record, tensors
