"""The one token-limit rule: the worker serves by it and the gateway's estimate follows it,
whichever order a client sends the fields in."""

import pytest

from gateway.auth import requested_tokens
from swiftcommon.token_limits import requested_limit
from worker.api.chat.protocol import ChatCompletionRequest
from worker.api.completions.protocol import CompletionRequest
from worker.api.sampling import to_sampling_params

MSGS = [{"role": "user", "content": "hi"}]


def _worker_limit(body: dict) -> int:
    req = (ChatCompletionRequest if "messages" in body else CompletionRequest)(**body)
    return to_sampling_params(req, prompt_len=4, max_model_len=1024, vocab_size=100).max_tokens


@pytest.mark.parametrize("body, want", [
    # chat: max_completion_tokens (OpenAI's current field) wins over the deprecated max_tokens, in either order
    ({"messages": MSGS, "max_completion_tokens": 7, "max_tokens": 30}, 7),
    ({"messages": MSGS, "max_tokens": 30, "max_completion_tokens": 7}, 7),
    ({"messages": MSGS, "max_tokens": 30}, 30),
    ({"messages": MSGS, "max_completion_tokens": 7}, 7),
    # completions: max_tokens only (max_completion_tokens is not a completions field), default 16
    ({"prompt": "hi", "max_tokens": 5, "max_completion_tokens": 9}, 5),
    ({"prompt": "hi", "max_completion_tokens": 9}, 16),
    ({"prompt": "hi"}, 16),
])
def test_gateway_estimate_follows_what_the_worker_serves(body, want):
    assert _worker_limit(body) == want
    assert requested_tokens({"model": "m", **body}) == want


def test_responses_read_max_output_tokens_only():
    assert requested_tokens({"input": "hi", "max_output_tokens": 12, "max_tokens": 99}) == 12
    assert requested_limit("responses", {"max_tokens": 99}) is None


def test_unset_chat_limit_is_the_rest_of_the_context_on_the_worker():
    assert requested_limit("chat", {"max_tokens": None, "max_completion_tokens": None}) is None
    assert _worker_limit({"messages": MSGS}) == 1024 - 4
