"""The cases of test_triton_decode.py, run as a script so that TRITON_INTERPRET=1 is set before triton is
imported (its language functions are decorated at import: set later, they refuse to run on CPU).

    python tests/refengine/triton_cases.py kernel|self_check|engine [MODEL_DIR]

Exits non-zero (an AssertionError's traceback) when a case fails."""

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from engine_support import logprobs, run_with_arrival, tokens  # noqa: E402

from refengine import triton_decode as td  # noqa: E402


def kernel() -> None:
    """The kernel against a float32 gather-and-softmax reference, the reference against SDPA."""
    for dtype in (torch.float32, torch.bfloat16):
        for g, dk, dv, kvh in ((3, 64, 64, 3), (4, 40, 24, 2), (1, 128, 128, 1), (8, 32, 48, 1)):
            gen = torch.Generator().manual_seed(g * dk + dv)
            N, bs, B = 20, 16, 4
            k = torch.randn(N, bs, kvh, dk, generator=gen).to(dtype)
            v = torch.randn(N, bs, kvh, dv, generator=gen).to(dtype)
            q = torch.randn(B, kvh, g, dk, generator=gen).to(dtype)
            table = torch.randperm(N, generator=gen)[:B * 5].view(B, 5)
            lens = torch.tensor([1, 17, 80, 33])
            atol = 1e-5 if dtype == torch.float32 else 1e-2
            for starts in (None, torch.tensor([0, 5, 40, 32])):    # a window's first entry: mid-block, on a boundary
                got = td.TritonDecodeKernel()(q, k, v, table, lens, 0.1, starts)
                want = td.reference(q, k, v, table, lens, 0.1, starts)
                assert got.dtype == dtype and got.shape == (B, kvh, g, dv)
                assert torch.allclose(got.float(), want.float(), atol=atol), (dtype, g, dk, dv, starts)
            kk = k[table].flatten(1, 2).float()                     # [B, 5 * bs, kvh, dk]
            vv = v[table].flatten(1, 2).float()
            mask = (torch.arange(5 * bs)[None, :] < lens[:, None])[:, None, None, :]
            sdpa = torch.nn.functional.scaled_dot_product_attention(
                q.float(), kk.transpose(1, 2), vv.transpose(1, 2), attn_mask=mask, scale=0.1)
            assert torch.allclose(td.reference(q, k, v, table, lens, 0.1).float(), sdpa, atol=atol)


def self_check() -> None:
    assert td.self_check(torch.device("cpu")) is None
    assert isinstance(td.resolve(torch.device("cpu")), td.TritonDecodeKernel)
    td.reference = lambda *a: torch.zeros(2, 2, 3, 48)
    assert "differs from the reference" in td.self_check(torch.device("cpu"))
    assert td.resolve(torch.device("cpu")) is None


def engine(model_dir: str) -> None:
    """What a CUDA engine runs: the static padded step (graph_decode, eagerly here) with this kernel,
    against the C++ kernel's ordinary steps: the same greedy tokens, log-probs within 1e-4."""
    from refengine import graph_decode
    from refengine.attention_backend import AttentionBackend
    from refengine.config import EngineConfig
    from refengine.engine import LLMEngine
    from refengine.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=1)
    prompts = [[1, 2, 3, 400 + i] * (4 + 9 * i) for i in range(3)]
    cfg = dict(model=model_dir, max_model_len=256, num_kv_blocks=64, dtype="float32")
    ref = run_with_arrival(LLMEngine(EngineConfig(**cfg)), prompts, params)

    eligible, graph_decode.eligible = graph_decode.eligible, lambda *a: None
    eng = LLMEngine(EngineConfig(**cfg))
    graph_decode.eligible = eligible
    calls = []

    class Counted(td.TritonDecodeKernel):
        def __call__(self, *a):
            calls.append(1)
            return super().__call__(*a)

    kernel, runner = Counted(), eng.runner
    runner.attn_backend = AttentionBackend(kernel, runner.attn_backend.prefill_kernel)
    runner.graphs.decode_kernel = kernel
    runner.model._stack_kv, runner.model._stack = runner.kv, None     # the C++ layer loop calls only the C++ kernel
    got = run_with_arrival(eng, prompts, params)
    assert calls and runner.graphs.replays > 0
    assert tokens(got) == tokens(ref)
    lp, lp_ref = torch.tensor(logprobs(got)), torch.tensor(logprobs(ref))
    assert torch.allclose(lp, lp_ref, atol=1e-4), float((lp - lp_ref).abs().max())


if __name__ == "__main__":
    {"kernel": kernel, "self_check": self_check, "engine": engine}[sys.argv[1]](*sys.argv[2:])
    print("ok")
