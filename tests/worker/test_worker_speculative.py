"""Speculative decoding through the worker (``--speculative-config``, the ``speculative`` request field).

With the real SmolLM2 (float32) on a worker started with suffix decoding: greedy text is the
same with drafting and with ``"speculative": false``, and a drafting stream carries several tokens
per chunk; ``/metrics`` exposes vLLM's ``vllm:spec_decode_*`` counters; a migrated stream
(``continuation_token_ids``) resumes with drafting and joins into the uninterrupted text. With
the fake engine: the field reaches the engine, and values a worker cannot honour are refused (400)."""

import re

import httpx
import pytest
from worker_test_fakes import ServerThread, parse_sse

pytestmark = pytest.mark.e2e

PASSAGE = ("Redistribution and use in source and binary forms, with or without modification, are permitted "
           "provided that the following conditions are met: Redistributions of source code must retain the above "
           "copyright notice, this list of conditions and the following disclaimer.")
CHAT = [{"role": "user", "content": "Repeat this text exactly:\n\n" + PASSAGE}]


@pytest.fixture(scope="module")
def url(smollm2_dir):
    from transformers import AutoTokenizer

    from refengine.config import EngineConfig
    from worker.app import build_app
    from worker.backends import create_engine_client
    from worker.config import WorkerConfig

    spec = {"method": "suffix"}
    config = WorkerConfig(engine_config=EngineConfig(model=str(smollm2_dir), max_model_len=1024, num_kv_blocks=128,
                                                     max_num_seqs=8, dtype="float32", speculative_config=spec),
                          served_model_name=("smol",), speculative_config=spec)
    app = build_app(config, create_engine_client(config), AutoTokenizer.from_pretrained(smollm2_dir))
    with ServerThread(app, startup_timeout=600) as srv:
        yield srv.url


def chat(url, **body):
    body = {"model": "smol", "messages": CHAT, "max_tokens": 48, "temperature": 0, **body}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return parse_sse(r.text)[:-1] if body.get("stream") else r.json()


def spec_counts(url):
    text = httpx.get(url + "/metrics", timeout=30).text
    return {name: float(re.search(rf"^vllm:spec_decode_{name}_total{{[^}}]*}} (\S+)$", text, re.M).group(1))
            for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")}, text


@pytest.mark.slow
@pytest.mark.model
def test_same_greedy_text_fewer_chunks_and_vllm_metrics(url):
    off = chat(url, speculative=False)["choices"][0]["message"]["content"]
    before, _ = spec_counts(url)
    events = chat(url, stream=True, stream_options={"include_usage": True})
    after, text = spec_counts(url)
    chunks = [e for e in events if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert "".join(e["choices"][0]["delta"]["content"] for e in chunks) == off
    assert events[-1]["usage"]["completion_tokens"] == 48
    assert len(chunks) < 40                                # several tokens per chunk
    assert after["num_accepted_tokens"] > before["num_accepted_tokens"]
    assert after["num_draft_tokens"] >= after["num_accepted_tokens"] and after["num_drafts"] > before["num_drafts"]
    assert 'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="smol",position="0"}' in text


@pytest.mark.slow
@pytest.mark.model
def test_a_migrated_stream_resumes_with_drafting(url):
    full = chat(url, return_token_ids=True)["choices"][0]
    ids = full["token_ids"]
    before, _ = spec_counts(url)
    rest = chat(url, continuation_token_ids=ids[:10], return_token_ids=True)["choices"][0]
    after, _ = spec_counts(url)
    assert ids[:10] + rest["token_ids"] == ids
    assert after["num_accepted_tokens"] > before["num_accepted_tokens"]


def test_the_field_reaches_the_engine_and_what_cannot_be_honoured_is_refused(client_for):
    client, engine = client_for(speculative_config={"method": "suffix"})
    body = {"model": "fake-model", "prompt": "Hi", "max_tokens": 4}
    for value in (True, False, None):
        assert client.post("/v1/completions", json={**body, "speculative": value}).status_code == 200
        assert list(engine.requests.values())[-1][1].speculative is value
    assert client.post("/v1/completions", json={**body, "speculative": "maybe"}).status_code == 400
    plain, _ = client_for()
    r = plain.post("/v1/completions", json={**body, "speculative": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "speculative"
    assert plain.post("/v1/completions", json={**body, "speculative": False}).status_code == 200
    # vLLM drafts for every request of a speculating engine: opting one out is refused, not ignored
    from types import SimpleNamespace

    from refengine.config import EngineConfig
    from worker.config import WorkerConfig
    from worker.errors import APIError
    from worker.api.completions.protocol import CompletionRequest
    from worker.serving import ServingState

    state = SimpleNamespace(config=WorkerConfig(EngineConfig(model="/m"), engine="vllm",
                                                speculative_config={"method": "ngram"}))
    with pytest.raises(APIError, match="vLLM drafts for every request"):
        ServingState.check_speculative(state, CompletionRequest(prompt="Hi", speculative=False))
    ServingState.check_speculative(state, CompletionRequest(prompt="Hi", speculative=True))
