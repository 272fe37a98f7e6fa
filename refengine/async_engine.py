"""AsyncEngine: the synchronous LLMEngine on a background thread, with asyncio streams.

The event loop never runs the engine. Requests and aborts travel to the engine
thread through a thread-safe command queue; each step's outputs travel back with
one ``loop.call_soon_threadsafe`` into per-request ``asyncio.Queue``s.

Contract (see worker/engine_client.py): ``generate`` yields increments until the
finished one; leaving the iterator early (client disconnect, cancellation)
aborts the request in ``finally``. A request the engine refuses (``ValueError``) or
that fails inside a step (``RequestFailed``, see ``LLMEngine``) gets that error on its
own stream; the others go on. If the engine thread dies, every open stream
receives the error and ``healthy()`` turns False.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from typing import AsyncIterator

from refengine.config import EngineConfig
from refengine.outputs import EngineStats, RequestOutput
from refengine.sampling_params import SamplingParams

log = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    pass


def engine_iteration(eng, next_cmd) -> list:
    """One turn of an engine loop (thread or process): apply the waiting commands, then step.

    ``next_cmd(block)`` returns the next command or None; ``block`` is True only while the
    engine has nothing to do (then it may wait briefly). Commands: ("add", id, prompt ids,
    params, arrival) and ("abort", id). Returns the outputs: ``RequestOutput``s and
    ``(request_id, exception)`` pairs for requests refused or failed alone."""
    outputs: list = []
    block = not eng.has_unfinished()
    while (cmd := next_cmd(block)) is not None:
        block = False
        if cmd[0] == "add":
            _, rid, prompt, params, arrival = cmd
            try:
                eng.add_request(rid, prompt, params, arrival)
            except Exception as exc:  # noqa: BLE001 - this request's error, not the engine's
                outputs.append((rid, exc))
        elif cmd[0] == "abort":
            out = eng.abort_request(cmd[1])
            if out is not None:
                outputs.append(out)
    if eng.has_unfinished():
        outputs.extend(eng.step())
        outputs.extend(eng.take_failures().items())
    return outputs


class AsyncEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.engine = None
        self.max_model_len = 0
        self.eos_token_ids: tuple[int, ...] = ()
        self.vocab_size: int | None = None          # the model's (a tokenizer may have more ids)
        self._cmds: queue.Queue = queue.Queue()
        self._streams: dict[str, asyncio.Queue] = {}
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stats = EngineStats()

    # ---- lifecycle --------------------------------------------------------
    async def start(self) -> None:
        from refengine.engine import LLMEngine

        self._loop = asyncio.get_running_loop()
        # Loading weights takes seconds: keep it off the event loop too.
        self.engine = await asyncio.to_thread(LLMEngine, self.config)
        self.max_model_len = self.engine.max_model_len
        self.eos_token_ids = self.engine.eos_token_ids
        self.vocab_size = self.engine.spec.vocab_size
        self._stats = self.engine.stats()
        self._thread = threading.Thread(target=self._run, name="refengine", daemon=True)
        self._thread.start()

    async def shutdown(self) -> None:
        self._stop.set()
        self._cmds.put(("wake",))
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 30)

    def healthy(self) -> bool:
        return self._error is None and self._thread is not None and self._thread.is_alive()

    def stats(self) -> EngineStats:
        return self._stats

    # ---- requests -----------------------------------------------------------
    async def generate(self, request_id: str, prompt_token_ids: list[int],
                       params: SamplingParams) -> AsyncIterator[RequestOutput]:
        if not self.healthy():
            raise EngineDeadError(f"engine is not running: {self._error!r}")
        if request_id in self._streams:
            raise ValueError(f"duplicate request id {request_id!r}")
        q: asyncio.Queue = asyncio.Queue()
        self._streams[request_id] = q
        self._submit(("add", request_id, list(prompt_token_ids), params, time.monotonic()))
        finished = False
        try:
            while True:
                item = await q.get()
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                self._submit(("abort", request_id))

    async def abort(self, request_id: str) -> None:
        self._submit(("abort", request_id))

    # ---- engine thread ------------------------------------------------------
    def _submit(self, cmd: tuple) -> None:
        """Hand a command to the engine (never blocks the event loop)."""
        self._cmds.put(cmd)

    def _next_cmd(self, block: bool):
        try:
            return self._cmds.get(timeout=0.5) if block else self._cmds.get_nowait()
        except queue.Empty:
            return None

    def _run(self) -> None:
        eng = self.engine
        try:
            while not self._stop.is_set():
                outputs = engine_iteration(eng, self._next_cmd)
                self._stats = eng.stats()
                if outputs:
                    self._loop.call_soon_threadsafe(self._dispatch, outputs)
        except BaseException as exc:  # noqa: BLE001 - reported to every stream, then re-raised in logs
            log.exception("engine thread died")
            self._error = exc
            err = EngineDeadError(f"engine failed: {exc!r}")
            self._loop.call_soon_threadsafe(self._fail_all, err)

    def _dispatch(self, outputs: list) -> None:
        for out in outputs:
            if isinstance(out, tuple):
                rid, item = out
            else:
                rid, item = out.request_id, out
            q = self._streams.get(rid)
            if q is not None:
                q.put_nowait(item)

    def _fail_all(self, err: BaseException) -> None:
        for q in self._streams.values():
            q.put_nowait(err)
