"""Fixtures for the worker tests: the tiny tokenizer, a fake engine, the app under
TestClient, and a real uvicorn server on a free port (for the openai SDK and for
client-disconnect tests).

``fakes.py`` is loaded under a package-unique module name (``worker_test_fakes``)
because tests/ directories are not packages here and a bare ``fakes`` could clash
with another directory's helper module."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("worker_test_fakes", Path(__file__).with_name("fakes.py"))
fakes = importlib.util.module_from_spec(_spec)
sys.modules["worker_test_fakes"] = fakes
_spec.loader.exec_module(fakes)

MODEL = "fake-model"


@pytest.fixture(scope="session")
def tokenizer():
    return fakes.make_tokenizer()


@pytest.fixture
def make_app(tokenizer):
    """make_app(engine=None, **worker_config_fields) -> (app, engine)."""
    from refengine.config import EngineConfig
    from worker.app import build_app
    from worker.config import WorkerConfig

    def make(engine=None, **kw):
        engine = engine or fakes.FakeEngineClient()
        kw.setdefault("served_model_name", (MODEL,))
        cfg = WorkerConfig(engine_config=EngineConfig(model="/models/fake-model"), **kw)
        return build_app(cfg, engine, tokenizer), engine

    return make


@pytest.fixture
def client_for(make_app):
    """client_for(engine=None, **cfg) -> (TestClient entered, engine); lifespan runs."""
    from fastapi.testclient import TestClient

    opened = []

    def make(engine=None, **kw):
        app, engine = make_app(engine, **kw)
        c = TestClient(app, raise_server_exceptions=False)
        c.__enter__()
        opened.append(c)
        return c, engine

    yield make
    for c in opened:
        c.__exit__(None, None, None)


@pytest.fixture
def client(client_for):
    c, _ = client_for()
    return c


@pytest.fixture
def serve(make_app):
    """serve(engine=None, **cfg) -> (ServerThread, engine), stopped at teardown."""
    running = []

    def start(engine=None, **kw):
        app, engine = make_app(engine, **kw)
        srv = fakes.ServerThread(app).__enter__()
        running.append(srv)
        return srv, engine

    yield start
    for srv in running:
        srv.__exit__(None, None, None)
