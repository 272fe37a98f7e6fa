"""worker.api.driver.serve against a recording formatter: the contract every endpoint
relies on (call order, in-band failure, the admission slot released on every path),
without an endpoint's wire format in the way."""

from __future__ import annotations

import asyncio

import pytest

from refengine.config import EngineConfig
from refengine.sampling_params import SamplingParams
from worker.config import WorkerConfig
from worker.errors import APIError, bad_request
from worker.choices import ChoiceSpec
from worker.serving import ServingState
from worker.api.driver import serve
from worker_test_fakes import FakeEngineClient, make_tokenizer


class Recorder:
    """Writes what the driver calls; the stream is the pieces joined."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.text = ""

    def opening(self):
        self.calls.append("opening")
        yield "<"

    def stream_event(self, ev):
        self.calls.append("event")
        yield ev.text

    def closing(self):
        self.calls.append("closing")
        yield ">"

    def failed(self, err: APIError):
        self.calls.append("failed")
        yield f"!{err.status}"

    def add(self, ev) -> None:
        self.calls.append("add")
        self.text += ev.text

    def result(self):
        self.calls.append("result")
        return self.text


class Raw:
    """A request whose client never disconnects."""

    async def receive(self):
        await asyncio.Event().wait()


def _state(engine: FakeEngineClient) -> ServingState:
    cfg = WorkerConfig(engine_config=EngineConfig(model="/models/fake-model"), served_model_name=("m",))
    return ServingState(cfg, engine, make_tokenizer())


def _prepare(fmt, n: int = 1):
    async def prepare():
        return [ChoiceSpec(i, f"r-{i}", [5, 6, 7], SamplingParams(max_tokens=4)) for i in range(n)], fmt
    return prepare


async def _body(response) -> str:
    """Run a streaming response as ASGI and return its body."""
    sent: list[bytes] = []

    async def send(msg):
        if msg["type"] == "http.response.body":
            sent.append(msg.get("body", b""))

    await response({"type": "http", "asgi": {"spec_version": "2.4"}}, Raw().receive, send)
    return b"".join(sent).decode()


def _run(engine: FakeEngineClient, stream: bool, n: int = 1):
    async def go():
        await engine.start()
        state, fmt = _state(engine), Recorder()
        response = await serve(state, Raw(), stream, _prepare(fmt, n))
        out = await _body(response) if stream else response
        return out, fmt, state
    return asyncio.run(go())


def test_stream_calls_opening_events_closing_and_releases_the_slot():
    body, fmt, state = _run(FakeEngineClient([11, 12, 2]), stream=True)
    assert body.startswith("<") and body.endswith(">")
    assert fmt.calls[0] == "opening" and fmt.calls[-1] == "closing" and "event" in fmt.calls
    assert state.in_flight == 0 and not state.active


def test_stream_failure_after_the_first_byte_ends_in_band_and_aborts():
    engine = FakeEngineClient([11, 12, 13, 2], fail_after=1)
    body, fmt, state = _run(engine, stream=True, n=2)
    assert body.startswith("<") and body.endswith("!503")
    assert fmt.calls[-1] == "failed" and "closing" not in fmt.calls
    assert state.in_flight == 0 and not state.active


def test_whole_answer_folds_every_event_then_asks_for_the_result():
    out, fmt, state = _run(FakeEngineClient([11, 12, 2]), stream=False)
    assert out == fmt.text and fmt.calls[-1] == "result" and fmt.calls.count("add") >= 1
    assert state.in_flight == 0


def test_whole_answer_engine_failure_is_an_api_error():
    with pytest.raises(APIError) as err:
        _run(FakeEngineClient(fail_after=0), stream=False)
    assert err.value.status == 503


@pytest.mark.parametrize("stream", [False, True])
def test_a_failing_prepare_releases_the_slot(stream):
    async def go():
        state = _state(FakeEngineClient())

        async def prepare():
            raise bad_request("no", "prompt")

        with pytest.raises(APIError):
            await serve(state, Raw(), stream, prepare)
        return state
    assert asyncio.run(go()).in_flight == 0
