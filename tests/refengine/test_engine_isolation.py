"""Engine isolation on the real SmolLM2: a failure while handling one request fails that
request with a clear error and the engine keeps serving the others; requests failing alone
step after step never stop the engine (its canary passes), while an engine that cannot run
its own canary is broken (``EngineFault``); a constraint the engine cannot follow fails as
the request's (``constraint``), with no library internals in the message; ids and options are
validated when a request is added; score() refuses what does not fit the context; a
SwiftKV config with num_key_value_layers 0 is an error."""

import asyncio
import json

import pytest

import refengine.model_runner as model_runner
from refengine.config import EngineConfig
from refengine.engine import MAX_FAILED_STEPS, LLMEngine
from refengine.faults import EngineFault
from refengine.structured.grammar import GrammarError
from refengine.structured.masks import GrammarMasks
from refengine.structured.spec import StructuredSpec
from refengine.model_config import ModelConfigError, parse_model_config
from refengine.outputs import RequestFailed
from refengine.sampling_params import SamplingParams

pytestmark = [pytest.mark.slow, pytest.mark.model]
POISON_SEED = 666          # a request with this seed makes the (patched) sampler raise


@pytest.fixture(scope="module")
def engine(smollm2_dir):
    return LLMEngine(EngineConfig(model=str(smollm2_dir), max_model_len=128, num_kv_blocks=64, block_size=8))


@pytest.fixture
def poisoned_sampler(monkeypatch):
    real = model_runner.sample

    def sample(logits, rows, gen, *rest, **kw):     # rest: the step's token masks (structured outputs)
        if any(r.params.seed == POISON_SEED for r in rows):
            raise IndexError("index 49999 is out of bounds for dimension 1 with size 49152")
        return real(logits, rows, gen, *rest, **kw)

    monkeypatch.setattr(model_runner, "sample", sample)


def run(engine, reqs):
    """reqs: {rid: (prompt, params)} -> ({rid: tokens}, {rid: finish_reason}, failures)."""
    for rid, (prompt, params) in reqs.items():
        engine.add_request(rid, prompt, params)
    tokens, reasons, failures = {rid: [] for rid in reqs}, {}, {}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
            if out.finished:
                reasons[out.request_id] = out.finish_reason
        failures.update(engine.take_failures())
    return tokens, reasons, failures


def test_a_failing_request_fails_alone(engine, poisoned_sampler):
    greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    prompts = {"a": [1, 504, 3458, 282], "b": [1, 9690, 314, 253], "c": [1, 1812, 339, 2367, 30]}
    clean, _, _ = run(engine, {rid: (p, greedy) for rid, p in prompts.items()})
    bad = SamplingParams(max_tokens=6, temperature=0.7, seed=POISON_SEED, ignore_eos=True)
    reqs = {"a2": (prompts["a"], greedy), "bad": (prompts["b"], bad), "c2": (prompts["c"], greedy)}
    tokens, reasons, failures = run(engine, reqs)
    assert set(failures) == {"bad"} and isinstance(failures["bad"], RequestFailed)
    assert "IndexError" in str(failures["bad"]) and "bad" not in reasons
    assert tokens["a2"] == clean["a"] and tokens["c2"] == clean["c"]           # the others are untouched
    assert reasons == {"a2": "length", "c2": "length"}
    assert engine.block_manager.num_used == 0 and not engine.scheduler.requests
    # and the engine keeps serving
    again, _, failures = run(engine, {"a3": (prompts["a"], greedy)})
    assert again["a3"] == clean["a"] and not failures


def test_requests_failing_alone_step_after_step_never_stop_the_engine(engine, poisoned_sampler):
    """The regression of issue 47: three hostile requests in a row on an idle engine used to make it
    declare itself broken. Now a canary of its own passes, and the engine goes on."""
    bad = SamplingParams(max_tokens=4, temperature=0.7, seed=POISON_SEED)
    canaries = engine.num_canaries
    for i in range(3 * MAX_FAILED_STEPS):
        _, reasons, failures = run(engine, {f"bad{i}": ([1, 9690, 314, 253], bad)})
        assert set(failures) == {f"bad{i}"} and not failures[f"bad{i}"].constraint and not reasons
    assert engine.num_canaries >= canaries + 2            # checked itself, and passed each time
    greedy = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    tokens, reasons, failures = run(engine, {"ok": ([1, 504, 3458, 282], greedy)})
    assert len(tokens["ok"]) == 3 and reasons == {"ok": "length"} and not failures
    assert engine.block_manager.num_used == 0 and not engine.scheduler.requests


def test_an_engine_that_fails_its_own_canary_is_broken(engine, monkeypatch):
    def broken(*args, **kw):
        raise RuntimeError("device lost")

    monkeypatch.setattr(model_runner, "sample", broken)
    greedy = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    try:
        with pytest.raises(EngineFault, match="own one-token check request"):
            for i in range(MAX_FAILED_STEPS + 2):
                run(engine, {f"r{i}": ([1, 504, 3458], greedy)})
    finally:                                  # leave the module's engine clean for the other tests
        for rid in list(engine.scheduler.requests):
            engine.abort_request(rid)
        engine._canary, engine._failed_steps = None, 0
        engine.take_failures()


def test_a_constraint_the_engine_cannot_follow_is_the_requests_fault(engine, monkeypatch):
    real = GrammarMasks._compute

    def compute(self, todo):
        if any(spec.text == "(poison)" for _, _, spec, *_ in todo):
            raise GrammarError("lexer error: too many expressions constructed\n<state>\nTokens: [1, 2]\n<backtrace>"
                               "\n0: <unknown>")
        return real(self, todo)

    monkeypatch.setattr(GrammarMasks, "_compute", compute)
    poison = SamplingParams(max_tokens=4, temperature=0, structured=StructuredSpec("regex", "(poison)"))
    greedy = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    tokens, reasons, failures = run(engine, {"p": ([1, 9690, 314], poison), "ok": ([1, 504, 3458, 282], greedy)})
    assert set(failures) == {"p"} and failures["p"].constraint
    assert "too many expressions" in str(failures["p"]) and "<state>" not in str(failures["p"])
    assert "backtrace" not in str(failures["p"]) and reasons == {"ok": "length"} and len(tokens["ok"]) == 3


def test_a_constraint_failing_deep_in_its_output_fails_alone_and_the_batch_runs_on(engine, monkeypatch):
    # A grammar that compiled but fails while masking a later token (llguidance's lexer limits, found by
    # benchmarks/serve/hostile.py) names its request: the others run again together at once, not one
    # request at a time (which stalled a 8-request batch for 21 s).
    real_rows = GrammarMasks._rows

    def rows(self, st, bits, j, drafts):
        if st.consumed >= 2:
            raise GrammarError("lexer error: too many expressions constructed")
        return real_rows(self, st, bits, j, drafts)

    monkeypatch.setattr(GrammarMasks, "_rows", rows)
    batches = []
    real_execute = engine.runner.execute
    monkeypatch.setattr(engine.runner, "execute", lambda sched: batches.append(len(sched.chunks)) or real_execute(sched))
    poison = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True, structured=StructuredSpec("regex", "[a-z ]+"))
    greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    tokens, reasons, failures = run(engine, {"p": ([1, 9690, 314], poison), "a": ([1, 504, 3458, 282], greedy),
                                             "b": ([1, 504, 3458], greedy)})
    assert set(failures) == {"p"} and failures["p"].constraint and "too many expressions" in str(failures["p"])
    assert reasons == {"a": "length", "b": "length"} and len(tokens["a"]) == len(tokens["b"]) == 6
    assert 1 not in batches, batches          # never a request alone
    assert engine.runner.grammar._states == {}


def test_async_engine_hands_the_error_to_that_stream_only(smollm2_dir, poisoned_sampler):
    from refengine.async_engine import AsyncEngine

    async def main():
        eng = AsyncEngine(EngineConfig(model=str(smollm2_dir), max_model_len=128, num_kv_blocks=64, block_size=8))
        await eng.start()
        try:
            async def consume(rid, params):
                toks = []
                try:
                    async for out in eng.generate(rid, [1, 504, 3458, 282], params):
                        toks += out.new_token_ids
                except RequestFailed as exc:
                    return exc
                return toks

            good = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
            bad = SamplingParams(max_tokens=5, temperature=1.0, seed=POISON_SEED)
            results = await asyncio.gather(consume("g1", good), consume("b", bad), consume("g2", good))
            return results, eng.healthy()
        finally:
            await eng.shutdown()

    (g1, b, g2), healthy = asyncio.run(main())
    assert isinstance(b, RequestFailed) and len(g1) == 5 and g1 == g2 and healthy


def test_ids_and_options_are_validated_when_added(engine):
    vocab = engine.spec.vocab_size
    with pytest.raises(ValueError, match="stop_token_ids"):
        engine.add_request("x", [1, 2], SamplingParams(max_tokens=4, min_tokens=2, stop_token_ids=(vocab + 5,)))
    with pytest.raises(ValueError, match="prompt token ids"):
        engine.add_request("y", [1, vocab], SamplingParams(max_tokens=4))
    with pytest.raises(ValueError, match="logprobs"):
        engine.add_request("z", [1, 2], SamplingParams(max_tokens=4, logprobs=vocab + 1))
    assert not engine.scheduler.requests


def test_score_refuses_what_does_not_fit(engine):
    n = engine.max_model_len
    with pytest.raises(ValueError, match="exceed the context"):
        engine.score([([1] * 4, [2] * 4), ([1] * (n - 3), [2] * 4)])
    assert not engine.scheduler.requests                  # nothing was added
    scores = engine.score([([1] * (n - 4), [2] * 4)])     # exactly the context: every log-prob comes back
    assert len(scores[0]) == 4


def test_num_key_value_layers_zero_is_an_error(smollm2_dir):
    cfg = json.loads((smollm2_dir / "config.json").read_text())
    cfg.update(swiftkv=True, num_key_value_layers=0)
    with pytest.raises(ModelConfigError, match="num_key_value_layers=0"):
        parse_model_config(cfg, None)
    cfg["num_key_value_layers"] = 15
    assert parse_model_config(cfg, None).num_key_value_layers == 15
    del cfg["num_key_value_layers"]                       # absent: every layer keeps its KV
    assert not parse_model_config(cfg, None).swiftkv
