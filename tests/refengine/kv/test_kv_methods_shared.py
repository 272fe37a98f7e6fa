"""Every registered KV method, on the real SmolLM2, with and without SwiftKV (AcrossKV g=2: a cache
slot shared by two layers) and with and without the FP8 codec:

- the engine serves (greedy generation runs to its length);
- memory: what the pool really allocates (device, and host where V lives there) equals the spec's
  arithmetic and /metrics' figures, and the method saves for real: fewer device bytes per token,
  or (eviction) fewer blocks held while serving;
- a method's lossless setting (nothing dropped, or 16-bit "quantisation") gives the uncompressed
  engine's greedy tokens (FP8 on: it adds no error beyond FP8's own, checked on teacher-forced
  log-probs against the dense cache). Eviction's exactness setting really evicts (a budget below
  the longer prompt): its greedy tokens equal those of the uncompressed engine whose decode
  attention is restricted, per layer and KV head, to the prompt entries eviction kept (what
  eviction claims: it drops entries, and attends to the kept ones exactly);
- a combination a method refuses (a second codec) stops before the model loads, with the reason;
- the combinations the issue names (ZACK x ZipCache, ZACK x eviction, and KCache with ZACK and with
  eviction; each on both layouts) serve with real bytes, their lossless settings together equal the
  uncompressed engine, and the pairs that do not compose are refused with the reason.

``CASES`` must name every method in ``refengine.kv.registry.METHODS``; a new method without a case
fails ``test_every_registered_method_has_a_case``.
"""

from dataclasses import dataclass

import pytest
import torch

from refengine.config import EngineConfig
from refengine.engine import LLMEngine
from refengine.kv import registry
from refengine.kv.base import MethodError
from refengine.sampling_params import SamplingParams

pytestmark = [pytest.mark.slow, pytest.mark.model]


@dataclass(frozen=True)
class Case:
    lossless: dict | None             # options that drop nothing, or None for a lossy codec
    lossy: dict
    saves: str = "bytes"              # "bytes": fewer device bytes per token; "blocks": fewer blocks held
    fp8: str | None = None            # with FP8 on: None = composes, else the refusal's message


# "{cal}" is replaced by the layout's calibration.
CASES = {
    "zack": Case({"calibration": "{cal}", "rate": 0.0}, {"calibration": "{cal}", "rate": 0.5}),
    "fp8": Case(None, {}),
    "kcache": Case({"top_n": 4096, "device_layers": 0}, {"top_n": 8, "device_layers": 2}),
    "zipcache": Case({"bits_hi": 16, "bits_lo": 16, "window": 0}, {"window": 0}, fp8="two KV codecs"),
    # eviction's "lossless" case evicts (21 of the longer prompt's 37 entries): see KeptOnly
    "eviction": Case({"budget": 16, "window": 4}, {"budget": 16, "window": 4}, saves="blocks"),
}
NO_EVICTION = {"budget": 4096, "window": 4}      # eviction in the lossless combinations: evicts nothing
PROMPTS = [[1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28],
           list(range(2000, 2037))]
GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


def test_every_registered_method_has_a_case():
    assert set(CASES) == set(registry.METHODS)


def options(template, cal):
    return {k: (str(cal) if v == "{cal}" else v) for k, v in template.items()}


def engine(model, methods=None, fp8=False):
    return LLMEngine(EngineConfig(model=str(model), max_model_len=256, num_kv_blocks=48, block_size=16,
                                  max_num_seqs=8, max_num_batched_tokens=256,
                                  kv_methods=methods or {}, kv_cache_dtype="fp8_e4m3" if fp8 else "auto"))


def pool_tensors(store) -> list:
    """The pool tensors of a store (a store with a full-precision staging area lists them itself)."""
    if hasattr(store, "tensors"):
        return store.tensors()
    return [t for t in vars(store).values() if torch.is_tensor(t)]


def allocated_bytes_per_block(eng) -> tuple[int, int]:
    """(device, host) bytes the pool really allocates per block."""
    kv = eng.runner.kv
    dev = host = 0
    for slot in kv.slots:
        for part in slot.parts:
            for store in (part.k, part.v):
                n = sum(t.numel() * t.element_size() for t in pool_tensors(store))
                if store.device.type == kv.device.type and not (store is part.v and slot.group.v_on_host):
                    dev += n
                else:
                    host += n
    return dev // kv.num_blocks, host // kv.num_blocks


def generate_counting_blocks(eng, prompts, params):
    """Greedy outputs and the mean number of blocks held over the steps."""
    ids = [f"p{i}" for i in range(len(prompts))]
    for rid, p in zip(ids, prompts):
        eng.add_request(rid, p, params)
    out, held = {rid: [] for rid in ids}, []
    while eng.has_unfinished():
        for o in eng.step():
            out[o.request_id] += o.new_token_ids
        held.append(eng.block_manager.num_used)
    return [out[rid] for rid in ids], sum(held) / len(held)


@pytest.fixture(scope="module")
def models(smollm2_dir, acrosskv_dir):
    return {"base": smollm2_dir, "swiftkv": acrosskv_dir}


@pytest.fixture(scope="module")
def reference(models):
    """Greedy tokens and scores of the uncompressed engines, per (layout, fp8)."""
    out = {}
    for layout, model in models.items():
        for fp8 in (False, True):
            eng = engine(model, fp8=fp8)
            tokens, held = generate_counting_blocks(eng, PROMPTS, GREEDY)
            out[layout, fp8] = (tokens, eng.score([(p[:8], p[8:]) for p in PROMPTS]),
                                eng.stats().kv_bytes_per_token, held)
    return out


@pytest.mark.parametrize("fp8", [False, True], ids=["dense", "fp8"])
@pytest.mark.parametrize("layout", ["base", "swiftkv"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_method_serves_and_counts_real_bytes(name, layout, fp8, models, zack_calibrations, reference):
    case, cal = CASES[name], zack_calibrations[layout]
    methods = {name: options(case.lossy, cal)}
    if fp8 and case.fp8:
        with pytest.raises(MethodError, match=case.fp8):
            engine(models[layout], methods, fp8)
        return
    eng = engine(models[layout], methods, fp8)
    out, held = generate_counting_blocks(eng, PROMPTS, GREEDY)
    assert [len(o) for o in out] == [12, 12]
    stats, spec = eng.stats(), eng.runner.cache_spec
    dev, host = allocated_bytes_per_block(eng)
    assert (dev, host) == (spec.device_bytes_per_block, spec.host_bytes_per_block)
    assert stats.kv_bytes_per_token == spec.device_bytes_per_token == dev / 16
    assert stats.extra["kv_host_bytes_per_token"] == host / 16
    assert stats.extra["kv_host_bytes_total"] == host * eng.runner.kv.num_blocks
    ref_bytes, ref_held = reference[layout, fp8][2:]
    assert stats.kv_bytes_per_token <= ref_bytes
    if case.saves == "blocks":                    # same bytes per token, fewer blocks held
        assert held < ref_held
    elif name != "fp8" or not fp8:                # a compressing method (or fp8 added) really saves bytes
        assert stats.kv_bytes_per_token < ref_bytes


# lossless settings with and without FP8, except where FP8 is refused (tested above)
LOSSLESS = [pytest.param(n, fp8, id=f"{n}-{'fp8' if fp8 else 'dense'}") for n, c in sorted(CASES.items())
            if c.lossless is not None for fp8 in (False, True) if not (fp8 and c.fp8)]


class KeptOnly:
    """An attention op of the uncompressed engine with request ``rid``'s decode rows restricted, per
    KV head, to the prompt entries in ``keep [heads, budget]`` (cache indices, = positions before
    eviction) and every entry from ``prompt_len`` on: the attention eviction claims to compute."""

    def __init__(self, op, keep, rid, prompt_len):
        self.op, self.keep, self.rid, self.prompt_len = op, keep, rid, prompt_len

    def __call__(self, q, part, batch, scale):
        out = self.op(q, part, batch, scale)
        d = batch.decode
        if d is None or self.rid not in d.seq_ids:
            return out
        r = d.seq_ids.index(self.rid)
        n, row = d.lengths[r], d.rows[r]
        if n <= self.prompt_len:        # a prompt row (SwiftKV's later layers see the last one alone): before eviction
            return out
        k, v = (x.flatten(0, 1)[:n].float() for x in part.gather(d.blocks[r]))     # [n, kvh, d]
        kvh = k.shape[1]
        allowed = torch.zeros(kvh, n, dtype=torch.bool)
        allowed[:, self.prompt_len:] = True
        allowed.scatter_(1, self.keep.to(torch.long), True)
        qd = q[row].float().view(kvh, -1, k.shape[-1])                             # [kvh, G, d]
        s = torch.einsum("hgd,lhd->hgl", qd, k) * scale
        p = s.masked_fill(~allowed[:, None, :], float("-inf")).softmax(-1)
        out[row] = torch.einsum("hgl,lhd->hgd", p, v).reshape(out.shape[1], -1).to(out.dtype)
        return out


def evicting_equals_attention_to_the_kept(model, opts):
    """Eviction evicts for real, and its greedy tokens equal the uncompressed engine's restricted by KeptOnly."""
    eng = engine(model, {"eviction": opts})
    kept = []
    compact = eng.runner.kv.compact
    eng.runner.kv.compact = lambda table, keep: (kept.append(keep), compact(table, keep))[1]
    got, _ = generate_counting_blocks(eng, PROMPTS, GREEDY)
    long = max(range(len(PROMPTS)), key=lambda i: len(PROMPTS[i]))
    assert len(kept) == 1 and eng.stats().extra["eviction_tokens_evicted"] == len(PROMPTS[long]) - opts["budget"]
    ref = engine(model)
    for s, slot in enumerate(ref.runner.kv.slots):
        slot.ops = [KeptOnly(op, kept[0][s][j], f"p{long}", len(PROMPTS[long])) for j, op in enumerate(slot.ops)]
    want, _ = generate_counting_blocks(ref, PROMPTS, GREEDY)
    assert got == want


@pytest.mark.parametrize("layout", ["base", "swiftkv"])
@pytest.mark.parametrize("name,fp8", LOSSLESS)
def test_lossless_setting_equals_the_uncompressed_engine(name, fp8, layout, models, zack_calibrations, reference):
    if name == "eviction" and not fp8:
        return evicting_equals_attention_to_the_kept(models[layout], CASES[name].lossless)
    eng = engine(models[layout], {name: options(CASES[name].lossless, zack_calibrations[layout])}, fp8)
    ref_tokens, ref_scores, _, _ = reference[layout, fp8]
    if not fp8:
        assert eng.generate(PROMPTS, GREEDY) == ref_tokens
    else:                                          # FP8 rounding differs in a rotated basis
        dense_scores = reference[layout, False][1]

        def err(scores):
            d = [abs(a[0] - b[0]) for sa, sb in zip(scores, dense_scores) for a, b in zip(sa, sb)]
            return sum(d) / len(d)

        got, fp8_alone = err(eng.score([(p[:8], p[8:]) for p in PROMPTS])), err(ref_scores)
        assert got <= 1.5 * fp8_alone + 0.02, (got, fp8_alone)


# Method combinations: name -> (lossless options per method, lossy options per method).
COMBOS = {
    "zack+zipcache": ({"zack": CASES["zack"].lossless, "zipcache": CASES["zipcache"].lossless},
                      {"zack": CASES["zack"].lossy, "zipcache": {"window": 0}}),
    "zack+eviction": ({"zack": CASES["zack"].lossless, "eviction": NO_EVICTION},
                      {"zack": CASES["zack"].lossy, "eviction": CASES["eviction"].lossy}),
    "zack+kcache": ({"zack": CASES["zack"].lossless, "kcache": CASES["kcache"].lossless},
                    {"zack": CASES["zack"].lossy, "kcache": CASES["kcache"].lossy}),
    "kcache+eviction": ({"kcache": CASES["kcache"].lossless, "eviction": NO_EVICTION},
                        {"kcache": CASES["kcache"].lossy, "eviction": CASES["eviction"].lossy}),
}


def combo(methods: dict, cal) -> dict:
    return {name: options(opts, cal) for name, opts in methods.items()}


@pytest.mark.parametrize("layout", ["base", "swiftkv"])
@pytest.mark.parametrize("name", sorted(COMBOS))
def test_combination_serves_with_real_bytes_and_is_exact_when_lossless(name, layout, models, zack_calibrations,
                                                                      reference):
    lossless, lossy = COMBOS[name]
    cal = zack_calibrations[layout]
    ref_tokens, _, ref_bytes, ref_held = reference[layout, False]
    assert engine(models[layout], combo(lossless, cal)).generate(PROMPTS, GREEDY) == ref_tokens
    eng = engine(models[layout], combo(lossy, cal))
    out, held = generate_counting_blocks(eng, PROMPTS, GREEDY)
    assert [len(o) for o in out] == [12, 12]
    spec = eng.runner.cache_spec
    assert allocated_bytes_per_block(eng) == (spec.device_bytes_per_block, spec.host_bytes_per_block)
    assert eng.stats().kv_bytes_per_token < ref_bytes               # every combination has a compressing part
    if "eviction" in lossy:                                          # and blocks really freed
        assert held < ref_held


@pytest.mark.parametrize("pair, words", [
    ({"kcache": {}, "zipcache": {}}, "kcache cannot be combined with zipcache"),
    ({"eviction": {}, "zipcache": {}}, "eviction cannot be combined with zipcache"),
])
def test_pairs_that_do_not_compose_are_refused_before_loading(pair, words, models):
    assert words in registry.check(pair, models["base"])


@pytest.mark.parametrize("layout", ["base", "swiftkv"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_prefix_caching_composes_or_the_method_opts_out(name, layout, models, zack_calibrations):
    """A method whose blocks are a function of their prefix shares them (same greedy tokens as with
    caching off, real hits); one that rewrites or re-ranks blocks (eviction, ZipCache) turns it off."""
    methods = {name: options(CASES[name].lossy, zack_calibrations[layout])}
    shared = PROMPTS[0] + list(range(4000, 4030))            # 44 tokens: 2 full blocks of 16
    prompts = [shared + [504, 3575], shared + [4649], shared + [314, 28, 9]]

    def run(caching):
        eng = LLMEngine(EngineConfig(model=str(models[layout]), max_model_len=256, num_kv_blocks=48, block_size=16,
                                     kv_methods=methods, enable_prefix_caching=caching))
        return eng, eng.generate(prompts[:1], GREEDY) + eng.generate(prompts[1:], GREEDY)

    on, got = run(True)
    cacheable = all(m.prefix_cacheable for m in on.runner.kv_methods)
    assert on.stats().prefix_caching == cacheable
    assert cacheable == (name not in ("eviction", "zipcache"))
    if cacheable:
        assert got == run(False)[1]
        assert on.stats().prefix_cache_hits == 2 * 2 * 16
    else:
        assert on.stats().prefix_cache_hits == 0
