"""The drafter interface. A drafter is a factory (it owns the model, if any); each request gets a
session that owns the per-request state (KV cache, n-gram index) and proposes target-vocabulary
tokens. All drafters look alike to the engine (vLLM's proposers do the same)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ..sampling import SamplingParams, logits_to_probs, sample


@dataclass
class Proposal:
    tokens: list[int]  # target-vocabulary ids, possibly fewer than asked (even none)
    probs: torch.Tensor | None = None  # [len(tokens), V_target] drafter distribution; None → deterministic (one-hot)


class DraftSession:
    """Per-request drafting state."""

    forwards: int = 0  # drafter model forwards so far
    # the target features the engine hands it (observe_hidden): False none, True the final hidden states (an
    # MTP head), a tuple of layer indices the residual streams entering those layers (an EAGLE-3 head)
    reads_hidden: bool | tuple[int, ...] = False
    free: bool = False  # True: proposing runs no model (n-gram, suffix), so a proposal not verified costs nothing

    def observe_hidden(self, start: int, hidden: torch.Tensor) -> None:
        """The target's features [n, F] (what ``reads_hidden`` asks for) of positions ``start`` …
        ``start + n - 1``, from the forward that just ran (a verification's rejected positions among
        them: later forwards overwrite those). Called only when ``reads_hidden``."""

    def attach_target(self, target) -> None:
        """The target's own session for this request (its ``KVSession``: cache and ids), given before
        the prefill. A drafter that runs part of the target (``self``) drafts over that cache and
        leaves it exactly as it found it; the others ignore it."""

    def warm(self, context: list[int], chunk: int) -> Iterator[None]:
        """Prefill the drafter on ``context`` in chunks of ``chunk`` tokens, yielding between them,
        so its first proposal is cheap and no single step keeps the engine busy for long. Drafters
        without a model have nothing to warm."""
        return iter(())

    def propose(self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator | None) -> Proposal:
        """Up to ``k`` tokens to follow ``context`` (all committed target ids: prompt + output)."""
        raise NotImplementedError

    def free_proposal(
        self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Proposal | None:
        """This step's proposal if making it runs no model (``free``; the lookup half of ngram-first
        when it matches), else None: the engine then decides how many tokens to ask the model for
        before it runs (the cost-aware length)."""
        return self.propose(context, k, params, generator) if self.free else None

    def finish(self, context: list[int]) -> None:
        """The request ended (finished, stopped or cancelled) with ``context``: its prompt and every
        token it produced, the last ones never proposed after. A drafter that learns across requests
        (``suffix``: the outputs of earlier requests) takes them here; the others ignore it."""


class Drafter:
    """What the registry (``vocabbridge.spec.DRAFTERS``) builds: ``from_spec(spec, target, drafter_lm)``."""

    name = "base"
    uses_model = False

    @classmethod
    def from_spec(cls, spec, target, drafter_lm) -> Drafter:
        """The drafter for an :class:`~vocabbridge.spec.EngineSpec`, its target and drafter model (or None)."""
        return cls()

    def load_model(self) -> None:
        """Load weights if the drafter has any (n-gram and none have nothing to load)."""

    def session(self, prompt: list[int]) -> DraftSession:
        raise NotImplementedError

    def describe(self) -> dict:
        return {"name": self.name}


def record_proposals(drafter: Drafter, log: list[tuple[int, list[int]]]) -> None:
    """Make every session of ``drafter`` append (context length, drafted tokens) to ``log`` for each
    proposal (a diagnostic: where drafts start and what they hold, e.g. against a teacher-forced pass)."""
    session = drafter.session

    def recording(prompt):
        s = session(prompt)
        propose = s.propose

        def logged(context, k, params, generator):
            p = propose(context, k, params, generator)
            log.append((len(context), list(p.tokens)))
            return p

        s.propose = logged
        return s

    drafter.session = recording


class _NoDraft(DraftSession):
    free = True

    def propose(self, context, k, params, generator):
        return Proposal([])


class NoDrafter(Drafter):
    """Plain decoding: one target forward per token."""

    name = "none"

    def session(self, prompt):
        return _NoDraft()


def pick_token(logits: torch.Tensor, params: SamplingParams, generator, *, need_confidence: bool):
    """One draft token from a drafter's logits: ``(token, confidence, probs)``.

    Greedy: the argmax, its probability only when a confidence gate needs it (else 1.0), no probs.
    Sampling: a token drawn from the drafter's distribution, the distribution's top probability as
    the confidence, and the distribution itself (the q of rejection sampling).
    """
    if params.greedy:
        tok = int(logits.argmax())
        return tok, float(torch.softmax(logits.float(), -1)[tok]) if need_confidence else 1.0, None
    probs = logits_to_probs(logits, params)
    return sample(probs, generator), float(probs.max()), probs
