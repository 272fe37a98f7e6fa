"""The shared request-preparation step (``worker.api.prepare``): on every generation endpoint the
output constraint is built once and every constraint of the request is compiled once, together,
before admission; the engine gets that same constraint."""

import pytest
from worker_test_fakes import FakeEngineClient

from worker.serving import ServingState

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}}
MSG = [{"role": "user", "content": "hi"}]

CASES = [
    ("/v1/completions", {"prompt": "x", "max_tokens": 2, "guided_regex": "[0-9]{3}"}, ["guided_*"]),
    ("/v1/completions", {"prompt": ["x", "y"], "n": 2, "max_tokens": 2, "structured_outputs": {"json": SCHEMA}},
     ["structured_outputs"]),
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": 2, "tools": [TOOL], "response_format": {
        "type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}},
     ["response_format", "tools.0.function.parameters"]),
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": 2, "tools": [TOOL], "tool_choice": "required"},
     ["tools.0.function.parameters", "tool_choice"]),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 2,
                       "text": {"format": {"type": "json_schema", "name": "p", "schema": SCHEMA}}}, ["text.format"]),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 2, "tools": [{"type": "function", **TOOL["function"]}],
                       "tool_choice": {"type": "function", "name": "get_weather"}}, ["tools.0.parameters"]),
]


@pytest.mark.parametrize("path, body, fields", CASES)
def test_the_constraint_is_built_and_compiled_once_per_request(client_for, monkeypatch, path, body, fields):
    import worker.api.responses.serving as responses_serving
    import worker.api.sampling as sampling

    built, compiled = [], []
    for module, name in ((sampling, "request_constraint"), (responses_serving, "check_generation")):
        real = getattr(module, name)

        def spy(*a, _real=real, _name=name, **kw):
            built.append(_name)
            return _real(*a, **kw)
        monkeypatch.setattr(module, name, spy)

    async def compile_check(self, items):
        compiled.append(list(items))
    monkeypatch.setattr(ServingState, "check_constraints", compile_check)

    client, engine = client_for(FakeEngineClient(max_model_len=4096))
    r = client.post(path, json={"model": "fake-model", **body})
    assert r.status_code == 200, r.text
    assert len(built) == 1                          # the output constraint (None or a spec): built once
    (items,) = compiled                                         # every constraint: compiled once, together
    assert [field for field, _ in items] == fields
    specs = {params.structured for _, params in engine.requests.values()}
    assert len(specs) == 1 and specs.pop() in [spec for _, spec in items]   # the engine gets one of them
