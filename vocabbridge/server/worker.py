"""One engine thread serving many requests: it owns the models and round-robins engine steps.

Every request is a ``SpecEngine.stream()`` generator. Each turn the worker admits waiting
requests (FIFO) up to ``max_num_seqs`` active ones, then advances every active request by exactly
one engine step (one prefill chunk of at most ``PREFILL_CHUNK`` prompt tokens, or draft + one
verifying target forward), turns the tokens into text and hands them to the request's
``asyncio.Queue`` on the HTTP event loop. No two forwards ever run at once, every KV cache belongs
to one request, and a cancelled request (its client went away) has its generator closed on the
next turn, which frees its cache and its slot.

Admission is bounded (``max_queued_tokens``): a request whose prompt would take the tokens
waiting for a slot (not those running) past the limit is refused at once with :class:`QueueFull`
(HTTP 429 with ``Retry-After``), instead of queueing work the server cannot reach for minutes; a
request that finds nobody waiting is always taken, so no prompt is refused for its length alone.

A long prompt therefore cannot stall the others: it is prefilled chunk by chunk between their
decode steps, so a short request that arrives meanwhile gets its first token after at most one
chunk per active request; and stopping the worker waits for one step at most.

Cost: steps of different requests run one after another, not batched, so N concurrent requests
share the throughput of one; each waits for the others' steps (latency grows about N-fold) while
the aggregate tokens/s stays close to sequential decoding.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from ..engine.engine import SpecEngine
from ..engine.sampling import SamplingParams
from ..engine.stats import SpecStats
from ..errors import VocabBridgeError
from .output_text import OutputText
from .prometheus import ServerMetrics

log = logging.getLogger("vocabbridge.server")


@dataclass
class Event:
    """What one engine step produced for a request, as the HTTP handler consumes it."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # stop | length | abort | error
    stop_reason: str | int | None = None
    error: tuple[int, str] | None = None  # (HTTP status, message)
    completion_tokens: int = 0


_ids = itertools.count()


class GenRequest:
    """One request in the worker: prompt, sampling, text state, timings, and its reply queue."""

    def __init__(self, prompt: list[int], params: SamplingParams, text: OutputText, loop: asyncio.AbstractEventLoop):
        self.id = next(_ids)
        self.prompt = prompt
        self.params = params
        self.text = text
        self.loop = loop
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.stats = SpecStats()
        self.gen = None
        self.cancelled = False
        self.done = False
        self.t_arrival = time.perf_counter()
        self.t_start = self.t_first = self.t_last = 0.0
        self._seen = (0, 0, 0, [])  # drafts, draft tokens, accepted, per position: what metrics have counted

    def deliver(self, ev: Event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, ev)
        except RuntimeError:  # the event loop is gone (server stopping); nobody is listening
            pass


IDLE_WAKEUP_S = 0.2  # how long Ctrl-C can wait for an idle engine loop to notice it
RETRY_AFTER_S = 5  # Retry-After of a refusal before any request has waited (then: the mean wait so far)


class QueueFull(VocabBridgeError):
    """The waiting queue holds too many prompt tokens to take this request now; retry after ``retry_after`` s."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class EngineWorker:
    """The engine loop, in a thread of its own (``thread=True``, started with the app) or on a
    thread the caller gives it with :meth:`run`: ``vocabbridge serve`` runs it on the main thread,
    where torch's CPU kernels run faster (measured on the 2-core machine: an int8 1.5B target's
    forward takes ~1.4× as long in any other thread, whatever OpenMP's wait policy)."""

    def __init__(
        self,
        engine: SpecEngine,
        metrics: ServerMetrics,
        *,
        max_num_seqs: int = 8,
        max_queued_tokens: int | None = None,
        thread: bool = True,
    ):
        if max_num_seqs < 1:
            raise ValueError("max_num_seqs must be at least 1")
        if max_queued_tokens is not None and max_queued_tokens < 1:
            raise ValueError("max_queued_tokens must be at least 1 (None: no limit)")
        self.engine = engine
        self.metrics = metrics
        self.max_num_seqs = max_num_seqs
        self.max_queued_tokens = max_queued_tokens
        self._waited = (0, 0.0)  # requests admitted to a slot, and the seconds they waited for it (Retry-After)
        self.threaded = thread
        self._cv = threading.Condition()
        self._waiting: deque[GenRequest] = deque()
        self._active: list[GenRequest] = []
        self._stopping = False
        self._started = False
        self._thread: threading.Thread | None = None

    # ==== called from the HTTP side ========================================================

    def start(self) -> None:
        """Accept requests; with ``thread=True`` start the engine thread (else :meth:`run` serves them)."""
        self._started = True
        if self.threaded:
            self._thread = threading.Thread(target=self._run, name="vocabbridge-engine", daemon=True)
            self._thread.start()

    @property
    def alive(self) -> bool:
        if self.threaded:
            return self._thread is not None and self._thread.is_alive()
        return self._started and not self._stopping

    def run(self) -> None:
        """Run the engine loop on the calling thread until :meth:`stop` (called from another thread
        or a signal handler); open requests then end with a 503 error. An exception (Ctrl-C's
        KeyboardInterrupt included) ends the loop the same way and propagates."""
        if self.threaded:
            raise RuntimeError("this worker runs its own engine thread; create it with thread=False to run it here.")
        try:
            self._loop()
        finally:
            with self._cv:
                self._stopping = True
            self._shutdown()

    def submit(self, req: GenRequest) -> None:
        """Queue ``req``; :class:`QueueFull` when its prompt would take the waiting prompt tokens past
        ``max_queued_tokens`` (a request that finds nobody waiting is always taken)."""
        with self._cv:
            if self._stopping:
                raise VocabBridgeError("the server is shutting down; retry on another server.")
            queued = self._queued_tokens()
            limit = self.max_queued_tokens
            if limit is not None and self._waiting and queued + len(req.prompt) > limit:
                with self.metrics.lock:
                    self.metrics.rejected["queue_full"].inc()
                wait = self._retry_after()
                raise QueueFull(
                    f"the server is busy: {len(self._waiting)} requests with {queued} prompt tokens wait for one of its "
                    f"{self.max_num_seqs} slots, and this prompt's {len(req.prompt)} tokens would pass its limit of {limit} "
                    f"queued prompt tokens (vocabbridge serve --max-queued-tokens); retry in {wait} s.",
                    wait,
                )
            self._waiting.append(req)
            self._set_waiting()
            self._cv.notify()

    def cancel(self, req: GenRequest) -> None:
        """The client is gone: drop the request (a waiting one at once, an active one next turn)."""
        with self._cv:
            req.cancelled = True
            if req in self._waiting:
                self._waiting.remove(req)
                req.done = True
                with self.metrics.lock:
                    self.metrics.success["abort"].inc()
                self._set_waiting()
            self._cv.notify()

    def stop(self, timeout: float | None = None) -> None:
        """Stop after the current engine step (a decode step or one prefill chunk), end every open
        request with a 503 error, and join the engine thread (no forward is left running)."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    def _queued_tokens(self) -> int:
        return sum(len(r.prompt) for r in self._waiting)

    def _set_waiting(self) -> None:
        """The waiting gauges (call under ``self._cv``)."""
        self.metrics.waiting.set(len(self._waiting))
        self.metrics.queued_tokens.set(self._queued_tokens())

    def _retry_after(self) -> int:
        """Seconds a refused client should wait: the mean time requests have waited for a slot so far."""
        n, total = self._waited
        return min(60, max(1, math.ceil(total / n))) if n else RETRY_AFTER_S

    # ==== the engine thread ===============================================================

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException:  # a bug here must not leave clients waiting forever
            log.exception("the engine worker stopped")
        finally:
            with self._cv:
                self._stopping = True
            self._shutdown()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._stopping and not self._waiting and not self._active:
                    # A timed wait: a signal (Ctrl-C) may land on any thread of the process, and
                    # Python runs its handler on the main thread only once that thread wakes up;
                    # an untimed wait there slept through SIGINT for 30 s and more in CI.
                    self._cv.wait(IDLE_WAKEUP_S)
                if self._stopping:
                    break
                while self._waiting and len(self._active) < self.max_num_seqs:
                    req = self._waiting.popleft()
                    n, total = self._waited
                    self._waited = (n + 1, total + time.perf_counter() - req.t_arrival)
                    self._active.append(req)
                batch = list(self._active)
                self._set_waiting()
                self.metrics.running.set(len(self._active))
            for req in batch:
                if self._stopping:  # stop between steps, not after a whole round
                    break
                self._turn(req)
            with self._cv:
                self._active = [r for r in self._active if not r.done]
                self.metrics.running.set(len(self._active))

    def _turn(self, req: GenRequest) -> None:
        """Advance one request by one engine step."""
        if req.cancelled:
            self._finish(req, "abort")
            return
        now = time.perf_counter()
        if req.gen is None:
            req.t_start = now
            req.gen = self.engine.stream(req.prompt, req.params, req.stats)
        try:
            step = next(req.gen)
        except StopIteration:
            self._finish(req, "length")
            return
        except VocabBridgeError as e:
            self._finish(req, "error", error=(400, str(e)))
            return
        except Exception as e:  # noqa: BLE001 - one broken request must not take the server down
            log.exception("request %s failed", req.id)
            self._finish(req, "error", error=(500, f"internal error in the engine: {type(e).__name__}: {e}"))
            return
        if not step.tokens and not step.finished:  # a prefill chunk: nothing to hand out yet
            return
        now = time.perf_counter()
        before = len(req.text.tokens)
        ended = any(req.text.add(t) for t in step.tokens)  # stops at the first stop string / stop token
        new = req.text.tokens[before:]
        self._observe_step(req, new, now)
        if ended or step.finished:
            reason = "stop" if ended or step.finish_reason == "stop" else (step.finish_reason or "length")
            self._finish(req, reason, last=Event(req.text.take(final=True), new))
            return
        req.deliver(Event(req.text.take(), new))

    def _observe_step(self, req: GenRequest, new: list[int], now: float) -> None:
        s, m = req.stats, self.metrics
        d0, t0, a0, p0 = req._seen
        per_pos = [n - (p0[i] if i < len(p0) else 0) for i, n in enumerate(s.accepted_per_pos)]
        with m.lock:
            if req.t_first == 0.0:
                req.t_first = now
                m.prompt_tokens.inc(len(req.prompt))
                m.ttft.observe(now - req.t_arrival)
            else:
                m.itl.observe(now - req.t_last)
                m.tpot_legacy.observe(now - req.t_last)
            m.generation_tokens.inc(len(new))
            m.spec_step(s.drafts - d0, s.draft_tokens - t0, s.accepted - a0, per_pos)
        req.t_last = now
        req._seen = (s.drafts, s.draft_tokens, s.accepted, list(s.accepted_per_pos))

    def _finish(self, req: GenRequest, reason: str, *, last: Event | None = None, error: tuple[int, str] | None = None) -> None:
        if req.gen is not None:
            req.gen.close()  # frees the request's KV caches (the engine's finally runs now)
        req.done = True
        now = time.perf_counter()
        n = len(req.text.tokens)
        m = self.metrics
        with m.lock:
            m.success[reason].inc()
            if reason in ("stop", "length"):
                m.req_prompt.observe(len(req.prompt))
                m.req_gen.observe(n)
                m.req_max_tokens.observe(req.params.max_new_tokens)
                start = req.t_start or now
                first = req.t_first or now
                m.phase["e2e"].observe(now - req.t_arrival)
                m.phase["queue"].observe(start - req.t_arrival)
                m.phase["inference"].observe(now - start)
                m.phase["prefill"].observe(first - start)
                m.phase["decode"].observe(now - first)
                if n > 1:
                    m.req_tpot.observe((now - first) / (n - 1))
        ev = last or Event(req.text.take(final=True) if error is None else "")
        ev.finish_reason, ev.error, ev.completion_tokens = reason, error, n
        ev.stop_reason = req.text.stop_reason if reason == "stop" else None
        req.deliver(ev)

    def _shutdown(self) -> None:
        with self._cv:
            pending = list(self._active) + list(self._waiting)
            self._active, self._waiting = [], deque()
        for req in pending:
            if not req.done:
                self._finish(req, "abort", error=(503, "the server is shutting down; retry the request."))
        self.metrics.running.set(0)
        self.metrics.waiting.set(0)
        self.metrics.queued_tokens.set(0)
