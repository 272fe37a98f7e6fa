"""``worker.request_body``: bodies parsed once (``swiftcommon.json_body``, tested in tests/swiftcommon)
and over-count lists refused before FastAPI validates their items, on the fake engine."""

from __future__ import annotations

import asyncio

import pytest

from worker.limits import RequestLimits
from worker.request_body import check_counts

MODEL = "fake-model"
MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture
def limited(client_for):
    c, _ = client_for(limits=RequestLimits(max_stop_strings=3, max_tools=2))
    return c


def err(r, status: int, param):
    assert r.status_code == status, r.text
    e = r.json()["error"]
    assert e["param"] == param, e
    return e


def test_counts_are_checked_before_any_item_is_validated(limited):
    # Items that validation would refuse (numbers as stop strings, tools that are not objects):
    # over the limit, the count's 400 comes first, so the items were never validated.
    r = limited.post("/v1/completions", json={"model": MODEL, "prompt": "x", "stop": list(range(4))})
    assert err(r, 400, "stop")["message"] == "4 stop strings; this server takes at most 3 (--max-stop-strings)."
    r = limited.post("/v1/chat/completions", json={"model": MODEL, "messages": MSG, "tools": [1, 2, 3]})
    assert err(r, 400, "tools")["message"] == "3 tools; this server takes at most 2 (--max-tools)."
    r = limited.post("/v1/responses", json={"model": MODEL, "input": "hi", "tools": [None] * 5})
    assert err(r, 400, "tools")["message"] == "5 tools; this server takes at most 2 (--max-tools)."
    # At the limit, the items are validated as before.
    r = limited.post("/v1/completions", json={"model": MODEL, "prompt": "x", "stop": [1, 2, 3]})
    assert r.status_code == 400 and err(r, 400, r.json()["error"]["param"])["param"].startswith("stop")


def test_what_is_not_counted_is_answered_as_before(limited):
    r = limited.post("/v1/completions", json={"model": MODEL, "prompt": "x", "stop": "a"})
    assert r.status_code == 200, r.text
    r = limited.post("/v1/completions", content=b'{"model": "fake-model", "prompt": "x", "stop": [',
                     headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["message"]
    r = limited.post("/v1/completions", content=b'{"model": "fake-model", "prompt": "x", "temperature": NaN}',
                     headers={"content-type": "application/json"})
    assert r.status_code == 400 and "temperature" in (r.json()["error"]["param"] or "")
    r = limited.post("/v1/completions", content=b'{"model": "fake-model", "prompt": "\\ud800"}',
                     headers={"content-type": "application/json"})
    assert r.status_code == 400 and "surrogate" in r.json()["error"]["message"]
    # Not JSON by its content type: not parsed here, validation answers as before.
    r = limited.post("/v1/completions", content=b'{"stop": [1, 2, 3, 4]}', headers={"content-type": "text/plain"})
    assert r.status_code == 400 and r.json()["error"]["param"] != "stop"


def test_check_counts_leaves_other_shapes_to_validation():
    limits = RequestLimits(max_stop_strings=1, max_tools=1)
    for body in ([1, 2], "x", {"stop": "ab"}, {"tools": {"a": 1, "b": 2}}, {"stop": ["a"], "tools": [{}]}):
        check_counts(body, limits)


def test_a_client_gone_while_sending_gets_fastapis_answer(make_app):
    app, _ = make_app()
    sent = []
    messages = iter([{"type": "http.request", "body": b'{"model": "fake-', "more_body": True},
                     {"type": "http.disconnect"}])

    async def receive():
        return next(messages)

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "raw_path": b"/v1/completions",
             "query_string": b"", "headers": [(b"content-type", b"application/json")], "app": app,
             "http_version": "1.1", "scheme": "http", "server": ("x", 80), "client": ("y", 1), "root_path": ""}
    asyncio.run(app(scope, receive, send))
    assert sent[0]["status"] == 400
