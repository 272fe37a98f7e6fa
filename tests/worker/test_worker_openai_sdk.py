"""The official openai SDK (sync and async) parses our responses, streams and errors."""

import asyncio

import openai
import pytest
from worker_test_fakes import FakeEngineClient, make_tokenizer


@pytest.fixture
def sdk(serve):
    srv, engine = serve(FakeEngineClient(make_tokenizer().encode(" Hello world, STOP here.", add_special_tokens=False)))
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    yield client, srv, engine
    client.close()


def test_models(sdk):
    client, _, _ = sdk
    assert [m.id for m in client.models.list()] == ["fake-model"]


def test_completion(sdk):
    client, _, _ = sdk
    c = client.completions.create(model="fake-model", prompt="Hello", max_tokens=4, logprobs=1, n=2, seed=1)
    assert c.object == "text_completion" and len(c.choices) == 2
    assert c.choices[0].text == make_tokenizer().decode(
        make_tokenizer().encode(" Hello world, STOP here.", add_special_tokens=False)[:4])
    assert c.choices[0].finish_reason == "length"
    assert len(c.choices[0].logprobs.tokens) == 4
    assert c.usage.completion_tokens == 8 and c.usage.total_tokens == c.usage.prompt_tokens + 8


def test_completion_stream_with_usage(sdk):
    client, _, _ = sdk
    chunks = list(client.completions.create(model="fake-model", prompt="Hello", max_tokens=30, stop=["STOP"],
                                            stream=True, stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == " Hello world, "
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_chat(sdk):
    client, _, _ = sdk
    r = client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}],
                                       max_completion_tokens=5, logprobs=True, top_logprobs=2, temperature=0.7)
    assert r.object == "chat.completion"
    msg = r.choices[0].message
    assert msg.role == "assistant" and msg.content
    assert len(r.choices[0].logprobs.content) == 5
    assert len(r.choices[0].logprobs.content[0].top_logprobs) == 2
    assert r.usage.completion_tokens == 5


def test_chat_stream(sdk):
    client, _, _ = sdk
    full = client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=6)
    stream = client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=6, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].usage.total_tokens == full.usage.total_tokens


def test_errors_map_to_sdk_exceptions(sdk):
    client, _, _ = sdk
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="nope", prompt="x")
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "x"}],
                                       temperature=-1)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="fake-model", prompt="x", max_tokens=100000)


def test_async_client_stream(sdk):
    _, srv, _ = sdk

    async def run():
        async with openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0) as client:
            stream = await client.chat.completions.create(
                model="fake-model", messages=[{"role": "user", "content": "hi"}], max_tokens=4, n=2, stream=True)
            texts = {0: "", 1: ""}
            async for ch in stream:
                for c in ch.choices:
                    texts[c.index] += c.delta.content or ""
            return texts

    texts = asyncio.run(run())
    assert texts[0] and texts[0] == texts[1]
