"""SpecEngine: speculative decoding over one target and any drafter, one request at a time.

    prefill  the target on the prompt, in chunks → the first token     (the drafter is not touched)
    warm     the drafter on the context, in chunks                      (its first proposal is cheap)
    loop:
        draft   up to k tokens from the committed context               (drafter.propose)
        verify  one target forward over [last token, draft...]          (verify.verify: k+1 logits)
        commit  the accepted prefix + the target's own next token; roll the rejected tail out of the KV cache
        adapt   the policies (policies.py): back-off, adaptive k, cost-aware draft length

Every prefill chunk is one step of the generator, so a server interleaves a long prompt with the
other requests' decode steps and a cancelled request stops at the next chunk.

A drafter that reads the target's hidden states (an MTP or EAGLE-3 head, ``DraftSession.reads_hidden``:
the final ones, or the residual streams entering chosen layers) gets those of every position a
target forward feeds (prefill chunks, verifications): no extra pass.
Every session is handed the target's own session first (``attach_target``): the ``self`` drafter
drafts over the target's KV cache with its first layers, and crops it back before the verification.

The policies are small named pieces (:mod:`.policies`: back-off, adaptive k, the cost-aware draft
length): they change what is proposed, never what is emitted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from ..errors import RequestError
from .drafters.base import Drafter, DraftSession, NoDrafter, Proposal
from .model import CausalLM, KVSession
from .policies import AdaptiveK, BackOff, CostAware, RowCosts
from .sampling import SamplingParams, logits_to_probs, sample
from .stats import SpecStats
from .threads import ThreadGovernor
from .verify import verify

PREFILL_CHUNK = 256  # prompt tokens per forward (EngineSpec.prefill_chunk): bounds how long one step keeps the engine busy


@dataclass
class StepOutput:
    """Tokens emitted by one engine step; a prefill chunk emits none."""

    tokens: list[int]
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length"


@dataclass
class GenerationResult:
    tokens: list[int]  # every token generated, the stop token that ended them included
    finish_reason: str
    stats: SpecStats
    text: str = ""  # what a reader sees: the tokens without that stop token (as vLLM's text)
    k_trace: list[int] = field(default_factory=list)


def shown_tokens(tokens: list[int], finish_reason: str | None) -> list[int]:
    """The tokens whose text a reader sees: all but the stop token (end of turn, eos, a stop id) that
    ended them; a step or a result that finished with "stop" ends with exactly one.

    >>> shown_tokens([5, 6, 2], "stop"), shown_tokens([5, 6, 2], "length")
    ([5, 6], [5, 6, 2])
    """
    return tokens[:-1] if finish_reason == "stop" and tokens else tokens


# ==== the engine ================================================================================


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
        cost_aware: bool = False,
        prefill_chunk: int = PREFILL_CHUNK,
        threads: ThreadGovernor | None = None,
    ):
        if num_speculative_tokens < 1:
            raise RequestError(f"num_speculative_tokens must be ≥ 1, got {num_speculative_tokens}.")
        self.target = target
        self.drafter = drafter or NoDrafter()
        self.k = num_speculative_tokens
        self.adaptive_k = adaptive_k
        self.k_max = k_max or 2 * num_speculative_tokens
        self.backoff = backoff
        self.cost_aware = cost_aware
        self.row_costs = RowCosts()  # the target's measured seconds per forward by rows, shared by requests
        self.prefill_chunk = prefill_chunk
        self.threads = threads  # sizes the kernels' threads to the free cores (threads.py), looked at before each forward
        roles = target.view.roles
        self.eos_ids = frozenset(roles[r] for r in ("eos", "end_of_turn") if r in roles)

    def stream(self, prompt: list[int], params: SamplingParams, stats: SpecStats | None = None) -> Iterator[StepOutput]:
        """Yield what each step emits; ``stats`` (if given) is filled in as it goes."""
        stats = stats if stats is not None else SpecStats()
        self._check(prompt, params)
        gen = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        stop = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else self.eos_ids)
        t0 = time.perf_counter()
        stats.prompt_tokens = len(prompt)
        target = self.target.session()
        session = self.drafter.session(prompt)
        session.attach_target(target)

        # prefill → the first token
        logits = yield from self._prefill(target, prompt, stats, session)
        tok = self._pick(logits[-1], params, gen)
        stats.time_prefill = stats.ttft = time.perf_counter() - t0
        stats.generated = 1
        out = [tok]
        finish = "stop" if tok in stop else "length" if params.max_new_tokens == 1 else None
        if finish:
            session.finish(prompt + out)  # before the yield: the caller may close the generator there
        yield StepOutput([tok], finish is not None, finish)
        if finish:
            stats.time_total = time.perf_counter() - t0
            return

        backoff = BackOff(self.backoff)
        k = AdaptiveK(self.k, self.k_max, self.adaptive_k)
        length = CostAware(self.row_costs, self.k_max, self.cost_aware)
        try:
            for _ in session.warm(prompt + out, self.prefill_chunk):
                yield StepOutput([])
            while True:
                # draft
                t1 = time.perf_counter()
                budget = params.max_new_tokens - len(out)
                forwards = session.forwards
                proposal, free = self._draft(session, prompt, out, min(k.k, budget - 1), params, gen, backoff, length, stats)
                draft = proposal.tokens
                t2 = time.perf_counter()
                stats.time_draft += t2 - t1

                # verify: one target forward over the last committed token and the draft, [n+1, V] logits
                before = len(target)
                logits = self._extend(target, [tok] + draft, len(draft) + 1, session)
                stats.target_forwards += 1
                n_acc, nxt = verify(logits, draft, proposal.probs, params, gen)
                target.truncate(before + 1 + n_acc)  # roll back the rejected draft tokens
                t3 = time.perf_counter()
                stats.time_verify += t3 - t2
                stats.observe_draft(len(draft), n_acc)

                # adapt
                backoff.observe(n_acc, costly=session.forwards - forwards > 1)
                k.observe(len(draft), n_acc)
                length.observe_step(len(draft), n_acc, t3 - t2, t2 - t1, free)

                # commit
                emitted, finish = self._commit(draft[:n_acc] + [nxt], len(out), params, stop)
                out += emitted
                length.score_shadow(out)
                stats.generated = len(out)
                tok = out[-1]
                if finish:
                    stats.time_total = time.perf_counter() - t0
                    stats.drafter_forwards = session.forwards
                yield StepOutput(emitted, finish is not None, finish)
                if finish:
                    return
        finally:
            session.finish(prompt + out)  # also when the caller closes the generator (a stop string, a cancel)
            stats.drafter_forwards = session.forwards
            if not stats.time_total:
                stats.time_total = time.perf_counter() - t0

    def generate(
        self, prompt: list[int], params: SamplingParams | None = None, *, on_step: Callable[[StepOutput], None] | None = None
    ) -> GenerationResult:
        """Run one request to the end; ``on_step`` sees every step as it is produced (to print text as it comes)."""
        params = params or SamplingParams()
        stats = SpecStats()
        tokens: list[int] = []
        finish = "length"
        for step in self.stream(prompt, params, stats):
            if on_step is not None:
                on_step(step)
            tokens += step.tokens
            if step.finished:
                finish = step.finish_reason or finish
        text = self.target.view.decode_bytes(shown_tokens(tokens, finish)).decode("utf-8", errors="replace")
        return GenerationResult(tokens, finish, stats, text)

    # ==== pieces ================================================================================

    @staticmethod
    def _draft(
        session: DraftSession, prompt, out, cap, params, gen, backoff: BackOff, length: CostAware, stats
    ) -> tuple[Proposal, bool]:
        """This step's proposal and whether it was free. None while backing off or at the end of the
        token budget. A free proposal (lookup) is made in full and cut to the cost-aware length (and
        kept as a shadow draft when that is 0); a model is asked for no more than the cost-aware
        length, and not run at all when that is 0."""
        if cap <= 0:
            return Proposal([]), False
        if backoff.sit_out():
            stats.skipped_drafts += 1
            return Proposal([]), False
        context = prompt + out
        p = session.free_proposal(context, cap, params, gen)
        if p is not None:
            n = length.length(len(p.tokens), free=True)
            if n == 0:
                length.observe_shadow(len(out), p.tokens)
            return Proposal(p.tokens[:n], None if p.probs is None else p.probs[:n]), True
        cap = length.length(cap)
        if cap == 0:
            stats.skipped_drafts += 1
            return Proposal([]), False
        return session.propose(context, cap, params, gen), False

    def _check(self, prompt: list[int], params: SamplingParams) -> None:
        if not prompt:
            raise RequestError("the prompt is empty; give at least one token.")
        if len(prompt) + params.max_new_tokens > self.target.max_context:
            raise RequestError(
                f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_new_tokens}) exceeds the target's context "
                f"of {self.target.max_context} tokens; shorten the prompt or lower max_tokens."
            )

    def _prefill(self, target: KVSession, prompt: list[int], stats: SpecStats, session: DraftSession):
        """Feed the prompt in chunks, yielding an empty step between them; returns the last logits [1, V]."""
        n = self.prefill_chunk
        for start in range(0, len(prompt), n):
            logits = self._extend(target, prompt[start : start + n], 1, session)
            stats.prefill_chunks += 1
            if start + n < len(prompt):
                yield StepOutput([])
        stats.target_forwards += 1  # the prefill counts as one target pass, however many chunks
        return logits

    def _extend(self, target: KVSession, tokens: list[int], keep: int, session: DraftSession) -> torch.Tensor:
        """One target forward ([keep, V] logits); a drafter that reads the target's hidden states (an
        MTP head) gets those of the fed positions from the same forward: no extra target pass. Before
        it, the thread governor may resize the kernels' threads to the free cores (every ~1.5 s)."""
        if self.threads is not None:
            self.threads.tick()
        if not session.reads_hidden:
            return target.extend(tokens, keep=keep)
        start = len(target)
        logits, hidden = target.extend(tokens, keep=keep, hidden=session.reads_hidden)
        session.observe_hidden(start, hidden)
        return logits

    @staticmethod
    def _commit(tokens: list[int], n_out: int, params: SamplingParams, stop: frozenset[int]) -> tuple[list[int], str | None]:
        """The tokens to emit (up to a stop token or the token budget) and why the request ends, if it does."""
        emitted = []
        for t in tokens:
            emitted.append(t)
            if t in stop:
                return emitted, "stop"
            if n_out + len(emitted) >= params.max_new_tokens:
                return emitted, "length"
        return emitted, None

    @staticmethod
    def _pick(logits: torch.Tensor, params: SamplingParams, gen) -> int:
        if params.greedy:
            return int(logits.argmax())
        return sample(logits_to_probs(logits, params), gen)
