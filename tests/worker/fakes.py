"""Test doubles for the worker's HTTP layer: a fake EngineClient and a tiny real tokenizer.

``make_tokenizer()`` trains a byte-level BPE (the same family as SmolLM2's) on a
few sentences in-process: a real HF fast tokenizer with special tokens
``<|endoftext|>`` (0), ``<|im_start|>`` (1), ``<|im_end|>`` (2 = EOS) and SmolLM2's
chat template, without any model files. Single bytes are in its vocabulary, so a
multi-byte character can be split over several tokens (``byte_tokens``).

``FakeEngineClient`` implements worker.engine_client.EngineClient with a
deterministic script: for each request it emits ``script(prompt_ids, params)``
token by token (cycling when exhausted) and applies max_tokens, min_tokens, EOS,
stop_token_ids, ignore_eos and the context limit the way the reference engine
does; prompt logprobs (logprob -0.25 for every prompt token but the first) come
with the first increment when asked for. It records requests, aborts (from ``abort()`` and from streams left early),
and supports delays, a mid-stream failure, and settable health and stats.

``parse_sse`` checks SSE framing; ``ServerThread`` runs an app under uvicorn on a
free port (for the openai SDK and real client disconnects); ``real_stack`` puts a worker
with a real engine behind a gateway process.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from functools import lru_cache
from typing import Callable

from benchmarks.lib.procs import free_port
from refengine.outputs import EngineStats, RequestOutput, RequestTimings, TokenLogprob
from refengine.sampling_params import SamplingParams

CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CORPUS = [
    "Hello world, this is a test. The capital of France is Paris.",
    "Once upon a time, in a small village, there lived a cat named STOP.",
    "héllo wörld 日本語 🎉 café naïve",
    "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n",
]
EOS = 2


@lru_cache(maxsize=1)
def make_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator(CORPUS * 20, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                  unk_token="<|endoftext|>", pad_token="<|im_end|>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def byte_tokens(tokenizer, text: str) -> list[int]:
    """One token per UTF-8 byte of ``text`` (splits multi-byte characters)."""
    from worker.token_texts import _BYTE_DECODER

    enc = {b: c for c, b in _BYTE_DECODER.items()}
    return tokenizer.convert_tokens_to_ids([enc[b] for b in text.encode("utf-8")])


Script = Callable[[list[int], SamplingParams], list[int]]


class FakeEngineClient:
    def __init__(self, script: Script | list[int] | None = None, *, max_model_len: int = 256,
                 eos_token_ids: tuple[int, ...] = (EOS,), token_delay: float = 0.0, first_token_delay: float = 0.0,
                 fail_after: int | None = None, vocab_size: int = 500) -> None:
        if script is None:
            tok = make_tokenizer()
            reply = tok.encode(" Hello world, this is a test.", add_special_tokens=False)
            script = reply
        self.script: Script = script if callable(script) else (lambda _p, _s, ids=list(script): ids)
        self.max_model_len = max_model_len
        self.eos_token_ids = tuple(eos_token_ids)
        self.token_delay = token_delay
        self.first_token_delay = first_token_delay
        self.fail_after = fail_after
        self.vocab_size = vocab_size
        self.started = False
        self.stopped = False
        self._healthy = True
        self.requests: dict[str, tuple[list[int], SamplingParams]] = {}
        self.active: set[str] = set()
        self.aborted: list[str] = []        # streams left before their finished increment
        self.abort_calls: list[str] = []    # explicit abort() calls
        self.finished: dict[str, str] = {}  # request id -> finish reason
        self.stats_value = EngineStats(num_running=1, num_waiting=2, kv_usage=0.25, kv_blocks_total=100,
                                       kv_blocks_used=25, kv_block_size=16, kv_bytes_total=1 << 20,
                                       kv_bytes_per_token=1024.0, kv_bytes_per_token_baseline=2048.0,
                                       num_preemptions=3, prefix_caching=True, prefix_cache_queries=1000,
                                       prefix_cache_hits=640, extra={"swiftkv_layers": 15.0,
                                                                              "swiftkv_unnarrowed_tail_rows_total": 7.0})

    async def start(self) -> None:
        self.started = True

    async def shutdown(self) -> None:
        self.stopped = True

    def healthy(self) -> bool:
        return self._healthy and self.started and not self.stopped

    def set_healthy(self, value: bool) -> None:
        self._healthy = value

    def stats(self) -> EngineStats:
        return self.stats_value

    async def abort(self, request_id: str) -> None:
        self.abort_calls.append(request_id)

    def _logprob(self, tid: int, k: int) -> TokenLogprob:
        top = [((tid + j) % self.vocab_size, -0.25 * (j + 1)) for j in range(k)]
        return TokenLogprob(token_id=tid, logprob=-0.25, top=top)

    async def generate(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams):
        if request_id in self.requests:
            raise ValueError(f"duplicate request id {request_id!r}")
        if not prompt_token_ids:
            raise ValueError("prompt must contain at least one token")
        self.requests[request_id] = (list(prompt_token_ids), params)
        self.active.add(request_id)
        timings = RequestTimings(arrival=time.monotonic())
        script = self.script(list(prompt_token_ids), params) or [EOS]
        n_prompt = len(prompt_token_ids)
        finished = False
        try:
            await asyncio.sleep(self.first_token_delay)
            timings.first_scheduled = time.monotonic()
            n = 0
            while True:
                if self.fail_after is not None and n >= self.fail_after:
                    raise RuntimeError("fake engine failure")
                tid = script[n % len(script)]
                n += 1
                reason, stop_reason = None, None
                if n >= params.min_tokens:
                    if not params.ignore_eos and tid in self.eos_token_ids:
                        reason = "stop"
                    elif tid in params.stop_token_ids:
                        reason, stop_reason = "stop", tid
                if reason is None and (n >= params.max_tokens or n_prompt + n >= self.max_model_len):
                    reason = "length"
                now = time.monotonic()
                if n == 1:
                    timings.first_token = now
                if reason:
                    timings.finished = now
                lps = [self._logprob(tid, params.logprobs)] if params.logprobs is not None else None
                finished = reason is not None
                out = RequestOutput(request_id, [tid], n_prompt, n, lps, finished, reason, stop_reason,
                                    timings if finished else None)
                if n == 1 and params.prompt_logprobs is not None:
                    out.prompt_logprobs = [None] + [self._logprob(t, params.prompt_logprobs)
                                                    for t in prompt_token_ids[1:]]
                yield out
                if finished:
                    self.finished[request_id] = reason
                    return
                await asyncio.sleep(self.token_delay)
        finally:
            self.active.discard(request_id)
            if not finished:
                self.aborted.append(request_id)


def parse_sse(body: str) -> list:
    """Split an SSE body into JSON payloads; the final ``[DONE]`` stays a string.

    Asserts the framing: every event is one ``data: ...`` line followed by a blank line."""
    import json

    assert body.endswith("\n\n"), body[-50:]
    events = []
    for block in body[:-2].split("\n\n"):
        assert block.startswith("data: ") and "\n" not in block, block
        payload = block[len("data: "):]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


class ServerThread:
    """uvicorn serving ``app`` on a free port in a daemon thread; a context manager."""

    def __init__(self, app, startup_timeout: float = 60.0) -> None:
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.startup_timeout = startup_timeout

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + self.startup_timeout
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@contextlib.contextmanager
def real_stack(model_dir, engine_config, name: str = "smol"):
    """A worker with a real engine (``engine_config``, the model's tokenizer) in a thread, behind one
    gateway process; yields the gateway's URL."""
    import subprocess
    import sys

    from transformers import AutoTokenizer

    from benchmarks.lib.procs import wait_healthy
    from worker.app import build_app
    from worker.backends import create_engine_client
    from worker.config import WorkerConfig

    config = WorkerConfig(engine_config=engine_config, served_model_name=(name,))
    app = build_app(config, create_engine_client(config), AutoTokenizer.from_pretrained(model_dir))
    with ServerThread(app, startup_timeout=600) as worker:
        port = free_port()
        gw = subprocess.Popen([sys.executable, "-m", "gateway", "--workers", worker.url, "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_healthy(url, gw, 60)
            yield url
        finally:
            gw.terminate()
            gw.wait(30)
