"""SwiftKV checkpoint format: the names, shapes and config fields of Snowflake's published
checkpoints (e.g. Snowflake/Llama-3.1-SwiftKV-8B-Instruct: l=16 of 32, g=1), built here on a
tiny random Llama with the same proportions, loaded by the engine and round-tripped."""

import json

import pytest
import torch
from safetensors.torch import save_file

from modelkit.swiftkv import init_swiftkv_tensors, load_swiftkv_tensors, write_swiftkv_checkpoint
from refengine.swiftkv_format import tensor_names as swiftkv_tensor_names
from refengine.config import EngineConfig
from refengine.engine import LLMEngine
from refengine.model_config import load_model_spec
from refengine.sampling_params import SamplingParams

# Llama-3.1-8B proportions, shrunk: 32 layers, 32 query heads, 8 KV heads, head_dim 8.
CFG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
       "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 300,
       "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 512, "tie_word_embeddings": False,
       "bos_token_id": 1, "eos_token_id": 2,
       "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 128, "rope_type": "llama3"}}


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    H, I, L, hd = 256, 512, 32, 8
    t = {"model.embed_tokens.weight": torch.randn(300, H) * 0.02, "model.norm.weight": torch.ones(H),
         "lm_head.weight": torch.randn(300, H) * 0.02}
    for i in range(L):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": torch.ones(H), p + "post_attention_layernorm.weight": torch.ones(H),
                  p + "self_attn.q_proj.weight": torch.randn(32 * hd, H) * 0.05,
                  p + "self_attn.k_proj.weight": torch.randn(8 * hd, H) * 0.05,
                  p + "self_attn.v_proj.weight": torch.randn(8 * hd, H) * 0.05,
                  p + "self_attn.o_proj.weight": torch.randn(H, 32 * hd) * 0.05,
                  p + "mlp.gate_proj.weight": torch.randn(I, H) * 0.05, p + "mlp.up_proj.weight": torch.randn(I, H) * 0.05,
                  p + "mlp.down_proj.weight": torch.randn(H, I) * 0.05})
    save_file(t, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(CFG))
    return d


@pytest.mark.parametrize("g", [1, 2, 4])
def test_snowflake_names_shapes_and_config(tiny_llama, tmp_path, g):
    out = write_swiftkv_checkpoint(tiny_llama, tmp_path / "skv", 16, g)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaSwiftKVForCausalLM"] and cfg["model_type"] == "llama_swiftkv"
    assert cfg["swiftkv"] is True and cfg["num_key_value_layers"] == 16 and cfg["key_value_group_size"] == g
    tensors = load_swiftkv_tensors(out)
    assert set(tensors) == set(swiftkv_tensor_names(32, 16, g))
    assert tensors["model.norm_swiftkv.weight"].shape == (256,)
    for i in range(16, 32):
        assert tensors[f"model.layers.{i}.self_attn.q_proj_swiftkv.weight"].shape == (256, 256)
        has_kv = (i - 16) % g == 0
        assert (f"model.layers.{i}.self_attn.k_proj_swiftkv.weight" in tensors) == has_kv
        if has_kv:
            assert tensors[f"model.layers.{i}.self_attn.v_proj_swiftkv.weight"].shape == (64, 256)
    # Original q/k/v stay in the checkpoint; the index maps every name to a file.
    index = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    assert "model.layers.20.self_attn.k_proj.weight" in index and "model.norm_swiftkv.weight" in index
    spec = load_model_spec(out)
    assert spec.swiftkv and spec.num_key_value_layers == 16 and spec.key_value_group_size == g
    eng = LLMEngine(EngineConfig(model=str(out), max_model_len=64, num_kv_blocks=16))
    assert len(eng.runner.kv.slots) == 16 + -(-16 // g)
    assert len(eng.generate([[1, 5, 7, 9]], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))[0]) == 4


def test_initialisation_follows_the_papers(tiny_llama, tmp_path):
    from refengine.weights import WeightSource

    w = WeightSource(tiny_llama)
    t = init_swiftkv_tensors(lambda n: w.get(n), 32, 16, 2)
    assert torch.equal(t["model.norm_swiftkv.weight"], w.get("model.layers.16.input_layernorm.weight"))
    assert torch.equal(t["model.layers.17.self_attn.q_proj_swiftkv.weight"], w.get("model.layers.17.self_attn.q_proj.weight"))
    mean = (w.get("model.layers.18.self_attn.k_proj.weight") + w.get("model.layers.19.self_attn.k_proj.weight")) / 2
    assert torch.allclose(t["model.layers.18.self_attn.k_proj_swiftkv.weight"], mean)


def test_trained_tensors_override_and_bad_inputs(tiny_llama, tmp_path):
    name = "model.layers.20.self_attn.q_proj_swiftkv.weight"
    trained = {name: torch.full((256, 256), 0.5)}
    out = write_swiftkv_checkpoint(tiny_llama, tmp_path / "a", 16, 1, trained)
    assert torch.equal(load_swiftkv_tensors(out)[name], trained[name])
    with pytest.raises(ValueError, match="shape"):
        write_swiftkv_checkpoint(tiny_llama, tmp_path / "b", 16, 1, {name: torch.zeros(3, 3)})
    with pytest.raises(ValueError, match="num_key_value_layers"):
        write_swiftkv_checkpoint(tiny_llama, tmp_path / "c", 32, 1)
    with pytest.raises(ValueError, match="already a SwiftKV"):
        write_swiftkv_checkpoint(out, tmp_path / "d", 16, 1)
