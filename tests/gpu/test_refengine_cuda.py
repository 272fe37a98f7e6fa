"""The reference engine on CUDA against the same engine on CPU (float32, torch ops) and against
transformers: greedy tokens (a divergence must sit on a near-tie of the reference) and
teacher-forced distributions read through the KV cache, for the dense model, SwiftKV and
AcrossKV, the FP8 KV cache, KCache's pinned host V pool, bf16, and concurrent requests. Decode
steps run from CUDA graphs (refengine.graph_decode) wherever the engine captures them (every case
here but KCache's), and against the eager engine in test_cuda_graph_decode_equals_eager."""

import pytest
import torch
from gpu_support import (SMALL, assert_greedy_matches, dist_rows, greedy, make_engine, max_abs, mean_kl,
                         needs_cuda, prepared_smollm2, prompts, random_llama)

pytestmark = [pytest.mark.gpu, needs_cuda]

TIE = 1e-3            # float32 log-prob gap below which two devices may pick either token
ROWS_ATOL = 2e-3      # float32 log-probs, CUDA vs CPU


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return random_llama(tmp_path_factory.mktemp("random-llama") / "m")


@pytest.fixture(scope="module")
def cpu_ref(model):
    P = prompts(SMALL["vocab_size"])
    eng = make_engine(model, "cpu")
    toks = greedy(eng, P)
    return P, toks, dist_rows(eng, P, toks)


def _parity(model, ref, **kw):
    P, toks, rows = ref
    eng = make_engine(model, "cuda", **kw)
    assert_greedy_matches(toks, rows, greedy(eng, P, len(toks[0])), TIE)
    got = dist_rows(eng, P, toks)
    assert max_abs(rows, got) < ROWS_ATOL
    return eng, got


@pytest.mark.parametrize("kw", [{}, {"max_num_batched_tokens": 64, "block_size": 8}, {"max_num_seqs": 1}],
                         ids=["batched", "chunked", "serial"])
def test_cuda_equals_cpu(model, cpu_ref, kw):
    eng, _ = _parity(model, cpu_ref, **kw)
    assert eng.runner.device.type == "cuda" and eng.runner.dtype == torch.float32


@pytest.mark.parametrize("kw", [{}, {"max_num_seqs": 3}], ids=["batched", "padded"])
def test_cuda_graph_decode_equals_eager(model, cpu_ref, kw):
    """refengine.graph_decode: decode steps captured (per batch size and table width) and replayed give
    the CPU's greedy tokens, and the eager CUDA engine's (--enforce-eager) exactly."""
    P, toks, _ = cpu_ref
    eng, _ = _parity(model, cpu_ref, **kw)
    graphs = eng.runner.graphs
    assert graphs is not None and graphs.graphs and graphs.replays > 0
    eager = make_engine(model, "cuda", cuda_graphs=False, **kw)
    assert eager.runner.graphs is None
    assert greedy(eager, P, len(toks[0])) == greedy(eng, P, len(toks[0]))


@pytest.mark.parametrize("g", [1, 2])
def test_swiftkv_cuda_equals_cpu(model, tmp_path, g):
    from modelkit.swiftkv import write_swiftkv_checkpoint

    ckpt = write_swiftkv_checkpoint(model, tmp_path / "skv", SMALL["num_hidden_layers"] // 2, g)
    P = prompts(SMALL["vocab_size"], seed=1)
    cpu = make_engine(ckpt, "cpu")
    toks = greedy(cpu, P)
    eng, _ = _parity(ckpt, (P, toks, dist_rows(cpu, P, toks)), max_num_batched_tokens=64)
    l, L = SMALL["num_hidden_layers"] // 2, SMALL["num_hidden_layers"]
    assert len(eng.runner.kv.slots) == l + (L - l) // g               # AcrossKV: one cache per group
    assert eng.runner.graphs.replays > 0                               # SwiftKV's tail inside the graph


def test_fp8_kv_cache_on_cuda(model, cpu_ref):
    P, toks, rows32 = cpu_ref
    cpu8 = make_engine(model, "cpu", kv_cache_dtype="fp8_e4m3")
    eng8 = make_engine(model, "cuda", kv_cache_dtype="fp8_e4m3")
    ref8, got8 = dist_rows(cpu8, P, toks), dist_rows(eng8, P, toks)
    assert mean_kl(ref8, got8) < 1e-3                       # the same quantisation on both devices
    assert mean_kl(rows32, got8) < 0.05                     # a quantised cache, not a broken one (CPU: 0.0065)
    dense = make_engine(model, "cuda")
    assert eng8.runner.kv.bytes_per_token * 3 < dense.runner.kv.bytes_per_token   # 64 + 4 vs 256 bytes a head


def test_kcache_keeps_v_in_pinned_host_memory(model, cpu_ref):
    P, toks, rows = cpu_ref
    eng, _ = _parity(model, cpu_ref, kv_methods={"kcache": {"top_n": 4096, "device_layers": 1}})  # nothing dropped
    assert [s.group.v_on_host for s in eng.runner.kv.slots] == [False] + [True] * (SMALL["num_hidden_layers"] - 1)
    host = [p.v.data for s in eng.runner.kv.slots[1:] for p in s.parts]
    assert host and all(t.device.type == "cpu" and t.is_pinned() for t in host)
    assert eng.runner.kv.host_bytes_total > 0
    lossy = make_engine(model, "cuda", kv_methods={"kcache": {"top_n": 8, "device_layers": 1}})
    got = dist_rows(lossy, P, toks)
    assert lossy.runner.kv_methods[0].counters["kcache_v_rows_fetched"] > 0
    assert mean_kl(rows, got) < 1.0 and max_abs(rows, got) > 0


def test_bf16_on_cuda_tracks_float32(model, cpu_ref):
    P, toks, rows = cpu_ref
    eng = make_engine(model, "cuda", dtype="bfloat16")
    assert eng.runner.dtype == torch.bfloat16
    got = dist_rows(eng, P, toks)
    agree = float((torch.cat(rows).argmax(-1) == torch.cat(got).argmax(-1)).float().mean())
    assert agree >= 0.9 and mean_kl(rows, got) < 5e-3          # CPU bf16: 0.98 and 0.0004


def test_smollm2_greedy_on_cuda_matches_transformers():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = prepared_smollm2()
    tok = AutoTokenizer.from_pretrained(d)
    P = [tok(t)["input_ids"] for t in ("The capital of France is", "def fibonacci(n):\n",
                                       "Once upon a time, in a small village,")]
    hf = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).cuda()
    ref, rows = [], []
    with torch.no_grad():
        for p in P:
            out = hf.generate(torch.tensor([p], device="cuda"), attention_mask=torch.ones(1, len(p), device="cuda",
                              dtype=torch.long), max_new_tokens=32, do_sample=False, eos_token_id=None,
                              pad_token_id=0, output_scores=True, return_dict_in_generate=True)
            ref.append(out.sequences[0, len(p):].tolist())
            rows.append(torch.log_softmax(torch.cat(out.scores).float(), -1).cpu())
    del hf
    eng = make_engine(d, "cuda", max_model_len=1024)
    assert_greedy_matches(ref, rows, greedy(eng, P, 32), TIE)


def test_shipped_swiftkv_on_cuda_equals_cpu():
    from modelkit import shipped
    from modelkit.models import resolve_model

    prepared_smollm2()
    name = "SmolLM2-135M-Instruct-SwiftKV-AcrossKV2"
    if name not in shipped.names():        # a GPU session's pack carries it; SWIFTSERVE_CHECKPOINTS says where
        pytest.skip(f"{shipped.VARIANTS[name][0]} is in none of {[str(d) for d in shipped.checkpoint_dirs()]} "
                    "(parked: `make gpu-unpark`; or carry it with `make gpu-pack`)")
    ckpt = resolve_model(name)
    P = prompts(49152, lengths=(12, 200), seed=2)
    cpu = make_engine(ckpt, "cpu")
    toks = greedy(cpu, P, 16)
    _parity(ckpt, (P, toks, dist_rows(cpu, P, toks)))
