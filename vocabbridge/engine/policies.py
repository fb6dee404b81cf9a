"""How much to draft: small named policies that change what is proposed, never what is emitted.

    BackOff     a drafter that keeps missing sits out for a while
    AdaptiveK   k grows after a fully accepted draft and shrinks after a miss
    CostAware   the draft length that maximizes expected tokens per second, from this request's
                acceptance per position (:class:`Acceptance`) and the target's measured cost of a
                forward by rows (:class:`RowCosts`); 0 (a plain step) when no draft pays for itself

Why cost matters: a verification of k+1 rows costs what the kernels make it cost. On fp32 or int8
weights a 5-row forward costs ~1.1–1.4× one row, so nearly any draft pays; on llama.cpp's Q4_K
kernels on a 2-core AVX2 CPU it costs ~2.8×, so a draft pays only where the drafter is nearly sure.
:class:`CostAware` measures both sides as it runs, so one engine does the right thing on either.

A drafter that costs nothing (n-gram, suffix: ``DraftSession.free``) keeps being scored while it
sits out: its proposal is compared with what the target then emits (a *shadow* draft), so it comes
back as soon as the text starts repeating. A costly drafter's record fades toward the prior while it
sits out, so it is tried again now and then.
"""

from __future__ import annotations

import time

REMEASURE = 32  # forwards after which the cost-aware policy re-measures a plain step's cost
EXPLORE = 16  # steps after which the cost-aware policy tries a model drafter that sat them out


class BackOff:
    """A drafter that keeps missing sits out: after ``after`` costly misses in a row (a step that
    ran the drafter model more than once and had nothing accepted), drafting is skipped for 1, 2,
    4, … (at most ``most``) steps; any accepted token resets it.

    A weak drafter on text it cannot predict (SmolLM2 on Korean for a coder target) then costs
    almost nothing instead of several drafter forwards every step. A draft the confidence gate
    stopped after one forward is cheap and does not count; free proposals (n-gram) never back off.
    """

    def __init__(self, enabled: bool = True, *, after: int = 3, most: int = 16):
        self.enabled, self.after, self.most = enabled, after, most
        self.misses = self.skip = 0

    def sit_out(self) -> bool:
        """True when this step drafts nothing (and counts down the steps left)."""
        if self.skip:
            self.skip -= 1
            return True
        return False

    def observe(self, accepted: int, costly: bool) -> None:
        if accepted:
            self.misses = 0
        elif costly and self.enabled:
            self.misses += 1
            if self.misses >= self.after:
                self.skip = min(self.most, 2 ** (self.misses - self.after))


class AdaptiveK:
    """k per request: +1 after a fully accepted draft, −1 after a draft rejected at its first token,
    within [1, k_max]. A wasted draft position costs a drafter forward, and on a CPU that is not free."""

    def __init__(self, k: int, k_max: int, enabled: bool):
        self.k, self.k_max, self.enabled = k, k_max, enabled

    def observe(self, drafted: int, accepted: int) -> None:
        if not self.enabled or not drafted:
            return
        if accepted == drafted:
            self.k = min(self.k_max, self.k + 1)
        elif accepted == 0:
            self.k = max(1, self.k - 1)


class RowCosts:
    """Seconds one target forward of ``rows`` tokens takes, measured (an exponential average per
    row count); unmeasured row counts are interpolated between measured ones, or extrapolated along
    the slope of the last two. One per engine: the target's cost does not depend on the request.

    >>> c = RowCosts()
    >>> c.observe(1, 0.100); c.observe(5, 0.300)
    >>> round(c.seconds(3), 3), round(c.seconds(7), 3)
    (0.2, 0.4)
    >>> noisy = RowCosts()
    >>> noisy.observe(3, 0.2); noisy.observe(5, 0.05)  # noise slopes the line down: 7 rows still cost what 5 do
    >>> noisy.seconds(7), noisy.seconds(1)
    (0.05, 0.2)
    """

    def __init__(self, smoothing: float = 0.3):
        self.smoothing = smoothing
        self.by_rows: dict[int, float] = {}
        self.forwards = 0
        self._last: dict[int, int] = {}  # rows → the forward that last measured them

    def observe(self, rows: int, seconds: float) -> None:
        old = self.by_rows.get(rows)
        self.by_rows[rows] = seconds if old is None else old + self.smoothing * (seconds - old)
        self.forwards += 1
        self._last[rows] = self.forwards

    def known(self, rows: int) -> bool:
        return rows in self.by_rows

    def age(self, rows: int) -> int:
        """Forwards since ``rows`` was last measured (a large number if never)."""
        return self.forwards - self._last.get(rows, -(10**9))

    def seconds(self, rows: int) -> float | None:
        """The estimate for ``rows``; None while nothing is measured."""
        if rows in self.by_rows:
            return self.by_rows[rows]
        if not self.by_rows:
            return None
        below = [r for r in self.by_rows if r < rows]
        above = [r for r in self.by_rows if r > rows]
        if below and above:
            lo, hi = max(below), min(above)
            return self._line(lo, hi, rows)
        if len(self.by_rows) == 1:  # one point: rows cost the same until a second is measured (optimistic)
            return next(iter(self.by_rows.values()))
        pts = sorted(self.by_rows)
        lo, hi = (pts[-2], pts[-1]) if below else (pts[0], pts[1])
        line = self._line(lo, hi, rows)
        # Noisy timings can slope the wrong way: more rows never cost less than the most measured
        # below them, and fewer rows never cost more than the fewest above them, nor nothing (a
        # zero would divide a rate by zero).
        if below:
            return max(self.by_rows[max(below)], line)
        nearest = self.by_rows[min(above)]
        return min(nearest, max(0.5 * nearest, line))

    def _line(self, lo: int, hi: int, rows: int) -> float:
        a, b = self.by_rows[lo], self.by_rows[hi]
        return a + (b - a) * (rows - lo) / (hi - lo)


class Acceptance:
    """This request's acceptance by draft position: ``rate(i)`` estimates P(position i accepted |
    positions before it accepted) from the drafts verified (or shadowed) so far, each observation
    weighted ``memory`` times less per later one (the text changes; so does how predictable it is),
    with a prior worth ``weight`` observations at every position (``rates``). The defaults are the
    best of a scan on the tiny models' dear-row tests (prior 0.4/0.6 × weight 1/3 × memory 0.7/0.9):
    cautious, since on dear rows a wrong draft costs more than a right one gains.

    >>> a = Acceptance(4, prior=0.6, weight=1.0, memory=0.9)
    >>> for _ in range(20): a.observe(4, 1)  # the first token always accepted, the second never
    >>> round(a.rate(0), 2), round(a.rate(1), 2), round(a.expected_tokens(3), 2)
    (0.96, 0.1, 2.06)
    """

    def __init__(self, positions: int, *, prior: float = 0.4, weight: float = 3.0, memory: float = 0.9):
        self.prior, self.weight, self.memory = prior, weight, memory
        self.hits = [0.0] * positions
        self.tries = [0.0] * positions

    def forget(self) -> None:
        """One step's fading, with or without an observation: a drafter that sits out drifts back to the prior."""
        self.hits = [h * self.memory for h in self.hits]
        self.tries = [t * self.memory for t in self.tries]

    def observe(self, drafted: int, accepted: int) -> None:
        self.forget()
        for i in range(min(accepted, len(self.hits))):
            self.hits[i] += 1
            self.tries[i] += 1
        if accepted < drafted and accepted < len(self.tries):
            self.tries[accepted] += 1

    def rates(self, d: int) -> list[float]:
        """The first ``d`` positions' rates. Each position's prior is the rate of the one before it
        (the first's is ``prior``): a position never drafted yet is taken to do as well as the last
        one measured, so a drafter kept short by a cautious start is tried longer once it does well."""
        out, prior = [], self.prior
        for i in range(d):
            h, t = (self.hits[i], self.tries[i]) if i < len(self.hits) else (0.0, 0.0)
            prior = (h + prior * self.weight) / (t + self.weight)
            out.append(prior)
        return out

    def rate(self, i: int) -> float:
        return self.rates(i + 1)[i]

    def expected_tokens(self, d: int) -> float:
        """Tokens one step emits with a draft of ``d``: the target's own token plus each draft token
        that survives (1 + Σᵢ Πⱼ≤ᵢ rate(j))."""
        total, survive = 1.0, 1.0
        for r in self.rates(d):
            survive *= r
            total += survive
        return total


class CostAware:
    """The draft length (0 … ``cap``) with the most expected tokens per second:
    ``expected_tokens(d) / (target seconds for d+1 rows + d × drafter seconds per token)``.

    Proposals that cost nothing (n-gram, suffix, the n-gram half of ngram-first) and those a model
    made are scored apart (``free`` / ``acceptance``): a lookup match and a small model's guess are
    right at very different rates. A model that sat out ``EXPLORE`` steps drafts once in full, so a
    drafter whose record (or the cautious prior) says no is still tried now and then, unless even a
    draft accepted in full would not pay at the measured costs.

    Off (``enabled=False``) it always answers ``cap``. Until the target's cost of one row is known it
    answers 0 once (the plain step that measures it), and again when that figure is ``REMEASURE``
    forwards old; until a longer forward is measured, more rows are taken to cost what one does, so
    the first drafts are tried.
    """

    def __init__(self, costs: RowCosts, positions: int, enabled: bool, acceptance: Acceptance | None = None):
        self.costs, self.enabled = costs, enabled
        self.acceptance = acceptance or Acceptance(positions)  # a model's proposals
        self.free = Acceptance(positions)  # free proposals (lookup), verified or shadowed
        self.draft_seconds = 0.0  # a model's seconds per proposed token, exponential average
        self.idle = 0  # steps since a model's draft was last verified
        self.shadow: tuple[int, list[int]] | None = None  # (where in the output it starts, its tokens)

    def length(self, cap: int, free: bool = False) -> int:
        if not self.enabled or cap <= 0:
            return cap
        if not self.costs.known(1):
            return 0 if self.costs.by_rows else cap
        if self.costs.age(1) > REMEASURE:  # the baseline drifts (context length, a busy machine): a plain step re-measures it
            return 0
        if not free and self.idle >= EXPLORE:
            return cap if self._could_pay(cap) else 0
        acceptance, per_token = (self.free, 0.0) if free else (self.acceptance, self.draft_seconds)
        best, best_rate = 0, 1.0 / self.costs.seconds(1)
        for d in range(1, cap + 1):
            rate = acceptance.expected_tokens(d) / self._step_seconds(d, per_token)
            if rate > best_rate:
                best, best_rate = d, rate
        return best

    def _step_seconds(self, d: int, per_token: float) -> float:
        """A step with a draft of ``d``: the target's forward over d+1 rows and the drafter's d tokens."""
        return self.costs.seconds(d + 1) + d * per_token

    def _could_pay(self, cap: int) -> bool:
        """Whether some draft of the model's, every token of it accepted, would beat a plain step at
        the measured costs (a drafter too slow for these kernels is not explored again)."""
        plain = 1.0 / self.costs.seconds(1)
        return any((d + 1) / self._step_seconds(d, self.draft_seconds) > plain for d in range(1, cap + 1))

    def observe_step(self, drafted: int, accepted: int, verify_seconds: float, draft_seconds: float, free: bool = False) -> None:
        """One verification: its rows' cost, a model's cost per token, and what was accepted."""
        self.costs.observe(drafted + 1, verify_seconds)
        if drafted and free:
            self.free.observe(drafted, accepted)
            self.shadow = None
        elif drafted:
            per = draft_seconds / drafted
            self.draft_seconds = per if self.draft_seconds == 0.0 else self.draft_seconds + 0.3 * (per - self.draft_seconds)
            self.acceptance.observe(drafted, accepted)
            self.idle = 0
        else:
            self.idle += 1
            self.acceptance.forget()

    def observe_shadow(self, start: int, tokens: list[int]) -> None:
        """A free proposal that was not verified, to score against the output from ``start`` on."""
        if self.enabled and tokens and self.shadow is None:
            self.shadow = (start, list(tokens))

    def score_shadow(self, out: list[int]) -> None:
        """Score the pending shadow draft once the output has settled it (a mismatch, or all of it emitted)."""
        if self.shadow is None:
            return
        start, tokens = self.shadow
        emitted = out[start : start + len(tokens)]
        n = 0
        while n < len(emitted) and emitted[n] == tokens[n]:
            n += 1
        if n < len(emitted) or n == len(tokens):
            self.free.observe(len(tokens), n)
            self.shadow = None


def row_cost_ratio(lm, rows: int, *, context: int = 32, repeats: int = 5) -> float:
    """What a forward over ``rows`` new tokens costs in one-token forwards, measured on ``lm`` after a
    ``context``-token prompt (the fastest of ``repeats``: a busy machine only ever adds time, so the
    minimum is the figure least moved by it): the figure that decides whether drafting needs
    the cost-aware length (llama.cpp's kernels on 2 AVX2 cores: ~2.8 for 5 rows; int8: ~1.1-1.4)."""
    rows = max(1, min(rows, lm.max_context - context))
    ids = [(97 * i + 13) % lm.vocab_size for i in range(context + rows)]
    s = lm.session()
    s.extend(ids[:context])

    def seconds(n: int) -> float:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            s.extend(ids[context : context + n], keep=n)
            times.append(time.perf_counter() - t0)
            s.truncate(context)
        return min(times)

    seconds(rows)  # warm: the first forwards of a shape allocate
    one = seconds(1)
    return seconds(rows) / max(one, 1e-9)
