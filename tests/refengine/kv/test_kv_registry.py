"""--kv-methods parsing into the typed value, the one validation before weights load,
composition rules (no torch)."""

import json

import pytest

from refengine.kv import registry
from refengine.kv.base import KVMethod, MethodError
from refengine.kv.spec import ModelFacts

FACTS = ModelFacts("/nonexistent", 30, 9, 3, 64, 4, None, 1)


@pytest.mark.parametrize("config, words", [
    ({"bogus": {}}, ["unknown KV method 'bogus'", "zack", "fp8"]),
    ({"zack": {"rate": 1.5}}, ["zack.rate", "less than 1"]),
    ({"zack": {"rate": "0.5"}}, ["zack.rate", "'0.5'"]),
    ({"zack": {"rate": 0.5, "ratee": 1}}, ["zack.ratee", "Extra inputs"]),
    ({"zack": {"mode": "fancy"}}, ["zack.mode"]),
    ({"zack": [0.5]}, ["zack: options must be a JSON object"]),
    ({"fp8": {"bits": 4}}, ["fp8.bits"]),
])
def test_bad_values_are_refused_with_the_reason(config, words):
    with pytest.raises(MethodError) as exc:
        registry.KVMethods.parse(config)
    for w in words:
        assert w in str(exc.value)


def test_two_codecs_cannot_combine(monkeypatch):
    class OtherCodec(KVMethod):
        name, role, summary = "other", "codec", "a second codec"

    monkeypatch.setitem(registry.METHODS, "other", OtherCodec)
    with pytest.raises(MethodError, match="two KV codecs cannot be combined: other and fp8"):
        registry.compose({"other": {}}, FACTS, kv_cache_dtype="fp8_e4m3")
    # fp8 twice (flag and method) is one codec, not two
    assert [m.name for m in registry.compose({"fp8": {}}, FACTS, kv_cache_dtype="fp8_e4m3")] == ["fp8"]
    with pytest.raises(MethodError, match="contradicts"):
        registry.compose({"fp8": False}, FACTS, kv_cache_dtype="fp8_e4m3")


def test_role_order_dims_before_codec():
    ms = registry.compose({"fp8": True, "zack": {"rate": 0.5}}, FACTS)
    assert [m.name for m in ms] == ["zack", "fp8"]


def test_model_directory_turns_zack_on_and_false_turns_it_off(tmp_path):
    facts = ModelFacts(str(tmp_path), 30, 9, 3, 64, 4, None, 1, config={"zack": {"k_ranks": []}})
    assert [m.name for m in registry.compose({}, facts)] == ["zack"]
    assert registry.compose({"zack": False}, facts) == []


def test_zack_without_calibration_is_refused_before_loading(tmp_path):
    _llama_dir(tmp_path)
    reason = registry.check({"zack": {"rate": 0.5}}, tmp_path)
    assert "no ZACK calibration" in reason and "modelkit zack-calibrate" in reason
    assert registry.check({}, tmp_path) is None
    assert "unknown KV method" in registry.check({"kcache2": {}}, tmp_path)


def test_every_registered_method_documents_itself():
    for name, cls in registry.METHODS.items():
        assert cls.name == name and cls.role in ("dims", "codec", "placement", "eviction") and cls.summary
        assert cls.__module__.startswith("refengine.kv.methods.")
    assert "zack (dims)" in registry.describe()


def test_parsed_value_is_typed_immutable_and_reads_like_its_json():
    kv = registry.KVMethods.parse('{"zack": {"rate": 0.5}, "fp8": true, "kcache": false}')
    assert kv == {"zack": {"rate": 0.5}, "fp8": True, "kcache": False} and list(kv) == ["zack", "fp8", "kcache"]
    assert registry.KVMethods.parse(kv) is kv and registry.KVMethods.parse(kv.to_json()) == kv
    assert registry.KVMethods.parse(None) == {} and not registry.KVMethods()
    with pytest.raises(AttributeError):
        kv.given = ()
    for bad, words in (("{bad", "not valid JSON"), ("[1]", "must be a JSON object")):
        with pytest.raises(MethodError, match=words):
            registry.KVMethods.parse(bad)


def test_engine_config_parses_where_it_is_built():
    from refengine.config import EngineConfig

    assert EngineConfig(model="m", kv_methods={"fp8": {}}).kv_methods == {"fp8": {}}
    with pytest.raises(MethodError, match="unknown KV method"):
        EngineConfig(model="m", kv_methods={"bogus": {}})


def _llama_dir(path):
    (path / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
        "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152}))   # no weights at all
    return path


def test_one_check_takes_block_size_and_kv_dtype_from_the_engine_config(tmp_path):
    from refengine.config import EngineConfig

    model = str(_llama_dir(tmp_path))
    plan = registry.check_engine(EngineConfig(model=model, kv_methods={"zipcache": {}}))
    assert [m.name for m in plan.methods] == ["zipcache"] and plan.spec.block_size == 32     # ZipCache's default
    plan = registry.check_engine(EngineConfig(model=model, kv_methods={"zipcache": {}}, block_size=16))
    assert plan.spec.block_size == 16 and plan.methods[0].layout.block_size == 16          # an explicit size wins
    with pytest.raises(MethodError, match="block_size 512 > 256"):       # the block size reaches the check
        registry.check_engine(EngineConfig(model=model, kv_methods={"zipcache": {}}, block_size=512))
    with pytest.raises(MethodError, match="two KV codecs"):              # and so does the KV dtype
        registry.check_engine(EngineConfig(model=model, kv_methods={"zipcache": {}}, kv_cache_dtype="fp8_e4m3"))


def test_the_default_block_size_is_16_unless_a_method_prefers_another():
    from refengine.config import EngineConfig

    assert registry.default_block_size(None) == registry.DEFAULT_BLOCK_SIZE == 16
    assert registry.default_block_size({"kcache": {}}) == 16
    assert registry.default_block_size({"zipcache": {}}) == 32
    assert registry.default_block_size({"zipcache": False}) == 16                  # switched off: no preference
    assert EngineConfig(model="m").block_size == 16
    assert EngineConfig(model="m", kv_methods='{"zipcache": {}}').block_size == 32


def test_the_one_check_sees_swiftkv_on_or_off(tmp_path):
    from refengine.config import EngineConfig

    cfg = json.loads(_llama_dir(tmp_path).joinpath("config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "model_type": "llama_swiftkv", "swiftkv": True,
                                                      "num_key_value_layers": 10, "key_value_group_size": 20}))
    kcache = {"kcache": {"device_layers": 15}}      # SwiftKV: layers 10..29 share one slot, below 15
    with pytest.raises(MethodError, match="no cache slot has all its layers >= device_layers=15"):
        registry.check_engine(EngineConfig(model=str(tmp_path), kv_methods=kcache))
    plan = registry.check_engine(EngineConfig(model=str(tmp_path), kv_methods=kcache, swiftkv=False))
    assert plan.spec.num_slots == 30 and [m.name for m in plan.methods] == ["kcache"]
