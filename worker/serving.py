"""The serving state every endpoint shares (``ServingState``): engine, tokenizer, checks, admission.

``ServingState`` (on ``app.state.serving``) holds the engine, the tokenizer, the
metrics and a one-thread executor for tokenisation and chat templates (HF fast
tokenizers are not safe to call from several threads at once, and the work must
stay off the event loop). Prompts of more than ``BIG_PROMPT_BYTES`` go to a second
one-thread executor with a copy of the tokenizer (``run_tokenizer``), so a long prompt
never holds up the short ones queued behind it. Before that, ``check_prompt_bytes``
refuses a prompt that cannot fit the context by its byte length alone (``worker.limits``),
and ``check_constraints`` compiles the request's constraints in ``worker.constraints``. ``screen``
checks a large body in a child process before the event loop parses it (``worker.body_screen``).

The engine side of a request, its choices, is ``worker.choices``; the HTTP side (admission,
streaming or not, disconnects) is ``worker.api.driver``.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from swiftcommon.priority import background_priority
from worker.body_screen import BodyScreen
from worker.config import WorkerConfig
from worker.constraints import ConstraintChecker, ConstraintError
from worker.engine_client import EngineClient
from worker.errors import APIError, bad_request, model_not_found
from worker.metrics import WorkerMetrics
from worker.token_texts import TokenTexts

BIG_PROMPT_BYTES = 64 * 1024        # prompts longer than this tokenise on their own thread


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


class ServingState:
    def __init__(self, config: WorkerConfig, engine: EngineClient, tokenizer) -> None:
        self.config = config
        self.engine = engine
        self.tokenizer = tokenizer
        self.tokenizer_size = len(tokenizer)
        self.token_texts = TokenTexts(tokenizer)
        self.in_flight = 0
        self.draining = False                 # SIGTERM: no new requests, /health 503 (worker.shutdown)
        self.active: set[str] = set()         # engine request ids of running choices
        self.drain_aborting = False           # the drain time ran out: aborts now are the worker's (shutdown)
        self.metrics = WorkerMetrics(config.model_name, engine, in_flight=lambda: self.in_flight)
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenizer")
        self._big: tuple[ThreadPoolExecutor, object] | None = None      # long prompts: own thread, own tokenizer
        # Bytes of the longest token (an upper bound: its text as UTF-8), for the context check by bytes.
        self.max_token_bytes = max((len(t.encode("utf-8", "replace")) for t in tokenizer.get_vocab()), default=1)
        self.constraints: ConstraintChecker | None = None                # started on first use
        self.screen = BodyScreen(config)     # large bodies' first checks; its child starts on first use

    @property
    def vocab_size(self) -> int:
        """Token ids a request may use: the tokenizer's, capped by the model's vocabulary
        when the engine reports one (a tokenizer can have more ids than the model)."""
        model = getattr(self.engine, "vocab_size", None)
        return min(self.tokenizer_size, model) if model else self.tokenizer_size

    # ---- checks -----------------------------------------------------------------------------
    def check_model(self, name: str | None) -> None:
        if name is not None and name not in self.config.model_names:
            raise model_not_found(name)

    def check_engine(self) -> None:
        if not self.engine.healthy():
            raise APIError(503, "The engine is not running.", code="engine_unavailable")

    def check_chat_template(self, req) -> None:
        if req.chat_template is not None and not self.config.trust_request_chat_template:
            raise bad_request("chat_template in a request is refused: this worker runs only its model's template "
                              "(start it with --trust-request-chat-template to allow it).", "chat_template")

    def check_prompt_logprobs(self, req) -> None:
        """Refuse (400) a request that needs prompt logprobs from an engine that cannot give them."""
        if req.engine_prompt_logprobs() is None:
            return
        reason = getattr(self.engine, "prompt_logprobs_refusal", None)
        if reason:
            raise bad_request(reason, "prompt_logprobs" if req.prompt_logprobs is not None else "echo")

    def check_prompt_bytes(self, nbytes: int, param: str, truncating: bool = False) -> None:
        """Refuse (400) a prompt of ``nbytes`` UTF-8 bytes before tokenising it: over ``--max-prompt-bytes``,
        or (that flag 0, no truncation) over what can fit the context, as no token is longer than
        ``max_token_bytes``."""
        limit = self.config.limits.max_prompt_bytes
        if limit and nbytes > limit:
            raise bad_request(f"The prompt is {nbytes} bytes; this server takes at most {limit} (--max-prompt-bytes).",
                              param)
        fits = self.engine.max_model_len * self.max_token_bytes
        if not limit and not truncating and nbytes > fits:
            raise bad_request(f"This model's maximum context length is {self.engine.max_model_len} tokens. However, "
                              f"your prompt is {nbytes} bytes, more than that many tokens can hold. Please reduce "
                              "the length of the prompt.", param)

    async def check_constraints(self, items: list) -> None:
        """Compile the request's constraints (``[(field, StructuredSpec)]``) before admission; 400 naming the
        first that cannot be used (``worker.constraints``)."""
        if not items:
            return
        if self.constraints is None:
            checker = await self.run_sync(ConstraintChecker, self.tokenizer, self.vocab_size,
                                          tuple(self.engine.eos_token_ids))
            if self.constraints is None:            # two first requests at once: keep one checker
                self.constraints = checker
            else:
                checker.close()
        try:
            await self.constraints.check(items, self.config.limits.constraint_timeout)
        except ConstraintError as exc:
            raise bad_request(f"{exc.param}: the constraint cannot be used: {exc.reason}", exc.param) from None

    def check_speculative(self, req) -> None:
        """Refuse (400) a ``speculative`` value this worker cannot honour: drafting asked of a worker without
        ``--speculative-config``, or turned off for one request on vLLM (which drafts for every request)."""
        if req.speculative is None:
            return
        if req.speculative and not self.config.speculative:
            raise bad_request("speculative is true, but this worker runs without speculative decoding (start it "
                              "with --speculative-config).", "speculative")
        if not req.speculative and self.config.speculative and self.config.engine != "reference":
            raise bad_request("speculative: false cannot be honoured on this vLLM worker: vLLM drafts for every "
                              "request when started with --speculative-config. Leave it out, or use a "
                              "reference-engine worker.", "speculative")

    def admit(self) -> None:
        """Take one in-flight slot or refuse at once (429 or 503, configured)."""
        if self.draining:
            raise APIError(503, "The worker is shutting down; retry on another worker.", code="shutting_down",
                           headers={"Retry-After": "1"})
        limit = self.config.max_concurrent_requests
        if limit and self.in_flight >= limit:
            status = self.config.overload_status
            raise APIError(status, f"The worker is at its limit of {limit} concurrent requests; retry later.",
                           code="rate_limit_exceeded" if status == 429 else "overloaded",
                           headers={"Retry-After": "1"})
        self.in_flight += 1

    def release(self) -> None:
        self.in_flight = max(0, self.in_flight - 1)

    async def run_sync(self, fn: Callable, *args, **kwargs) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, lambda: fn(*args, **kwargs))

    async def run_tokenizer(self, nbytes: int, fn: Callable, *args) -> Any:
        """``fn(tokenizer, *args)`` in the tokenizer thread, or, for a prompt of more than ``BIG_PROMPT_BYTES``,
        in the long prompts' thread with its own copy of the tokenizer."""
        if nbytes <= BIG_PROMPT_BYTES:
            return await self.run_sync(fn, self.tokenizer, *args)
        if self._big is None:
            self._big = (ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenizer-long",
                                            initializer=background_priority),
                         await self.run_sync(copy.deepcopy, self.tokenizer))
        pool, tok = self._big
        return await asyncio.get_running_loop().run_in_executor(pool, lambda: fn(tok, *args))

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
        if self._big is not None:
            self._big[0].shutdown(wait=False, cancel_futures=True)
        if self.constraints is not None:
            self.constraints.close()
        self.screen.close()
