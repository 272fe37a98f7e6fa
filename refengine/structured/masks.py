"""Token masks for constrained requests, computed beside the forward pass.

``GrammarMasks`` belongs to one ``ModelRunner``. Each step, before the model runs,
``start(requests)`` hands the constrained rows to a one-thread executor, which for each:
takes (or compiles, through an LRU cache keyed by ``StructuredSpec``) the request's
matcher, catches it up with the tokens the request generated since its last mask, and
writes the next-token bitmask (``[rows, ceil(V/32)]`` int32, bit ``t % 32`` of word
``t // 32`` set when token ``t`` is allowed), one row after the other, without the GIL. The forward pass runs meanwhile on the engine thread; ``result()``
waits for the masks before sampling, and the sampler applies them to the whole batch
at once (``refengine.sampler``). Unconstrained requests never wait on a grammar.

With no core to spare (CPU engines whose torch threads take every core) ``overlap`` is off
and the masks are computed on the engine thread before the forward pass: measured on 2
cores, a grammar thread beside the forward pass made a 16-request decode step ~8x slower
(torch's OpenMP threads stall when one of them loses its core, however short the
intrusion), while computing the masks inline costs about their own time.

Invariants: matchers and the cache are touched only on the executor's thread (one
task in flight at a time: ``result()`` is called before the next ``start``). A
matcher's progress is the number of output tokens it consumed, not an event per
sample: a step that is run again (batch isolation) or a preempted and recomputed
request simply catch up from the request's own token list. ``release`` drops a
request's matcher when it finishes or aborts.

A continuation (a generation resumed from another worker's tokens, which end its prompt)
carries those tokens as ``SamplingParams.structured_prefix``: ``constrained_ids`` puts them
before the request's output, so the matcher (and the JSON number state) first consumes
what the other engine generated and masks the next token from exactly its state. Ids the
constraint does not accept fail that request alone (``GrammarError``, the engine's isolation).

The compiled template of a spec (an ``LLMatcher`` before any token) is copied per
request (``deep_copy``), so a schema is compiled once while it stays in the cache.
``prepare(spec)`` compiles a template ahead, on a compile thread of its own, and computes
its first mask once (the lexer it builds is shared by every copy): the engine loop holds
a constrained request back until its template is ready (``refengine.async_engine``), so
a grammar that takes a second to build delays only its own request, never a step. The
template cache is shared by the two threads under a lock; ``_setup`` runs once, under it.

Speculative decoding: a request that verifies drafted tokens has one sampling row per draft position
(``drafts``: row ``j + i`` follows ``drafts[:i]``). Its matcher consumes the drafts one by one to
write each position's mask, then rolls them back (``LLMatcher.rollback``; the JSON number state is
copied and restored), so the state stays the request's own output. The row after a draft that ends
the grammar allows only the end of sequence (the stopped matcher's mask). Past a draft the grammar
refuses, the remaining rows allow everything: verification stops at the refused draft, whose own
row's mask gives it probability 0.

JSON constraints also follow their output's numbers (``refengine.structured.numbers``): a
fraction stops offering digits after 17 significant digits, what a double carries.
"""

from __future__ import annotations

import collections
import copy
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import torch

from refengine.structured.grammar import GrammarError, parser_limits, to_grammar
from refengine.structured.numbers import JsonNumberState, cap_row, digit_start_words
from refengine.structured.spec import StructuredSpec
from swiftcommon.priority import background_priority

CACHE_SIZE = 256


@dataclass
class TokenMasks:
    rows: list[int]              # positions in the step's sampling batch
    bits: torch.Tensor           # [len(rows), ceil(V/32)] int32


def constrained_ids(params, output_ids: list[int]) -> list[int]:
    """The tokens a request's constraint has to have consumed: a continuation's prefix, then its output."""
    prefix = params.structured_prefix
    return [*prefix, *output_ids] if prefix else output_ids


class _State:
    __slots__ = ("matcher", "consumed", "numbers")

    def __init__(self, matcher, json: bool) -> None:
        self.matcher = matcher
        self.consumed = 0
        self.numbers = JsonNumberState() if json else None


class GrammarMasks:
    def __init__(self, tokenizer_dir: str, vocab_size: int, eos_token_ids: tuple[int, ...],
                 cache_size: int = CACHE_SIZE, overlap: bool = True) -> None:
        self.tokenizer_dir = tokenizer_dir
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self.cache_size = cache_size
        self.overlap = overlap
        self._tokenizer = None                   # built on first use (~1 s), on the executor's thread
        self._ll = None
        self._digit_words = None                 # [ceil(V/32)] int32: tokens starting with a digit
        self._templates: collections.OrderedDict[StructuredSpec, object] = collections.OrderedDict()
        self._states: dict[str, _State] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar")
        # Compiles run at background priority: a slow one must not take a core from the forward pass.
        self._compiler = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar-compile",
                                            initializer=background_priority)
        self._lock = threading.Lock()            # the template cache and _setup, shared by both threads
        self._preparing: dict[StructuredSpec, Future] = {}
        self.compiled = 0                        # grammars compiled (cache misses)
        self.cache_hits = 0
        self.mask_ms: collections.deque[float] = collections.deque(maxlen=4096)   # per row and step
        self.wait_ms: collections.deque[float] = collections.deque(maxlen=4096)   # engine thread, per step

    # ---- on the executor's thread -----------------------------------------------------------
    def _setup(self) -> None:
        with self._lock:
            if self._tokenizer is None:
                self._load()

    def _load(self) -> None:
        import llguidance

        self._ll = llguidance
        self._tokenizer = llguidance.LLTokenizer(f"{self.tokenizer_dir}/tokenizer.json", n_vocab=self.vocab_size,
                                                 eos_token=self.eos_token_ids)
        self._digit_words = digit_start_words(self._tokenizer, self.vocab_size)

    def _cached(self, spec: StructuredSpec):
        with self._lock:
            m = self._templates.get(spec)
            if m is not None:
                self._templates.move_to_end(spec)
            return m

    def _template(self, spec: StructuredSpec):
        m = self._cached(spec)
        if m is not None:
            self.cache_hits += 1
            return m
        return self._build(spec)

    def _build(self, spec: StructuredSpec, warm: bool = False):
        """Compile ``spec``'s template (and, ``warm``, compute a first mask on a copy) and cache it."""
        m = self._ll.LLMatcher(self._tokenizer, to_grammar(spec), log_level=0, limits=parser_limits())
        if m.is_error():
            raise GrammarError(m.get_error())
        if warm:
            probe = m.deep_copy()
            probe.compute_bitmask()
            if probe.is_error():
                raise GrammarError(probe.get_error())
        with self._lock:
            self.compiled += 1
            self._templates[spec] = m
            if len(self._templates) > self.cache_size:
                self._templates.popitem(last=False)
        return m

    def _prepare(self, spec: StructuredSpec) -> None:
        self._setup()
        if self._cached(spec) is None:
            self._build(spec, warm=True)

    def _compute(self, todo: list[tuple[int, str, StructuredSpec, list[int], list[int]]]) -> TokenMasks:
        if self._tokenizer is None:
            self._setup()
        t0 = time.perf_counter()
        pairs = []
        rows: list[int] = []
        for row, rid, spec, out_ids, drafts in todo:
            st = self._states.get(rid)
            if st is None:
                st = self._states[rid] = _State(self._template(spec).deep_copy(), spec.kind == "json")
            new = out_ids[st.consumed:]
            if new:
                if not st.matcher.consume_tokens(new):
                    self._states.pop(rid, None)
                    raise GrammarError(f"request {rid}: the output (or the continuation it resumes) left its "
                                       f"grammar: {st.matcher.get_error()}", rid)
                st.consumed += len(new)
                if st.numbers is not None:
                    st.numbers.feed(self._tokenizer.decode_bytes(new))
            pairs.append((st, len(rows), drafts))
            rows.extend(range(row, row + 1 + len(drafts)))
        bits = torch.full((len(rows), (self.vocab_size + 31) // 32), -1, dtype=torch.int32)
        for (st, j, drafts), (_, rid, *_) in zip(pairs, todo):
            try:
                self._rows(st, bits, j, drafts)
            except GrammarError as exc:         # e.g. the lexer's limits, reached deep into an output
                self._states.pop(rid, None)
                raise GrammarError(f"request {rid}: {exc}", rid) from None
        per_row = 1e3 * (time.perf_counter() - t0) / len(rows)
        self.mask_ms.extend([per_row] * len(rows))
        return TokenMasks(rows, bits)

    def _rows(self, st: _State, bits: torch.Tensor, j: int, drafts: list[int]) -> None:
        """Mask rows ``j ..`` of one request: its next token, then after each draft (consumed, then rolled back)."""
        # One row at a time on this thread (the GIL is released inside). llguidance's parallel
        # executor keeps a pool of spinning worker threads, which on a small CPU took cores from
        # the forward pass (a 16-request constrained batch ran at half speed).
        m, row_bytes = st.matcher, bits.shape[1] * 4
        numbers = copy.copy(st.numbers) if drafts and st.numbers is not None else None
        taken = 0
        for i in range(len(drafts) + 1):
            if i:
                d = drafts[i - 1]
                # The previous row's mask (capped numbers included) decides; a refused token is never fed
                # to the matcher (it would leave it in an error state).
                if not (int(bits[j + i - 1, d // 32]) >> (d % 32)) & 1 or m.is_stopped() or not m.consume_token(d):
                    break                         # rows past a refused draft are never used: they allow all
                taken += 1
                if st.numbers is not None:
                    st.numbers.feed(self._tokenizer.decode_bytes([d]))
            # A draft that ended the grammar still gets its row: a stopped matcher's mask allows the end
            # of sequence only. Left all-allowed, the bonus token after an accepted closing draft could
            # be anything, and the next step's catch-up would find the output outside its grammar.
            m.unsafe_compute_mask_ptr(bits.data_ptr() + (j + i) * row_bytes, row_bytes)
            if m.is_error():
                raise GrammarError(m.get_error())
            if st.numbers is not None and st.numbers.capped:
                cap_row(bits[j + i], self._digit_words)
        if taken:
            m.rollback(taken)
        if numbers is not None:
            st.numbers = numbers

    # ---- on the engine thread ---------------------------------------------------------------
    def prepare(self, spec: StructuredSpec) -> Future | None:
        """None when ``spec``'s template is ready; else the future of its compilation (GrammarError when
        it cannot be compiled) on the compile thread. Concurrent calls for one spec share the future."""
        if self._tokenizer is not None and self._cached(spec) is not None:
            return None
        fut = self._preparing.get(spec)
        if fut is None or (fut.done() and fut.exception() is None and self._cached(spec) is None):
            fut = self._preparing[spec] = self._compiler.submit(self._prepare, spec)
            fut.add_done_callback(lambda f, s=spec: self._preparing.pop(s, None) if self._preparing.get(s) is f
                                  else None)
        return fut

    def start(self, todo: list[tuple[int, str, StructuredSpec, list[int], list[int]]]) -> Future | None:
        """``todo``: (first sampling row, request id, spec, ``constrained_ids``: the request's output token ids
        so far, after a continuation's, drafts verified this step: one more row each) per constrained request.
        Returns a future of ``TokenMasks`` (None when nothing is constrained)."""
        if not todo:
            return None
        # The token lists are copied: the engine thread appends to them after this step.
        todo = [(r, rid, s, list(ids), list(drafts)) for r, rid, s, ids, drafts in todo]
        if self.overlap:
            return self._pool.submit(self._compute, todo)
        done: Future = Future()
        try:
            done.set_result(self._compute(todo))
        except BaseException as exc:  # noqa: BLE001 - raised by result(), as from the thread
            done.set_exception(exc)
        return done

    def result(self, fut: Future) -> TokenMasks:
        """The step's masks; records how long the engine thread waited for them after the forward pass."""
        t0 = time.perf_counter()
        masks = fut.result()
        self.wait_ms.append(1e3 * (time.perf_counter() - t0))
        return masks

    def release(self, request_id: str) -> None:
        # Runs on the engine thread while no task is in flight (between steps): no race on _states.
        self._states.pop(request_id, None)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._compiler.shutdown(wait=False, cancel_futures=True)
