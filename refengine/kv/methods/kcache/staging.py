"""Staging between the device and KCache's host V pool: reusable buffers and the copies' order.

Contract:

- ``StagingRing(slots, pin)``: ``acquire(*specs)`` hands out the next of ``slots`` buffers in
  round-robin order and returns one view per ``(shape, dtype)`` spec, carved from that buffer
  (64-byte aligned). A buffer is allocated when first used and regrown (to at least twice its
  size) only when a larger request comes, so steady serving allocates nothing per copy:
  ``allocations`` counts them. A buffer whose copy is still in flight is registered with
  ``hold(i, release)``; before buffer ``i`` is handed out again every held release up to and
  including its own runs, oldest first (a later write of the same rows must land after an
  earlier one). ``release_all()`` runs every held release, in order.
- ``Copier(device)``: how rows cross. On CUDA, copies run on one side stream that first waits
  for the producing (current) stream; each returns an event, the consumer's stream waits for it
  (``wait``) or the host does (``sync``). Elsewhere copies are synchronous and events None, so the
  bookkeeping above (``refengine.kv.methods.kcache.ops.HostStore`` in staged mode) runs unchanged in CPU
  tests. Pinned buffers (``pin``) only where the device is CUDA.

The CUDA side (streams, events, pinned memory, and whether the copies really overlap compute)
is untested here: no GPU was available when it was written (docs/kv-methods.md says so).
"""

from __future__ import annotations

from collections import deque
from typing import Callable

import torch

ALIGN = 64


class StagingRing:
    def __init__(self, slots: int = 2, pin: bool = False) -> None:
        self.buffers: list[torch.Tensor | None] = [None] * slots     # flat uint8, one per slot
        self.pin = pin
        self.next = 0
        self.allocations = 0
        self._held: deque[tuple[int, Callable[[], None]]] = deque()  # (slot, release), oldest first

    def acquire(self, *specs: tuple[tuple[int, ...], torch.dtype]) -> tuple[int, list[torch.Tensor]]:
        i = self.next
        self.next = (i + 1) % len(self.buffers)
        while any(j == i for j, _ in self._held):                     # land up to this slot's own copy
            self._held.popleft()[1]()
        sizes = [-(-torch.Size(s).numel() * torch.empty((), dtype=dt).element_size() // ALIGN) * ALIGN
                 for s, dt in specs]
        need = sum(sizes)
        buf = self.buffers[i]
        if buf is None or buf.numel() < need:
            size = need if buf is None else max(need, 2 * buf.numel())
            buf = torch.empty(size, dtype=torch.uint8, pin_memory=self.pin)
            self.buffers[i] = buf
            self.allocations += 1
        views, off = [], 0
        for (shape, dt), n in zip(specs, sizes):
            count = torch.Size(shape).numel() * torch.empty((), dtype=dt).element_size()
            views.append(buf[off:off + count].view(dt).view(shape))
            off += n
        return i, views

    def hold(self, i: int, release: Callable[[], None]) -> None:
        self._held.append((i, release))

    def release_all(self) -> None:
        while self._held:
            self._held.popleft()[1]()

    @property
    def in_flight(self) -> int:
        return len(self._held)


class Copier:
    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None

    def to_host(self, buf: torch.Tensor, x: torch.Tensor):
        """``buf`` (host) <- ``x`` (device); an event to sync on before reading ``buf`` (None: done)."""
        return self._copy(buf, x, device_side=x)        # x is not reused before the copy read it

    def to_device(self, buf: torch.Tensor, out: torch.Tensor):
        """``out`` (device) <- ``buf`` (host); an event the consumer waits for (None: done)."""
        return self._copy(out, buf, device_side=out)

    def _copy(self, dst: torch.Tensor, src: torch.Tensor, device_side: torch.Tensor):
        """``dst`` <- ``src`` on the copy stream after the work queued so far; ``device_side`` (the
        device tensor of the two) is recorded on that stream so its memory outlives the copy."""
        if not self.cuda:
            dst.copy_(src)
            return None
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            dst.copy_(src, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self.stream)
        device_side.record_stream(self.stream)
        return event

    def wait(self, event) -> None:
        """The current stream waits for ``event`` (the host does not)."""
        if event is not None:
            torch.cuda.current_stream(self.device).wait_event(event)

    @staticmethod
    def sync(event) -> None:
        """The host waits for ``event``."""
        if event is not None:
            event.synchronize()
