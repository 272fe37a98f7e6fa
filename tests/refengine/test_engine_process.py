"""ProcessEngine (the engine core in its own process) on the real SmolLM2: the same greedy
tokens as the in-process engine, per-request errors on their own stream, load errors
raised from start(), early exit aborts, a killed engine process fails every open stream
and turns healthy() False, and the engine process exits when the serving process dies."""

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from refengine.async_engine import EngineDeadError
from refengine.config import EngineConfig
from refengine.engine import LLMEngine
from refengine.engine_process import ProcessEngine, engine_client
from refengine.sampling_params import SamplingParams

pytestmark = [pytest.mark.e2e, pytest.mark.model]
PROMPTS = {"a": [1, 504, 3458, 282], "b": [1, 9690, 314, 253, 1812]}


def config(model_dir, **kw) -> EngineConfig:
    return EngineConfig(model=str(model_dir), max_model_len=256, num_kv_blocks=64, block_size=8, **kw)


async def collect(eng, rid, prompt, params):
    tokens, last = [], None
    async for out in eng.generate(rid, prompt, params):
        tokens += out.new_token_ids
        last = out
    return tokens, last


def test_same_tokens_as_the_engine_in_process(smollm2_dir):
    greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    ref = LLMEngine(config(smollm2_dir))
    expected, steps = {}, 0
    for rid, prompt in PROMPTS.items():
        ref.add_request(rid, prompt, greedy)
        expected[rid] = []
    while ref.has_unfinished():
        steps += 1
        for out in ref.step():
            expected[out.request_id] += out.new_token_ids
    # The engine counts the steps it ran and their time (the server's own step time, for /metrics).
    ran = ref.stats().extra
    assert ran["engine_steps_total"] == steps and ran["engine_step_seconds_total"] > 0

    async def main():
        eng = ProcessEngine(config(smollm2_dir))
        await eng.start()
        try:
            assert eng.healthy() and eng.max_model_len == 256 and eng.vocab_size == ref.spec.vocab_size
            assert eng.eos_token_ids == tuple(ref.eos_token_ids)
            results = await asyncio.gather(*(collect(eng, rid, p, greedy) for rid, p in PROMPTS.items()))
            # a refused request gets its error on its own stream; the engine goes on
            with pytest.raises(ValueError, match="prompt token ids"):
                await collect(eng, "bad", [1, 10 ** 7], greedy)
            again = await collect(eng, "again", PROMPTS["a"], greedy)
            for _ in range(50):                       # stats arrive with the engine's next message
                if eng.stats().generation_tokens_total >= 24:
                    break
                await asyncio.sleep(0.1)
            return results, again, eng.stats()
        finally:
            await eng.shutdown()
            assert not eng._proc.is_alive() and eng._proc.exitcode == 0

    results, again, stats = asyncio.run(main())
    for (tokens, last), rid in zip(results, PROMPTS):
        assert tokens == expected[rid] and last.finished and last.finish_reason == "length"
        assert last.timings is not None and last.timings.first_token >= last.timings.arrival
    assert again[0] == expected["a"]
    assert stats.generation_tokens_total == 24 and stats.num_running == 0
    # the engine process's step counters reach the serving process: a and b together (8 steps, one
    # prefill), then "again" alone (8 more); the refused request never reaches a step
    assert stats.extra["engine_steps_total"] >= 16 and stats.extra["engine_step_seconds_total"] > 0


def test_leaving_a_stream_early_aborts_it(smollm2_dir):
    async def main():
        eng = engine_client(config(smollm2_dir), "process")
        await eng.start()
        try:
            agen = eng.generate("long", PROMPTS["a"], SamplingParams(max_tokens=200, temperature=0, ignore_eos=True))
            await agen.__anext__()
            await agen.aclose()                      # the client went away
            for _ in range(100):
                s = eng.stats()
                if s.num_running == 0 and s.generation_tokens_total > 0:
                    return s
                await asyncio.sleep(0.05)
            raise AssertionError(f"request still running: {eng.stats()}")
        finally:
            await eng.shutdown()

    stats = asyncio.run(main())
    assert stats.generation_tokens_total < 200


def test_a_load_error_is_raised_from_start(smollm2_dir):
    async def main():
        eng = ProcessEngine(EngineConfig(model=str(smollm2_dir), max_model_len=10 ** 7))
        with pytest.raises(ValueError, match="exceeds the model's max_position_embeddings"):
            await eng.start()
        assert not eng.healthy()

    asyncio.run(main())


def test_a_killed_engine_process_fails_open_streams(smollm2_dir):
    async def main():
        eng = ProcessEngine(config(smollm2_dir))
        await eng.start()
        try:
            agen = eng.generate("victim", PROMPTS["b"], SamplingParams(max_tokens=200, temperature=0, ignore_eos=True))
            await agen.__anext__()
            os.kill(eng._proc.pid, signal.SIGKILL)
            with pytest.raises(EngineDeadError, match="exit code -9"):
                async for _ in agen:
                    pass
            assert not eng.healthy()
            with pytest.raises(EngineDeadError):
                await collect(eng, "after", PROMPTS["a"], SamplingParams(max_tokens=2))
        finally:
            await eng.shutdown()

    asyncio.run(main())


def alive(pid: int) -> bool:
    """Running (an exited orphan may stay a zombie when PID 1 does not reap)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def test_the_engine_process_exits_with_the_serving_process(smollm2_dir, tmp_path):
    script = textwrap.dedent(f"""
        import asyncio, os, sys
        from refengine.config import EngineConfig
        from refengine.engine_process import ProcessEngine

        async def main():
            eng = ProcessEngine(EngineConfig(model={str(smollm2_dir)!r}, max_model_len=256, num_kv_blocks=64))
            await eng.start()
            print(eng._proc.pid, flush=True)
            os._exit(0)                                # no shutdown: as if the worker were killed

        asyncio.run(main())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         cwd=os.getcwd())
    assert out.returncode == 0, out.stderr
    pid = int(out.stdout.split()[-1])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not alive(pid):
            return
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
    raise AssertionError("the engine process outlived the serving process")
