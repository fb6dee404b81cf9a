"""Drafters that run a small model: ``draft`` (same vocabulary) and ``bridged`` (another
vocabulary, through a token map). The ``text`` drafter (text.py) builds on the same session.

Each step the session turns the committed target context into drafter tokens, syncs its KV cache
to them (crop to the common prefix, feed the rest: rollback after a rejection is implicit, and no
stale entry survives), then drafts up to k tokens autoregressively. The last drafted token is
never fed (its logits are not needed), and drafting stops early when the drafter's top
probability falls below ``min_confidence`` (a guess it doubts is a wasted target position).
"""

from __future__ import annotations

import numpy as np
import torch

from ...errors import ConfigError
from ...mapping import token_map_for
from ...mapping.tokenmap import unpaired_choice
from ...tokenizer import same_vocabulary
from ...util import common_prefix_len
from ..model import CausalLM
from ..sampling import SamplingParams
from .base import Drafter, DraftSession, Proposal, pick_token

WARM_K = 64  # the largest k: a window set while warming holds for every later proposal


class ModelDraftSession(DraftSession):
    """Shared machinery: context translation, KV sync with a context window, the draft loop."""

    def __init__(self, lm: CausalLM, *, min_confidence: float):
        self.lm = lm
        # Drafting past the drafter's own end of turn proposes tokens the target will never reach.
        self.stop_ids = frozenset(lm.view.roles[r] for r in ("eos", "end_of_turn") if r in lm.view.roles)
        self.kv = lm.session()
        self.min_confidence = min_confidence
        self.window_start = 0  # drafter-token index where the drafter's view of the context starts
        self.forwards = 0

    # Subclasses: translate target context → drafter ids; drafter id → target id (or -1).
    def drafter_context(self, context: list[int]) -> list[int]:
        raise NotImplementedError

    def _windowed(self, want: list[int], k: int) -> list[int]:
        """Keep the drafter inside its context limit; move the window rarely (re-prefill costs)."""
        limit = self.lm.max_context - k - 2
        if len(want) - self.window_start > limit:
            self.window_start = max(0, len(want) - limit // 2)
        return want[self.window_start :] if self.window_start else want

    def warm(self, context: list[int], chunk: int):
        want = self._windowed(self.drafter_context(context), WARM_K)[:-1]  # propose() feeds the last token
        n = common_prefix_len(self.kv.ids, want)
        self.kv.truncate(n)
        for start in range(n, len(want), chunk):
            self.kv.extend(want[start : start + chunk], keep=1)
            self.forwards += 1
            yield

    def _feed(self, context: list[int], k: int) -> torch.Tensor:
        want = self._windowed(self.drafter_context(context), k)
        before = self.lm.forwards
        logits = self.kv.sync(want, keep=1)[-1]  # [V_draft]
        self.forwards += self.lm.forwards - before
        return logits

    def _step(self, token: int) -> torch.Tensor:
        self.forwards += 1
        return self.kv.extend([token], keep=1)[-1]

    def draft_loop(self, logits: torch.Tensor, k: int, params: SamplingParams, generator, *, mask: torch.Tensor | None = None):
        """Draft up to k drafter ids; returns (ids, probs rows or None).

        With ``min_confidence`` > 0, drafting stops as soon as the product of the drafter's
        top probabilities so far (its own estimate that the whole draft survives) falls below it,
        the first token included: an empty draft makes the engine take a plain one-token step,
        which on a CPU is much cheaper than verifying a doubtful guess.
        """
        ids: list[int] = []
        rows: list[torch.Tensor] = []
        survive = 1.0
        for i in range(k):
            if mask is not None:
                logits = logits + mask
            tok, conf, probs = pick_token(logits, params, generator, need_confidence=self.min_confidence > 0)
            if probs is not None:
                rows.append(probs)
            survive *= conf
            if survive < self.min_confidence:
                if rows:
                    rows.pop()
                break
            ids.append(tok)
            if self.stop_after(tok) or i == k - 1:
                break
            logits = self._step(tok)
        return ids, (torch.stack(rows) if rows else None)

    def stop_after(self, drafter_id: int) -> bool:
        return drafter_id in self.stop_ids


# ==== same vocabulary ========================================================================


class _DraftSession(ModelDraftSession):
    def drafter_context(self, context):
        return context

    def propose(self, context, k, params, generator):
        logits = self._feed(context, k)
        ids, probs = self.draft_loop(logits, k, params, generator)
        if probs is not None and probs.shape[-1] != self.target_vocab:
            probs = _resize(probs, self.target_vocab)
        return Proposal(ids, probs)


def _resize(probs: torch.Tensor, width: int) -> torch.Tensor:
    out = probs.new_zeros((probs.shape[0], width))
    n = min(width, probs.shape[-1])
    out[:, :n] = probs[:, :n]
    return out


class DraftModelDrafter(Drafter):
    """A small model with the target's own vocabulary (e.g. Qwen2.5-Coder-0.5B for the 1.5B)."""

    name = "draft"
    uses_model = True

    def __init__(self, lm: CausalLM, *, target_vocab_size: int, target_view=None, min_confidence: float = 0.0):
        self.lm = lm
        self.target_vocab = target_vocab_size
        self.min_confidence = min_confidence
        if target_view is not None and not same_vocabulary(lm.view, target_view):
            raise ConfigError(
                f"drafter {lm.source} does not share the target's vocabulary; use the bridged or text drafter "
                "(--mode bridged|text) for a drafter with another tokenizer."
            )

    @classmethod
    def from_spec(cls, spec, target, drafter_lm):
        return cls(drafter_lm, target_vocab_size=target.vocab_size, min_confidence=spec.min_confidence)

    def session(self, prompt):
        s = _DraftSession(self.lm, min_confidence=self.min_confidence)
        s.target_vocab = self.target_vocab
        return s

    def describe(self):
        return {"name": self.name, "model": self.lm.source, "min_confidence": self.min_confidence}


# ==== another vocabulary, through a token map =================================================


class _BridgedSession(ModelDraftSession):
    def __init__(self, drafter: BridgedDrafter, **kw):
        super().__init__(drafter.lm, **kw)
        self.d = drafter
        self.mapped: list[int] = []  # drafter ids for context[:n_mapped]
        self.n_mapped = 0

    def drafter_context(self, context):
        if self.n_mapped > len(context):  # never happens in the engine (context only grows)
            self.mapped, self.n_mapped = [], 0
        feed = self.d.feed_ids
        for t in context[self.n_mapped :]:
            self.mapped.extend(feed(t))
        self.n_mapped = len(context)
        return self.mapped

    def propose(self, context, k, params, generator):
        logits = self._feed(context, k)
        ids, probs = self.draft_loop(logits, k, params, generator, mask=self.d.mask)
        d2t = self.d.d2t
        tokens = [int(d2t[i]) for i in ids]
        if probs is not None:  # drafter distribution → target ids (mass of unmapped ids is 0 by the mask)
            q = probs.new_zeros((probs.shape[0], self.d.target_vocab))
            q.index_add_(1, self.d.d2t_targets, probs[:, self.d.d2t_sources])
            probs = q
        return Proposal(tokens, probs)


class BridgedDrafter(Drafter):
    """A drafter with another vocabulary: context reaches it through the map and its input bridge
    (never as unk); its proposals are restricted to mapped tokens and translated to target ids."""

    name = "bridged"
    uses_model = True

    def __init__(self, lm: CausalLM, token_map, *, target_vocab_size: int, min_confidence: float = 0.0):
        self.lm = lm
        self.token_map = token_map
        self.target_vocab = target_vocab_size
        self.min_confidence = min_confidence
        d2t = np.asarray(token_map.draft_to_target, dtype=np.int64)
        width = lm.vocab_size
        full = np.full(width, -1, dtype=np.int64)
        full[: min(width, len(d2t))] = d2t[:width]
        full[full >= target_vocab_size] = -1
        self.d2t = full
        mapped = full >= 0
        if not mapped.any():
            raise ConfigError("the token map pairs no drafter token with a target token; rebuild it for these tokenizers.")
        self.mask = torch.where(torch.from_numpy(mapped), 0.0, float("-inf")).to(lm.device)  # [V_draft]
        src = np.nonzero(mapped)[0]
        self.d2t_sources = torch.from_numpy(src).to(lm.device)
        self.d2t_targets = torch.from_numpy(full[src]).to(lm.device)

    @classmethod
    def from_spec(cls, spec, target, drafter_lm):
        tm = token_map_for(
            drafter_lm.view,
            target.view,
            path=spec.map_path,
            mode=spec.map_mode,
            drafter_vocab_size=drafter_lm.vocab_size,
            target_vocab_size=target.vocab_size,
        )
        return cls(drafter_lm, tm, target_vocab_size=target.vocab_size, min_confidence=spec.min_confidence)

    def feed_ids(self, target_id: int) -> tuple[int, ...]:
        """The drafter ids that stand for ``target_id`` in the drafter's context: its partner, else its bridge."""
        return self.token_map.draft_ids_for_target(target_id)

    def session(self, prompt):
        return _BridgedSession(self, min_confidence=self.min_confidence)

    def describe(self):
        return {
            "name": self.name,
            "model": self.lm.source,
            "map_mode": self.token_map.mode,
            "mapped_drafter_tokens": int((self.d2t >= 0).sum()),
            "min_confidence": self.min_confidence,
        }


# ==== vLLM's token-level intersection, in our engine ==========================================


class TLIDrafter(BridgedDrafter):
    """vLLM's heterogeneous-vocabulary path (``use_heterogeneous_vocab``) reproduced in our engine,
    to compare it with the other drafters on the same hardware: one drafter token per target token,
    through the map where there is a pair and a single fallback id where there is none (the
    drafter's unk, as vLLM; or the first token of the input bridge's spelling); proposals masked to
    paired tokens. Without ``--map`` the map is vLLM's own (``--map-mode vllm``), exactly."""

    name = "tli"

    def __init__(self, lm: CausalLM, token_map, *, target_vocab_size: int, min_confidence: float = 0.0, unpaired: str = "unk"):
        super().__init__(lm, token_map, target_vocab_size=target_vocab_size, min_confidence=min_confidence)
        self.unpaired = unpaired
        self.inputs = token_map.single_token_inputs(unpaired)

    @classmethod
    def from_spec(cls, spec, target, drafter_lm):
        mode = spec.map_mode if spec.map_path else "vllm"
        tm = token_map_for(
            drafter_lm.view,
            target.view,
            path=spec.map_path,
            mode=mode,
            drafter_vocab_size=drafter_lm.vocab_size,
            target_vocab_size=target.vocab_size,
        )
        unpaired = "unk" if tm.mode == "vllm" else unpaired_choice()  # vLLM's own map: exactly what vLLM feeds
        return cls(drafter_lm, tm, target_vocab_size=target.vocab_size, min_confidence=spec.min_confidence, unpaired=unpaired)

    def feed_ids(self, target_id: int) -> tuple[int, ...]:
        return (int(self.inputs[target_id]),) if 0 <= target_id < len(self.inputs) else ()

    def describe(self):
        return super().describe() | {"name": self.name, "unpaired": self.unpaired}
