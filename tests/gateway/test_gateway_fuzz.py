"""Hostile and malformed input against the gateway (uvicorn on loopback, with the gateway's own
HTTP protocol) in front of a worker (fake engine, real HTTP): schemathesis on the gateway's
OpenAPI schema (with negative data), Hypothesis bodies with every field of every JSON type and
raw bytes, the structured families (constraints, tools, Responses items, scoring fields), the
fixed hostile cases and issue 47's regressions, header injection, header size and count limits,
slow headers and silent connections, malformed HTTP, the bearer scheme, slow clients and
oversized bodies.

Property: never a 5xx, every 4xx is OpenAI-style JSON (the gateway's own 404, 405, 408, 431 and
malformed-HTTP 400 too), the gateway still routes afterwards and its in-flight counts are back
to zero.
"""

import socket
import sys
import time
from pathlib import Path

import httpx
import pytest
import schemathesis
from benchmarks.lib.fuzz import CMPL, FAMILIES, Tally, check_answer, family_bodies, fixed_cases, hostile_bodies, regressions
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "worker"))
from test_gateway_proxy import Gateway  # noqa: E402

from gateway.app import build_app  # noqa: E402
from gateway.config import GatewayConfig  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
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

    from worker.limits import RequestLimits

    cfg = WorkerConfig(engine_config=EngineConfig(model="/models/fake-model"), served_model_name=("fake-model",),
                       limits=RequestLimits(constraint_timeout=0.5))
    with fakes.ServerThread(build_worker(cfg, fakes.FakeEngineClient(), fakes.make_tokenizer())) as worker:
        gw = Gateway([worker.url], max_body_bytes=MAX_BODY, body_timeout=2.0, api_keys=["sk-fuzz"],
                     header_timeout=1.0, max_headers=50, max_header_bytes=16384)
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


@settings(max_examples=max(20, settings().max_examples // 2), **LAX)
@given(case=st.sampled_from(FAMILIES).flatmap(family_bodies))
def test_structured_tools_responses_and_scoring_families(case, stack, tally):
    path, raw = case
    r = httpx.post(stack.url + path, content=raw, headers={"content-type": "application/json", **AUTH}, timeout=30)
    tally.saw(r.status_code)
    check_answer(r.status_code, r.content, r.headers)


def test_issue_47_regressions(stack, tally):
    import json

    with httpx.Client(timeout=60) as c:
        for path, body in regressions():
            r = c.post(stack.url + path, content=json.dumps(body), headers={"content-type": "application/json", **AUTH})
            tally.saw(r.status_code)
            check_answer(r.status_code, r.content, r.headers)
    still_routes(stack)


def _raw_exchange(url: str, data: bytes, timeout: float = 10) -> tuple[bytes, float]:
    """Send ``data`` on a fresh connection; (everything answered until the gateway closes, seconds taken)."""
    host, port = url.removeprefix("http://").split(":")
    t0, out = time.monotonic(), b""
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        try:
            s.sendall(data)
            while chunk := s.recv(65536):
                out += chunk
        except (ConnectionResetError, BrokenPipeError):
            pass
    return out, time.monotonic() - t0


def _json_error(answer: bytes, status: int, code: str) -> None:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d" % status) and b"application/json" in head, answer[:300]
    assert json_loads(body)["error"]["code"] == code, body


def json_loads(b: bytes):
    import json

    return json.loads(b)


def test_the_http_edge_holds_like_a_proxys(stack, tally):
    """Header bytes and lines are limited (431), headers must arrive within --header-timeout (408, or a
    plain close for a connection that sent nothing), malformed HTTP gets JSON; others are served meanwhile."""
    line = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
    answer, _ = _raw_exchange(stack.url, line + b"X-Big: " + b"a" * 100_000 + b"\r\n\r\n")
    _json_error(answer, 431, "headers_too_large")
    answer, _ = _raw_exchange(stack.url, line + b"".join(b"X-%d: 1\r\n" % i for i in range(60)) + b"\r\n")
    _json_error(answer, 431, "too_many_headers")
    answer, _ = _raw_exchange(stack.url, b"NOT HTTP AT ALL\r\n\r\n")
    _json_error(answer, 400, "bad_http")
    answer, took = _raw_exchange(stack.url, line + b"X-Slow: 1\r\n")           # never finishes its headers
    _json_error(answer, 408, "header_timeout")
    assert took < 5, took
    answer, took = _raw_exchange(stack.url, b"")                                # connects, sends nothing
    assert answer == b"" and took < 5, (answer, took)
    for _ in range(5):
        tally.saw(400)
    still_routes(stack)


def test_the_bearer_scheme_is_case_insensitive_and_401_names_it(stack, tally):
    body = {"model": "fake-model", "prompt": "x", "max_tokens": 2}
    for auth in ("Bearer sk-fuzz", "bearer sk-fuzz", "BEARER   sk-fuzz"):
        r = httpx.post(stack.url + CMPL, json=body, headers={"authorization": auth})
        tally.saw(r.status_code)
        assert r.status_code == 200, (auth, r.text)
    for headers in ({}, {"authorization": "bearer nope"}):
        r = httpx.post(stack.url + CMPL, json=body, headers=headers)
        tally.saw(r.status_code)
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer"), r.headers


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
    from benchmarks.lib.procs import free_port

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
