"""Offline drafter evaluation: the acceptance a drafter would get, without the generate loop.

Along a token sequence (a text, or the target's own greedy continuation of a prompt), one target
forward over the whole sequence gives the target's greedy token and distribution at every
position. The drafter then proposes at every position as it would during decoding (its session
sees the same committed context), and we count, per draft position j, how often its first j
tokens all equal the target's greedy tokens. On the target's own greedy continuation this is
exactly the greedy acceptance the engine would measure; on other texts it is the agreement
along that text. We also report the mean target probability of the drafter's first proposal
(the figure the EXAONE study computed offline).
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field

import torch

from ..chat import chat_prompt_ids
from ..util import read_text_file
from .drafters.base import Drafter
from .drafters.self_spec import SelfSpecDrafter
from .engine import SpecEngine
from .model import CausalLM
from .sampling import SamplingParams

_GREEDY = SamplingParams(temperature=0.0)


@dataclass
class OfflineEval:
    name: str
    positions: int = 0  # positions where the drafter was asked
    proposed: int = 0  # positions where it proposed at least one token
    accepted_per_pos: list[int] = field(default_factory=list)  # first j tokens all correct
    target_prob_sum: float = 0.0  # Σ p_target(first proposal)
    seconds: float = 0.0
    draft_tokens: int = 0  # tokens proposed (at most k per position)

    @property
    def acceptance_per_position(self) -> list[float]:
        return [a / self.positions if self.positions else float("nan") for a in self.accepted_per_pos]

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens / draft tokens (vLLM's definition)."""
        return sum(self.accepted_per_pos) / self.draft_tokens if self.draft_tokens else float("nan")

    @property
    def mean_target_prob(self) -> float:
        return self.target_prob_sum / self.positions if self.positions else float("nan")

    @property
    def expected_acceptance_length(self) -> float:
        """1 + expected accepted tokens per draft (greedy, fixed k)."""
        return 1 + sum(self.acceptance_per_position) if self.positions else float("nan")

    def merge(self, other: OfflineEval) -> OfflineEval:
        n = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        pad = lambda xs: xs + [0] * (n - len(xs))  # noqa: E731
        return OfflineEval(
            self.name,
            self.positions + other.positions,
            self.proposed + other.proposed,
            [a + b for a, b in zip(pad(self.accepted_per_pos), pad(other.accepted_per_pos))],
            self.target_prob_sum + other.target_prob_sum,
            self.seconds + other.seconds,
            self.draft_tokens + other.draft_tokens,
        )


@torch.inference_mode()
def target_greedy_along(target: CausalLM, tokens: list[int]) -> tuple[list[int], torch.Tensor]:
    """Target argmax after each prefix tokens[:i+1] and its full distribution: ([n], [n, V])."""
    logits = target.session().extend(tokens, keep=len(tokens))  # [n, V]
    return logits.argmax(-1).tolist(), torch.softmax(logits, -1)


def eval_drafter(
    target: CausalLM,
    drafter: Drafter,
    sequences: list[tuple[int, list[int]]],
    *,
    k: int = 4,
    name: str | None = None,
) -> OfflineEval:
    """Evaluate ``drafter`` along each ``(start, tokens)``: positions from ``start`` (the prompt
    length) to the end are scored; the drafter sees ``tokens[:i+1]`` at position i."""
    out = OfflineEval(name or drafter.name, accepted_per_pos=[0] * k)
    t0 = time.perf_counter()
    for start, tokens in sequences:
        greedy, probs = target_greedy_along(target, tokens)
        session = drafter.session(tokens[:start])
        # Positions whose whole k-token chain lies inside the sequence (no bias at its end).
        for i in range(max(start - 1, 0), len(tokens) - k + 1):
            draft = session.propose(tokens[: i + 1], k, _GREEDY, None).tokens
            out.positions += 1
            if not draft:
                continue
            out.proposed += 1
            out.draft_tokens += len(draft[:k])
            out.target_prob_sum += float(probs[i, draft[0]]) if draft[0] < probs.shape[-1] else 0.0
            for j, d in enumerate(draft[:k]):
                if i + j >= len(greedy) or d != greedy[i + j] or (j and tokens[i + j] != greedy[i + j - 1]):
                    break
                out.accepted_per_pos[j] += 1
        session.finish(tokens)  # as the engine does: a drafter that learns across requests sees this one's output
    out.seconds = time.perf_counter() - t0
    return out


def greedy_continuations(target: CausalLM, prompts: list[list[int]], max_new_tokens: int) -> list[tuple[int, list[int]]]:
    """The target's own greedy continuation of each prompt, as ``(prompt_len, prompt + output)``."""
    engine = SpecEngine(target)
    params = SamplingParams(max_new_tokens=max_new_tokens)
    return [(len(p), p + engine.generate(p, params).tokens) for p in prompts]


DEFAULT_EVAL_PROMPTS = (
    "Write a Python function that merges two sorted lists, with a docstring and two tests.",
    "Explain in a short paragraph what a KV cache is in transformer inference.",
    "오늘 저녁 메뉴로 간단한 한식 요리를 추천해 주세요.",
)


def eval_sequences(
    target: CausalLM, *, texts=(), prompts=(), continuation_tokens: int = 64, max_positions: int = 512
) -> tuple[list[tuple[int, list[int]]], str]:
    """What ``eval_drafter`` scores, and a line saying what it is: the first ``max_positions``
    tokens of each text file, else the target's greedy continuations of chat prompts."""
    if texts:
        seqs = [(1, target.view.encode(read_text_file(t))[:max_positions]) for t in texts]
        return seqs, "texts: " + ", ".join(str(t) for t in texts)
    ps = [chat_prompt_ids(target.view, [{"role": "user", "content": p}]) for p in (prompts or DEFAULT_EVAL_PROMPTS)]
    seqs = greedy_continuations(target, ps, continuation_tokens)
    return seqs, f"the target's greedy continuations ({continuation_tokens} tokens) of {len(ps)} prompts"


# ==== self-speculation: which L ===================================================================


@dataclass
class SelfSpecPoint:
    """One depth of a ``--drafter self:L`` sweep: its offline acceptance and what drafting costs."""

    layers: int  # L: the target's first L decoder layers draft
    eval: OfflineEval
    draft_cost: float  # one L-layer draft forward / one full target forward (one token each)
    verify_cost: float  # one (k+1)-token verification forward / one full one-token forward

    @property
    def acceptance_rate(self) -> float:
        return self.eval.acceptance_rate

    @property
    def mean_acceptance_length(self) -> float:
        """1 + accepted tokens per draft (the target's bonus token counted)."""
        return self.eval.expected_acceptance_length

    @property
    def estimated_speedup(self) -> float:
        """Tokens per step over the step's cost in one-token target forwards, from the forwards alone:
        ``mean_acceptance_length / (verify_cost + draft tokens per step × draft_cost)``."""
        ev = self.eval
        if not ev.positions:
            return float("nan")
        return self.mean_acceptance_length / (self.verify_cost + ev.draft_tokens / ev.positions * self.draft_cost)


def forward_seconds(target: CausalLM, drafters: list[SelfSpecDrafter], tokens: list[int], *, k: int, rounds: int = 5):
    """Seconds of one one-token target forward, one (k+1)-token verification and one draft forward
    of each drafter (over the target's cache, as in the engine), all at the end of ``tokens``: the
    fastest of ``rounds`` rounds that time each in turn, so a busy machine slows them all alike."""
    m = len(tokens) - k - 1  # the timed forwards feed tokens[m:]
    if m < 1:
        raise ValueError(f"timing needs a sequence of at least k + 2 = {k + 2} tokens, got {len(tokens)}.")
    s = target.session()
    s.extend(tokens[:m])
    sessions = [d.session(tokens[:m]) for d in drafters]
    for session in sessions:
        session.attach_target(s)
    steps = [
        lambda: (s.extend(tokens[m : m + 1]), s.truncate(m)),
        lambda: (s.extend(tokens[m : m + k + 1], keep=k + 1), s.truncate(m)),
        *(functools.partial(x.propose, tokens[: m + 1], 1, _GREEDY, None) for x in sessions),
    ]
    times: list[list[float]] = [[] for _ in steps]
    for _ in range(rounds + 1):
        for step, spent in zip(steps, times):
            t0 = time.perf_counter()
            step()
            spent.append(time.perf_counter() - t0)
    best = [min(spent[1:]) for spent in times]  # the first round warms up
    return best[0], best[1], best[2:]


def sweep_self_spec(
    target: CausalLM,
    sequences: list[tuple[int, list[int]]],
    layers: list[int],
    *,
    k: int = 4,
    min_confidence: float = 0.0,
    rounds: int = 5,
) -> list[SelfSpecPoint]:
    """Score ``--drafter self:L`` for each L in ``layers`` along ``sequences`` (as :func:`eval_drafter`),
    the target loaded once, with the cost of an L-layer draft forward and of a (k+1)-token
    verification relative to a one-token target forward (:func:`forward_seconds`, at the end of
    the longest sequence).

    >>> [(p.layers, round(p.acceptance_rate, 2)) for p in sweep_self_spec(lm, seqs, [4, 8])]  # doctest: +SKIP
    [(4, 0.21), (8, 0.43)]
    """
    drafters = [SelfSpecDrafter(target, layers=n, min_confidence=min_confidence) for n in layers]  # a bad L fails first
    probe = max((tokens for _, tokens in sequences), key=len)
    full, verify, drafts = forward_seconds(target, drafters, probe, k=k, rounds=rounds)
    return [
        SelfSpecPoint(d.layers, eval_drafter(target, d, sequences, k=k, name=f"self:{d.layers}"), t / full, verify / full)
        for d, t in zip(drafters, drafts)
    ]
