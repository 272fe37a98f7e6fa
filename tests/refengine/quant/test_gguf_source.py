"""``GGUFWeights`` on tiny random GGUF files written as llama.cpp's converter writes them: HF names,
Q/K rows un-permuted, blocks kept as stored (``get_quant``) and dequantized on ``get``, the
fallback for tensors the file lacks, refusals that name the problem; and the engine serving the
file (``load_format="gguf"``) next to the same weights dequantized into safetensors."""

import json
import shutil

import pytest
import torch

from refengine.config import EngineConfig
from refengine.engine import LLMEngine
from refengine.model_config import load_model_spec
from refengine.quant import find_gguf
from refengine.quant.gguf_source import GGUFWeights
from refengine.quant.qlinear import GGUFLinear
from refengine.sampling_params import SamplingParams
from refengine.weights import WeightSource
from tests.refengine.quant.quant_support import write_tiny_llama

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-gguf")
    return d, write_tiny_llama(d, "Q4_K", v_type="Q6_K")


def test_names_unpermuted_blocks_kept(tiny):
    d, ref = tiny
    w = GGUFWeights(find_gguf(d))
    assert w.arch == "llama" and set(ref) <= set(w.names())
    for name, t in ref.items():
        assert torch.equal(w.get(name), t), name                     # Q/K back in HF order, exact
    q = w.get_quant("model.layers.1.self_attn.v_proj.weight")
    assert q.qtype == "Q6_K" and q.shape == (128, 256)
    assert w.get_quant("model.layers.0.self_attn.q_proj.weight").qtype == "Q4_K"
    assert w.get_quant("model.norm.weight") is None and w.stored_dense("model.norm.weight")
    w.check(load_model_spec(d))


def test_fallback_and_refusals(tiny, tmp_path):
    d, _ = tiny
    w = GGUFWeights(find_gguf(d), WeightSource(d))
    assert "model.layers.0.mlp.up_proj.weight" in w
    with pytest.raises(KeyError):
        w.get("model.layers.0.self_attn.q_proj_swiftkv.weight")
    other = tmp_path / "other"
    other.mkdir()
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_hidden_layers"] = 4
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="block_count = 3"):
        GGUFWeights(find_gguf(d)).check(load_model_spec(other))
    with pytest.raises(FileNotFoundError, match="exactly one"):
        find_gguf(other)
    shutil.copy(find_gguf(d), other / "a.gguf")
    shutil.copy(find_gguf(d), other / "b.gguf")
    with pytest.raises(FileNotFoundError, match="a.gguf, b.gguf"):
        find_gguf(other)


def test_engine_serves_the_file_close_to_its_dequantized_weights(tiny):
    """Same weights two ways: GGUF blocks + int8 activations vs the dequantized float32 copy."""
    d, _ = tiny
    kw = dict(model=str(d), dtype="float32", max_model_len=256, kv_cache_memory_gb=0.05, seed=0)
    prompt = list(range(3, 40))
    dense = LLMEngine(EngineConfig(**kw))
    ref = dense.score([(prompt[:4], prompt[4:])], want_dist=True)[0]
    quant = LLMEngine(EngineConfig(load_format="gguf", **kw))
    layer = quant.runner.model.layers[0]
    assert isinstance(layer.qkv_proj, GGUFLinear) and layer.qkv_proj.formats == ["Q4_K", "Q6_K"]
    assert isinstance(quant.runner.model.lm_head, GGUFLinear)         # tied: the embedding's blocks
    got = quant.score([(prompt[:4], prompt[4:])], want_dist=True)[0]
    diffs = [abs(a[0] - b[0]) for a, b in zip(ref, got)]           # log-prob of each true token
    # int8 activations (per 32 values) on a random model: ~0.04 nats on average here; a wrong row
    # order or scale would be whole nats
    assert sum(diffs) / len(diffs) < 0.1 and max(diffs) < 0.3, diffs
    p = SamplingParams(temperature=0.0, max_tokens=12)
    alone = quant.generate([prompt], p)[0]
    batched = quant.generate([prompt, prompt[5:], prompt[::-1]], p)[0]
    assert alone == batched                                            # batch-invariant kernels


def test_q5_0_file_is_read_and_served(tmp_path):
    """Q5_0 (what a Q4_K_M file of a model whose rows are not a multiple of 256 values falls back to,
    e.g. Gemma 3 270M's q/k/gate/up) with a Q6_K v: blocks kept, read back exactly, served close to
    the dequantized weights."""
    ref = write_tiny_llama(tmp_path, "Q5_0", seed=1, v_type="Q6_K")
    w = GGUFWeights(find_gguf(tmp_path))
    q = w.get_quant("model.layers.0.self_attn.q_proj.weight")
    assert q.qtype == "Q5_0" and q.shape == (256, 256)
    for name, t in ref.items():
        assert torch.equal(w.get(name), t), name
    kw = dict(model=str(tmp_path), dtype="float32", max_model_len=256, kv_cache_memory_gb=0.05, seed=0)
    prompt = list(range(3, 40))
    want = LLMEngine(EngineConfig(**kw)).score([(prompt[:4], prompt[4:])], want_dist=True)[0]
    quant = LLMEngine(EngineConfig(load_format="gguf", **kw))
    assert quant.runner.model.layers[0].qkv_proj.formats == ["Q5_0", "Q6_K"]
    got = quant.score([(prompt[:4], prompt[4:])], want_dist=True)[0]
    diffs = [abs(a[0] - b[0]) for a, b in zip(want, got)]
    assert sum(diffs) / len(diffs) < 0.1 and max(diffs) < 0.3, diffs
