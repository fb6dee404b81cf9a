"""The protocol of the EXAONE speculative-decoding study, for any OpenAI-compatible server.

Per configuration:

1. a warm-up request (the shortest prompt), measured and reported on its own, never averaged;
2. ``repeats`` × prompts × thinking modes × prefill variants (plain, then each
   ``--prefill-think`` value: :mod:`.prefill`), one at a time, ``/metrics`` scraped before and
   after each request so each counter delta belongs to that request;
3. a concurrency sweep: every level c sends the same request set (the prompts, shortest first,
   repeated until the highest level fills its slots) with at most c requests in flight; per-request
   and aggregate throughput, counters over the whole wave (plain requests only).

>>> s = BenchSettings(max_tokens=16, repeats=1, thinking="both", concurrency=(1, 4), prefill_think=("match", "en"))
>>> s.thinking_modes, s.variants
([True, False], [None, 'match', 'en'])
"""

from __future__ import annotations

import os
import platform
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

from .. import __version__
from ..errors import BenchError, MetricsError
from ..prompts import Prompt
from .client import BenchClient, Completion
from .counters import Counters, SpecDelta, counter_delta
from .prefill import check_variants, prefill_text
from .results import (
    BenchResult,
    ConcurrencyFigures,
    ConfigResult,
    Endpoint,
    RequestResult,
    apply_speedups,
    compare_answers,
    pick_baseline,
)

THINKING = {"model": [None], "on": [True], "off": [False], "both": [True, False]}


@dataclass(frozen=True)
class BenchSettings:
    max_tokens: int = 400  # a prompt's own max_tokens wins
    repeats: int = 2
    thinking: str = "model"  # model (send nothing) | on | off | both, via chat_template_kwargs.enable_thinking
    temperature: float | None = None  # None: leave it out (the server's / model's default); 0: greedy
    concurrency: tuple[int, ...] = (1, 4, 8)
    warmup: bool = True
    baseline: str | None = None  # the no-drafting configuration speedups are against
    request_timeout: float = 1800.0
    settle_s: float = 2.0  # how long to wait for the server's counters to count a finished request
    prefill_think: tuple[str, ...] = ()  # variants run beside the plain requests: match | en | ko | literal text

    def __post_init__(self):
        if self.max_tokens < 1:
            raise BenchError("--max-tokens must be at least 1.")
        if self.repeats < 1:
            raise BenchError("--repeats must be at least 1.")
        if self.thinking not in THINKING:
            raise BenchError(f"--thinking must be one of {', '.join(THINKING)}, got {self.thinking!r}.")
        if self.temperature is not None and self.temperature < 0:
            raise BenchError("--temperature must be ≥ 0 (0 is greedy).")
        if any(c < 1 for c in self.concurrency):
            raise BenchError("--concurrency levels must be positive integers, e.g. 1,4,8.")
        check_variants(self.prefill_think)

    @property
    def thinking_modes(self) -> list[bool | None]:
        return THINKING[self.thinking]

    @property
    def variants(self) -> list[str | None]:
        """None (plain: nothing prefilled), then the ``prefill_think`` values."""
        return [None, *self.prefill_think]

    def requests_per_config(self, n_prompts: int) -> int:
        wave = n_prompts * -(-max(self.concurrency) // n_prompts) if self.concurrency else 0
        measured = self.repeats * n_prompts * len(self.thinking_modes) * len(self.variants)
        return int(self.warmup) + measured + wave * len(self.concurrency)


class Progress:
    """Hooks a front end implements (the CLI draws progress bars); these do nothing."""

    def config_started(self, name: str, total_requests: int) -> None: ...

    def request_started(self, label: str) -> None: ...

    def request_done(self, result: RequestResult) -> None: ...

    def config_done(self, result: ConfigResult) -> None: ...

    def message(self, text: str) -> None: ...


def _kwargs(thinking: bool | None) -> dict[str, Any] | None:
    return None if thinking is None else {"enable_thinking": thinking}


def _thinking_label(t: bool | None) -> str:
    return {None: "", True: " (thinking)", False: " (no thinking)"}[t]


def _prefill_label(v: str | None) -> str:
    return "" if v is None else f" [prefill {v if len(v) <= 20 else v[:17] + '...'}]"


class _Runner:
    def __init__(self, client: BenchClient, endpoint: Endpoint, settings: BenchSettings, progress: Progress):
        self.client, self.endpoint, self.settings, self.progress = client, endpoint, settings, progress
        self.model = ""
        self.metrics = True

    def scrape(self) -> Counters | None:
        return self.client.scrape() if self.metrics else None

    def scrape_after(self, before: Counters | None, n_requests: int) -> SpecDelta | None:
        """The delta since ``before``, waiting (up to settle_s) until the server has counted the requests."""
        if before is None:
            return None
        deadline = time.perf_counter() + self.settle_s
        while True:
            after = self.client.scrape()
            if after is None:
                return None
            delta = counter_delta(before, after)
            if delta.requests is None or delta.requests >= n_requests or time.perf_counter() > deadline:
                return delta
            time.sleep(0.05)

    @property
    def settle_s(self) -> float:
        return self.settings.settle_s

    def chat(self, prompt: Prompt, thinking: bool | None, prefill: str | None = None) -> Completion:
        s = self.settings
        return self.client.chat(
            self.model,
            [dict(m) for m in prompt.messages],
            max_tokens=prompt.max_tokens or s.max_tokens,
            temperature=s.temperature,
            chat_template_kwargs=_kwargs(thinking),
            prefill=prefill,
        )

    def one(self, prompt: Prompt, thinking: bool | None, *, phase: str, repeat: int, variant: str | None = None) -> RequestResult:
        self.progress.request_started(
            f"{self.endpoint.name}: {prompt.id}{_thinking_label(thinking)}{_prefill_label(variant)}"
            + (" [warm-up]" if phase == "warmup" else f" [{repeat + 1}/{self.settings.repeats}]")
        )
        text = None if variant is None else prefill_text(variant, prompt.language)
        before = self.scrape()
        comp = self.chat(prompt, thinking, text)
        delta = self.scrape_after(before, 1) if comp.ok else None
        r = RequestResult(
            self.endpoint.name,
            phase,
            prompt.id,
            prompt.category,
            thinking,
            repeat,
            1,
            comp,
            delta,
            prefill=variant,
            prefill_text=text,
        )
        self.progress.request_done(r)
        return r

    def wave(self, jobs: list[Prompt], thinking: bool | None, c: int) -> ConcurrencyFigures:
        """The same request set at every level: ``jobs`` sent with at most ``c`` in flight."""
        self.progress.request_started(f"{self.endpoint.name}: {len(jobs)} requests, {c} at a time")
        starts: list[float] = [0.0] * len(jobs)
        ends: list[float] = [0.0] * len(jobs)

        def run(i: int) -> Completion:
            starts[i] = time.perf_counter()
            comp = self.chat(jobs[i], thinking)
            ends[i] = time.perf_counter()
            return comp

        before = self.scrape()
        with ThreadPoolExecutor(max_workers=c) as pool:
            comps = list(pool.map(run, range(len(jobs))))
        delta = self.scrape_after(before, len(jobs))
        out = []
        for i, (p, comp) in enumerate(zip(jobs, comps)):
            r = RequestResult(self.endpoint.name, "concurrency", p.id, p.category, thinking, i, c, comp, None)
            self.progress.request_done(r)
            out.append(r)
        return ConcurrencyFigures(c, out, max(ends) - min(starts), delta)


def concurrency_jobs(prompts: list[Prompt], levels: tuple[int, ...]) -> list[Prompt]:
    """The request set every concurrency level runs: the prompts, shortest first, repeated until
    the highest level has a request for every slot (so each level measures the same work).

    >>> [p.id for p in concurrency_jobs([Prompt("a", "c", ({"role": "user", "content": "xx"},)),
    ...                                  Prompt("b", "c", ({"role": "user", "content": "x"},))], (1, 3))]
    ['b', 'a', 'b', 'a']
    """
    if not levels:
        return []
    by_size = sorted(prompts, key=lambda p: p.chars)
    rounds = -(-max(levels) // len(by_size))
    return by_size * rounds


def bench_endpoint(
    endpoint: Endpoint,
    prompts: list[Prompt],
    settings: BenchSettings,
    *,
    api_key: str | None = None,
    progress: Progress | None = None,
) -> ConfigResult:
    """Run the protocol against one server."""
    progress = progress or Progress()
    res = ConfigResult(endpoint)
    progress.config_started(endpoint.name, settings.requests_per_config(len(prompts)))
    with BenchClient(
        endpoint.url, api_key=api_key, timeout=settings.request_timeout, max_connections=max(settings.concurrency + (1,)) + 2
    ) as client:
        run = _Runner(client, endpoint, settings, progress)
        run.model = res.model = client.model()
        try:
            first, why = client.scrape(), f"no Prometheus /metrics at {client.url}"
        except MetricsError as e:  # a page there, but not Prometheus text (an HTML catch-all route...)
            first, why = None, f"{client.url}/metrics: {e}"
        run.metrics = res.metrics_available = first is not None
        if first is None:
            res.unmeasured.append(f"acceptance, per-position acceptance, mean acceptance length and target forwards: {why}")
        elif not first.has_spec_counters and not first.vllm_metrics:
            res.unmeasured.append(f"acceptance: {client.url}/metrics has no vllm:* counters (is it a vLLM-compatible server?)")
        modes = settings.thinking_modes
        by_size = sorted(prompts, key=lambda p: p.chars)
        if settings.warmup:
            res.warmup = run.one(by_size[0], modes[0], phase="warmup", repeat=0)
        for rep in range(settings.repeats):
            for p in prompts:
                for t in modes:
                    for v in settings.variants:
                        res.requests.append(run.one(p, t, phase="measure", repeat=rep, variant=v))
        jobs = concurrency_jobs(prompts, settings.concurrency)
        for c in settings.concurrency:
            res.concurrency.append(run.wave(jobs, modes[0], c))
    res.summarize()
    res.unmeasured += _gaps(res)
    progress.config_done(res)
    return res


def _gaps(res: ConfigResult) -> list[str]:
    out = []
    everything = res.requests + [r for w in res.concurrency for r in w.requests] + ([res.warmup] if res.warmup else [])
    failed = [r for r in everything if not r.ok]
    if failed:
        first = failed[0]
        out.append(f"{len(failed)} of {len(everything)} requests failed; the first: {first.prompt_id}: {first.completion.error}")
    if any(r.ok and r.completion.tokens_from == "chunks" for r in everything):
        out.append("output tokens counted from stream chunks (the server sent no usage): a chunk may hold several tokens")
    spec = res.overall.spec
    if res.metrics_available and spec is not None:
        if not spec.spec_counters:
            out.append(
                "no spec-decode counters in /metrics (the server drafts nothing): 0 accepted, one target forward per token"
            )
        elif spec.drafts is None:
            out.append("mean acceptance length: the server exposes no vllm:spec_decode_num_drafts counter")
        for n in spec.notes:
            out.append(f"counters: {n}")
    if any(r.ok and r.ttft is None for r in everything):
        out.append("time to first token: some streams carried no text")
    return out


def finish(
    configs: list[ConfigResult], prompts: list[Prompt], settings: BenchSettings, *, notes: list[str] | None = None
) -> BenchResult:
    """Pick the baseline, compute speedups, and wrap everything up."""

    names = [c.name for c in configs]
    if settings.baseline and settings.baseline not in names:
        raise BenchError(f"--baseline {settings.baseline} is not one of the configurations: {', '.join(names)}.")
    baseline = pick_baseline(configs, settings.baseline)
    apply_speedups(configs, baseline)
    if settings.temperature == 0:
        compare_answers(configs, baseline)
    notes = list(notes or [])
    if baseline is None:
        notes.append("speedup not measured: no no-drafting configuration (name one 'none', or pass --baseline NAME)")
    notes.append("acceptance at concurrency > 1 is over the whole wave (counter deltas cannot be split per request)")
    env = {
        "vocabbridge": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }
    return BenchResult(
        settings=asdict(settings),
        prompts=[
            {"id": p.id, "category": p.category, "language": p.language, "chars": p.chars, "max_tokens": p.max_tokens}
            for p in prompts
        ],
        configs=configs,
        baseline=baseline,
        notes=notes,
        environment=env,
    )


def bench_urls(
    endpoints: list[Endpoint],
    prompts: list[Prompt],
    settings: BenchSettings,
    *,
    api_key: str | None = None,
    progress: Progress | None = None,
) -> BenchResult:
    """Benchmark running servers one after the other."""
    names = [e.name for e in endpoints]
    if len(set(names)) != len(names):
        raise BenchError(f"configuration names must be unique, got {', '.join(names)}; give --name once per --url.")
    if settings.baseline and settings.baseline not in names:
        raise BenchError(f"--baseline {settings.baseline} is not one of the configurations: {', '.join(names)}.")
    for e in endpoints:  # every server answers before the first one is benchmarked
        with BenchClient(e.url, api_key=api_key, timeout=30.0) as c:
            c.model()
    configs = [bench_endpoint(e, prompts, settings, api_key=api_key, progress=progress) for e in endpoints]
    return finish(configs, prompts, settings)
