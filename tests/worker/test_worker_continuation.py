"""``return_token_ids`` and ``continuation_token_ids`` (worker.continuation) with the fake engine.

The fake engine's script resumes its reply after whatever part of it ends the prompt, like a
greedy model would; so a stream cut after any chunk and resumed with the ids sent so far
must join into the uninterrupted text, with a split multi-byte character or a pending stop
prefix coming out once, on the resuming side."""

import pytest
from worker_test_fakes import EOS, FakeEngineClient, byte_tokens, make_tokenizer, parse_sse

REPLY_TEXT = " héllo wörld café, the end"


CALL_TEXT = '<tool_call>[{"name": "f", "arguments": {"x": "é"}}, {"name": "f", "arguments": {"x": "b"}}]</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def reply(text=REPLY_TEXT):
    return byte_tokens(make_tokenizer(), text)       # one token per byte: characters split over tokens


def resuming_with(text):
    def script(prompt, _params):
        r = reply(text)
        for k in range(len(r), 0, -1):
            if prompt[-k:] == r[:k]:
                return r[k:] + [EOS]
        return r + [EOS]
    return script


resuming = resuming_with(REPLY_TEXT)


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
                                         ({"n": 2}, "continuation_token_ids")])
def test_continuations_that_cannot_resume_exactly_are_refused(client, extra, param):
    body = {"model": "fake-model", "prompt": "Hi", "max_tokens": 10, "continuation_token_ids": [5], **extra}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_tools_continuation_needs_a_stream(client):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    r = client.post("/v1/chat/completions", json={"model": "fake-model", "messages": [{"role": "user", "content": "Hi"}],
                                                  "max_tokens": 10, "continuation_token_ids": [5], "tools": tools})
    assert r.status_code == 400 and "stream" in r.json()["error"]["message"]


def test_an_engine_that_cannot_rebuild_a_grammar_refuses_constrained_continuations(client_for):
    engine = FakeEngineClient(resuming)
    engine.constrained_continuation_refusal = "cannot advance a grammar"
    engine.max_model_len = 4096             # the tools' system prompt
    client, _ = client_for(engine)
    base = {"model": "fake-model", "prompt": "Hi", "max_tokens": 10, "continuation_token_ids": [5]}
    r = client.post("/v1/completions", json={**base, "response_format": {"type": "json_object"}})
    assert r.status_code == 400 and r.json()["error"]["message"] == "cannot advance a grammar", r.text
    assert r.json()["error"]["param"] == "continuation_token_ids"
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    chat = {"model": "fake-model", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 10,
            "continuation_token_ids": [5], "stream": True, "tools": tools}
    assert client.post("/v1/chat/completions", json={**chat, "tool_choice": "required"}).status_code == 400
    r = client.post("/v1/chat/completions", json=chat)
    assert r.status_code == 200, r.text             # auto: no grammar to rebuild
    assert client.post("/v1/completions", json=base).status_code == 200


def chat_view(events):
    """What a chat client makes of chunks: content, tool calls [(id, name, arguments)], finishes."""
    content, calls, finishes = "", {}, []
    for e in events:
        for c in e["choices"]:
            content += c["delta"].get("content") or ""
            for tc in c["delta"].get("tool_calls") or ():
                call = calls.setdefault(tc["index"], ["", "", ""])
                call[0] += tc.get("id", "")
                call[1] += tc.get("function", {}).get("name") or ""
                call[2] += tc.get("function", {}).get("arguments") or ""
            if c["finish_reason"]:
                finishes.append(c["finish_reason"])
    return content, [tuple(calls[i]) for i in sorted(calls)], finishes


@pytest.mark.parametrize("text", [CALL_TEXT, "<tool_ca no call, prose", "  plain prose"])
def test_a_tool_stream_resumed_after_any_chunk_holds_and_releases_as_the_first_worker_did(client_for, text):
    engine = FakeEngineClient(resuming_with(text))
    engine.max_model_len = 4096                     # the tools' system prompt
    client, _ = client_for(engine)
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 200, "tools": TOOLS}
    _, full = stream(client, "/v1/chat/completions", **body)
    content, calls, finishes = chat_view(full)
    if text == CALL_TEXT:
        assert content == "" and [c[1:] for c in calls] == [("f", '{"x": "é"}'), ("f", '{"x": "b"}')]
        assert finishes == ["tool_calls"]
    else:
        assert content == text and calls == [] and finishes == ["stop"]
    chunks = [e for e in full if e["choices"]]
    # up to the final burst (calls and finish): a gateway does not resume a stream cut inside it
    burst = next(k for k, e in enumerate(chunks) if "tool_calls" in e["choices"][0]["delta"]
                 or e["choices"][0]["finish_reason"])
    assert burst > len(reply(text)) // 2
    for cut in range(1, burst + 1):
        sent = chunks[:cut]
        done = [t for e in sent for t in e["choices"][0]["token_ids"]]
        if not done:
            continue
        _, rest = stream(client, "/v1/chat/completions", continuation_token_ids=done, **body)
        got = chat_view(sent + [e for e in rest if e["choices"]])
        assert got[0] == content and [c[1:] for c in got[1]] == [c[1:] for c in calls] and got[2] == finishes, cut
        assert all(c[0].startswith("call_") for c in got[1])
        assert rest[-1]["usage"] == full[-1]["usage"]
