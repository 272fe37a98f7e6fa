"""Messages -> prompt token ids through the model's chat template, with tools: chat, Responses, /tokenize.

``conversation(req)`` turns chat ``messages`` into the template's dicts (text content parts
joined with newlines; other part types refused). ``with_tools`` makes the request's tool plan
(``worker.tools.plan``, tools read in the calling API's shape) and the messages and ``tools``
argument the template gets (``worker.tools.prepare_messages``). After admission, ``prompt_ids``
renders the template in the tokenizer thread (``render_chat``: the prompt is the template's text
encoded without adding special tokens unless asked; the template has them), truncates it
(``truncate_prompt_tokens``) and refuses an empty one.

The template options are the request's own fields where its API has them (chat and /tokenize:
``add_generation_prompt``, ``continue_final_message``, ``chat_template``,
``chat_template_kwargs``, ``add_special_tokens``, as vLLM), else ``TemplateOptions()``, vLLM's
defaults (the Responses API). ``param`` is the API's name for its messages (``messages``,
``input``): an error about the rendered prompt names it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worker import tools as tool_calls
from worker.errors import APIError, bad_request
from worker.serving import ServingState

# Arguments of apply_chat_template that chat_template_kwargs must not override.
_RESERVED_KWARGS = {"conversation", "tokenize", "add_generation_prompt", "continue_final_message", "chat_template",
                    "return_dict", "return_tensors", "padding", "truncation", "max_length", "tokenizer_kwargs",
                    "return_assistant_tokens_mask"}


@dataclass(frozen=True)
class TemplateOptions:
    """The template fields of a request whose API has none (vLLM's defaults)."""
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_special_tokens: bool = False


def conversation(req) -> list[dict]:
    msgs = []
    for i, m in enumerate(req.messages):
        d = m.model_dump(exclude_none=True)
        content = m.content
        if isinstance(content, list):
            texts = []
            for part in content:
                kind = part.get("type")
                if kind not in ("text", "input_text"):
                    raise bad_request(f"Content part type {kind!r} is not supported (text only).",
                                      f"messages.{i}.content")
                if not isinstance(part.get("text"), str):
                    raise bad_request("A text content part needs a string 'text'.", f"messages.{i}.content")
                texts.append(part["text"])
            content = "\n".join(texts)
        d["content"] = content or ""
        msgs.append(d)
    return msgs


def render_chat(tokenizer, msgs, opts, tools: list | None = None, param: str = "messages") -> list[int]:
    """Runs in the executor. ``opts``: the template options (the request, or ``TemplateOptions``).
    ``tools``: passed to a template that renders them (``worker.tools.prepare_messages``)."""
    kwargs = dict(opts.chat_template_kwargs or {})
    if tools is not None:
        kwargs["tools"] = tools
    bad = _RESERVED_KWARGS & kwargs.keys()
    if bad:
        raise bad_request(f"chat_template_kwargs may not set {sorted(bad)}.", "chat_template_kwargs")
    try:
        text = tokenizer.apply_chat_template(
            msgs, tokenize=False, add_generation_prompt=opts.add_generation_prompt,
            continue_final_message=opts.continue_final_message, chat_template=opts.chat_template, **kwargs)
    except APIError:
        raise
    except Exception as exc:  # noqa: BLE001 - template errors (jinja, missing template) are the client's input
        raise bad_request(f"Could not apply the chat template: {exc}", param) from exc
    return list(tokenizer.encode(text, add_special_tokens=opts.add_special_tokens))


def template_text(state: ServingState, opts) -> str | None:
    t = opts.chat_template if opts.chat_template is not None else getattr(state.tokenizer, "chat_template", None)
    return t if isinstance(t, str) else None


def with_tools(state: ServingState, msgs: list[dict], opts, tools, choice=None, parallel: bool | None = None,
               function_of=tool_calls.chat_function):
    """The tool plan (400s before admission) -> (plan, messages, tools for the template)."""
    template = template_text(state, opts)
    plan = tool_calls.plan(tools, choice, parallel, template, state.config.limits, function_of)
    msgs, shown = tool_calls.prepare_messages(msgs, plan, template)
    return plan, msgs, shown


def messages_bytes(msgs: list[dict]) -> int:
    """UTF-8 bytes of the messages' text (what the template renders at least)."""
    return sum(len(m["content"].encode("utf-8")) for m in msgs if isinstance(m.get("content"), str))


async def prompt_ids(state: ServingState, msgs: list[dict], opts, tools, truncate: int | None,
                     param: str) -> list[int]:
    """After admission: the template in the tokenizer thread, truncated to the last ``truncate`` tokens."""
    ids = await state.run_tokenizer(messages_bytes(msgs), render_chat, msgs, opts, tools, param)
    if truncate is not None and len(ids) > truncate:
        ids = ids[-truncate:]
    if not ids:
        raise bad_request("The rendered prompt is empty.", param)
    return ids
