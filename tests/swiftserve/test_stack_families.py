"""Qwen3 and Gemma 3 through the whole stack: ``swiftserve up`` (gateway + a reference-engine worker)
serving a tiny random-weights model of the family (built here, with SmolLM2's tokenizer files so
that text goes in and out). The gateway's greedy completion must be the text transformers
generates from the same weights and prompt, and a chat request must answer."""

import shutil

import httpx
import pytest
import torch
from benchmarks.lib.procs import free_port
from test_stack_e2e import start_stack, stop_stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.model]


def tiny(kind: str):
    import transformers as tf

    common = dict(vocab_size=49152, hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=1024,
                  bos_token_id=1, eos_token_id=2)
    if kind == "qwen3":
        return tf.Qwen3ForCausalLM(tf.Qwen3Config(**common))
    return tf.Gemma3ForCausalLM(tf.Gemma3TextConfig(**common, sliding_window=16, layer_types=[
        "sliding_attention", "full_attention", "sliding_attention"]))


@pytest.mark.parametrize("kind", ["qwen3", "gemma3"])
def test_family_serves_through_the_gateway(kind, smollm2_dir, tmp_path):
    from transformers import AutoTokenizer

    torch.manual_seed(0)
    hf = tiny(kind).eval()
    hf.save_pretrained(tmp_path / kind)
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (smollm2_dir / f).is_file():
            shutil.copy2(smollm2_dir / f, tmp_path / kind / f)
    tok = AutoTokenizer.from_pretrained(tmp_path / kind)
    prompt = "The capital of France is Paris. The capital of Germany is"
    ids = tok(prompt)["input_ids"]
    with torch.no_grad():
        want = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                           max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
    want_text = tok.decode(want[0, len(ids):])
    port, wport = free_port(), free_port()
    proc = start_stack(str(tmp_path / kind), port, wport, workers=1, name=kind)
    try:
        url = f"http://127.0.0.1:{port}"
        r = httpx.post(f"{url}/v1/completions", timeout=120, json={
            "model": kind, "prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == want_text
        r = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
            "model": kind, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] > 0, r.text
    finally:
        assert stop_stack(proc) == 0
