"""Shared by the GPU tests: the CUDA skip, random-weights models whose greedy tokens are decided
by clear margins, and the prepared SmolLM2 when it is there.

Every test here needs a CUDA device and is skipped at once without one (collection imports
only torch and this project), so the CPU suite pays nothing for them. On a GPU machine they
compare the reference engine on CUDA with the same engine on CPU, or with transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gpubundle.random_model import write_random_llama

ROOT = Path(__file__).resolve().parents[2]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
needs_2_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="fewer than 2 GPUs")

# SmolLM2's attention shape (9 query / 3 KV heads of 64, hidden 576), 4 layers, a smaller vocabulary.
SMALL = {"vocab_size": 8192, "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 4,
         "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "rms_norm_eps": 1e-5,
         "rope_theta": 100000.0, "max_position_embeddings": 2048, "tie_word_embeddings": True}
# Matrices ~ N(0, 0.05^2): varied greedy text (0.02 repeats one token) that bf16 still follows closely
# (teacher-forced top-1 agreement with float32 0.98 on CPU; at 0.1 the network is chaotic: 0.90).
STD = 0.05
CPU_REF = {"decode_kernel": "torch", "prefill_kernel": "torch", "fused_ops": "torch"}   # CPU side: torch ops


def make_engine(model: Path, device: str, dtype: str = "float32", **kw):
    from refengine.config import EngineConfig
    from refengine.engine import LLMEngine

    opts = {"max_model_len": 512, "num_kv_blocks": 256, **(CPU_REF if device == "cpu" else {}), **kw}
    return LLMEngine(EngineConfig(model=str(model), device=device, dtype=dtype, **opts))


def greedy(eng, prompts: list[list[int]], n: int = 24) -> list[list[int]]:
    from refengine.sampling_params import SamplingParams

    return eng.generate(prompts, SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))


def dist_rows(eng, prompts: list[list[int]], conts: list[list[int]]) -> list[torch.Tensor]:
    """Teacher-forced log-prob rows [len(cont), V] (float32, CPU) of each continuation, read through the cache."""
    return [torch.stack([r[2] for r in item]).float() for item in eng.score(list(zip(prompts, conts)), want_dist=True)]


def assert_greedy_matches(ref: list[list[int]], ref_rows: list[torch.Tensor], got: list[list[int]], tol: float):
    """Greedy tokens agree up to the first position whose reference top-2 log-probs are within ``tol``
    (a near-tie that rounding may break either way); a divergence with a clear margin fails."""
    for p, (r, rows, g) in enumerate(zip(ref, ref_rows, got)):
        i = next((j for j, (a, b) in enumerate(zip(r, g)) if a != b), None)
        if i is None:
            assert len(r) == len(g), f"prompt {p}: {len(g)} tokens, expected {len(r)}"
            continue
        top2 = rows[i].topk(2).values
        margin = float(top2[0] - top2[1])
        assert margin < tol, f"prompt {p}: token {i} is {g[i]}, expected {r[i]} (reference margin {margin:.4f})"


def mean_kl(ref_rows: list[torch.Tensor], rows: list[torch.Tensor]) -> float:
    a, b = torch.cat(ref_rows), torch.cat(rows)
    return float((a.exp() * (a - b)).sum(-1).mean())


def max_abs(ref_rows: list[torch.Tensor], rows: list[torch.Tensor]) -> float:
    return max(float((a - b).abs().max()) for a, b in zip(ref_rows, rows))


def prompts(vocab: int, lengths=(5, 37, 150, 300), seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (n,), generator=g).tolist() for n in lengths]


def random_llama(path: Path, shape: dict = SMALL, seed: int = 0, std: float = STD) -> Path:
    return write_random_llama(path, shape, seed=seed, std=std)


def prepared_smollm2() -> Path:
    """The prepared SmolLM2 directory (``make test`` prepares it; a GPU session gets it from the pack)."""
    from modelkit.prepare import FORMAT, default_model_dir
    from modelkit.prepare_source import GGUF_SHA256
    from modelkit.artifacts import check_manifest

    d = default_model_dir()
    why = check_manifest(d, {"format": FORMAT, "gguf_sha256": GGUF_SHA256})
    if why is not None:
        pytest.skip(f"SmolLM2 not prepared at {d} ({why}): `modelkit prepare`, or carry the GPU pack")
    return d


def copy_tokenizer(src: Path, dst: Path) -> None:
    """SmolLM2's tokenizer files next to a random model of its vocabulary (vLLM loads one)."""
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (src / name).is_file():
            (dst / name).write_bytes((src / name).read_bytes())
    cfg = json.loads((dst / "config.json").read_text())
    assert cfg["vocab_size"] == json.loads((src / "config.json").read_text())["vocab_size"]
