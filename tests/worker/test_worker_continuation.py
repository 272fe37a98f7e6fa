"""``return_token_ids`` and ``continuation_token_ids`` (worker.continuation) with the fake engine.

The fake engine's script resumes its reply after whatever part of it ends the prompt, like a
greedy model would; so a stream cut after any chunk and resumed with the ids sent so far
must join into the uninterrupted text, with a split multi-byte character or a pending stop
prefix coming out once, on the resuming side."""

import pytest
from worker_test_fakes import EOS, FakeEngineClient, byte_tokens, make_tokenizer, parse_sse

REPLY_TEXT = " héllo wörld café, the end"


def reply():
    return byte_tokens(make_tokenizer(), REPLY_TEXT)       # one token per byte: characters split over tokens


def resuming(prompt, _params):
    r = reply()
    for k in range(len(r), 0, -1):
        if prompt[-k:] == r[:k]:
            return r[k:] + [EOS]
    return r + [EOS]


@pytest.fixture
def resumer(client_for):
    return client_for(FakeEngineClient(resuming))


def stream(client, path, **body):
    r = client.post(path, json={"model": "fake-model", "stream": True, "return_token_ids": True,
                                "stream_options": {"include_usage": True}, **body})
    assert r.status_code == 200, r.text
    return r, parse_sse(r.text)[:-1]


def text_of(ev, chat):
    c = ev["choices"][0]
    return (c["delta"].get("content") or "") if chat else c["text"]


@pytest.mark.parametrize("path,chat,base", [("/v1/completions", False, {"prompt": "Hi"}),
                                             ("/v1/chat/completions", True,
                                              {"messages": [{"role": "user", "content": "Hi"}]})])
def test_a_stream_resumed_after_any_chunk_joins_into_the_uninterrupted_one(resumer, path, chat, base):
    client, engine = resumer
    body = {**base, "max_tokens": 40, "stop": ["the end"]}
    _, full = stream(client, path, **body)
    chunks = [e for e in full if e["choices"]]
    whole = "".join(text_of(e, chat) for e in chunks)
    assert whole == " héllo wörld café, "
    ids = [t for e in chunks for t in e["choices"][0]["token_ids"]]
    assert ids == reply()[:len(ids)]
    for cut in range(1, len(chunks) - 1):
        sent = chunks[:cut]
        done = [t for e in sent for t in e["choices"][0]["token_ids"]]
        if not done:
            continue
        r, rest = stream(client, path, continuation_token_ids=done, **body)
        assert r.headers["x-swiftserve-continuation"] == str(len(done))
        assert not any("role" in e["choices"][0].get("delta", {}) for e in rest if e["choices"])
        joined = "".join(text_of(e, chat) for e in sent) + "".join(text_of(e, chat) for e in rest if e["choices"])
        assert joined == whole, cut
        assert rest[-1]["usage"] == full[-1]["usage"]          # the whole generation's usage
        finishes = [e["choices"][0]["finish_reason"] for e in rest if e["choices"]]
        assert finishes[-1] == "stop" and rest[-2]["choices"][0]["stop_reason"] == "the end"
    prompt, params = list(engine.requests.values())[-1]
    assert prompt[-len(done):] == done and params.max_tokens == 40 - len(done)


def test_non_streamed_continuation_and_token_ids(resumer):
    client, engine = resumer
    full = client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 11, "return_token_ids": True}).json()
    ids = full["choices"][0]["token_ids"]
    assert ids == reply()[:11]
    r = client.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 11, "continuation_token_ids": ids[:3]})
    body = r.json()
    assert r.headers["x-swiftserve-continuation"] == "3" and "token_ids" not in body["choices"][0]
    assert body["usage"]["completion_tokens"] == 11 and body["choices"][0]["finish_reason"] == "length"
    # ids[:3] end inside "é": its text comes out with the rest, on the resuming side
    assert body["choices"][0]["text"] == REPLY_TEXT.encode()[:11].decode()[2:]


@pytest.mark.parametrize("extra,param", [({"echo": True}, "continuation_token_ids"),
                                         ({"continuation_token_ids": [10**6]}, "continuation_token_ids"),
                                         ({"continuation_token_ids": [-1]}, "continuation_token_ids"),
                                         ({"prompt": ["a", "b"]}, "continuation_token_ids"),
                                         ({"response_format": {"type": "json_object"}}, "continuation_token_ids")])
def test_continuations_that_cannot_resume_exactly_are_refused(client, extra, param):
    body = {"model": "fake-model", "prompt": "Hi", "max_tokens": 10, "continuation_token_ids": [5], **extra}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
