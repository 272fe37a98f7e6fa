"""ProcessEngine: the engine core in its own process (vLLM v1's layout), same contract as AsyncEngine.

Why: in one process the engine thread competes for the GIL with the HTTP layer
(request parsing, detokenisation, SSE formatting for every stream). A served
batched decode measured ~25% below the same engine in-process, with the engine thread
blocked in ~30% of samples (results/perf/README.md). Here the serving process keeps the
tokenizer and the streams, and a spawned child owns ``LLMEngine``.

Transport (``multiprocessing`` pipes, pickled tuples):
- parent -> child: ("add", id, prompt ids, params, arrival), ("abort", id), ("stop",).
  A sender thread writes them, so a full pipe (the child is in a long prefill step)
  never blocks the event loop.
- child -> parent: ("ready", info, stats) once loaded, or ("error", exc) when loading
  fails (``start`` raises it); then ("out", outputs, stats) after every loop turn
  that did work and on idle ticks, and ("dead", message) if the loop crashes.
  A reader thread unpickles them and hands outputs to the event loop with one
  ``call_soon_threadsafe`` per message, as the thread engine does per step.

A script that starts a ProcessEngine must guard its entry point with
``if __name__ == "__main__":`` (spawn re-imports the main module, as with vLLM).

Invariants: arrival times are ``time.monotonic()`` (system-wide on Linux, so both
processes share the clock). The child ignores SIGINT (the worker drains on it and
then stops the child) and exits when the parent's end of the command pipe closes, so
a killed worker leaves no engine behind (after its current step). If the child dies,
every open stream gets ``EngineDeadError`` and ``healthy()`` turns False for good (the
worker then exits so that its supervisor restarts it: ``worker.shutdown``). The child
reports at least every ``IDLE_WAIT_S`` when idle and after every step: silence for
``step_timeout`` seconds is a hang (a step that never ends, a stopped process), and the
reader kills the child (SIGKILL), which then counts as dead.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing as mp
import pickle
import signal
import threading

from refengine.async_engine import AsyncEngine, EngineDeadError, EngineLoop
from refengine.config import EngineConfig
from refengine.host_malloc import spawn_environment
from refengine.outputs import RequestFailed

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 30.0


def _portable(exc: BaseException) -> BaseException:
    """The exception itself when it pickles, else a RequestFailed with its text."""
    try:
        pickle.dumps(exc)
        return exc
    except Exception:  # noqa: BLE001 - any pickling failure
        return RequestFailed(f"{type(exc).__name__}: {exc}")


def _child_main(config: EngineConfig, cmd_conn, out_conn, log_level: int) -> None:
    """Entry point of the engine process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s [engine]: %(message)s")
    from refengine.engine import LLMEngine

    try:
        eng = LLMEngine(config)
    except BaseException as exc:  # noqa: BLE001 - the parent raises it from start()
        out_conn.send(("error", _portable(exc)))
        return
    info = {"max_model_len": eng.max_model_len, "eos_token_ids": tuple(eng.eos_token_ids),
            "vocab_size": eng.spec.vocab_size}
    out_conn.send(("ready", info, eng.stats()))
    stop = False

    def next_cmd(timeout: float | None):
        nonlocal stop
        if stop or not cmd_conn.poll(timeout or 0):
            return None
        cmd = cmd_conn.recv()             # EOFError when the parent is gone: ends the loop
        if cmd[0] == "stop":
            stop = True
            return None
        return cmd

    loop = EngineLoop(eng)
    try:
        while not stop:
            outputs = loop.turn(next_cmd)
            outputs = [(o[0], _portable(o[1])) if isinstance(o, tuple) else o for o in outputs]
            out_conn.send(("out", outputs, eng.stats()))
    except (EOFError, BrokenPipeError):
        log.info("serving process gone; engine process exits")
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails every stream
        log.exception("engine process loop died")
        try:
            out_conn.send(("dead", f"engine failed: {exc!r}"))
        except OSError:
            pass


class ProcessEngine(AsyncEngine):
    """EngineClient whose ``LLMEngine`` runs in a spawned child process."""

    def __init__(self, config: EngineConfig, step_timeout: float | None = None) -> None:
        super().__init__(config, step_timeout)
        self._proc = None
        self._cmd_conn = None
        self._out_conn = None
        self._reader: threading.Thread | None = None
        self._sender: threading.Thread | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        ctx = mp.get_context("spawn")        # never fork a process that holds threads (tokenizers, uvloop)
        cmd_r, cmd_w = ctx.Pipe(duplex=False)
        out_r, out_w = ctx.Pipe(duplex=False)
        self._proc = ctx.Process(target=_child_main, name="refengine-core", daemon=True,
                                 args=(self.config, cmd_r, out_w, logging.getLogger().getEffectiveLevel()))
        with spawn_environment(self.config.huge_pages):
            self._proc.start()
        cmd_r.close()                         # the child holds these; closing ours lets EOF reach each side
        out_w.close()
        self._cmd_conn, self._out_conn = cmd_w, out_r
        try:
            msg = await asyncio.to_thread(out_r.recv)
        except EOFError:
            await asyncio.to_thread(self._proc.join, 5)
            raise EngineDeadError(f"engine process exited while loading (exit code {self._proc.exitcode})") from None
        if msg[0] == "error":
            await asyncio.to_thread(self._proc.join, 5)
            raise msg[1]
        _, info, self._stats = msg
        self.max_model_len = info["max_model_len"]
        self.eos_token_ids = info["eos_token_ids"]
        self.vocab_size = info["vocab_size"]
        self._reader = threading.Thread(target=self._read, name="refengine-reader", daemon=True)
        self._sender = threading.Thread(target=self._send, name="refengine-sender", daemon=True)
        self._reader.start()
        self._sender.start()
        log.info("engine core running in process %d", self._proc.pid)

    async def shutdown(self) -> None:
        self._stop.set()
        if self._proc is None:
            return
        self._cmds.put(("stop",))
        await asyncio.to_thread(self._proc.join, STOP_TIMEOUT_S)
        if self._proc.is_alive():
            log.warning("engine process did not stop in %.0f s; terminating", STOP_TIMEOUT_S)
            self._proc.terminate()
            await asyncio.to_thread(self._proc.join, 5)
            if self._proc.is_alive():
                self._proc.kill()
                await asyncio.to_thread(self._proc.join, 5)
        self._cmds.put(None)                  # ends the sender thread
        for t in (self._reader, self._sender):
            if t is not None:
                await asyncio.to_thread(t.join, 5)
        self._cmd_conn.close()
        self._out_conn.close()

    def healthy(self) -> bool:          # the reader thread is the watchdog here (a hang kills the child)
        return (self._error is None and self._proc is not None and self._proc.is_alive()
                and self._reader is not None and self._reader.is_alive())

    # ---- transport threads --------------------------------------------------
    def _send(self) -> None:
        while (cmd := self._cmds.get()) is not None:
            try:
                self._cmd_conn.send(cmd)
            except OSError:                   # the child is gone; the reader reports it
                return
            if cmd[0] == "stop":
                return

    def _read(self) -> None:
        reason = "engine process exited"
        try:
            while True:
                if self.step_timeout and not self._out_conn.poll(self.step_timeout) and not self._stop.is_set():
                    reason = f"engine process hung (no report for {self.step_timeout:g} s); killed"
                    self._proc.kill()
                    break
                msg = self._out_conn.recv()
                if msg[0] == "out":
                    self._stats = msg[2]
                    if msg[1]:
                        self._loop.call_soon_threadsafe(self._dispatch, msg[1])
                elif msg[0] == "dead":
                    reason = msg[1]
        except (EOFError, OSError):
            pass
        if self._stop.is_set() and reason == "engine process exited":
            return                            # an orderly shutdown
        code = None
        if self._proc is not None:
            # The pipe reaches EOF as the child's descriptors close, which can be before the
            # kernel has made it reapable; exitcode would still read None then.
            self._proc.join(timeout=5)
            code = self._proc.exitcode
        log.error("%s (exit code %s)", reason, code)
        self._error = EngineDeadError(f"{reason} (exit code {code})")
        self._loop.call_soon_threadsafe(self._fail_all, self._error)


def engine_client(config: EngineConfig, core: str = "process", step_timeout: float | None = None) -> AsyncEngine:
    """The reference engine as an EngineClient: ``core`` "process" (own process) or "thread";
    ``step_timeout``: seconds without progress after which the engine counts as hung (None: never)."""
    if core == "process":
        return ProcessEngine(config, step_timeout)
    if core == "thread":
        return AsyncEngine(config, step_timeout)
    raise ValueError(f"engine core must be 'process' or 'thread', got {core!r}")

