"""The C++ paged decode and prefill kernels (refengine/paged_kernel.py) against the gather + SDPA
path: same outputs over scattered blocks, ragged lengths, chunked prefills (a cached prefix), GQA
groups, K/V widths that differ (ZACK) and bf16 pools; option resolution; identical greedy tokens
in the engine on the real model."""

import shutil
from pathlib import Path

import pytest
import torch

from refengine.attention import build_attn_batch, slot_mapping
from refengine.config import EngineConfig
from refengine.engine import LLMEngine
from refengine.kv.cache import PartKV, paged_op
from refengine.kv.spec import HeadPart
from refengine.kv.storage import DenseStore, Fp8Store
from refengine.paged_kernel import build, resolve_decode_kernel, resolve_prefill_kernel
from refengine.sampling_params import SamplingParams

CPU = torch.device("cpu")
needs_compiler = pytest.mark.skipif(not shutil.which("c++"), reason="no C++ compiler to build the kernel")


@pytest.fixture(scope="module")
def kernel():
    return build()


def filled_part(store, kvh, d, dv, dtype, lengths, bs=4, blocks=40):
    """A part whose pool holds random K/V for each sequence in scattered blocks."""
    p = PartKV(HeadPart(tuple(range(kvh)), d, dv), store(blocks, bs, kvh, d, dtype, CPU),
               store(blocks, bs, kvh, dv, dtype, CPU))
    perm = torch.randperm(blocks).tolist()
    tables = []
    for n in lengths:
        need = -(-n // bs)
        table, perm = perm[:need], perm[need:]
        slots = slot_mapping([(0, n, table)], bs, CPU)
        p.k.write(slots, torch.randn(n, kvh, d))
        p.v.write(slots, torch.randn(n, kvh, dv))
        tables.append(table)
    return p, tables


@needs_compiler
@pytest.mark.parametrize("kvh,g,d,dv", [(3, 3, 64, 64), (2, 1, 8, 8), (1, 4, 16, 8), (4, 2, 32, 48), (1, 6, 16, 128),
                                         (2, 2, 24, 32)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lengths", [[23], [1, 4, 5, 17, 30, 2, 8, 9, 3, 12, 70]])
def test_kernel_matches_gather_sdpa(kernel, kvh, g, d, dv, dtype, lengths):
    """Both decode paths (d and dv multiples of 16: in place; else packed tiles, V padded to whole
    vectors), one sequence and many, one entry, a full block, ragged tails, more than one 64-key
    tile, query groups of more than 4 rows. Ragged ZACK widths: test_paged_kernel_ragged.py."""
    torch.manual_seed(0)
    p, tables = filled_part(DenseStore, kvh, d, dv, dtype, lengths, blocks=60)
    chunks = [(n - 1, 1, t) for n, t in zip(lengths, tables)]    # one decode query per sequence
    q = torch.randn(len(lengths), kvh * g, d, dtype=dtype)
    ref = paged_op(q, p, build_attn_batch(chunks, 4, CPU), 0.3)
    out = paged_op(q, p, build_attn_batch(chunks, 4, CPU, decode_kernel=kernel), 0.3)
    assert out.dtype == ref.dtype and out.shape == ref.shape == (len(lengths), kvh * g, dv)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(out.float(), ref.float(), atol=tol, rtol=tol)


@needs_compiler
@pytest.mark.parametrize("kvh,g,d,dv", [(3, 3, 64, 64), (1, 4, 16, 32), (2, 2, 32, 16), (8, 1, 128, 128)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_kernel_matches_gather_sdpa(kernel, kvh, g, d, dv, dtype):
    """Whole prompts and chunks after a cached prefix (causal offset), rows past one 48-row tile
    and one 64-key tile, several prefills plus a decode row in one step."""
    torch.manual_seed(2)
    lengths = [150, 230, 7, 40]
    p, tables = filled_part(DenseStore, kvh, d, dv, dtype, lengths, blocks=160)
    chunks = [(0, 150, tables[0]), (101, 129, tables[1]), (0, 7, tables[2]), (39, 1, tables[3])]
    q = torch.randn(sum(n for _, n, _ in chunks), kvh * g, d, dtype=dtype)
    ref = paged_op(q, p, build_attn_batch(chunks, 4, CPU), 0.2)
    batch = build_attn_batch(chunks, 4, CPU, prefill_kernel=kernel)
    assert batch.prefill_kernel is kernel
    out = paged_op(q, p, batch, 0.2)
    assert out.dtype == dtype and out.shape == ref.shape == (q.shape[0], kvh * g, dv)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(out.float(), ref.float(), atol=tol, rtol=tol)


@needs_compiler
@pytest.mark.parametrize("kvh,g,d,dv,window", [(3, 3, 64, 64, 0), (1, 4, 16, 40, 0), (2, 2, 128, 128, 0),
                                                (1, 2, 64, 64, 37), (1, 2, 24, 7, 0)])
def test_bf16_dot_prefill_tracks_the_float32_kernel(kernel, kvh, g, d, dv, window):
    """bf16 queries over bf16 pools (AVX-512-BF16 dot products where the CPU has them) against the
    float32 kernel on the same values: scores are exact bf16 products either way; only P is rounded
    to bf16 for P V, so the output moves by at most ~2^-8 of its scale (bound 4e-3 x max |out|)."""
    torch.manual_seed(7)
    bs, n, start = 16, 300, 45
    kp = torch.randn(40, bs, kvh, d).bfloat16()
    vp = torch.randn(40, bs, kvh, dv).bfloat16()
    blocks = torch.randperm(40)[:-(-(start + n) // bs)]
    q = torch.randn(n, kvh * g, d).bfloat16()
    got, want = torch.empty(n, kvh * g, dv), torch.empty(n, kvh * g, dv)
    kernel.prefill(q, kp, vp, blocks, start, 0.125, got, window)
    kernel.prefill(q.float(), kp, vp, blocks, start, 0.125, want, window)
    assert (got - want).abs().max() <= 4e-3 * want.abs().max()
    assert (got - want).abs().mean() <= 1e-3 * want.abs().max()


@needs_compiler
@pytest.mark.parametrize("kvh,g,d,dv,window", [(3, 3, 64, 64, 0), (2, 2, 128, 128, 0), (1, 4, 32, 48, 0),
                                                (1, 2, 64, 64, 37), (2, 1, 48, 32, 0), (1, 2, 24, 7, 0)])
@pytest.mark.parametrize("lengths", [[1, 17, 64, 300], [5] * 20])
def test_bf16_dot_decode_tracks_the_float32_query_path(kernel, kvh, g, d, dv, window, lengths):
    """bf16 queries over bf16 pools take decode_vec's dot-product path (d a multiple of 32, dv of 16,
    AVX-512-BF16; others widen q): q K^T are exact bf16 products summed in float32 either way, the
    rest of the kernel is shared, so it agrees with the float32-query path to float32 rounding
    (bound 1e-5 x max |out|); ragged lengths, windows, sequences split by KV head (few) or not (many)."""
    torch.manual_seed(3)
    bs = 16
    need = [-(-n // bs) for n in lengths]
    kp = torch.randn(sum(need) + 3, bs, kvh, d).bfloat16()
    vp = torch.randn(sum(need) + 3, bs, kvh, dv).bfloat16()
    perm = torch.randperm(sum(need) + 3)
    table = torch.zeros(len(lengths), max(need), dtype=torch.long)
    at = 0
    for i, k in enumerate(need):
        table[i, :k], at = perm[at:at + k], at + k
    lens = torch.tensor(lengths)
    starts = (lens - window).clamp(min=0) if window else None
    q = torch.randn(len(lengths), kvh, g, d).bfloat16()
    got = kernel(q, kp, vp, table, lens, 0.3, starts)
    want = kernel._op(q.float(), kp, vp, table, lens, 0.3, starts)       # the float32-query path
    assert got.dtype == torch.bfloat16 and got.shape == want.shape == (len(lengths), kvh, g, dv)
    assert (kernel._op(q, kp, vp, table, lens, 0.3, starts) - want).abs().max() <= 1e-5 * want.abs().max()


@needs_compiler
def test_prefill_kernel_declines_what_it_cannot_read(kernel):
    """Float16 and non-dense pools take the SDPA path (any head width is the kernel's since issue 32)."""
    torch.manual_seed(3)
    chunks = [(0, 9, None), (5, 4, None)]
    for dv, qdtype, store in ((16, torch.float16, DenseStore),
                              (16, torch.float32, Fp8Store)):
        p, tables = filled_part(store, 2, 16, dv, qdtype if store is DenseStore else torch.float32, [9, 9])
        ch = [(s, n, t) for (s, n, _), t in zip(chunks, tables)]
        q = torch.randn(13, 4, 16, dtype=qdtype)
        ref = paged_op(q, p, build_attn_batch(ch, 4, CPU), 0.5)
        assert torch.equal(paged_op(q, p, build_attn_batch(ch, 4, CPU, prefill_kernel=kernel), 0.5), ref)


@needs_compiler
def test_kernel_leaves_prefills_and_other_codecs_to_torch(kernel):
    """Prefill rows in the same step and non-dense pools (FP8) take the gather path unchanged."""
    torch.manual_seed(1)
    p, tables = filled_part(Fp8Store, 2, 8, 8, torch.float32, [9, 6])
    assert p.dense_pools() is None
    chunks = [(0, 9, tables[0]), (5, 1, tables[1])]
    q = torch.randn(10, 4, 8)
    ref = paged_op(q, p, build_attn_batch(chunks, 4, CPU), 0.5)
    assert torch.equal(paged_op(q, p, build_attn_batch(chunks, 4, CPU, decode_kernel=kernel), 0.5), ref)
    d, _ = filled_part(DenseStore, 2, 8, 8, torch.float32, [9, 6])
    assert d.dense_pools() is not None


@needs_compiler
def test_a_killed_builder_does_not_block_later_builds(kernel):
    """torch's lock file left by a builder that died is removed instead of waited on forever."""
    from torch.utils import cpp_extension

    from refengine.paged_kernel import NAME

    lock = Path(cpp_extension._get_build_directory(NAME, False)) / "lock"
    lock.write_text("")
    assert build() is not None and not lock.exists()


@pytest.mark.parametrize("resolve", [resolve_decode_kernel, resolve_prefill_kernel])
def test_kernel_option_resolution(resolve):
    assert resolve("torch", CPU) is None
    assert resolve("auto", torch.device("cuda")) is None      # a CPU kernel: not on CUDA
    with pytest.raises(ValueError, match="CPU kernel"):
        resolve("cpp", torch.device("cuda"))
    with pytest.raises(ValueError, match="not in"):
        resolve("triton", CPU)


def test_auto_prefill_kernel_only_on_avx512(monkeypatch):
    # Without AVX-512 the prefill kernel is slower than SDPA (its 16-float tiles spill): auto picks SDPA.
    import refengine.paged_kernel as pk

    monkeypatch.setattr(pk, "_resolve", lambda option, name, device: ("kernel", option, name))
    assert resolve_prefill_kernel("auto", CPU, flags={"avx2", "fma"}) is None
    assert resolve_prefill_kernel("auto", CPU, flags={"avx2", "avx512f"}) == ("kernel", "prefill_kernel", "auto")
    assert resolve_prefill_kernel("cpp", CPU, flags={"avx2"}) == ("kernel", "prefill_kernel", "cpp")


@needs_compiler
@pytest.mark.model
def test_engine_greedy_tokens_identical_kernel_or_not(smollm2_dir):
    """Both attention kernels and the fused element-wise ops, or none; the 120-token prompt is
    prefilled in chunks (64-token budget), so the prefill kernel also runs with a cached prefix."""
    long = [1] + [(7 * i) % 4000 + 30 for i in range(119)]
    prompts = [[1, 504, 3458, 282, 4649, 314], [1, 9690, 28, 2683, 314, 253, 1345, 30, 732], long]
    outs = {}
    for mode in ("torch", "cpp"):
        eng = LLMEngine(EngineConfig(model=str(smollm2_dir), decode_kernel=mode, prefill_kernel=mode,
                                     fused_ops=mode, max_model_len=256, kv_cache_memory_gb=0.05,
                                     max_num_batched_tokens=64, enable_prefix_caching=False))
        backend = eng.runner.attn_backend
        assert (backend.decode_kernel is not None) == (backend.prefill_kernel is not None) == (mode == "cpp")
        assert eng.runner.model.ops.name == {"cpp": "C++", "torch": "torch"}[mode]
        for i, p in enumerate(prompts):
            eng.add_request(f"r{i}", p, SamplingParams(max_tokens=16, temperature=0))
        toks: dict[str, list[int]] = {}
        while eng.has_unfinished():
            for o in eng.step():
                toks.setdefault(o.request_id, []).extend(o.new_token_ids)
        outs[mode] = toks
    assert [len(t) for t in outs["torch"].values()] == [16, 16, 16] and outs["torch"] == outs["cpp"]


def dense_window_reference(q, k, v, q_pos, window, scale):
    """SDPA over contiguous K/V ``[ctx, kvh, d]``: query row r at position ``q_pos[r]`` sees keys
    ``q_pos[r] - window + 1 .. q_pos[r]`` (transformers' sliding-window mask)."""
    keys = torch.arange(k.shape[0]).unsqueeze(0)
    qp = torch.tensor(q_pos).unsqueeze(1)
    mask = (keys <= qp) & (keys > qp - window)
    g = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(g, 1).transpose(0, 1), v.repeat_interleave(g, 1).transpose(0, 1)
    out = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1).float(), kk.float(), vv.float(),
                                                           attn_mask=mask, scale=scale)
    return out.transpose(0, 1)


@needs_compiler
@pytest.mark.parametrize("window", [1, 5, 16, 64, 100, 1000])
@pytest.mark.parametrize("kvh,g,d,dv", [(2, 2, 64, 64), (1, 4, 16, 32), (1, 2, 24, 8), (2, 2, 24, 32), (1, 4, 256, 256),
                                         (1, 4, 233, 239), (1, 4, 229, 240)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernels_with_a_sliding_window_match_sdpa(kernel, window, kvh, g, d, dv, dtype):
    """Windows shorter than a block, equal to a key tile, longer than the context; whole prompts,
    chunks after a cached prefix and decode rows in one step, through ``build_attn_batch(window=)``
    (blocks before the window are not passed: their table entries are poisoned) with the kernels
    and with gather + SDPA, against SDPA with transformers' window mask on contiguous K/V.
    Tolerance: 1e-5 per 64 head dims (float32 pools), 2e-2 (bfloat16 pools, compared against the
    stored values)."""
    torch.manual_seed(4)
    bs, lengths = 4, [150, 230, 7, 40]
    p = PartKV(HeadPart(tuple(range(kvh)), d, dv), DenseStore(200, bs, kvh, d, dtype, CPU),
               DenseStore(200, bs, kvh, dv, dtype, CPU))
    perm, tables, kv = torch.randperm(200).tolist(), [], []
    for n in lengths:
        table, perm = perm[:-(-n // bs)], perm[-(-n // bs):]
        k, v = torch.randn(n, kvh, d).to(dtype), torch.randn(n, kvh, dv).to(dtype)
        slots = slot_mapping([(0, n, table)], bs, CPU)
        p.k.write(slots, k)
        p.v.write(slots, v)
        tables.append(table)
        kv.append((k, v))
    chunks = [(0, 150, tables[0]), (101, 129, tables[1]), (0, 7, tables[2]), (39, 1, tables[3])]
    for start, _, table in chunks:                           # entries before the window: never read
        first = max(0, start - window + 1) // bs
        table[:first] = [-10**6] * first
    q = torch.randn(sum(n for _, n, _ in chunks), kvh * g, d, dtype=dtype)
    ref, row = [], 0
    for (start, n, _), (k, v) in zip(chunks, kv):
        ref.append(dense_window_reference(q[row:row + n], k[:start + n], v[:start + n],
                                          list(range(start, start + n)), window, 0.3))
        row += n
    ref = torch.cat(ref)
    tol = 1e-5 * max(1, d // 64) if dtype == torch.float32 else 2e-2   # float32 sums over d terms
    for kw in ({}, {"prefill_kernel": kernel, "decode_kernel": kernel}):
        batch = build_attn_batch(chunks, bs, CPU, window=window, **kw)
        out = paged_op(q, p, batch, 0.3)
        assert out.shape == ref.shape
        assert torch.allclose(out.float(), ref, atol=tol, rtol=tol), (kw.keys(), (out.float() - ref).abs().max())
