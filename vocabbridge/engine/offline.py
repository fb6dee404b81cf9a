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

import time
from dataclasses import dataclass, field

import torch

from ..chat import chat_prompt_ids
from ..util import read_text_file
from .drafters.base import Drafter
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

    @property
    def acceptance_per_position(self) -> list[float]:
        return [a / self.positions if self.positions else float("nan") for a in self.accepted_per_pos]

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
            out.target_prob_sum += float(probs[i, draft[0]]) if draft[0] < probs.shape[-1] else 0.0
            for j, d in enumerate(draft[:k]):
                if i + j >= len(greedy) or d != greedy[i + j] or (j and tokens[i + j] != greedy[i + j - 1]):
                    break
                out.accepted_per_pos[j] += 1
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
