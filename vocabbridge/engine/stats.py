"""What one generation did, as data. Acceptance figures follow vLLM's definitions:

- acceptance rate = accepted draft tokens / draft tokens;
- mean acceptance length = 1 + accepted / drafts (the +1 is the target's own "bonus" token);
- accepted_per_pos[i] = drafts whose i-th token was accepted
  (vllm:spec_decode_num_accepted_tokens_per_pos{position="i"}).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecStats:
    prompt_tokens: int = 0
    generated: int = 0
    drafts: int = 0  # verification steps that carried at least one draft token
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    verify_sizes: dict[int, int] = field(default_factory=dict)  # tokens fed per decode forward → count
    target_forwards: int = 0  # the prefill counts as one, however many chunks
    prefill_chunks: int = 0  # forwards the prefill took (PREFILL_CHUNK prompt tokens each)
    drafter_forwards: int = 0
    skipped_drafts: int = 0  # steps a model drafter sat out: backing off after misses, or no draft paying for itself
    time_prefill: float = 0.0
    time_draft: float = 0.0
    time_verify: float = 0.0
    time_total: float = 0.0
    ttft: float = 0.0  # time to first token

    def observe_draft(self, n_draft: int, n_accepted: int) -> None:
        self.verify_sizes[n_draft + 1] = self.verify_sizes.get(n_draft + 1, 0) + 1
        if n_draft == 0:
            return
        self.drafts += 1
        self.draft_tokens += n_draft
        self.accepted += n_accepted
        if len(self.accepted_per_pos) < n_draft:
            self.accepted_per_pos.extend([0] * (n_draft - len(self.accepted_per_pos)))
        for i in range(n_accepted):
            self.accepted_per_pos[i] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.draft_tokens if self.draft_tokens else float("nan")

    @property
    def mean_acceptance_length(self) -> float:
        return 1 + self.accepted / self.drafts if self.drafts else float("nan")

    @property
    def tokens_per_target_forward(self) -> float:
        """Generated tokens per decoding forward of the target (the prefill excluded)."""
        decode_forwards = self.target_forwards - 1
        return self.generated / decode_forwards if decode_forwards > 0 else float(self.generated)

    @property
    def time_other(self) -> float:
        return max(0.0, self.time_total - self.time_prefill - self.time_draft - self.time_verify)

    @property
    def decode_tokens_per_second(self) -> float:
        t = self.time_total - self.ttft
        return (self.generated - 1) / t if t > 0 and self.generated > 1 else float("nan")

    @property
    def tokens_per_second(self) -> float:
        return self.generated / self.time_total if self.time_total > 0 else float("nan")

    def merge(self, other: SpecStats) -> SpecStats:
        """Sum of two stats (for aggregates over requests)."""
        out = SpecStats()
        for f in (
            "prompt_tokens",
            "generated",
            "drafts",
            "draft_tokens",
            "accepted",
            "target_forwards",
            "drafter_forwards",
            "skipped_drafts",
            "prefill_chunks",
            "time_prefill",
            "time_draft",
            "time_verify",
            "time_total",
            "ttft",
        ):
            setattr(out, f, getattr(self, f) + getattr(other, f))
        n = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        pad = lambda xs: xs + [0] * (n - len(xs))  # noqa: E731
        out.accepted_per_pos = [a + b for a, b in zip(pad(self.accepted_per_pos), pad(other.accepted_per_pos))]
        out.verify_sizes = {
            m: self.verify_sizes.get(m, 0) + other.verify_sizes.get(m, 0)
            for m in sorted(set(self.verify_sizes) | set(other.verify_sizes))
        }
        return out
