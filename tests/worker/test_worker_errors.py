"""Every bad request gets an OpenAI-style error body with the right 4xx status and param,
and never reaches the engine."""

import pytest
from worker_test_fakes import FakeEngineClient

CMPL, CHAT = "/v1/completions", "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]


def check_error(r, status, param=None, code=None, contains=None):
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code
    if contains is not None:
        assert contains in err["message"], err["message"]
    return err


CASES = [
    # (path, body, status, param)
    (CMPL, {"prompt": "x", "temperature": -0.5}, 400, "temperature"),
    (CMPL, {"prompt": "x", "temperature": 2.5}, 400, "temperature"),
    (CMPL, {"prompt": "x", "temperature": "hot"}, 400, "temperature"),
    (CMPL, {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    (CMPL, {"prompt": "x", "max_tokens": 1.5}, 400, "max_tokens"),
    (CMPL, {"prompt": "x", "top_p": 0}, 400, "top_p"),
    (CMPL, {"prompt": "x", "top_p": 1.5}, 400, "top_p"),
    (CMPL, {"prompt": "x", "top_k": -2}, 400, "top_k"),
    (CMPL, {"prompt": "x", "min_p": 2}, 400, "min_p"),
    (CMPL, {"prompt": "x", "presence_penalty": 3}, 400, "presence_penalty"),
    (CMPL, {"prompt": "x", "frequency_penalty": -3}, 400, "frequency_penalty"),
    (CMPL, {"prompt": "x", "repetition_penalty": 0}, 400, "repetition_penalty"),
    (CMPL, {"prompt": "x", "n": 0}, 400, "n"),
    (CMPL, {"prompt": "x", "n": 2, "best_of": 3}, 400, "best_of"),
    (CMPL, {"prompt": "x", "echo": False, "max_tokens": 0}, 400, "max_tokens"),
    (CMPL, {"prompt": "x", "suffix": "y"}, 400, "suffix"),
    (CMPL, {"prompt": "x", "logprobs": 21}, 400, "logprobs"),
    (CMPL, {"prompt": "x", "logprobs": -1}, 400, "logprobs"),
    (CMPL, {"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    (CMPL, {"prompt": "x", "stop": ["ok", ""]}, 400, "stop"),
    (CMPL, {"prompt": "x", "stop": 5}, 400, "stop"),
    (CMPL, {"prompt": "x", "stop_token_ids": [100000]}, 400, "stop_token_ids"),
    (CMPL, {"prompt": "x", "min_tokens": 10, "max_tokens": 5}, 400, "min_tokens"),
    (CMPL, {"prompt": "x", "logit_bias": {"a": 1.0}}, 400, "logit_bias"),
    (CMPL, {"prompt": "x", "logit_bias": {"-5": 1.0}}, 400, "logit_bias"),
    (CMPL, {"prompt": "x", "logit_bias": {"\u00b2": 1.0}}, 400, "logit_bias"),
    (CMPL, {"prompt": "x", "logit_bias": {"9" * 5000: 1.0}}, 400, "logit_bias"),
    (CMPL, {"prompt": "x", "logit_bias": {"5": 100.5}}, 400, "logit_bias.5"),
    (CMPL, {"prompt": "x", "logit_bias": {"5": "up"}}, 400, "logit_bias.5"),
    (CMPL, {"prompt": "x", "logit_bias": {"500": 1.0}}, 400, "logit_bias"),            # vocabulary is 500
    (CMPL, {"prompt": "x", "prompt_logprobs": 21}, 400, "prompt_logprobs"),
    (CMPL, {"prompt": "x", "prompt_logprobs": -1}, 400, "prompt_logprobs"),
    (CMPL, {"prompt": "x", "prompt_logprobs": 1, "stream": True}, 400, "prompt_logprobs"),
    (CMPL, {"prompt": "x", "echo": True, "logprobs": 1, "max_tokens": 0, "min_tokens": 1}, 400, "min_tokens"),
    (CMPL, {"prompt": "x", "guided_json": "{not json"}, 400, "guided_json"),
    (CMPL, {"prompt": "x", "structured_outputs": {"choice": []}}, 400, "structured_outputs.choice"),
    (CMPL, {"prompt": "x", "use_beam_search": True}, 400, "use_beam_search"),
    (CMPL, {"prompt": "x", "allowed_token_ids": [1, 2]}, 400, "allowed_token_ids"),
    (CMPL, {"prompt": "x", "bad_words": ["no"]}, 400, "bad_words"),
    (CMPL, {"prompt": "x", "priority": 3}, 400, "priority"),
    (CMPL, {"prompt": "x", "cache_salt": "tenant-a"}, 400, "cache_salt"),
    (CMPL, {"prompt": "x", "truncation_side": "right"}, 400, "truncation_side"),
    (CMPL, {"prompt": "x", "response_format": {"type": "json_object"}, "ignore_eos": True}, 400, "ignore_eos"),
    (CMPL, {"prompt": "x", "seed": 2**70}, 400, "seed"),
    (CMPL, {"prompt": ""}, 400, "prompt"),
    (CMPL, {"prompt": []}, 400, "prompt"),
    (CMPL, {"prompt": ["a", ""]}, 400, "prompt"),
    (CMPL, {"prompt": [[]]}, 400, "prompt"),
    (CMPL, {"prompt": [1, -2]}, 400, "prompt"),
    (CMPL, {"prompt": [1, 100000]}, 400, "prompt"),
    (CMPL, {"prompt": [1, "a"]}, 400, "prompt"),
    (CMPL, {"prompt": {"text": "x"}}, 400, "prompt"),
    (CMPL, {}, 400, "prompt"),
    (CMPL, {"prompt": "x", "max_tokens": 300}, 400, "max_tokens"),      # prompt + 300 > 256
    (CMPL, {"prompt": list(range(3, 259))}, 400, "prompt"),              # 256 tokens: no room
    (CHAT, {"messages": []}, 400, "messages"),
    (CHAT, {"messages": "hi"}, 400, "messages"),
    (CHAT, {"messages": [{"content": "no role"}]}, 400, "messages.0.role"),
    (CHAT, {"messages": MSG, "top_logprobs": 2}, 400, "top_logprobs"),
    (CHAT, {"messages": MSG, "prompt_logprobs": 1, "stream": True}, 400, "prompt_logprobs"),
    (CHAT, {"messages": MSG, "logit_bias": {"1": -101}}, 400, "logit_bias.1"),
    (CHAT, {"messages": MSG, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
    (CHAT, {"messages": MSG, "logprobs": 5}, 400, "logprobs"),
    (CHAT, {"messages": MSG, "max_completion_tokens": 0}, 400, "max_completion_tokens"),
    (CHAT, {"messages": MSG, "max_completion_tokens": 1000}, 400, "max_tokens"),
    (CHAT, {"messages": MSG, "tools": [{"type": "function", "function": {"name": "no spaces"}}]}, 400,
     "tools.0.function.name"),
    (CHAT, {"messages": MSG, "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": {"type": "function", "function": {"name": "g"}}}, 400, "tool_choice"),
    (CHAT, {"messages": MSG, "tool_choice": "required"}, 400, "tool_choice"),
    (CHAT, {"messages": MSG, "echo": True}, 400, "echo"),
    (CHAT, {"messages": MSG, "return_token_ids": [1]}, 400, "return_token_ids"),
    (CHAT, {"messages": MSG, "continuation_token_ids": []}, 400, "continuation_token_ids"),
    (CHAT, {"messages": MSG, "continuation_token_ids": [1], "n": 2}, 400, "continuation_token_ids"),
    (CHAT, {"messages": MSG, "continuation_token_ids": [1, 2], "max_tokens": 2}, 400, "continuation_token_ids"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     400, "messages.0.content"),
    (CHAT, {"messages": MSG, "add_generation_prompt": True, "continue_final_message": True}, 400,
     "continue_final_message"),
    (CHAT, {"messages": MSG, "chat_template": "{% for i in range(99999) %}{% endfor %}"}, 400, "chat_template"),
    (CHAT, {"messages": MSG, "chat_template_kwargs": {"tokenize": True}}, 400, "chat_template_kwargs"),
    (CHAT, {"messages": [{"role": "user", "content": "x" * 400}]}, 400, "messages"),
]


@pytest.mark.parametrize("path,body,status,param", CASES)
def test_bad_requests_are_openai_errors(client_for, path, body, status, param):
    client, engine = client_for()
    body = {"model": "fake-model", **body}
    check_error(client.post(path, json=body), status, param)
    assert engine.requests == {}


@pytest.mark.parametrize("extra", [{"length_penalty": 1}, {"use_beam_search": False, "bad_words": [], "priority": 0},
                                   {"spaces_between_special_tokens": True, "truncation_side": "left"}])
def test_vllm_fields_at_their_off_value_are_accepted(client, extra):
    assert client.post(CMPL, json={"model": "fake-model", "prompt": "x", "max_tokens": 1, **extra}).status_code == 200


def test_context_error_names_the_numbers(client):
    err = check_error(client.post(CMPL, json={"prompt": [5] * 200, "max_tokens": 100}), 400, "max_tokens")
    assert "256" in err["message"] and "300" in err["message"] and "200" in err["message"]


@pytest.mark.parametrize("path", [CMPL, CHAT])
def test_unknown_model_is_404(client, path):
    body = {"model": "gpt-9", "prompt": "x", "messages": MSG}
    err = check_error(client.post(path, json=body), 404, "model", "model_not_found")
    assert "gpt-9" in err["message"]


@pytest.mark.parametrize("raw", ['{"prompt": ', "not json", '{"prompt": "x",}', ""])
def test_malformed_json_is_400(client, raw):
    check_error(client.post(CMPL, content=raw, headers={"content-type": "application/json"}), 400)


def test_non_object_body_is_400(client):
    err = check_error(client.post(CHAT, json=[1, 2, 3]), 400)
    assert "object" in err["message"]


def test_unknown_route_and_method_keep_openai_shape(client):
    check_error(client.get("/v1/nothing"), 404)
    check_error(client.get(CMPL), 405)


def test_unknown_fields_are_ignored(client):
    r = client.post(CMPL, json={"model": "fake-model", "prompt": "x", "max_tokens": 2, "some_vendor_field": [1],
                                "store": True, "metadata": {"a": "b"}, "user": "u1"})
    assert r.status_code == 200, r.text


def test_model_may_be_omitted_and_aliases_accepted(client_for):
    client, _ = client_for(served_model_name=("main", "alias"))
    r = client.post(CMPL, json={"prompt": "x", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["model"] == "main"
    r = client.post(CMPL, json={"model": "alias", "prompt": "x", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["model"] == "main"


def test_unhealthy_engine_gives_503(client_for):
    client, engine = client_for()
    engine.set_healthy(False)
    check_error(client.post(CMPL, json={"prompt": "x"}), 503)
    check_error(client.get("/health"), 503)


def test_engine_failure_before_output_is_503_not_500(client_for):
    client, engine = client_for(FakeEngineClient(fail_after=0))
    check_error(client.post(CMPL, json={"prompt": "x", "max_tokens": 4}), 503)


def test_engine_value_error_is_400(client_for):
    class Rejecting(FakeEngineClient):
        async def generate(self, request_id, prompt_token_ids, params):
            raise ValueError("prompt token ids must be in [0, 10)")
            yield  # pragma: no cover

    client, _ = client_for(Rejecting())
    err = check_error(client.post(CMPL, json={"prompt": "x"}), 400)
    assert "[0, 10)" in err["message"]
