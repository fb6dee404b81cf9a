"""Speculative-decoding counters from a server's Prometheus ``/metrics`` page, and their change
between two scrapes (before and after a request: at concurrency 1 the change is that request's).

vLLM's counters (ours use the same names), exposed with ``_total``:

- ``vllm:spec_decode_num_drafts``: verification steps that carried draft tokens;
- ``vllm:spec_decode_num_draft_tokens`` / ``vllm:spec_decode_num_accepted_tokens``;
- ``vllm:spec_decode_num_accepted_tokens_per_pos{position="i"}``: drafts whose i-th token was accepted.

Acceptance rate = accepted / draft tokens; mean acceptance length = 1 + accepted / drafts (the +1 is
the target's own token); per-position acceptance = accepted_per_pos[i] / drafts. Label sets other
than ``position`` (``model_name``, ``engine``...) are summed.

>>> a = parse_counters('vllm:spec_decode_num_drafts_total 3\\nvllm:spec_decode_num_accepted_tokens_total 4\\n')
>>> b = parse_counters('vllm:spec_decode_num_drafts_total 5\\nvllm:spec_decode_num_accepted_tokens_total 7\\n'
...                    'vllm:spec_decode_num_draft_tokens_total 8\\n')
>>> d = counter_delta(a, b)
>>> d.drafts, d.accepted, d.draft_tokens, d.mean_acceptance_length
(2, 3, 8, 2.5)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from ..errors import MetricsError

PREFIX = "vllm:"
SPEC = {  # field → metric name without "_total"
    "drafts": "vllm:spec_decode_num_drafts",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens",
    "accepted": "vllm:spec_decode_num_accepted_tokens",
}
PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
TOKENS = {
    "prompt_tokens": "vllm:prompt_tokens",
    "generation_tokens": "vllm:generation_tokens",
    "requests": "vllm:request_success",
}
COUNTERS = SPEC | TOKENS


@dataclass(frozen=True)
class Counters:
    """The counters of one scrape; None where the page does not expose the counter."""

    values: dict[str, float | None]  # field (drafts, draft_tokens, accepted, prompt_tokens...) → sum
    accepted_per_pos: dict[int, float] = field(default_factory=dict)
    vllm_metrics: bool = False  # the page has any vllm:* metric at all

    @property
    def has_spec_counters(self) -> bool:
        return any(self.values.get(f) is not None for f in SPEC) or bool(self.accepted_per_pos)


def _base_name(sample_name: str) -> str:
    return sample_name[: -len("_total")] if sample_name.endswith("_total") else sample_name


def parse_counters(text: str) -> Counters:
    """Sum the counters this benchmark reads out of Prometheus text exposition."""

    wanted = {name: f for f, name in COUNTERS.items()}
    values: dict[str, float | None] = dict.fromkeys(COUNTERS)
    per_pos: dict[int, float] = {}
    vllm = False
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name.endswith("_created"):  # creation timestamps of counters, not counts
                    continue
                vllm = vllm or s.name.startswith(PREFIX)
                name = _base_name(s.name)
                if name == PER_POS:
                    try:
                        pos = int(s.labels.get("position", ""))
                    except ValueError:
                        raise MetricsError(f"{s.name} has a non-integer position label {s.labels.get('position')!r}.") from None
                    per_pos[pos] = per_pos.get(pos, 0.0) + s.value
                elif name in wanted:
                    f = wanted[name]
                    values[f] = (values[f] or 0.0) + s.value
    except (ValueError, TypeError, IndexError) as e:
        raise MetricsError(
            f"the /metrics page is not Prometheus text exposition ({e}); is the URL a vLLM-compatible server?"
        ) from None
    return Counters(values, per_pos, vllm)


@dataclass(frozen=True)
class SpecDelta:
    """What the counters moved by between two scrapes; None where that is unknown."""

    drafts: int | None = None
    draft_tokens: int | None = None
    accepted: int | None = None
    accepted_per_pos: list[int] = field(default_factory=list)
    prompt_tokens: int | None = None
    generation_tokens: int | None = None
    requests: int | None = None
    spec_counters: bool = False  # False: no spec-decode counters in /metrics (no drafting configured)
    notes: tuple[str, ...] = ()

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.draft_tokens if self.accepted is not None and self.draft_tokens else None

    @property
    def mean_acceptance_length(self) -> float | None:
        return 1 + self.accepted / self.drafts if self.accepted is not None and self.drafts else None

    @property
    def per_position_acceptance(self) -> list[float]:
        """accepted_per_pos[i] / drafts: the share of drafts whose (i+1)-th token was accepted."""
        return [a / self.drafts for a in self.accepted_per_pos] if self.drafts else []

    def __add__(self, other: SpecDelta) -> SpecDelta:
        def add(a, b):
            return None if a is None or b is None else a + b

        n = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        pad = lambda xs: list(xs) + [0] * (n - len(xs))  # noqa: E731
        return SpecDelta(
            drafts=add(self.drafts, other.drafts),
            draft_tokens=add(self.draft_tokens, other.draft_tokens),
            accepted=add(self.accepted, other.accepted),
            accepted_per_pos=[a + b for a, b in zip(pad(self.accepted_per_pos), pad(other.accepted_per_pos))],
            prompt_tokens=add(self.prompt_tokens, other.prompt_tokens),
            generation_tokens=add(self.generation_tokens, other.generation_tokens),
            requests=add(self.requests, other.requests),
            spec_counters=self.spec_counters or other.spec_counters,
            notes=tuple(dict.fromkeys(self.notes + other.notes)),
        )


def counter_delta(before: Counters, after: Counters) -> SpecDelta:
    """``after − before``. A counter first seen in ``after`` counts from 0 (vLLM creates labelled
    series lazily); one that vanished or went down (a restarted server) is unknown (None)."""
    notes: list[str] = []
    out: dict[str, int | None] = {}
    for f, name in COUNTERS.items():
        b, a = before.values.get(f), after.values.get(f)
        if a is None:
            if b is not None:
                notes.append(f"{name} disappeared between scrapes")
            out[f] = None
        elif a < (b or 0.0):
            notes.append(f"{name} went down between scrapes (server restarted?)")
            out[f] = None
        else:
            out[f] = round(a - (b or 0.0))
    spec = before.has_spec_counters or after.has_spec_counters
    if not spec and after.vllm_metrics:
        # A server with vLLM metrics but no spec-decode counters drafts nothing: vLLM registers them
        # only with a speculative config.
        out.update(drafts=0, draft_tokens=0, accepted=0)
    per_pos: list[int] = []
    positions = set(before.accepted_per_pos) | set(after.accepted_per_pos)
    if positions:
        per_pos = [0] * (max(positions) + 1)
        for i in positions:
            b, a = before.accepted_per_pos.get(i), after.accepted_per_pos.get(i)
            if a is None or a < (b or 0.0):
                notes.append(f'{PER_POS}{{position="{i}"}} went down or disappeared between scrapes')
                continue
            per_pos[i] = round(a - (b or 0.0))
    return SpecDelta(accepted_per_pos=per_pos, spec_counters=spec, notes=tuple(notes), **out)
