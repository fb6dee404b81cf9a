"""The ``mtp`` drafter: an MTP, EAGLE-3 or P-EAGLE head drafting from the target's own hidden states.

``--drafter mtp:heads/NAME`` loads a head trained by ``vocabbridge train-head`` (any architecture:
``--arch mtp`` reads the target's final hidden states, ``--arch eagle3`` and ``--arch peagle`` the
residual streams entering a few of its layers); ``--drafter mtp`` loads the MTP weights of the
target's own checkpoint (DeepSeek-V3, EXAONE 4.5, Qwen3.5, MiMo layouts: vocabbridge/heads/layouts.py).

No extra target pass: every target forward of the engine (prefill chunks, verifications) hands the
session the hidden states of the positions it fed (``observe_hidden``). The head keeps one KV
cache over its own positions, where position i holds the pair (h_i, x_{i+1}), and a pair is fed
only once both are committed. A proposal:

    feed the committed pairs not fed yet    → the last one's output g predicts the first draft token
    then k−1 times: feed (g, draft token)    → the next draft token (the layer re-runs on its own output)

A P-EAGLE head (heads/peagle.py) does it all in one forward: the committed pairs not fed yet, then
k−1 mask positions; the last k outputs are the k draft tokens' distributions (each drawn from its
own, none conditioned on the draft tokens before it: still a valid q for rejection sampling).

The k−1 speculative entries (chained states or masks) are cropped from the head's cache at the next
proposal, whatever was accepted (rollback, as the other sessions do). Greedy output is the target's
own (the target verifies every token); when sampling, the head's q goes to rejection sampling.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from ...errors import ConfigError, RequestError
from ...heads.draft_head import DraftHead, causal_mask, target_parts
from ...heads.layouts import checkpoint_files, head_from_weights, read_mtp_weights
from ...heads.peagle import MASK
from ...heads.store import load_head
from ..model import QUANTIZED, drafter_dtype_for
from ..quant import quantize_int8
from ..sampling import SamplingParams
from .base import Drafter, DraftSession, Proposal, pick_token


class _MTPSession(DraftSession):
    def __init__(self, d: MTPDrafter):
        self.d = d
        self.reads_hidden = d.head.target_features  # the final hidden states, or the layers EAGLE-3 reads
        self.cache = DynamicCache()
        self.fed = 0  # committed pairs in the head's cache: positions 0 … fed-1
        self.cached = 0  # entries in the head's cache: the committed pairs, then a proposal's speculative ones
        self.rows = torch.empty(0, d.head.feature_size, device=d.device)  # target features of positions rows_start …
        self.rows_start = 0
        self.forwards = 0

    def observe_hidden(self, start, hidden):
        assert start >= self.rows_start, "a target forward starts at the last committed token, after every fed pair"
        self.rows = torch.cat([self.rows[: start - self.rows_start], hidden.float()])

    @torch.inference_mode()
    def _feed(self, context: list[int], upto: int, masks: int = 0) -> torch.Tensor | None:
        """Feed the committed pairs [fed, upto) (after cropping speculative entries), and ``masks`` mask
        positions after them (P-EAGLE); the outputs of the last pair and of the masks [1 + masks, d]."""
        self._crop()
        n = upto - self.fed
        if n <= 0:
            return None
        lo = self.fed - self.rows_start
        if lo < 0 or lo + n > len(self.rows):
            raise RequestError(
                "the mtp drafter has no target hidden states for these positions: it drafts inside the engine's "
                "generate loop only (eval-drafter cannot score it; train-head reports its held-out acceptance)."
            )
        dev = self.d.device
        hidden = self.d.head.combine(self.rows[lo : lo + n].to(dev, self.d.dtype)[None])  # [1, n, F] → [1, n, d]
        tokens = context[self.fed + 1 : upto + 1]
        if masks:  # mask positions upto … upto + masks − 1: the mask state and the mask token
            hidden = torch.cat([hidden, self.d.mask_state.expand(1, masks, -1)], dim=1)
            tokens = tokens + [MASK] * masks
        positions = torch.arange(self.fed, upto + masks, device=dev)[None]  # [1, n + masks]
        mask = causal_mask(n + masks, self.fed, device=dev)
        g = self.d.head(hidden, torch.tensor([tokens], device=dev), positions, cache=self.cache, mask=mask)[0, -1 - masks :]
        self.forwards += 1
        self.rows, self.rows_start = self.rows[lo + n :], upto  # fed rows are no longer needed
        self.fed, self.cached = upto, upto + masks
        return g

    def _crop(self) -> None:
        """Drop the speculative entries the last proposal left after the committed pairs."""
        if self.cached > self.fed:
            self.cache.crop(-(self.cached - self.fed))  # negative = remove that many (across transformers versions)
            self.cached = self.fed

    def warm(self, context, chunk):
        upto = len(context) - 2  # every pair but the last, which propose() feeds for its first token
        while self.fed < upto:
            self._feed(context, min(upto, self.fed + chunk))
            yield

    @torch.inference_mode()
    def propose(self, context, k, params: SamplingParams, generator):
        if self.d.parallel:
            return self._propose_parallel(context, k, params, generator)
        g = self._feed(context, len(context) - 1)
        if g is None:
            return Proposal([])
        g = g[-1]
        d, head = self.d, self.d.head
        tokens: list[int] = []
        dists: list[torch.Tensor] = []  # the head's q of each sampled token (sampling only)
        survive = 1.0
        for i in range(k):
            logits = head.logits(g.view(1, -1))[0]  # [V_draft] (int8 linears want 2-D input)
            j, conf, probs = pick_token(logits, params, generator, need_confidence=d.min_confidence > 0)
            if probs is not None:
                dists.append(probs)
            survive *= conf
            if survive < d.min_confidence:
                dists = dists[: len(tokens)]
                break
            tok = d.to_target(j)
            tokens.append(tok)
            if tok in d.stop_ids or i == k - 1:
                break
            pos = len(context) - 1 + i  # the draft token's pair sits one position after the last
            step = head(
                g.view(1, 1, -1), torch.tensor([[tok]], device=d.device), torch.tensor([[pos]], device=d.device), cache=self.cache
            )
            self.forwards += 1
            self.cached += 1
            g = step[0, -1]
        return Proposal(tokens, d.scatter(torch.stack(dists)) if dists else None)

    def _propose_parallel(self, context, k, params: SamplingParams, generator) -> Proposal:
        """P-EAGLE: one head forward over the pairs not fed yet and k−1 mask positions; k tokens."""
        d = self.d
        k = min(k, d.parallel)
        g = self._feed(context, len(context) - 1, masks=k - 1)
        if g is None:
            return Proposal([])
        logits = d.head.logits(g)  # [k, V_draft] (2-D: int8 linears want it)
        tokens: list[int] = []
        dists: list[torch.Tensor] = []
        survive = 1.0
        for row in logits:
            j, conf, probs = pick_token(row, params, generator, need_confidence=d.min_confidence > 0)
            survive *= conf
            if survive < d.min_confidence:
                break
            if probs is not None:
                dists.append(probs)
            tok = d.to_target(j)
            tokens.append(tok)
            if tok in d.stop_ids:
                break
        return Proposal(tokens, d.scatter(torch.stack(dists)) if dists else None)


class MTPDrafter(Drafter):
    """Drafts with an MTP head (ours or a checkpoint's) over the target's hidden states."""

    name = "mtp"
    uses_model = False

    def __init__(self, head: DraftHead, *, target_vocab_size: int, stop_ids=(), min_confidence: float = 0.0, source: str = ""):
        self.head = head.eval()
        self.target_vocab = target_vocab_size
        self.stop_ids = frozenset(stop_ids)
        self.min_confidence = min_confidence
        self.source = source
        self.device = head.parts.embed.weight.device
        self.dtype = head.norm.weight.dtype  # activations (int8 heads keep fp32 norms and activations)
        self.d2t = head.d2t.tolist() if head.d2t is not None else None
        self.parallel = getattr(head, "parallel_tokens", 0)  # P-EAGLE: the most tokens one forward proposes
        if self.parallel:
            with torch.inference_mode():  # the mask positions' hidden input, once (vLLM keeps it in a buffer too)
                self.mask_state = head.mask_state().to(self.dtype)  # [1, 1, d]

    @classmethod
    def from_spec(cls, spec, target, drafter_lm):
        parts = target_parts(target.model)
        if spec.drafter_path:
            head = load_head(spec.drafter_path, parts, tokenizer_fingerprint=target.view.fingerprint, source=target.source)
            source = spec.drafter_path
        else:
            layout, weights = read_mtp_weights(checkpoint_files(target.source), num_layers=parts.num_layers)
            if layout is None:
                raise ConfigError(
                    f"{target.source} has no MTP weights in its checkpoint, so --drafter mtp has no head to load. "
                    f"Train one: vocabbridge train-head --target {spec.target_name} -o heads/NAME, then "
                    f"--drafter mtp:heads/NAME."
                )
            head = head_from_weights(parts, layout, weights, source=target.source).to(target.device)
            source = f"{target.source} ({layout} MTP weights)"
        # int8 weights with one scale per output row (auto on a CPU): one scale per matrix, as the other
        # drafters get, wrecked the least-squares-fitted 1.5B head (code-gen: 4 of 18 first draft tokens
        # accepted); per row it accepts as float32 does (11 of 22 vs 10 of 18) at a quarter of the draft
        # time (10 vs 42 ms a step: the 32k-row lm_head and the MLP are read as int8).
        dtype = drafter_dtype_for(spec.drafter_dtype, str(target.device), "float32")
        if dtype in QUANTIZED:
            head = quantize_int8(head, per_channel=True)
        elif dtype not in ("float32", "fp32"):
            head = head.to(getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}.get(dtype, dtype)))
        roles = target.view.roles
        stops = [roles[r] for r in ("eos", "end_of_turn") if r in roles]
        return cls(head, target_vocab_size=target.vocab_size, stop_ids=stops, min_confidence=spec.min_confidence, source=source)

    @torch.inference_mode()
    def teacher_forced(self, target, tokens: list[int]) -> list[int]:
        """The head's greedy guess for ``tokens[i + 2]`` at every i (target ids), teacher-forced: one
        target forward over ``tokens`` and one head pass over all its pairs (h_i, x_{i+1}), what the
        held-out evaluation scores; in the engine's loop the head drafts the same first tokens."""
        head, dev = self.head, self.device
        _, hidden = target.session().extend(tokens, keep=1, hidden=head.target_features)
        n = len(tokens) - 1
        g = head(
            head.combine(hidden[:n].to(dev, self.dtype))[None],
            torch.tensor([tokens[1:]], device=dev),
            torch.arange(n, device=dev)[None],
            mask=causal_mask(n, 0, device=dev),
        )[0]
        return [self.to_target(j) for j in head.logits(g).argmax(-1).tolist()]

    def to_target(self, j: int) -> int:
        """Draft id → target id."""
        return j if self.d2t is None else self.d2t[j]

    def scatter(self, probs: torch.Tensor) -> torch.Tensor:
        """[n, V_draft] → [n, V_target] (zero outside the draft vocabulary)."""
        out = probs.new_zeros((probs.shape[0], self.target_vocab))
        if self.head.d2t is not None:
            out[:, self.head.d2t.to(probs.device)] = probs
        else:
            n = min(self.target_vocab, probs.shape[-1])
            out[:, :n] = probs[:, :n]
        return out

    def session(self, prompt):
        return _MTPSession(self)

    def describe(self):
        return {
            "name": self.name,
            "head": self.source,
            "arch": self.head.arch,
            "draft_vocab_size": self.head.draft_vocab_size,
            "min_confidence": self.min_confidence,
        } | ({"parallel_tokens": self.parallel} if self.parallel else {})
