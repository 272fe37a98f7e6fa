"""/v1/completions with the fake engine: response shapes, SSE framing, usage, n>1,
batches, echo, stop strings / stop tokens / EOS, logprobs, parameter conversion."""

import pytest
from worker_test_fakes import EOS, FakeEngineClient, byte_tokens, make_tokenizer, parse_sse

CMPL = "/v1/completions"


def post(client, **body):
    body.setdefault("model", "fake-model")
    return client.post(CMPL, json=body)


def chunks_of(r):
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(r.text)
    assert events[-1] == "[DONE]" and "[DONE]" not in events[:-1]
    return events[:-1]


def enc(text):
    return make_tokenizer().encode(text, add_special_tokens=False)


def test_non_streaming_shape_and_usage(client):
    r = post(client, prompt="Hello", max_tokens=5)
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {"id", "object", "created", "model", "choices", "usage", "system_fingerprint"}
    assert body["id"].startswith("cmpl-") and len(body["id"]) > 10
    assert body["object"] == "text_completion" and body["model"] == "fake-model"
    (choice,) = body["choices"]
    assert set(choice) == {"index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_logprobs"}
    reply = enc(" Hello world, this is a test.")
    assert choice["text"] == make_tokenizer().decode(reply[:5])
    assert choice["finish_reason"] == "length" and choice["logprobs"] is None
    assert body["usage"] == {"prompt_tokens": len(enc("Hello")), "completion_tokens": 5,
                             "total_tokens": len(enc("Hello")) + 5}


def test_ids_are_unique(client):
    ids = {post(client, prompt="x", max_tokens=1).json()["id"] for _ in range(5)}
    assert len(ids) == 5


def test_default_max_tokens_is_16_and_null_means_rest_of_context(client_for):
    client, engine = client_for(FakeEngineClient(max_model_len=64))
    assert post(client, prompt="Hello").json()["usage"]["completion_tokens"] == 16
    body = post(client, prompt="Hello", max_tokens=None).json()
    assert body["usage"]["completion_tokens"] == 64 - len(enc("Hello"))
    assert body["choices"][0]["finish_reason"] == "length"


def test_streaming_format_matches_non_streaming(client):
    full = post(client, prompt="Hello", max_tokens=7).json()
    events = chunks_of(post(client, prompt="Hello", max_tokens=7, stream=True))
    assert all(set(e) == {"id", "object", "created", "model", "choices"} for e in events)   # no usage key
    assert len({e["id"] for e in events}) == 1 and events[0]["id"].startswith("cmpl-")
    assert all(e["object"] == "text_completion" for e in events)
    assert "".join(e["choices"][0]["text"] for e in events) == full["choices"][0]["text"]
    assert [e["choices"][0]["finish_reason"] for e in events] == [None] * (len(events) - 1) + ["length"]


def test_include_usage_and_continuous_usage(client):
    events = chunks_of(post(client, prompt="Hello", max_tokens=4, stream=True,
                            stream_options={"include_usage": True}))
    *body, last = events
    assert all(e["usage"] is None for e in body)
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 4
    assert last["usage"]["total_tokens"] == last["usage"]["prompt_tokens"] + 4
    events = chunks_of(post(client, prompt="Hello", max_tokens=4, stream=True,
                            stream_options={"include_usage": True, "continuous_usage_stats": True}))
    counts = [e["usage"]["completion_tokens"] for e in events[:-1]]
    assert counts == sorted(counts) and counts[-1] == 4


def test_n_fans_out_with_distinct_seeds(client_for):
    client, engine = client_for()
    body = post(client, prompt="Hello", max_tokens=3, n=3, seed=7).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert body["usage"] == {"prompt_tokens": len(enc("Hello")), "completion_tokens": 9,
                             "total_tokens": len(enc("Hello")) + 9}
    seeds = sorted(p.seed for _, p in engine.requests.values())
    assert seeds == [7, 8, 9]
    assert len(engine.requests) == 3


def test_n_streaming_ends_every_choice(client):
    events = chunks_of(post(client, prompt="Hello", max_tokens=3, n=2, stream=True))
    finished = sorted(e["choices"][0]["index"] for e in events if e["choices"][0]["finish_reason"])
    assert finished == [0, 1]


def echo_engine():
    return FakeEngineClient(lambda prompt, _params: prompt)   # replies with its own prompt, cycled


def test_batch_of_text_prompts_with_n(client_for):
    client, _ = client_for(echo_engine())
    prompts = ["Hello world", "The capital of France"]
    lens = [len(enc(p)) for p in prompts]
    body = post(client, prompt=prompts, max_tokens=min(lens), n=2).json()
    texts = {c["index"]: c["text"] for c in body["choices"]}
    tok = make_tokenizer()
    for p_idx, p in enumerate(prompts):
        for i in range(2):
            assert texts[p_idx * 2 + i] == tok.decode(enc(p)[:min(lens)])
    assert body["usage"]["prompt_tokens"] == sum(lens)
    assert body["usage"]["completion_tokens"] == 4 * min(lens)


@pytest.mark.parametrize("prompt", [[5, 6, 7], [[5, 6, 7], [8, 9]]])
def test_token_id_prompts(client_for, prompt):
    client, engine = client_for(echo_engine())
    body = post(client, prompt=prompt, max_tokens=2).json()
    groups = prompt if isinstance(prompt[0], list) else [prompt]
    assert sorted(p for p, _ in engine.requests.values()) == sorted(groups)
    assert body["usage"]["prompt_tokens"] == sum(map(len, groups))


def test_echo(client):
    body = post(client, prompt="Hello", max_tokens=2, echo=True).json()
    assert body["choices"][0]["text"].startswith("Hello") and len(body["choices"][0]["text"]) > 5
    events = chunks_of(post(client, prompt="Hello", max_tokens=2, echo=True, stream=True))
    assert events[0]["choices"][0]["text"] == "Hello"
    assert "".join(e["choices"][0]["text"] for e in events) == body["choices"][0]["text"]


def test_truncate_prompt_tokens(client_for):
    client, engine = client_for()
    post(client, prompt=list(range(10, 30)), max_tokens=1, truncate_prompt_tokens=5)
    (prompt, _), = engine.requests.values()
    assert prompt == list(range(25, 30))


SCRIPT = " Hello world, STOP here and more text after the stop."


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_across_tokens_aborts_the_engine(client_for, stream):
    ids = enc(SCRIPT)
    client, engine = client_for(FakeEngineClient(ids))
    r = post(client, prompt="x", max_tokens=50, stop=["STOP"], stream=stream)
    if stream:
        events = chunks_of(r)
        text = "".join(e["choices"][0]["text"] for e in events)
        final = events[-1]["choices"][0]
        assert all("S" not in e["choices"][0]["text"] for e in events)   # never a piece of the stop string
    else:
        final = r.json()["choices"][0]
        text = final["text"]
    assert text == " Hello world, "
    assert final["finish_reason"] == "stop" and final["stop_reason"] == "STOP"
    (rid,) = engine.requests
    assert rid in engine.aborted and rid in engine.abort_calls and not engine.active


def test_stop_string_include_in_output_and_usage(client_for):
    client, engine = client_for(FakeEngineClient(enc(SCRIPT)))
    body = post(client, prompt="x", max_tokens=50, stop="STOP", include_stop_str_in_output=True).json()
    assert body["choices"][0]["text"] == " Hello world, STOP"
    consumed = len(enc(" Hello world, STOP"))
    assert consumed <= body["usage"]["completion_tokens"] < len(enc(SCRIPT))


def test_stop_token_ids_excluded_from_text(client_for):
    ids = enc(" Hello world")
    client, engine = client_for(FakeEngineClient(ids))
    body = post(client, prompt="x", max_tokens=50, stop_token_ids=[ids[-1]], skip_special_tokens=False).json()
    c = body["choices"][0]
    assert c["finish_reason"] == "stop" and c["stop_reason"] == ids[-1]
    assert c["text"] == make_tokenizer().decode(ids[:-1])
    assert body["usage"]["completion_tokens"] == len(ids)
    body = post(client, prompt="x", max_tokens=50, stop_token_ids=[ids[-1]], include_stop_str_in_output=True).json()
    assert body["choices"][0]["text"] == " Hello world"


def test_eos_ends_with_stop_and_is_not_text(client_for):
    ids = enc(" Hello") + [EOS]
    client, _ = client_for(FakeEngineClient(ids))
    body = post(client, prompt="x", max_tokens=50, skip_special_tokens=False).json()
    c = body["choices"][0]
    assert (c["text"], c["finish_reason"], c["stop_reason"]) == (" Hello", "stop", None)
    assert body["usage"]["completion_tokens"] == len(ids)
    body = post(client, prompt="x", max_tokens=6, ignore_eos=True).json()
    assert body["choices"][0]["finish_reason"] == "length"


def test_multibyte_stream_never_splits_characters(client_for):
    tok = make_tokenizer()
    client, _ = client_for(FakeEngineClient(byte_tokens(tok, "日本語 🎉 é")))
    n = len("日本語 🎉 é".encode())
    events = chunks_of(post(client, prompt="x", max_tokens=n, stream=True))
    pieces = [e["choices"][0]["text"] for e in events]
    assert "".join(pieces) == "日本語 🎉 é"
    assert all("\ufffd" not in p for p in pieces)
    assert "日" in pieces and "🎉" in pieces


def test_logprobs_format(client):
    tok = make_tokenizer()
    body = post(client, prompt="Hello", max_tokens=4, logprobs=2).json()
    lp = body["choices"][0]["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert len(lp["tokens"]) == 4 and lp["token_logprobs"] == [-0.25] * 4
    assert lp["tokens"] == [tok.decode([t]) for t in enc(" Hello world, this is a test.")[:4]]
    offsets = [0]
    for t in lp["tokens"][:-1]:
        offsets.append(offsets[-1] + len(t))
    assert lp["text_offset"] == offsets
    for tok_s, top in zip(lp["tokens"], lp["top_logprobs"], strict=True):
        assert tok_s in top and 1 <= len(top) <= 3
    events = chunks_of(post(client, prompt="Hello", max_tokens=4, logprobs=2, stream=True))
    streamed = [t for e in events if e["choices"][0]["logprobs"] for t in e["choices"][0]["logprobs"]["tokens"]]
    assert streamed == lp["tokens"]


def test_logprobs_zero_returns_the_sampled_token_only(client):
    lp = post(client, prompt="Hello", max_tokens=2, logprobs=0).json()["choices"][0]["logprobs"]
    assert all(list(top) == [t] for t, top in zip(lp["tokens"], lp["top_logprobs"], strict=True))


def test_sampling_params_conversion(client_for):
    client, engine = client_for()
    post(client, prompt="Hello", max_tokens=5, temperature=0.5, top_p=0.9, top_k=-1, min_p=0.1, seed=3,
         presence_penalty=0.5, frequency_penalty=-0.5, repetition_penalty=1.2, stop=["a", "b"],
         stop_token_ids=[7], ignore_eos=True, min_tokens=2, logprobs=3, include_stop_str_in_output=True)
    (_, p), = engine.requests.values()
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.min_p, p.seed) == (5, 0.5, 0.9, 0, 0.1, 3)
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.5, -0.5, 1.2)
    assert (p.stop, p.stop_token_ids, p.ignore_eos, p.min_tokens, p.logprobs) == (("a", "b"), (7,), True, 2, 3)
    assert p.include_stop_str_in_output is True
    engine.requests.clear()
    post(client, prompt="Hello", max_tokens=5, top_k=40, temperature=0)
    (_, p), = engine.requests.values()
    assert p.top_k == 40 and p.greedy and p.logprobs is None and p.stop == ()
