"""Scoring on /v1/completions and /v1/chat/completions with the fake engine: echo with and
without logprobs (prompt entries first, the first null), max_tokens 0, batched prompts,
vLLM's prompt_logprobs shape, and logit_bias reaching the engine's parameters."""

import pytest
from worker_test_fakes import FakeEngineClient, make_tokenizer, parse_sse

CMPL, CHAT = "/v1/completions", "/v1/chat/completions"


def post(client, path=CMPL, **body):
    body.setdefault("model", "fake-model")
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json() if not body.get("stream") else parse_sse(r.text)[:-1]


def enc(text):
    return make_tokenizer().encode(text, add_special_tokens=False)


def text_of(tid):
    return make_tokenizer().decode([tid])


@pytest.fixture
def client(client_for):
    c, _ = client_for(FakeEngineClient(enc(" Paris is nice.")))
    return c


def test_echo_with_logprobs_puts_the_prompt_first(client):
    prompt = "The capital of France is"
    ids = enc(prompt)
    (c,) = post(client, prompt=prompt, max_tokens=2, echo=True, logprobs=2, temperature=0)["choices"]
    lp = c["logprobs"]
    assert c["text"] == prompt + make_tokenizer().decode(enc(" Paris is nice.")[:2])
    assert lp["tokens"] == [text_of(t) for t in ids + enc(" Paris is nice.")[:2]]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["token_logprobs"][1:] == [-0.25] * (len(ids) + 1)
    assert all(len(d) <= 3 and text_of(t) in d for d, t in zip(lp["top_logprobs"][1:], ids[1:]))
    offsets = [0]
    for tok in lp["tokens"][:-1]:
        offsets.append(offsets[-1] + len(tok))
    assert lp["text_offset"] == offsets
    assert c["prompt_logprobs"] is None


def test_echo_max_tokens_zero_scores_only(client_for):
    client, engine = client_for(FakeEngineClient(enc(" Paris is nice.")))
    body = post(client, prompt=["one two", "three"], max_tokens=0, echo=True, logprobs=0)
    texts = [c["text"] for c in body["choices"]]
    assert texts == ["one two", "three"]
    for c, p in zip(body["choices"], ["one two", "three"]):
        assert c["finish_reason"] == "length"
        assert len(c["logprobs"]["tokens"]) == len(enc(p))          # prompt only: the sampled token is dropped
    assert body["usage"]["completion_tokens"] == 0
    assert {params.max_tokens for _, params in engine.requests.values()} == {1}
    assert {params.prompt_logprobs for _, params in engine.requests.values()} == {0}


def test_token_id_batches_and_prompt_logprobs_shape(client_for):
    client, engine = client_for(FakeEngineClient(enc(" Paris")))
    body = post(client, prompt=[[5, 6, 7], [8, 9]], max_tokens=1, prompt_logprobs=1)
    for c, ids in zip(body["choices"], [[5, 6, 7], [8, 9]]):
        plp = c["prompt_logprobs"]
        assert plp[0] is None and len(plp) == len(ids)
        for entry, t in zip(plp[1:], ids[1:]):
            assert entry[str(t)] == {"logprob": -0.25, "rank": None, "decoded_token": text_of(t)}
            assert len(entry) <= 2
        assert c["logprobs"] is None                          # prompt_logprobs alone leaves logprobs off
    # echo with logprobs 3 and prompt_logprobs 1: the engine computes 3; each output keeps its own k
    body = post(client, prompt=[5, 6, 7], max_tokens=1, prompt_logprobs=1, echo=True, logprobs=3)
    (c,) = body["choices"]
    assert all(len(e) <= 2 for e in c["prompt_logprobs"][1:])
    assert max(len(d) for d in c["logprobs"]["top_logprobs"][1:]) == 3      # the fake's top-3 holds the token
    assert [p.prompt_logprobs for _, p in engine.requests.values()][-1] == 3


def test_streamed_echo_with_logprobs(client):
    whole = post(client, prompt="Hello world", max_tokens=3, echo=True, logprobs=1)["choices"][0]
    events = post(client, prompt="Hello world", max_tokens=3, echo=True, logprobs=1, stream=True)
    first = events[0]["choices"][0]
    assert first["text"] == "Hello world" and first["logprobs"]["token_logprobs"][0] is None
    assert "".join(e["choices"][0]["text"] for e in events) == whole["text"]
    merged = [t for e in events for t in (e["choices"][0]["logprobs"] or {}).get("tokens", [])]
    assert merged == whole["logprobs"]["tokens"]
    offsets = [o for e in events for o in (e["choices"][0]["logprobs"] or {}).get("text_offset", [])]
    assert offsets == whole["logprobs"]["text_offset"]


def test_chat_prompt_logprobs_and_logit_bias(client_for):
    client, engine = client_for()
    body = post(client, CHAT, messages=[{"role": "user", "content": "hi"}], max_tokens=2, prompt_logprobs=2,
                logit_bias={"7": 5, "3": -100})
    (prompt, params), = engine.requests.values()
    assert params.logit_bias == ((3, -100.0), (7, 5.0)) and params.prompt_logprobs == 2
    assert body["prompt_logprobs"][0] is None and len(body["prompt_logprobs"]) == len(prompt)
    assert str(prompt[1]) in body["prompt_logprobs"][1]


def test_engine_without_prompt_logprobs_refuses_clearly(client_for):
    engine = FakeEngineClient()
    engine.prompt_logprobs_refusal = "no prompt logprobs here (SwiftKV fast prefill)"
    client, _ = client_for(engine)
    r = client.post(CMPL, json={"model": "fake-model", "prompt": "x", "echo": True, "logprobs": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "echo"
    assert "SwiftKV" in r.json()["error"]["message"]
    r = client.post(CHAT, json={"model": "fake-model", "messages": [{"role": "user", "content": "x"}],
                                "prompt_logprobs": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_logprobs"
    assert post(client, prompt="x", echo=True, max_tokens=2)["choices"][0]["text"].startswith("x")
    assert not engine.requests or all(p.prompt_logprobs is None for _, p in engine.requests.values())
