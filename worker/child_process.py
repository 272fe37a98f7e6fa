"""One helper child process that answers one line per request: ``LineChild``.

The worker keeps CPU-heavy request screening off its event loop in such children (the
constraint compiler of ``worker.constraints``, the large-body screen of ``worker.body_screen``).
Children run at background CPU priority from their start (``swiftcommon.priority``).
Protocol: the child prints ``"ready"`` on a line once it can work, then answers each request it
reads from stdin with one line on stdout. The event loop only writes the request and awaits
the line.

``ready()`` starts the child unless it runs or is starting (its start is not counted in any
request's time limit). ``ask(payload, timeout)`` writes ``payload`` and returns the answer line;
when the child does not answer within ``timeout`` s or dies, it is killed and started again in the
background, ready for the next request, and ``ask`` raises ``ChildFailed`` (``timed_out`` says which).
"""

from __future__ import annotations

import asyncio

from swiftcommon.priority import lower_priority_of

START_TIMEOUT_S = 120.0     # a child's start (imports, tokenizer), not counted in a request's time limit


class ChildFailed(Exception):
    def __init__(self, timed_out: bool) -> None:
        super().__init__("timed out" if timed_out else "died")
        self.timed_out = timed_out


class LineChild:
    def __init__(self, argv: list[str], what: str) -> None:
        self.argv, self.what = argv, what
        self.proc: asyncio.subprocess.Process | None = None
        self.starting: asyncio.Task | None = None

    async def ready(self) -> None:
        """Start the child unless it runs (or is starting); raises if it cannot start."""
        self.start_soon()
        await asyncio.shield(self.starting)

    def start_soon(self) -> None:
        """Start the child in the background unless it runs or is starting (``ready`` raises a failed start)."""
        if self.starting is None or self.starting.done() and not self.running:
            self.starting = asyncio.ensure_future(self._start())
            self.starting.add_done_callback(lambda t: t.cancelled() or t.exception())   # retrieved: no warning

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def _start(self) -> None:
        proc = await asyncio.create_subprocess_exec(*self.argv, stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE, limit=1 << 20)
        lower_priority_of(proc.pid)             # its start too is side work (swiftcommon.priority)
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT_S)
        except asyncio.TimeoutError:
            line = b"(no answer)"
        if line.strip() != b'"ready"':
            proc.kill()
            raise RuntimeError(f"the {self.what} did not start: {line[:200]!r}")
        self.proc = proc

    async def ask(self, payload: bytes, timeout: float) -> bytes:
        """The child's answer line to ``payload`` (the child must be running: ``ready()``)."""
        self.proc.stdin.write(payload)
        try:
            await self.proc.stdin.drain()
            line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        except asyncio.TimeoutError:
            self.restart()
            raise ChildFailed(timed_out=True) from None
        except (ConnectionError, OSError):
            line = b""
        if not line:
            self.restart()
            raise ChildFailed(timed_out=False)
        return line

    def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
        if self.proc is not None and getattr(self.proc, "_transport", None) is not None:
            self.proc._transport.close()            # its pipes now, not when the loop may be gone
        self.proc = None

    def restart(self) -> None:
        self.kill()
        self.start_soon()                       # in the background: ready for the next request
