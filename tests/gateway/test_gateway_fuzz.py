"""Hostile and malformed input against the gateway (uvicorn on loopback) in front of a worker
(fake engine, real HTTP): schemathesis on the gateway's OpenAPI schema (with negative data),
Hypothesis bodies with every field of every JSON type and raw bytes, the fixed hostile cases,
header injection, slow clients and oversized bodies.

Property: never a 5xx, every 4xx is OpenAI-style JSON (the gateway's own 404 and 405 too), the
gateway still routes afterwards and its in-flight counts are back to zero.
"""

import socket
import sys
import time
from pathlib import Path

import httpx
import pytest
import schemathesis
from fuzz_support import CMPL, Tally, check_answer, fixed_cases, hostile_bodies
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "worker"))
from test_gateway_proxy import Gateway  # noqa: E402

from gateway.app import build_app  # noqa: E402
from gateway.config import GatewayConfig  # noqa: E402

pytestmark = pytest.mark.slow
LAX = dict(deadline=None, suppress_health_check=list(HealthCheck))
MAX_BODY = 1 << 20
SCHEMA = schemathesis.openapi.from_dict(build_app(GatewayConfig(workers=["http://127.0.0.1:9"])).openapi())
SCHEMA.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE])


@pytest.fixture(scope="module")
def stack():
    import importlib.util

    spec = importlib.util.spec_from_file_location("worker_test_fakes", Path(__file__).parent.parent / "worker" / "fakes.py")
    fakes = sys.modules.get("worker_test_fakes")
    if fakes is None:
        fakes = importlib.util.module_from_spec(spec)
        sys.modules["worker_test_fakes"] = fakes
        spec.loader.exec_module(fakes)
    from refengine.config import EngineConfig
    from worker.app import build_app as build_worker
    from worker.config import WorkerConfig

    cfg = WorkerConfig(engine_config=EngineConfig(model="/models/fake-model"), served_model_name=("fake-model",))
    with fakes.ServerThread(build_worker(cfg, fakes.FakeEngineClient(), fakes.make_tokenizer())) as worker:
        gw = Gateway([worker.url], max_body_bytes=MAX_BODY, body_timeout=2.0, api_keys=["sk-fuzz"])
        yield gw
        gw.stop()


@pytest.fixture(scope="module")
def tally(reliability_log):
    t = Tally()
    yield t
    reliability_log.malformed("gateway", t.cases, t.server_errors)


AUTH = {"authorization": "Bearer sk-fuzz"}


def still_routes(gw) -> None:
    r = httpx.post(gw.url + CMPL, json={"model": "fake-model", "prompt": "Hello", "max_tokens": 3}, headers=AUTH)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3, r.text
    assert gw.in_flight() == [0]


@SCHEMA.parametrize()
@settings(**LAX)
def test_schemathesis_every_operation(case, stack, tally):
    r = case.call(base_url=stack.url, headers=AUTH, timeout=30)
    tally.saw(r.status_code)
    check_answer(r.status_code, r.content, r.headers)


@settings(**LAX)
@given(case=hostile_bodies(), auth=st.sampled_from([AUTH, {}, {"authorization": "Bearer sk-fuzZ"},
                                                     {"authorization": "Basic c2stZnV6eg=="}]))
def test_every_field_with_every_type(case, auth, stack, tally):
    path, raw = case
    r = httpx.post(stack.url + path, content=raw, headers={"content-type": "application/json", **auth}, timeout=30)
    tally.saw(r.status_code)
    check_answer(r.status_code, r.content, r.headers)
    if not auth or auth != AUTH:
        assert r.status_code in (400, 401, 408, 413), r.status_code   # bad keys never reach a worker


def test_fixed_cases_and_own_errors(stack, tally):
    with httpx.Client(timeout=60) as c:
        for path, raw, headers in fixed_cases(MAX_BODY):
            r = c.post(stack.url + path, content=raw, headers={"content-type": "application/json", **AUTH, **headers})
            tally.saw(r.status_code)
            check_answer(r.status_code, r.content, r.headers)
        for method, path, status in (("GET", "/nope", 404), ("DELETE", CMPL, 405), ("GET", CMPL, 405),
                                     ("PUT", "/v1/models", 405), ("GET", "/../../etc/passwd", 404)):
            r = c.request(method, stack.url + path, headers=AUTH)
            tally.saw(r.status_code)
            assert r.status_code == status and r.json()["error"]["message"], (method, path, r.text)
    still_routes(stack)


@settings(**LAX)
@given(name=st.sampled_from(["x-api-key", "authorization", "x-forwarded-for", "cookie", "x-request-id", "accept"]),
       value=st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=300))
def test_header_values(name, value, stack, tally):
    headers = {"content-type": "application/json", name: value.encode("latin-1")}
    try:
        r = httpx.post(stack.url + CMPL, json={"model": "fake-model", "prompt": "x", "max_tokens": 2},
                       headers=headers, timeout=30)
    except httpx.LocalProtocolError:
        return                                 # the client itself refuses to send it
    tally.saw(r.status_code)
    check_answer(r.status_code, r.content, r.headers)


def test_header_injection_is_refused_on_the_wire(stack, tally):
    """CR/LF inside a header value: h11 refuses the request (400), nothing is smuggled."""
    host, port = stack.url.removeprefix("http://").split(":")
    body = b'{"model": "fake-model", "prompt": "x", "max_tokens": 2}'
    req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-A: 1\rX-Injected: 2\r\n"
           b"Content-Length: %d\r\n\r\n" % len(body) + body)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(req)
        answer = s.recv(4096)
    tally.saw(int(answer.split()[1]))
    assert answer.startswith(b"HTTP/1.1 4"), answer[:100]


def test_slow_client_gets_408_and_others_are_served(stack, tally):
    host, port = stack.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer sk-fuzz\r\nContent-Length: 1000\r\n\r\n{\"model\": ")
        t0 = time.monotonic()
        still_routes(stack)                        # while the slow client holds its connection
        for _ in range(3):
            s.sendall(b" ")
            time.sleep(0.5)
        answer = s.recv(4096)
        while b'"}}' not in answer:
            more = s.recv(4096)
            if not more:
                break
            answer += more
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert b'"code":"body_timeout"' in answer and time.monotonic() - t0 < 10
    tally.saw(408)


def test_oversized_bodies_are_refused_before_they_are_read(stack, tally):
    r = httpx.post(stack.url + CMPL, content=b"x" * (MAX_BODY + 1), headers={"content-type": "application/json", **AUTH})
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"

    def chunks():
        for _ in range(32):
            yield b"y" * 65536

    r = httpx.post(stack.url + CMPL, content=chunks(), headers={"content-type": "application/json", **AUTH})
    assert r.status_code == 413
    tally.saw(413)
    tally.saw(413)
    still_routes(stack)


def test_api_keys_are_compared_in_constant_time(monkeypatch):
    import hmac

    import gateway.auth as auth_mod

    keys = [f"sk-{i:02d}-" + "x" * 30 for i in range(5)]
    auth = auth_mod.Auth(keys)
    calls = []
    real = hmac.compare_digest
    monkeypatch.setattr(auth_mod.hmac, "compare_digest", lambda a, b: calls.append(len(a)) or real(a, b))
    for presented in (keys[0], keys[4], "sk-00-" + "x" * 29 + "y", "short", ""):
        calls.clear()
        try:
            auth.check("Bearer " + presented)
            ok = True
        except Exception:  # noqa: BLE001
            ok = False
        assert ok == (presented in keys)
        assert calls == [32] * len(keys)          # every key, equal-length digests, whatever matched


def test_api_keys_never_reach_the_logs(tmp_path):
    import os

    from fault_support import Proc, fault_worker
    from proc_support import free_port

    secret, wrong = "sk-live-SECRET-4242", "sk-guess-WRONG-1717"
    w = fault_worker("w")
    port = free_port()
    gw = Proc([sys.executable, "-m", "gateway", "--port", str(port), "--workers", w.url, "--log-level", "debug"],
              f"http://127.0.0.1:{port}", env={**os.environ, "SWIFTSERVE_API_KEYS": secret}).wait_ready()
    try:
        for key in (secret, wrong, secret):
            httpx.post(gw.url + CMPL, json={"model": "m", "prompt": "x"}, headers={"authorization": f"Bearer {key}"})
        time.sleep(0.5)
        out = gw.output()
        assert "POST /v1/completions" in out and "auth on" in out          # the log is there
        assert secret not in out and wrong not in out and "SECRET" not in out
    finally:
        gw.kill()
        w.kill()
