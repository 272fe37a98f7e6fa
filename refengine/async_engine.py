"""AsyncEngine: the synchronous LLMEngine on a background thread, with asyncio streams.

The event loop never runs the engine. Requests and aborts travel to the engine
thread through a thread-safe command queue; each step's outputs travel back with
one ``loop.call_soon_threadsafe`` into per-request ``asyncio.Queue``s.

Contract (see worker/engine_client.py): ``generate`` yields increments until the
finished one; leaving the iterator early (client disconnect, cancellation)
aborts the request in ``finally``. A request the engine refuses (``ValueError``) or
that fails inside a step (``RequestFailed``, see ``LLMEngine``) gets that error on its
own stream; the others go on. If the engine thread dies, every open stream
receives the error and ``healthy()`` turns False for good (the worker then exits so that
its supervisor restarts it: ``worker.shutdown``). ``step_timeout``: a loop that has not come
round for that many seconds (a step that never ends) is hung: dead as well.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from typing import AsyncIterator

from refengine.config import EngineConfig
from refengine.faults import request_failure
from refengine.outputs import EngineStats, RequestOutput
from refengine.sampling_params import SamplingParams

log = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    pass


IDLE_WAIT_S = 0.5            # how long an idle engine loop waits for a command (then it reports stats again)
COMPILE_POLL_S = 0.01        # how often a loop with only requests waiting for their grammar looks at them


class EngineLoop:
    """One engine's command handling and stepping, for the thread and the process loops alike.

    ``turn(next_cmd)`` is one turn: apply the waiting commands, admit the constrained requests whose
    grammar is now compiled, then step. ``next_cmd(timeout)`` returns the next command or None;
    ``timeout`` None means "do not wait" (the engine has work), else the most seconds to wait.
    Commands: ("add", id, prompt ids, params, arrival) and ("abort", id). Returns the outputs:
    ``RequestOutput``s and ``(request_id, exception)`` pairs for requests refused or failed alone.

    A constrained request whose grammar is not compiled yet waits here (``pending``) while the
    grammar compiles on its own thread (``GrammarMasks.prepare``), then joins the engine: a
    grammar that takes long to build delays its own request only, never the running batch.
    ``last_turn`` (monotonic) is when the loop last came round: a watchdog's heartbeat."""

    def __init__(self, eng) -> None:
        self.eng = eng
        self.pending: dict[str, tuple] = {}          # request id -> (add command, compile future)
        self.last_turn = time.monotonic()

    def turn(self, next_cmd) -> list:
        eng, outputs = self.eng, []
        wait = None if eng.has_unfinished() else COMPILE_POLL_S if self.pending else IDLE_WAIT_S
        while (cmd := next_cmd(wait)) is not None:
            wait = None
            if cmd[0] == "add":
                self._add(cmd, outputs)
            elif cmd[0] == "abort":
                self._abort(cmd[1], outputs)
        for rid, (cmd, fut) in list(self.pending.items()):
            if fut.done():
                del self.pending[rid]
                exc = fut.exception()
                if exc is not None:
                    outputs.append((rid, request_failure(exc)))
                else:
                    self._add(cmd, outputs, compiled=True)
        if eng.has_unfinished():
            outputs.extend(eng.step())
            outputs.extend(eng.take_failures().items())
        self.last_turn = time.monotonic()
        return outputs

    def _add(self, cmd: tuple, outputs: list, compiled: bool = False) -> None:
        _, rid, prompt, params, arrival = cmd
        if not compiled and params.structured is not None:
            # The engine's grammar cache (refengine.structured.masks); None: the template is ready.
            fut = self.eng.runner.grammar.prepare(params.structured)
            if fut is not None:
                self.pending[rid] = (cmd, fut)
                return
        try:
            self.eng.add_request(rid, prompt, params, arrival)
        except Exception as exc:  # noqa: BLE001 - this request's error, not the engine's
            outputs.append((rid, exc))

    def _abort(self, rid: str, outputs: list) -> None:
        waiting = self.pending.pop(rid, None)
        if waiting is not None:
            prompt = waiting[0][2]
            outputs.append(RequestOutput(rid, [], len(prompt), 0, finished=True, finish_reason="abort"))
            return
        out = self.eng.abort_request(rid)
        if out is not None:
            outputs.append(out)


class AsyncEngine:
    def __init__(self, config: EngineConfig, step_timeout: float | None = None) -> None:
        self.config = config
        self.step_timeout = step_timeout
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
        self._turns: EngineLoop | None = None

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
        if self._thread is not None and self._error is None:        # a hung thread would never join
            await asyncio.to_thread(self._thread.join, 30)

    def healthy(self) -> bool:
        if self._error is None and self._turns is not None and self.step_timeout \
                and time.monotonic() - self._turns.last_turn > self.step_timeout:
            # Called on the event loop's thread (health checks, the worker's watch): fail the streams here.
            self._error = EngineDeadError(f"engine hung: its loop has not come round for {self.step_timeout:g} s")
            log.error("%s", self._error)
            self._fail_all(self._error)
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

    def _next_cmd(self, timeout: float | None):
        try:
            return self._cmds.get(timeout=timeout) if timeout else self._cmds.get_nowait()
        except queue.Empty:
            return None

    def _run(self) -> None:
        eng = self.engine
        self._turns = loop = EngineLoop(eng)
        try:
            while not self._stop.is_set():
                outputs = loop.turn(self._next_cmd)
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
