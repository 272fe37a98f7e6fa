"""benchmarks/lib/model_shapes.py: the weightless ~1B Llama directory (config + tokenizer files)."""

import json
import math

import pytest

from refengine.dummy_weights import _shapes
from refengine.model_config import load_model_spec

from benchmarks.lib import model_shapes as shapes


@pytest.fixture
def tokenizer_dir(tmp_path):
    """A stand-in for SmolLM2's directory: tokenizer files, its config, and a weight file."""
    src = tmp_path / "smollm2"
    src.mkdir()
    for name, text in (("tokenizer.json", '{"t": 1}'), ("tokenizer_config.json", '{"c": 1}'),
                       ("chat_template.jinja", "{{ x }}"), ("generation_config.json", '{"eos_token_id": 2}'),
                       ("config.json", json.dumps({"vocab_size": 49152, "hidden_size": 576})),
                       ("model.safetensors", "weights")):
        (src / name).write_text(text)
    return src


def test_1b_directory_has_the_shape_and_no_weights(tokenizer_dir, tmp_path):
    d = shapes.llama_1b_dir(tokenizer_dir, tmp_path / "models")
    assert d == tmp_path / "models" / "llama-1b-shape"
    assert sorted(p.name for p in d.iterdir()) == ["chat_template.jinja", "config.json", "generation_config.json",
                                                   "tokenizer.json", "tokenizer_config.json"]
    assert (d / "tokenizer.json").read_text() == '{"t": 1}'
    spec = load_model_spec(d)
    assert (spec.hidden_size, spec.num_layers, spec.num_heads, spec.num_kv_heads) == (2048, 16, 32, 8)
    assert spec.head_dim == 64
    assert (spec.intermediate_size, spec.vocab_size, spec.tie_word_embeddings) == (8192, 49152, True)
    assert spec.rope_theta == 100000.0 and spec.max_position_embeddings >= 2048 and spec.model_type == "llama"
    # parameters from the spec: tied embedding + per layer (q, k, v, o, gate/up/down, two norms) + final norm
    H, I, L, V = 2048, 8192, 16, 49152
    q, kv = 32 * 64, 8 * 64
    expected = V * H + L * (H * q + 2 * H * kv + q * H + 3 * H * I + 2 * H) + H
    assert expected == 1_073_809_408
    assert sum(math.prod(s) for s in _shapes(spec).values()) == expected      # what --load-format dummy draws


def test_1b_directory_is_idempotent(tokenizer_dir, tmp_path):
    d = shapes.llama_1b_dir(tokenizer_dir, tmp_path)
    before = (d / "config.json").stat().st_mtime_ns, (d / "config.json").read_bytes()
    (d / "chat_template.jinja").unlink()
    assert shapes.llama_1b_dir(tokenizer_dir, tmp_path) == d
    assert ((d / "config.json").stat().st_mtime_ns, (d / "config.json").read_bytes()) == before
    assert (d / "chat_template.jinja").read_text() == "{{ x }}"              # a missing tokenizer file comes back


def test_1b_directory_refuses_a_different_config(tokenizer_dir, tmp_path):
    d = tmp_path / "llama-1b-shape"
    d.mkdir()
    other = json.dumps({**shapes.LLAMA_1B, "num_hidden_layers": 8})
    (d / "config.json").write_text(other)
    with pytest.raises(ValueError, match="not the 1B Llama shape"):
        shapes.llama_1b_dir(tokenizer_dir, tmp_path)
    assert (d / "config.json").read_text() == other and not (d / "tokenizer.json").exists()


def test_1b_directory_refuses_another_vocabulary_or_no_tokenizer(tokenizer_dir, tmp_path):
    (tokenizer_dir / "config.json").write_text(json.dumps({"vocab_size": 32000}))
    with pytest.raises(ValueError, match="vocab_size 32000"):
        shapes.llama_1b_dir(tokenizer_dir, tmp_path / "a")
    (tokenizer_dir / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match="no tokenizer.json"):
        shapes.llama_1b_dir(tokenizer_dir, tmp_path / "b")


def test_1b_directory_default_root_is_the_model_cache(tokenizer_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("SWIFTSERVE_CACHE", str(tmp_path / "cache"))
    assert shapes.llama_1b_dir(tokenizer_dir) == tmp_path / "cache" / "models" / "llama-1b-shape"
