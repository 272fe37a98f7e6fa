"""The vLLM plugin's pure parts (no vLLM needed): checkpoint layout, ZACK rank policy,
KV bytes per token, the supported-version check, and the ZACK weight folding algebra."""

import json

import pytest
import torch

from swiftserve_vllm import version
from swiftserve_vllm.layout import LayoutError, parse_layout
from swiftserve_vllm.zack import fold_o, fold_v, rotate

BASE = {"num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "hidden_size": 576,
        "head_dim": 64}


def _zack(rank_rows, mode="uniform"):
    return {"format_version": 1, "rotations": "zack.safetensors", "mode": mode, "rate": 0.5,
            "k_ranks": rank_rows, "v_ranks": rank_rows}


def test_swiftkv_acrosskv_layout_and_bytes():
    lay = parse_layout(dict(BASE, swiftkv=True, num_key_value_layers=15, key_value_group_size=2))
    assert lay.group_leaders == [15, 17, 19, 21, 23, 25, 27, 29]
    assert [lay.leader_of(i) for i in (14, 15, 16, 17, 29)] == [14, 15, 15, 17, 29]
    assert lay.num_cache_owners == 23                      # 15 + ceil(15 / 2)
    assert lay.kv_bytes_per_token(4) == 35328 and lay.baseline_kv_bytes_per_token(4) == 46080
    g1 = parse_layout(dict(BASE, swiftkv=True, num_key_value_layers=15, key_value_group_size=1))
    assert g1.num_cache_owners == 30 and g1.kv_bytes_per_token(4) == 46080
    off = parse_layout(dict(BASE, swiftkv=True, num_key_value_layers=15, key_value_group_size=2), use_swiftkv=False)
    assert not off.swiftkv and off.num_cache_owners == 30 and off.leader_of(20) == 20


def test_zack_uniform_rank_halves_the_cache_and_adaptive_is_refused():
    lay = parse_layout(dict(BASE, zack=_zack([[32] * 3] * 30)))
    assert lay.zack_rank == 32 and lay.kv_head_size == 32
    assert lay.kv_bytes_per_token(4) * 2 == lay.baseline_kv_bytes_per_token(4)
    rows = [[32] * 3] * 29 + [[48, 32, 32]]
    with pytest.raises(LayoutError, match="per-head adaptive ranks.*reference engine"):
        parse_layout(dict(BASE, zack=_zack(rows, "adaptive")))
    with pytest.raises(LayoutError, match="format_version"):
        parse_layout(dict(BASE, zack=dict(_zack([[32] * 3] * 30), format_version=2)))
    with pytest.raises(LayoutError, match="k_ranks"):
        parse_layout(dict(BASE, zack=_zack([[32] * 3] * 29)))


def test_version_policy():
    assert version.check_version("0.32.0") == "0.32.0"
    assert version.check_version("0.32.3+cpu") == "0.32.3+cpu"
    for bad in ("0.31.9", "0.33.0", "1.0.0"):
        with pytest.raises(version.UnsupportedVLLMVersion, match=r"supports vllm>=0.32.0,<0.33.0"):
            version.check_version(bad)


def test_zack_folding_equals_rotating_v_and_unrotating_the_output():
    torch.manual_seed(0)
    kvh, per_kv, d, r, hidden, T = 3, 3, 8, 5, 12, 4
    rvo = torch.linalg.qr(torch.randn(kvh, d, d))[0][:, :, :r]
    wv, bv = torch.randn(kvh * d, hidden), torch.randn(kvh * d)
    wo = torch.randn(hidden, kvh * per_kv * d)
    x = torch.randn(T, hidden)
    v = (x @ wv.T + bv).view(T, kvh, d)
    v_rot = torch.einsum("tkd,kdr->tkr", v, rvo)
    assert torch.allclose(x @ fold_v(wv, rvo).T + fold_v(bv, rvo), v_rot.reshape(T, -1), atol=1e-5)
    a = torch.randn(T, kvh, per_kv, r)                       # attention output in rotated space
    full = torch.einsum("tkgr,kdr->tkgd", a, rvo).reshape(T, -1) @ wo.T
    assert torch.allclose(a.reshape(T, -1) @ fold_o(wo, rvo, kvh * per_kv).T, full, atol=1e-4)
    rqk = torch.linalg.qr(torch.randn(kvh, d, d))[0]
    q, k = torch.randn(T, kvh * per_kv * d), torch.randn(T, kvh * d)
    s_full = torch.einsum("tkgd,ukd->kgtu", q.view(T, kvh, per_kv, d), k.view(T, kvh, d))
    s_rot = torch.einsum("tkgd,ukd->kgtu", rotate(q, rqk).view(T, kvh, per_kv, d), rotate(k, rqk).view(T, kvh, d))
    assert torch.allclose(s_full, s_rot, atol=1e-4)          # full rank: scores are rotation-invariant


def test_worker_settings_cpu_defaults_and_model_routing(tmp_path, monkeypatch):
    from refengine.config import EngineConfig
    from worker.backends.vllm_settings import build_settings
    from worker.config import WorkerConfig

    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    d = tmp_path / "m"
    d.mkdir()
    cfg = dict(BASE, swiftkv=True, num_key_value_layers=15, key_value_group_size=2, max_position_embeddings=8192)
    (d / "config.json").write_text(json.dumps(cfg))
    wc = WorkerConfig(EngineConfig(model=str(d), kv_cache_memory_gb=0.25), engine="vllm")
    s = build_settings(wc, "cpu")
    k = s.engine_kwargs
    assert k["dtype"] == "float32" and k["enforce_eager"] and k["kv_sharing_fast_prefill"]
    assert k["kv_cache_memory_bytes"] == 2 ** 28 and k["max_model_len"] == 8192 and "hf_overrides" not in k
    assert "-" in s.env["VLLM_CPU_OMP_THREADS_BIND"] or "," in s.env["VLLM_CPU_OMP_THREADS_BIND"] \
        or s.env["VLLM_CPU_OMP_THREADS_BIND"].isdigit()
    gpu = build_settings(wc, "cuda")
    assert gpu.engine_kwargs["dtype"] == "auto" and gpu.env == {} and "kv_cache_memory_bytes" not in gpu.engine_kwargs
    assert gpu.engine_kwargs["enforce_eager"]             # SwiftKV's tail is not CUDA-graph safe
    off = build_settings(WorkerConfig(EngineConfig(model=str(d), swiftkv=False), engine="vllm"), "cpu")
    assert off.engine_kwargs["hf_overrides"] == {"swiftkv": False} and "kv_sharing_fast_prefill" not in off.engine_kwargs
    off_gpu = build_settings(WorkerConfig(EngineConfig(model=str(d), swiftkv=False), engine="vllm"), "cuda")
    assert not off_gpu.engine_kwargs["enforce_eager"]
    (d / "config.json").write_text(json.dumps(dict(BASE, zack=_zack([[32] * 3] * 30))))
    z = build_settings(WorkerConfig(EngineConfig(model=str(d)), engine="vllm"), "cpu")
    assert z.engine_kwargs["hf_overrides"] == {"architectures": ["SwiftServeLlamaForCausalLM"]}
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    assert "kv_cache_memory_bytes" not in build_settings(wc, "cpu").engine_kwargs
