"""The live quality monitor: the original model scores a canary's answers, off the client's path.

For an alias with a shadow spec (gateway.aliases.ShadowSpec), a ``fraction`` of the requests
answered by one of its shadowed ``models`` (non-streamed or streamed /v1/completions and
/v1/chat/completions with one prompt and no tools) is *sampled* when it is routed. The
client's answer is read as it passes (gateway.answers.AnswerTap); once it is complete (the
body sent, or the stream closed) a comparison job may start, in a task of its own:

1. the prompt's token ids, rendered by a worker of the ``reference`` model (``/tokenize``,
   chat template included), and the variant's answer text tokenised there too (the first
   ``--shadow-max-tokens`` tokens, ``n`` of them);
2. the reference's own greedy answer to the same prompt (``temperature`` 0, ``max_tokens``
   ``n``, the request's stop settings), tokenised the same way;
3. one scoring request (``/v1/completions``, ``echo``, ``max_tokens`` 0, ``logprobs`` 1) with
   both sequences, prompt + answer: the reference's log-probability of every answer token.

It records per variant (gateway.metrics): the mean NLL per token of the variant's answer and of
the reference's own (``shadow_nll_nats_per_token``), their difference, the *gap*
(``shadow_logprob_gap_nats_per_token``: 0 for an answer the reference would have given, larger
the less the reference would have said it), and the share of the variant's tokens that are the
reference's greedy choice after the same prefix (``shadow_greedy_agreement``, teacher-forced;
for greedy canary requests it says how often the variant's next token differs). Shadowing the
reference itself (listed in ``models``) is the control: its gap is 0 for greedy requests and
shows the sampling baseline otherwise.

Bounds, so that shadowing never hurts clients: nothing starts before the client's answer is
complete; a job starts only while the gateway's admission queue is empty, a reference worker
is routable, has room and carries less than ``--shadow-max-load`` effective load, fewer than
``--shadow-max-concurrency`` jobs run and the ``--shadow-max-rps`` token bucket has a token
(otherwise the sample is *shed*, counted by outcome). A job holds its reference worker as one
in-flight request (routing sees it) and never retries. With ``--shadow-yield all`` (pools that
share machines, where a comparison's prefill on the original's worker takes CPU from the
canary's), a job also waits until no client request is in flight at the gateway (shed as
``shed_busy`` if none comes within ``--shadow-timeout``), and a client request that arrives while
it runs stops it at once (``preempted``: its connections close, so the worker aborts it).
Constrained answers of every model are checked here too (``constrained_outputs_total``;
gateway.answers.valid).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from dataclasses import dataclass

import aiohttp
import orjson

from gateway.answers import AnswerTap, Constraint, constraint_of, valid
from gateway.routing.base import effective_load, pick_min
from gateway.streaming import SSEStream
from gateway.upstream import UPSTREAM_HEADERS, Lease

log = logging.getLogger(__name__)
SHADOW_PATHS = ("/v1/completions", "/v1/chat/completions")
CHAT_FIELDS = ("messages", "chat_template", "chat_template_kwargs", "add_generation_prompt", "continue_final_message",
               "add_special_tokens")
STOP_FIELDS = ("stop", "stop_token_ids", "ignore_eos", "min_tokens", "skip_special_tokens")
IDLE_POLL_S = 0.05          # --shadow-yield all: how often a waiting job looks for an idle gateway


class ShadowFailed(Exception):
    pass


@dataclass
class Watch:
    """What the gateway inspects of one answer: a shadow sample (the reference to ask) and/or a constraint."""
    model: str
    path: str
    body: dict
    reference: str | None = None
    constraint: Constraint | None = None


def shadowable(path: str, body: dict) -> bool:
    """One prompt, text answers: what a comparison can score (choice 0)."""
    if path not in SHADOW_PATHS or body.get("echo") or body.get("tools") or body.get("continuation_token_ids"):
        return False
    prompt = body.get("prompt")
    if path == "/v1/completions":
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) and len(prompt) != 1:
            return False
    return True


def answer_nll(block: dict, n: int) -> tuple[float, float]:
    """(mean NLL per token, greedy agreement) of the last ``n`` tokens of an echoed completions logprobs block."""
    lps, tops = block["token_logprobs"][-n:], block["top_logprobs"][-n:]
    if len(lps) != n or any(v is None for v in lps):
        raise ShadowFailed("the scoring answer lacks token logprobs")
    agree = sum(1 for lp, top in zip(lps, tops) if top and lp >= max(top.values()) - 1e-4)
    return -sum(lps) / n, agree / n


class ShadowMonitor:
    def __init__(self, config, directory, health, admission, metrics, rng: random.Random | None = None) -> None:
        self.cfg, self.directory, self.health, self.admission, self.m = config, directory, health, admission, metrics
        self.rng = rng or random.Random()
        self.running = 0
        self.tokens, self.refilled = max(1.0, config.shadow_max_rps), time.monotonic()
        self.tasks: set[asyncio.Task] = set()
        self.started: set[asyncio.Task] = set()      # jobs holding a reference worker
        self.preempted: set[asyncio.Task] = set()    # jobs stopped for a client request (--shadow-yield all)
        self.timeout = aiohttp.ClientTimeout(total=config.shadow_timeout)

    # ---- on the request's path: decide, tap, hand over -------------------------------------
    def client_request(self) -> None:
        """A client request is about to be sent: with ``--shadow-yield all`` every running job stops."""
        if self.cfg.shadow_yield != "all":
            return
        for task in self.started - self.preempted:
            self.preempted.add(task)
            task.cancel()

    def plan(self, routed, path: str) -> Watch | None:
        """What to inspect of this request's answer (None: nothing, the answer is passed on untouched)."""
        if routed.model is None:
            return None
        spec = routed.alias.shadow if routed.alias is not None else None
        sample = (spec is not None and routed.model in spec.models and shadowable(path, routed.body)
                  and self.rng.random() < spec.fraction)
        constraint = constraint_of(path, routed.body)
        if not sample and constraint is None:
            return None
        return Watch(routed.model, path, routed.body, spec.reference if sample else None, constraint)

    def watch(self, response, w: Watch, session):
        """``response`` with its answer read as it goes out; the comparison starts once it is complete."""
        if isinstance(response, SSEStream):
            self._tap_stream(response, w, session)
        elif response.status_code == 200 and getattr(response, "body", None):
            tap = AnswerTap()
            tap.feed_body(response.body)
            self._done(tap, w, session)
        return response

    def _tap_stream(self, resp: SSEStream, w: Watch, session) -> None:
        tap, pump, on_close = AnswerTap(), resp.pump, resp.on_close

        async def tapped_pump(send):
            async def tapped_send(msg):
                if msg.get("body"):
                    tap.feed(msg["body"])
                await send(msg)
            await pump(tapped_send)

        async def tapped_close():
            await on_close()
            if not resp.client_gone:
                self._done(tap, w, session)

        resp.pump, resp.on_close = tapped_pump, tapped_close

    def _done(self, tap: AnswerTap, w: Watch, session) -> None:
        if not tap.finished:
            if w.reference is not None:
                self.m.shadow_requests.labels(w.model, "no_answer").inc()
            return
        if w.constraint is not None:
            for choice in tap.choices.values():
                ok = valid(w.constraint, choice)
                if ok is not None:
                    self.m.constrained.labels(w.model, "true" if ok else "false").inc()
        if w.reference is None:
            return
        answer = tap.choices.get(0)
        if answer is None or not answer.content:
            self.m.shadow_requests.labels(w.model, "no_answer").inc()
            return
        worker, outcome = self._admit(w.reference)
        if worker is None:
            self.m.shadow_requests.labels(w.model, outcome).inc()
            return
        task = asyncio.ensure_future(self._compare(session, worker, w, answer.content))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # ---- load shedding ----------------------------------------------------------------------
    def _admit(self, reference: str):
        """(a reference worker for a job, "") or (None, why the sample is shed)."""
        cfg, now = self.cfg, time.monotonic()
        if self.running >= cfg.shadow_max_concurrency:
            return None, "shed_concurrency"
        pool = [w for w in self.directory.of(reference) if w.routable(now)]
        if not pool:
            return None, "no_reference"
        cands = [w for w in pool if self.admission.has_room(w)
                 and effective_load(w, now, cfg.stale_after) < cfg.shadow_max_load]
        if self.admission.queued or not cands:
            return None, "shed_load"
        self.tokens = min(max(1.0, cfg.shadow_max_rps), self.tokens + (now - self.refilled) * cfg.shadow_max_rps)
        self.refilled = now
        if self.tokens < 1.0:
            return None, "shed_rate"
        self.tokens -= 1.0
        return pick_min(cands, lambda w: effective_load(w, now, cfg.stale_after), self.rng), ""

    # ---- the comparison -------------------------------------------------------------------------
    async def _compare(self, session, worker, w: Watch, text: str) -> None:
        self.running += 1
        self.m.shadow_in_flight.inc()
        try:
            if self.cfg.shadow_yield == "all" and not await self._until_idle():
                self.m.shadow_requests.labels(w.model, "shed_busy").inc()
                return
            outcome = await self._run(session, worker, w, text)
            self.m.shadow_requests.labels(w.model, outcome).inc()
        finally:
            self.running -= 1
            self.m.shadow_in_flight.dec()

    async def _until_idle(self) -> bool:
        """Wait until no client request is in flight (jobs' own leases aside); False after ``shadow_timeout``."""
        deadline = time.monotonic() + self.cfg.shadow_timeout
        while sum(w.in_flight for w in self.directory.pool) > len(self.started):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(IDLE_POLL_S)
        return True

    async def _run(self, session, worker, w: Watch, text: str) -> str:
        """One comparison on ``worker``; its outcome."""
        task = asyncio.current_task()
        self.started.add(task)
        lease = Lease(worker, self.health, self.admission, self.directory.pool)
        try:
            return "scored" if await self._score(session, worker.url, w, text) else "scored_no_reference"
        except asyncio.CancelledError:
            if task not in self.preempted:
                raise                       # the gateway is closing
            return "preempted"
        except (ShadowFailed, aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError, KeyError,
                TypeError, IndexError) as exc:
            log.warning("shadow comparison of %s on %s failed: %s", w.model, worker.url, exc or type(exc).__name__)
            return "failed"
        finally:
            lease.finish(None)              # shadow work never counts for or against a worker's health
            self.started.discard(task)
            self.preempted.discard(task)

    async def _post(self, session, url: str, path: str, body: dict) -> dict:
        async with session.post(url + path, data=orjson.dumps(body), headers=UPSTREAM_HEADERS,
                                timeout=self.timeout) as r:
            raw = await r.read()
        doc = json.loads(raw)               # the json module: logprobs may be -Infinity
        if r.status != 200:
            message = (doc.get("error") or {}).get("message") if isinstance(doc, dict) else None
            raise ShadowFailed(f"{path}: HTTP {r.status}: {message or raw[:200]!r}")
        return doc

    async def _tokens(self, session, url: str, ref: str, text: str) -> list[int]:
        doc = await self._post(session, url, "/tokenize", {"model": ref, "prompt": text, "add_special_tokens": False})
        return doc["tokens"]

    async def _prompt_ids(self, session, url: str, w: Watch) -> list[int]:
        body, ref = w.body, w.reference
        if w.path == "/v1/chat/completions":
            req = {k: body[k] for k in CHAT_FIELDS if k in body}
        else:
            prompt = body.get("prompt")
            prompt = prompt[0] if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else prompt
            if isinstance(prompt, list):
                return list(prompt)
            req = {"prompt": prompt, "add_special_tokens": body.get("add_special_tokens", True)}
        return (await self._post(session, url, "/tokenize", {"model": ref, **req}))["tokens"]

    async def _score(self, session, url: str, w: Watch, text: str) -> bool:
        """Run the comparison and record it; False when the reference's own answer was empty (no gap)."""
        ref = w.reference
        prompt, ids_v = await asyncio.gather(self._prompt_ids(session, url, w), self._tokens(session, url, ref, text))
        ids_v = ids_v[:self.cfg.shadow_max_tokens]
        if not ids_v:
            raise ShadowFailed("the answer tokenises to nothing")
        gen = {"model": ref, "prompt": prompt, "max_tokens": len(ids_v), "temperature": 0,
               **{k: w.body[k] for k in STOP_FIELDS if w.body.get(k) is not None}}
        if isinstance(gen.get("min_tokens"), int):      # the answer can tokenise to fewer than the client's minimum
            gen["min_tokens"] = min(gen["min_tokens"], len(ids_v))
        own = (await self._post(session, url, "/v1/completions", gen))["choices"][0]["text"]
        ids_r = (await self._tokens(session, url, ref, own))[:len(ids_v)] if own else []
        seqs = [prompt + ids_v] + ([prompt + ids_r] if ids_r else [])
        scored = await self._post(session, url, "/v1/completions",
                                  {"model": ref, "prompt": seqs, "echo": True, "max_tokens": 0, "logprobs": 1,
                                   "temperature": 0})
        choices = sorted(scored["choices"], key=lambda c: c["index"])
        nll_v, agreement = answer_nll(choices[0]["logprobs"], len(ids_v))
        self.m.shadow_nll.labels(w.model, "variant").observe(nll_v)
        self.m.shadow_agreement.labels(w.model).observe(agreement)
        if not ids_r:
            return False
        nll_r, _ = answer_nll(choices[1]["logprobs"], len(ids_r))
        self.m.shadow_nll.labels(w.model, "reference").observe(nll_r)
        self.m.shadow_gap.labels(w.model).observe(nll_v - nll_r)
        return True

    def close(self) -> None:
        for t in list(self.tasks):
            t.cancel()
