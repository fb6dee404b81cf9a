"""SpecEngine: speculative decoding over one target and any drafter, one request at a time.

    prefill target on the prompt → first token (time to first token; the drafter is not touched)
    loop:
        draft  k tokens from the committed context                      (drafter.propose)
        verify one target forward over [last token, draft...] → logits  (k+1 positions)
               accept a prefix, take the target's next token             (verify.verify)
        roll the target's KV cache back to the accepted prefix
        emit the accepted tokens + the target's token; stop on eos / stop ids / max tokens

``k`` adapts per request when ``adaptive_k`` is on: +1 after a fully accepted draft, −1 after a
draft rejected at its first token (bounded to [1, k_max]); a wasted draft position costs a
drafter forward, and on a CPU that is not free.

A drafter that keeps missing backs off (``backoff``, on by default): after ``BACKOFF_AFTER``
steps in a row where it ran its model more than once and nothing was accepted, the engine skips
drafting for 1, 2, 4, … (at most ``BACKOFF_MAX``) steps, and any accepted token resets it. A
weak drafter on text it cannot predict (SmolLM2 on Korean for a coder target) then costs almost
nothing instead of several drafter forwards every step. A draft that stopped after one forward
(the confidence gate said no at once) is cheap and does not count, so a good gated drafter is
not cut off; free proposals (n-gram lookup) never back off. Skipping a draft only changes what
is proposed, never what is emitted.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from ..errors import RequestError
from .drafters.base import Drafter, NoDrafter
from .model import CausalLM
from .sampling import SamplingParams, logits_to_probs, sample
from .stats import SpecStats
from .verify import verify

BACKOFF_AFTER = 3  # consecutive costly misses before the first skipped step
BACKOFF_MAX = 16  # most steps skipped in a row


@dataclass
class StepOutput:
    """Tokens emitted by one engine step (the first step is the prefill's token)."""

    tokens: list[int]
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length"


@dataclass
class GenerationResult:
    tokens: list[int]
    finish_reason: str
    stats: SpecStats
    text: str = ""
    k_trace: list[int] = field(default_factory=list)


class SpecEngine:
    def __init__(
        self,
        target: CausalLM,
        drafter: Drafter | None = None,
        *,
        num_speculative_tokens: int = 4,
        adaptive_k: bool = False,
        k_max: int | None = None,
        backoff: bool = True,
    ):
        if num_speculative_tokens < 1:
            raise RequestError(f"num_speculative_tokens must be ≥ 1, got {num_speculative_tokens}.")
        self.target = target
        self.drafter = drafter or NoDrafter()
        self.k = num_speculative_tokens
        self.adaptive_k = adaptive_k
        self.k_max = k_max or max(2 * num_speculative_tokens, num_speculative_tokens)
        self.backoff = backoff
        roles = target.view.roles
        self.eos_ids = frozenset(roles[r] for r in ("eos", "end_of_turn") if r in roles)

    # ==== one request ====================================================================

    def stream(self, prompt: list[int], params: SamplingParams, stats: SpecStats | None = None) -> Iterator[StepOutput]:
        """Yield the emitted tokens step by step; ``stats`` (if given) is filled in as it goes."""
        stats = stats if stats is not None else SpecStats()
        if not prompt:
            raise RequestError("the prompt is empty; give at least one token.")
        if len(prompt) + params.max_new_tokens > self.target.max_context:
            raise RequestError(
                f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_new_tokens}) exceeds the target's context "
                f"of {self.target.max_context} tokens; shorten the prompt or lower max_tokens."
            )
        gen = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        stop = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self.eos_ids)
        t0 = time.perf_counter()
        stats.prompt_tokens = len(prompt)
        target = self.target.session()
        logits = target.extend(prompt, keep=1)  # [1, V]
        stats.target_forwards += 1
        tok = self._pick(logits[-1], params, gen)
        stats.time_prefill = stats.ttft = time.perf_counter() - t0
        stats.generated = 1
        out = [tok]
        if tok in stop or params.max_new_tokens == 1:
            stats.time_total = time.perf_counter() - t0
            yield StepOutput([tok], True, "stop" if tok in stop else "length")
            return
        yield StepOutput([tok])

        session = self.drafter.session(prompt)
        k = self.k
        misses = skip = 0  # back-off state (see the module docstring)
        try:
            while True:
                context = prompt + out
                budget = params.max_new_tokens - len(out)
                t1 = time.perf_counter()
                forwards_before = session.forwards
                if skip:
                    skip, proposal = skip - 1, None
                    stats.skipped_drafts += 1
                else:
                    proposal = session.propose(context, min(k, budget - 1), params, gen) if budget > 1 else None
                costly = session.forwards - forwards_before > 1
                draft = proposal.tokens if proposal else []
                t2 = time.perf_counter()
                stats.time_draft += t2 - t1
                # One target forward over the last committed token and the draft: [n+1, V] logits.
                before = len(target)
                logits = target.extend([tok] + draft, keep=len(draft) + 1)
                stats.target_forwards += 1
                n_acc, nxt = verify(logits, draft, proposal.probs if proposal else None, params, gen)
                target.truncate(before + 1 + n_acc)  # roll back the rejected draft tokens
                stats.time_verify += time.perf_counter() - t2
                stats.observe_draft(len(draft), n_acc)
                if n_acc:
                    misses = 0
                elif costly and self.backoff:
                    misses += 1
                    if misses >= BACKOFF_AFTER:
                        skip = min(BACKOFF_MAX, 2 ** (misses - BACKOFF_AFTER))
                if self.adaptive_k and draft:
                    k = min(self.k_max, k + 1) if n_acc == len(draft) else max(1, k - 1) if n_acc == 0 else k

                emitted, finish = [], None
                for t in draft[:n_acc] + [nxt]:
                    emitted.append(t)
                    if t in stop:
                        finish = "stop"
                        break
                    if len(out) + len(emitted) >= params.max_new_tokens:
                        finish = "length"
                        break
                out += emitted
                stats.generated = len(out)
                tok = out[-1]
                if finish:
                    stats.time_total = time.perf_counter() - t0
                    stats.drafter_forwards = session.forwards
                    yield StepOutput(emitted, True, finish)
                    return
                yield StepOutput(emitted)
        finally:
            stats.drafter_forwards = session.forwards
            if not stats.time_total:
                stats.time_total = time.perf_counter() - t0

    def generate(self, prompt: list[int], params: SamplingParams | None = None) -> GenerationResult:
        """Run one request to the end."""
        params = params or SamplingParams()
        stats = SpecStats()
        tokens: list[int] = []
        finish = "length"
        for step in self.stream(prompt, params, stats):
            tokens += step.tokens
            if step.finished:
                finish = step.finish_reason or finish
        text = self.target.view.decode_bytes(tokens).decode("utf-8", errors="replace")
        return GenerationResult(tokens, finish, stats, text)

    @staticmethod
    def _pick(logits: torch.Tensor, params: SamplingParams, gen) -> int:
        if params.greedy:
            return int(logits.argmax())
        return sample(logits_to_probs(logits, params), gen)
