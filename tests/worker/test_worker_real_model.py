"""The worker over the real reference engine and SmolLM2's tokenizer (slow: loads the model).

Checks what the fake engine cannot: real greedy output, streamed and whole
responses agree, multi-byte text streams as whole characters and matches the
tokens' bytes, stop strings cut the real output and free the engine, seeds
reproduce, metrics carry the engine's KV figures, and the openai SDK works."""

import time

import httpx
import openai
import pytest
from worker_test_fakes import ServerThread, parse_sse

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.model]


@pytest.fixture(scope="module")
def url(smollm2_dir):
    from transformers import AutoTokenizer

    from refengine.config import EngineConfig
    from worker.app import build_app
    from worker.backends import create_engine_client
    from worker.config import WorkerConfig

    config = WorkerConfig(engine_config=EngineConfig(model=str(smollm2_dir), max_model_len=512, num_kv_blocks=128,
                                                     max_num_seqs=8),
                          served_model_name=("smol",))
    app = build_app(config, create_engine_client(config), AutoTokenizer.from_pretrained(smollm2_dir))
    with ServerThread(app, startup_timeout=600) as srv:
        yield srv.url


def post(url, path, **body):
    body.setdefault("model", "smol")
    body.setdefault("temperature", 0)
    r = httpx.post(url + path, json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json() if not body.get("stream") else parse_sse(r.text)


PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Say hello in Japanese, then in Chinese."}]


@pytest.fixture(scope="module")
def greedy(url):
    return post(url, "/v1/completions", prompt=PROMPT, max_tokens=24)["choices"][0]


def test_greedy_completion_and_stream_agree(url, greedy):
    assert greedy["text"].startswith(" Paris") and greedy["finish_reason"] == "length"
    events = post(url, "/v1/completions", prompt=PROMPT, max_tokens=24, stream=True)
    assert events[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == greedy["text"]


def test_multibyte_chat_streams_whole_characters(url):
    whole = post(url, "/v1/chat/completions", messages=CHAT, max_tokens=40, logprobs=True)
    choice = whole["choices"][0]
    toks = choice["logprobs"]["content"]
    if choice["finish_reason"] == "stop":
        toks = toks[:-1]                          # the EOS token is not part of the text
    assert bytes(b for t in toks for b in t["bytes"]).decode("utf-8", errors="replace") == choice["message"]["content"]
    events = post(url, "/v1/chat/completions", messages=CHAT, max_tokens=40, stream=True)[:-1]
    pieces = [e["choices"][0]["delta"].get("content", "") for e in events]
    assert "".join(pieces) == choice["message"]["content"]
    if any(ord(ch) > 127 for ch in choice["message"]["content"]):
        assert all("\ufffd" not in p for p in pieces)


def test_stop_string_cuts_real_output_and_frees_the_engine(url, greedy):
    text = greedy["text"]
    k = next(i for i in range(8, len(text) - 3) if text.find(text[i:i + 3]) == i and text[i:i + 3].strip())
    stop = text[k:k + 3]
    body = post(url, "/v1/completions", prompt=PROMPT, max_tokens=24, stop=[stop])
    c = body["choices"][0]
    assert (c["text"], c["finish_reason"], c["stop_reason"]) == (text[:k], "stop", stop)
    assert body["usage"]["completion_tokens"] < 24
    deadline = time.monotonic() + 10
    while httpx.get(url + "/load").json()["running"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert httpx.get(url + "/load").json()["running"] == 0


def test_seeded_sampling_reproduces(url):
    kw = dict(prompt=PROMPT, max_tokens=12, n=2, temperature=1.0, seed=1234)
    a = [c["text"] for c in post(url, "/v1/completions", **kw)["choices"]]
    b = [c["text"] for c in post(url, "/v1/completions", **kw)["choices"]]
    assert a == b


def test_metrics_carry_engine_kv_figures(url, greedy):
    text = httpx.get(url + "/metrics").text
    assert 'vllm:kv_cache_usage_perc{engine="0",model_name="smol"}' in text
    per_token = [line for line in text.splitlines() if line.startswith("swiftserve_worker_kv_bytes_per_token{")]
    assert per_token and float(per_token[0].split()[-1]) > 0
    assert 'vllm:request_success_total{engine="0",finished_reason="length",model_name="smol"}' in text


def test_openai_sdk_against_the_real_engine(url):
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
    r = client.chat.completions.create(model="smol", messages=CHAT, max_tokens=8, temperature=0)
    assert r.choices[0].message.content and r.usage.completion_tokens <= 8
    assert client.models.list().data[0].max_model_len == 512
