"""What a benchmark run measured, as dataclasses (the JSON report is these, with their properties).

Figures follow vLLM's definitions (see :mod:`.metrics`); in addition:

- target forwards of a request = generated tokens − accepted draft tokens (each forward of the
  target yields its own token plus the draft tokens it accepted; the prefill yields the first);
- speedup = decode tokens/s of a configuration / that of the no-drafting baseline, per prompt,
  thinking mode and prefill variant, and over all plain requests: like is compared with like,
  a prefilled request with the baseline's requests of the same variant;
- ``overall`` and the plots are the plain requests (no prefill); ``by_prefill`` puts each
  ``--prefill-think`` variant beside them, per thinking mode.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from .client import Completion
from .counters import SpecDelta
from .planning import answer_text, starts_with_planning


@dataclass(frozen=True)
class Endpoint:
    """A server to benchmark; ``launch`` says how it was started when bench started it."""

    name: str
    url: str
    launch: dict[str, Any] = field(default_factory=dict)


@dataclass
class RequestResult:
    config: str
    phase: str  # "warmup" | "measure" | "concurrency"
    prompt_id: str
    category: str
    thinking: bool | None  # None: the chat template's default (no chat_template_kwargs sent)
    repeat: int
    concurrency: int
    completion: Completion
    metrics: SpecDelta | None  # this request's counter deltas; None without /metrics or at concurrency > 1
    prefill: str | None = None  # the --prefill-think variant; None: plain (nothing prefilled)
    prefill_text: str | None = None  # the assistant text it sent

    @property
    def ok(self) -> bool:
        return self.completion.ok

    @property
    def starts_with_planning(self) -> bool | None:
        """Whether the answer opens with planning notes (:mod:`.planning`); None: no answer to judge."""
        if not self.ok:
            return None
        c = self.completion
        answer = answer_text(c.text, c.reasoning, thinking=self.thinking, prefilled=self.prefill is not None)
        return None if answer is None else starts_with_planning(answer)

    @property
    def output_tokens(self) -> int:
        return self.completion.output_tokens

    @property
    def ttft(self) -> float | None:
        return self.completion.ttft

    @property
    def total_time(self) -> float:
        return self.completion.total_time

    @property
    def decode_tokens_per_second(self) -> float | None:
        return self.completion.decode_tokens_per_second

    @property
    def acceptance_rate(self) -> float | None:
        return self.metrics.acceptance_rate if self.metrics else None

    @property
    def mean_acceptance_length(self) -> float | None:
        return self.metrics.mean_acceptance_length if self.metrics else None

    @property
    def per_position_acceptance(self) -> list[float]:
        return self.metrics.per_position_acceptance if self.metrics else []

    @property
    def target_forwards(self) -> int | None:
        """Generated − accepted: the target forwards this request needed (prefill included)."""
        if not self.ok or self.metrics is None or self.metrics.accepted is None:
            return None
        return max(self.output_tokens - self.metrics.accepted, 0)


def _mean(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def _stdev(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.stdev(xs) if len(xs) > 1 else None


@dataclass
class Figures:
    """Means over requests (rates from summed counters), and the speedup against the baseline."""

    requests: int = 0  # that completed
    failed: int = 0
    decode_tokens_per_second: float | None = None
    decode_tokens_per_second_stdev: float | None = None
    ttft: float | None = None
    total_time: float | None = None
    output_tokens: float | None = None
    measured_requests: int = 0  # with their own /metrics delta
    spec: SpecDelta | None = None  # counters summed over the measured requests
    target_forwards: float | None = None  # mean over the measured requests
    generated_measured: int = 0  # output tokens of the measured requests
    speedup: float | None = None  # decode tokens/s against the baseline
    speedup_total_time: float | None = None  # end to end (baseline total time / this one's)
    answers: int = 0  # completed requests with an answer to judge (see RequestResult.starts_with_planning)
    planning_answers: int = 0  # of those, answers that start with planning notes

    @classmethod
    def of(cls, results: list[RequestResult]) -> Figures:
        ok = [r for r in results if r.ok]
        measured = [r for r in ok if r.target_forwards is not None]
        spec = None
        for r in (r for r in ok if r.metrics is not None):
            spec = r.metrics if spec is None else spec + r.metrics
        tps = [r.decode_tokens_per_second for r in ok]
        judged = [r.starts_with_planning for r in ok]
        return cls(
            requests=len(ok),
            failed=len(results) - len(ok),
            decode_tokens_per_second=_mean(tps),
            decode_tokens_per_second_stdev=_stdev(tps),
            ttft=_mean([r.ttft for r in ok]),
            total_time=_mean([r.total_time for r in ok]),
            output_tokens=_mean([r.output_tokens for r in ok]),
            measured_requests=len(measured),
            spec=spec,
            target_forwards=_mean([r.target_forwards for r in measured]),
            generated_measured=sum(r.output_tokens for r in measured),
            answers=sum(j is not None for j in judged),
            planning_answers=sum(j is True for j in judged),
        )

    @property
    def acceptance_rate(self) -> float | None:
        return self.spec.acceptance_rate if self.spec else None

    @property
    def mean_acceptance_length(self) -> float | None:
        return self.spec.mean_acceptance_length if self.spec else None

    @property
    def per_position_acceptance(self) -> list[float]:
        return self.spec.per_position_acceptance if self.spec else []

    @property
    def forwards_per_token(self) -> float | None:
        """Target forwards per generated token (1.0 without drafting; lower is better)."""
        if not self.generated_measured or self.target_forwards is None:
            return None
        return self.target_forwards * self.measured_requests / self.generated_measured


@dataclass
class PromptFigures:
    prompt_id: str
    category: str
    thinking: bool | None
    figures: Figures
    prefill: str | None = None  # the --prefill-think variant; None: plain


@dataclass
class PrefillFigures:
    """All prompts of one thinking mode and prefill variant (None: plain)."""

    thinking: bool | None
    prefill: str | None
    figures: Figures


@dataclass
class ConcurrencyFigures:
    """One wave of ``concurrency`` simultaneous requests."""

    concurrency: int
    requests: list[RequestResult]
    wall_time: float
    metrics: SpecDelta | None = None  # counters over the whole wave

    @property
    def failed(self) -> int:
        return sum(not r.ok for r in self.requests)

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.requests if r.ok)

    @property
    def aggregate_tokens_per_second(self) -> float | None:
        """All output tokens of the wave / the wave's wall time."""
        return self.output_tokens / self.wall_time if self.wall_time > 0 else None

    @property
    def per_request_decode_tokens_per_second(self) -> float | None:
        return _mean([r.decode_tokens_per_second for r in self.requests if r.ok])

    @property
    def per_request_tokens_per_second(self) -> float | None:
        """Output tokens / total time, per request (queueing included), averaged."""
        return _mean([r.output_tokens / r.total_time for r in self.requests if r.ok and r.total_time > 0])

    @property
    def ttft(self) -> float | None:
        return _mean([r.ttft for r in self.requests if r.ok])

    @property
    def acceptance_rate(self) -> float | None:
        return self.metrics.acceptance_rate if self.metrics else None


@dataclass
class ConfigResult:
    endpoint: Endpoint
    model: str | None = None
    metrics_available: bool = False
    warmup: RequestResult | None = None
    requests: list[RequestResult] = field(default_factory=list)
    by_prompt: list[PromptFigures] = field(default_factory=list)
    overall: Figures = field(default_factory=Figures)  # the plain requests
    by_prefill: list[PrefillFigures] = field(default_factory=list)  # per thinking mode × variant, plain first
    concurrency: list[ConcurrencyFigures] = field(default_factory=list)
    unmeasured: list[str] = field(default_factory=list)  # what could not be measured, and why
    error: str | None = None  # the configuration could not be benchmarked at all
    same_answers: tuple[int, int] | None = None  # greedy runs: (answers equal to the baseline's, answers compared)

    @property
    def name(self) -> str:
        return self.endpoint.name

    def summarize(self) -> None:
        """Fill ``by_prompt``, ``overall`` and ``by_prefill`` from ``requests`` (the warm-up is never among them)."""
        keys: dict[tuple, list[RequestResult]] = {}
        variants: dict[tuple, list[RequestResult]] = {}
        for r in self.requests:
            keys.setdefault((r.prompt_id, r.category, r.thinking, r.prefill), []).append(r)
            variants.setdefault((r.thinking, r.prefill), []).append(r)
        self.by_prompt = [PromptFigures(p, c, t, Figures.of(rs), v) for (p, c, t, v), rs in keys.items()]
        self.overall = Figures.of([r for r in self.requests if r.prefill is None])
        order = sorted(variants, key=lambda k: k[1] is not None)  # plain first, then the variants as run
        self.by_prefill = [PrefillFigures(t, v, Figures.of(variants[t, v])) for t, v in order]

    def plain_figures(self, thinking: bool | None) -> Figures | None:
        """The plain requests of one thinking mode (what a prefill variant is beside)."""
        return next((f.figures for f in self.by_prefill if f.thinking == thinking and f.prefill is None), None)

    @property
    def warmup_extra_time(self) -> float | None:
        """Warm-up total time − mean total time of the same prompt and thinking mode afterwards."""
        w = self.warmup
        if w is None or not w.ok:
            return None
        same = [
            p.figures.total_time
            for p in self.by_prompt
            if (p.prompt_id, p.thinking, p.prefill) == (w.prompt_id, w.thinking, w.prefill)
        ]
        return w.total_time - same[0] if same and same[0] is not None else None


@dataclass
class BenchResult:
    settings: dict[str, Any]
    prompts: list[dict[str, Any]]
    configs: list[ConfigResult]
    baseline: str | None = None
    notes: list[str] = field(default_factory=list)
    environment: dict[str, Any] = field(default_factory=dict)

    def config(self, name: str) -> ConfigResult:
        return next(c for c in self.configs if c.name == name)


def pick_baseline(configs: list[ConfigResult], wanted: str | None) -> str | None:
    """``wanted``; else the configuration named or launched as ``none``; else one that drafted nothing."""
    if wanted:
        return wanted
    for c in configs:
        if c.error is None and (c.name == "none" or c.endpoint.launch.get("drafter") == "none"):
            return c.name
    for c in configs:
        s = c.overall.spec
        if c.error is None and s is not None and s.draft_tokens == 0 and c.overall.measured_requests:
            return c.name
    return None


def apply_speedups(configs: list[ConfigResult], baseline: str | None) -> None:
    """Speedup of every configuration (every prompt, every prefill variant) against the baseline's
    figures of the same prompt, thinking mode and variant."""
    base = next((c for c in configs if c.name == baseline and c.error is None), None)
    if base is None:
        return

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    def compare(f: Figures, b: Figures | None) -> None:
        if b is not None:
            f.speedup = ratio(f.decode_tokens_per_second, b.decode_tokens_per_second)
            f.speedup_total_time = ratio(b.total_time, f.total_time)

    base_prompts = {(p.prompt_id, p.thinking, p.prefill): p.figures for p in base.by_prompt}
    base_variants = {(v.thinking, v.prefill): v.figures for v in base.by_prefill}
    for c in configs:
        compare(c.overall, base.overall)
        for p in c.by_prompt:
            compare(p.figures, base_prompts.get((p.prompt_id, p.thinking, p.prefill)))
        for v in c.by_prefill:
            compare(v.figures, base_variants.get((v.thinking, v.prefill)))


def compare_answers(configs: list[ConfigResult], baseline: str | None) -> None:
    """Greedy runs: how many of each configuration's measured answers are the very text of the
    baseline's answer to the same prompt, thinking mode, variant and repeat. A drafter must not
    change a greedy answer, so anything below "N of N" is a lossless-ness failure (or a server
    whose verification rounds differently from its plain decoding)."""
    base = next((c for c in configs if c.name == baseline and c.error is None), None)
    if base is None:
        return
    ref = {(r.prompt_id, r.thinking, r.prefill, r.repeat): r.completion.text for r in base.requests if r.ok}
    for c in configs:
        pairs = [(r.completion.text, ref.get((r.prompt_id, r.thinking, r.prefill, r.repeat))) for r in c.requests if r.ok]
        pairs = [(a, b) for a, b in pairs if b is not None]
        c.same_answers = (sum(a == b for a, b in pairs), len(pairs)) if pairs else None
