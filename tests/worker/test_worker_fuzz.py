"""Hostile and malformed input against the worker over real HTTP (uvicorn on loopback).

* schemathesis: every operation of the worker's OpenAPI schema, with schema-conforming and
  schema-violating (negative) data;
* Hypothesis: every request field replaced by values of every JSON type, raw bytes that are
  not JSON, the structured families (constraints, tools, Responses items, scoring fields),
  the fixed hostile cases and issue 47's regressions of ``benchmarks.lib.fuzz``;
* the real SmolLM2 engine under extreme sampling options and ids, and under drawn output
  constraints and tools (the engine, not only the HTTP layer, must refuse or survive them).

Property: never a 5xx, every 4xx an OpenAI-style JSON error, and the worker still serves a
normal request afterwards. The number of cases (and of 5xx) goes to ``reliability_log``.
The number of examples comes from the Hypothesis profile (``--hypothesis-profile=long``).
"""

import json

import httpx
import pytest
import schemathesis
from benchmarks.lib.fuzz import CHAT, CMPL, FAMILIES, Tally, check_answer, family_bodies, fixed_cases, hostile_bodies, regressions
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from worker_test_fakes import FakeEngineClient, ServerThread, make_tokenizer

from refengine.config import EngineConfig
from worker.app import build_app
from worker.config import WorkerConfig

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
MAX_BODY = 1 << 20
LAX = dict(deadline=None, suppress_health_check=list(HealthCheck))


def worker_app(engine=None, **kw):
    from worker.limits import RequestLimits

    cfg = WorkerConfig(engine_config=EngineConfig(model="/models/fake-model"), served_model_name=("fake-model",),
                       max_body_bytes=MAX_BODY, limits=RequestLimits(constraint_timeout=0.5), **kw)
    return build_app(cfg, engine or FakeEngineClient(token_delay=0.0), make_tokenizer())


APP = worker_app()
SCHEMA = schemathesis.openapi.from_dict(APP.openapi())
SCHEMA.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE])


@pytest.fixture(scope="module")
def server():
    with ServerThread(APP) as srv:
        yield srv


@pytest.fixture(scope="module")
def tally(reliability_log):
    t = Tally()
    yield t
    reliability_log.malformed("worker", t.cases, t.server_errors)


def still_serves(url: str) -> None:
    r = httpx.post(url + CMPL, json={"model": "fake-model", "prompt": "Hello", "max_tokens": 3}, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3, r.text


@SCHEMA.parametrize()
@settings(**LAX)
def test_schemathesis_every_operation(case, server, tally):
    r = case.call(base_url=server.url, timeout=30)
    tally.saw(r.status_code)
    check_answer(r.status_code, r.content, r.headers)


@settings(**LAX)
@given(case=hostile_bodies())
def test_every_field_with_every_type(case, server, tally):
    path, raw = case
    r = httpx.post(server.url + path, content=raw, headers={"content-type": "application/json"}, timeout=30)
    tally.saw(r.status_code)
    check_answer(r.status_code, r.content, r.headers)


@settings(max_examples=max(20, settings().max_examples // 2), **LAX)
@given(case=st.sampled_from(FAMILIES).flatmap(family_bodies))
def test_structured_tools_responses_and_scoring_families(case, server, tally):
    path, raw = case
    r = httpx.post(server.url + path, content=raw, headers={"content-type": "application/json"}, timeout=30)
    tally.saw(r.status_code)
    check_answer(r.status_code, r.content, r.headers)


def test_issue_47_regressions(server, tally):
    with httpx.Client(timeout=60) as c:
        for path, body in regressions():
            r = c.post(server.url + path, content=json.dumps(body), headers={"content-type": "application/json"})
            tally.saw(r.status_code)
            check_answer(r.status_code, r.content, r.headers)
    still_serves(server.url)


def test_fixed_hostile_cases(server, tally):
    with httpx.Client(timeout=60) as c:
        for path, raw, headers in fixed_cases(MAX_BODY):
            r = c.post(server.url + path, content=raw, headers={"content-type": "application/json", **headers})
            tally.saw(r.status_code)
            check_answer(r.status_code, r.content, r.headers)
        r = c.post(server.url + CMPL, content=b"x" * (MAX_BODY + 1), headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
        r = c.get(server.url + "/nope")
        assert r.status_code == 404 and r.json()["error"]["message"]
        r = c.delete(server.url + CMPL)
        assert r.status_code == 405 and r.json()["error"]["message"]
        tally.cases += 3
    still_serves(server.url)


def test_chunked_oversized_body_is_refused_while_it_arrives(server):
    def chunks():
        for _ in range(64):
            yield b"x" * 65536             # 4 MiB, no Content-Length

    r = httpx.post(server.url + CMPL, content=chunks(), headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 413 and r.json()["error"]["message"].startswith("Request body exceeds")


# ---- the real engine ----------------------------------------------------------------------------
OPTIONS = st.fixed_dictionaries({}, optional={
    "temperature": st.sampled_from([0, 1e-6, 1e-5, 0.7, 2.0]),
    "top_p": st.sampled_from([5e-324, 1e-9, 0.5, 1.0]),
    "top_k": st.sampled_from([-1, 0, 1, 2, 49151, 49152, 10**9]),
    "min_p": st.sampled_from([0.0, 1e-9, 0.999, 1.0]),
    "repetition_penalty": st.sampled_from([5e-324, 1e-6, 1.0, 1e6, 1e300]),
    "presence_penalty": st.sampled_from([-2.0, 2.0]),
    "frequency_penalty": st.sampled_from([-2.0, 2.0]),
    "seed": st.sampled_from([-(2**63), 0, 2**63 - 1]),
    "stop_token_ids": st.lists(st.sampled_from([0, 1, 2, 49151, 49152, 49153, 2**40]), max_size=3),
    "min_tokens": st.integers(0, 6),
    "logprobs": st.integers(0, 20),
    "ignore_eos": st.booleans(),
    "n": st.integers(1, 3),
    "stop": st.lists(st.sampled_from(["\n", " the", "é", "<|im_end|>"]), max_size=4),
    "stream": st.booleans(),
    "echo": st.booleans(),
    "truncate_prompt_tokens": st.sampled_from([1, 3, 10**6]),
    "prompt_logprobs": st.sampled_from([0, 1, 20]),
    "logit_bias": st.dictionaries(st.sampled_from(["0", "2", "49151", "49152"]), st.sampled_from([-100, 0.5, 100]),
                                  max_size=3),
})
PROMPTS = st.one_of(st.sampled_from(["Hello", "The capital of France is", "é🎉" * 5]),
                    st.lists(st.sampled_from([0, 1, 2, 100, 49151, 49152, 10**10]), min_size=1, max_size=6))


@pytest.fixture(scope="module")
def real_server(smollm2_dir):
    from refengine.async_engine import AsyncEngine
    from worker.config import WorkerConfig as WC

    # A context long enough for chat prompts with a tools system prompt (the drawn tools reach the engine).
    cfg = WC(engine_config=EngineConfig(model=str(smollm2_dir), max_model_len=512, num_kv_blocks=128, block_size=8),
             served_model_name=("fake-model",))
    from transformers import AutoTokenizer

    app = build_app(cfg, AsyncEngine(cfg.engine_config), AutoTokenizer.from_pretrained(smollm2_dir))
    with ServerThread(app, startup_timeout=180) as srv:
        yield srv


@pytest.mark.model
@settings(max_examples=max(8, settings().max_examples // 10), **LAX)
@given(options=OPTIONS, prompt=PROMPTS, chat=st.booleans())
def test_real_engine_survives_extreme_options(options, prompt, chat, real_server, tally):
    body = {"model": "fake-model", **options, "max_tokens": 6}
    if chat:
        text = prompt if isinstance(prompt, str) else "hi"
        body["messages"] = [{"role": "user", "content": text}]
        body.pop("echo", None)
        body["logprobs"], body["top_logprobs"] = bool(options.get("logprobs")), options.get("logprobs")
        if not body["logprobs"]:
            body.pop("top_logprobs")
    else:
        body["prompt"] = prompt
    r = httpx.post(real_server.url + (CHAT if chat else CMPL), content=json.dumps(body),
                   headers={"content-type": "application/json"}, timeout=120)
    tally.saw(r.status_code)
    check_answer(r.status_code, r.content, r.headers)
    if r.status_code == 200 and body.get("stream"):
        events = [e for e in r.text.split("\n\n") if e]
        assert events[-1] == "data: [DONE]"
        assert not any('"error"' in e for e in events), r.text[-500:]      # no engine failure in-band
    assert httpx.get(real_server.url + "/health").status_code == 200      # the engine keeps serving


@pytest.mark.model
@settings(max_examples=max(8, settings().max_examples // 5), **LAX)
@given(case=st.sampled_from(["structured", "tools"]).flatmap(family_bodies))
def test_real_engine_survives_drawn_constraints_and_tools(case, real_server, tally):
    """Drawn constraints and tools on the real engine: the ones that compile are generated under their
    grammar (6 tokens), the others are 400s; never a 5xx or an engine failure in-band."""
    path, raw = case
    body = json.loads(raw)
    body["max_tokens"] = 6
    r = httpx.post(real_server.url + path, content=json.dumps(body), headers={"content-type": "application/json"},
                   timeout=120)
    tally.saw(r.status_code)
    check_answer(r.status_code, r.content, r.headers)
    assert httpx.get(real_server.url + "/health").status_code == 200
