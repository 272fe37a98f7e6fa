"""/v1/chat/completions with the fake engine: template rendering, shapes, SSE, logprobs."""

import pytest
from worker_test_fakes import FakeEngineClient, make_tokenizer, parse_sse

CHAT = "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]


def post(client, **body):
    body.setdefault("model", "fake-model")
    body.setdefault("messages", MSG)
    return client.post(CHAT, json=body)


def rendered_ids(messages, **kw):
    tok = make_tokenizer()
    kw.setdefault("add_generation_prompt", True)
    text = tok.apply_chat_template(messages, tokenize=False, **kw)
    return tok.encode(text, add_special_tokens=False)


def the_prompt(engine):
    (prompt, params), = engine.requests.values()
    return prompt, params


def test_non_streaming_shape(client_for):
    client, engine = client_for()
    body = post(client, max_tokens=4).json()
    assert set(body) == {"id", "object", "created", "model", "choices", "usage", "system_fingerprint",
                         "prompt_logprobs"}
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    (c,) = body["choices"]
    assert set(c) == {"index", "message", "logprobs", "finish_reason", "stop_reason"}
    assert c["message"]["role"] == "assistant" and isinstance(c["message"]["content"], str)
    assert c["message"]["content"] and c["finish_reason"] == "length"
    prompt, _ = the_prompt(engine)
    assert prompt == rendered_ids(MSG)
    assert body["usage"] == {"prompt_tokens": len(prompt), "completion_tokens": 4, "total_tokens": len(prompt) + 4}


def test_default_max_tokens_is_rest_of_context_and_max_completion_tokens_wins(client_for):
    client, engine = client_for()
    post(client)
    prompt, params = the_prompt(engine)
    assert params.max_tokens == 256 - len(prompt)
    engine.requests.clear()
    post(client, max_tokens=9, max_completion_tokens=3)
    assert the_prompt(engine)[1].max_tokens == 3


def test_streaming_chunks(client):
    full = post(client, max_tokens=6).json()
    r = post(client, max_tokens=6, stream=True, stream_options={"include_usage": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(r.text)
    assert events[-1] == "[DONE]"
    *chunks, usage = events[:-1]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(e["object"] == "chat.completion.chunk" and e["id"].startswith("chatcmpl-") for e in chunks)
    assert len({e["id"] for e in events[:-1]}) == 1
    assert all("role" not in e["choices"][0]["delta"] for e in chunks[1:])
    assert all(e["usage"] is None for e in chunks)
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in chunks)
    assert text == full["choices"][0]["message"]["content"]
    assert [e["choices"][0]["finish_reason"] for e in chunks] == [None] * (len(chunks) - 1) + ["length"]
    assert usage["choices"] == [] and usage["usage"] == full["usage"]


def test_n_streaming_has_a_role_chunk_and_a_finish_per_choice(client):
    events = parse_sse(post(client, max_tokens=3, n=2, stream=True).text)[:-1]
    roles = [e["choices"][0]["index"] for e in events if e["choices"][0]["delta"].get("role")]
    finishes = [e["choices"][0]["index"] for e in events if e["choices"][0]["finish_reason"]]
    assert sorted(roles) == [0, 1] and sorted(finishes) == [0, 1]
    body = post(client, max_tokens=3, n=2).json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    assert body["usage"]["completion_tokens"] == 6


def test_logprobs(client):
    body = post(client, max_tokens=3, logprobs=True, top_logprobs=2).json()
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == 3
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert entry["bytes"] == list(entry["token"].encode())
        assert len(entry["top_logprobs"]) == 2
        assert all(set(t) == {"token", "logprob", "bytes"} for t in entry["top_logprobs"])
    assert post(client, max_tokens=2).json()["choices"][0]["logprobs"] is None
    no_top = post(client, max_tokens=2, logprobs=True).json()["choices"][0]["logprobs"]["content"]
    assert all(e["top_logprobs"] == [] for e in no_top)
    events = parse_sse(post(client, max_tokens=3, logprobs=True, top_logprobs=2, stream=True).text)[:-1]
    streamed = [t["token"] for e in events if e["choices"][0]["logprobs"]
                for t in e["choices"][0]["logprobs"]["content"]]
    assert streamed == [e["token"] for e in content]


def test_content_parts_and_extra_message_fields(client_for):
    client, engine = client_for()
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "name": "bob", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert post(client, messages=msgs, max_tokens=1).status_code == 200
    expected = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "a\nb"}]
    assert the_prompt(engine)[0] == rendered_ids(expected)


def test_continue_final_message_and_no_generation_prompt(client_for):
    client, engine = client_for()
    msgs = MSG + [{"role": "assistant", "content": "Hello there"}]
    r = post(client, messages=msgs, add_generation_prompt=False, continue_final_message=True, max_tokens=1)
    assert r.status_code == 200, r.text
    prompt = the_prompt(engine)[0]
    assert prompt == rendered_ids(msgs, add_generation_prompt=False, continue_final_message=True)
    assert make_tokenizer().decode(prompt).endswith("Hello there")


def test_custom_template_and_kwargs(client_for):
    tmpl = "{{ greeting }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    client, engine = client_for()               # by default a request's template is refused
    r = post(client, chat_template=tmpl, max_tokens=1)
    assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template" and not engine.requests
    client, engine = client_for(trust_request_chat_template=True)
    r = post(client, chat_template=tmpl, chat_template_kwargs={"greeting": "Hello "}, max_tokens=1)
    assert r.status_code == 200, r.text
    assert the_prompt(engine)[0] == make_tokenizer().encode("Hello hi", add_special_tokens=False)
    r = post(client, chat_template="{{ messages[0]['content'] | nosuchfilter }}", max_tokens=1)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


def test_message_content_is_data_not_template(client_for):
    client, engine = client_for()
    r = post(client, messages=[{"role": "user", "content": "{{ 7 * 7 }} {% raw %}"}], max_tokens=1)
    assert r.status_code == 200, r.text
    assert "{{ 7 * 7 }} {% raw %}" in make_tokenizer().decode(the_prompt(engine)[0])


def test_stop_string_in_chat(client_for):
    ids = make_tokenizer().encode(" Sure. STOP now", add_special_tokens=False)
    client, engine = client_for(FakeEngineClient(ids))
    c = post(client, stop="STOP", max_tokens=30).json()["choices"][0]
    assert (c["message"]["content"], c["finish_reason"], c["stop_reason"]) == (" Sure. ", "stop", "STOP")
    assert not engine.active


@pytest.mark.parametrize("tool_choice", ["none", "auto"])
def test_harmless_tool_fields_are_accepted(client, tool_choice):
    assert post(client, max_tokens=1, tool_choice=tool_choice, parallel_tool_calls=False).status_code == 200
