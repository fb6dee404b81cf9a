"""Text-level drafting (in the spirit of SLEM, Timor et al., ICML 2025): the drafter reads the
context as *text* in its own tokenization, drafts text, and the drafted bytes are re-tokenized by
the target tokenizer (its normalizer included); the target tokens that are certain are proposed.

Token-boundary effects, and why the result stays lossless:

- the committed target tokens are never re-tokenized; drafts are proposals, and the target's
  verification decides (greedy: exact match with its own argmax), so the output equals plain
  decoding whatever this module proposes;
- to propose what the target would *naturally* produce, the drafted bytes are tokenized together
  with the last committed tokens' bytes; when that tokenization starts with exactly those
  committed tokens, what follows is the natural continuation;
- the last target token of the draft is dropped (the drafter may have stopped mid-word, and a
  longer word would tokenize differently), unless the drafter ended its turn, in which case the
  target's own end-of-turn token is proposed;
- bytes that end inside a UTF-8 character wait for the next step.

Drafting is greedy in both decoding modes: the proposal is deterministic, so verification uses a
one-hot q (acceptance probability p(x)), which keeps sampling exact.
"""

from __future__ import annotations

import math

from ...tokenizer.view import TokenizerView
from ..model import CausalLM
from ..sampling import SamplingParams
from .base import Drafter, Proposal
from .model_based import ModelDraftSession

_GREEDY = SamplingParams(temperature=0.0)


def utf8_complete_prefix(b: bytes) -> int:
    """Length of the longest prefix of ``b`` that does not end inside a UTF-8 character.

    >>> utf8_complete_prefix("안녕".encode()[:4])
    3
    """
    n = len(b)
    for back in range(1, min(4, n) + 1):
        c = b[n - back]
        if c < 0x80:  # ASCII: complete
            return n
        if c >= 0xC0:  # a lead byte: complete iff its sequence fits
            need = 2 if c < 0xE0 else 3 if c < 0xF0 else 4
            return n if back >= need else n - back
    return n


def encode_bytes(view: TokenizerView, b: bytes) -> list[int]:
    """Token ids for arbitrary bytes: the text encoded normally, undecodable bytes as byte tokens."""
    out: list[int] = []
    while b:
        try:
            out += view.encode(b.decode("utf-8"))
            break
        except UnicodeDecodeError as e:
            if e.start:
                out += view.encode(b[: e.start].decode("utf-8"))
            bad = b[e.start : e.end or e.start + 1]
            for byte in bad:
                tid = view.id_of(bytes([byte]))
                if tid is not None:
                    out.append(tid)
            b = b[e.start + len(bad) :]
    return out


class _TextSession(ModelDraftSession):
    def __init__(self, d: TextDrafter, **kw):
        super().__init__(d.lm, **kw)
        self.d = d
        self.stable: list[int] = []  # drafter ids for context[:stable_upto] (up to the last special)
        self.stable_upto = 0
        self.n_context = self.n_drafter = 0

    def drafter_context(self, context: list[int]) -> list[int]:
        d, special = self.d, self.d.target_added
        last = next((j for j in range(len(context) - 1, self.stable_upto - 1, -1) if context[j] in special), -1)
        if last >= self.stable_upto:  # close segments up to and including the last special token
            start = self.stable_upto
            for j in range(start, last + 1):
                if context[j] in special:
                    if j > start:
                        self.stable += encode_bytes(d.lm.view, d.target.decode_bytes(context[start:j]))
                    self.stable += d.special_to_drafter(context[j])
                    start = j + 1
            self.stable_upto = last + 1
        tail = encode_bytes(d.lm.view, d.target.decode_bytes(context[self.stable_upto :]))
        self.n_drafter = len(self.stable) + len(tail)
        return self.stable + tail

    def drafter_steps(self, k: int) -> int:
        """Drafter tokens to draft for k target tokens (+1: the last target token is dropped),
        from the two tokenizers' token counts on this very conversation."""
        ratio = self.n_drafter / max(1, self.n_context) if self.n_context > 32 else self.d.ratio
        return max(k + 1, min(3 * k + 1, math.ceil((k + 1) * ratio)))

    def propose(self, context, k, params, generator):
        d = self.d
        self.n_context = len(context)
        logits = self._feed(context, k)
        ids, _ = self.draft_loop(logits, self.drafter_steps(k), _GREEDY, None)
        ended = bool(ids) and ids[-1] in self.stop_ids
        body = ids[:-1] if ended else ids
        cut = next((i for i, t in enumerate(body) if t in d.drafter_added), len(body))
        if cut < len(body):  # the drafter emitted another special token: draft text up to it only
            body, ended = body[:cut], False
        return Proposal(d.retokenize(context, d.lm.view.decode_bytes(body), ended=ended)[:k])


class TextDrafter(Drafter):
    name = "text"
    uses_model = True

    def __init__(self, lm: CausalLM, target: TokenizerView, *, target_vocab_size: int, min_confidence: float = 0.0):
        self.lm = lm
        self.target = target
        self.target_vocab = target_vocab_size
        self.min_confidence = min_confidence
        self.target_added = frozenset(a.id for a in target.added)
        self.drafter_added = frozenset(a.id for a in lm.view.added)
        self.target_end = next((target.roles[r] for r in ("end_of_turn", "eos") if r in target.roles), None)
        self._special_cache: dict[int, list[int]] = {}
        # Drafter tokens per target token on a mixed sample, until a conversation gives its own ratio.
        sample = "The quick brown fox jumps over the lazy dog. 안녕하세요, 반갑습니다. def f(x): return x + 1\n"
        self.ratio = max(1.0, len(lm.view.encode(sample)) / max(1, len(target.encode(sample))))

    def special_to_drafter(self, target_id: int) -> list[int]:
        """A target special token in drafter ids: same role, else same text, else its text encoded."""
        if target_id not in self._special_cache:
            dv, tv = self.lm.view, self.target
            ids = None
            for role in tv.role_of(target_id):
                if role in dv.roles:
                    ids = [dv.roles[role]]
                    break
            if ids is None:
                content = tv.tokens[target_id] or b""
                same = next((a.id for a in dv.added if a.content.encode() == content), None)
                ids = [same] if same is not None else encode_bytes(dv, content)
            self._special_cache[target_id] = ids
        return self._special_cache[target_id]

    def retokenize(self, context: list[int], draft: bytes, *, ended: bool) -> list[int]:
        """Target ids for drafted bytes following ``context`` (see the module docstring)."""
        tv = self.target
        tail_n = 0
        while tail_n < 2 and tail_n < len(context) and context[-1 - tail_n] not in self.target_added:
            tail_n += 1
        tail = context[len(context) - tail_n :] if tail_n else []
        tail_bytes = tv.decode_bytes(tail)
        joined = tail_bytes + draft
        joined = joined[: utf8_complete_prefix(joined)]
        try:
            ids = tv.encode(joined.decode("utf-8"))
        except UnicodeDecodeError:  # the tail starts inside a character: tokenize the draft alone
            ids, tail = None, []
        if ids is not None and ids[: len(tail)] == tail:
            new = ids[len(tail) :]
        else:
            d = draft[: utf8_complete_prefix(draft)]
            new = tv.encode(d.decode("utf-8", errors="ignore")) if d else []
        if ended and self.target_end is not None:
            return new + [self.target_end]
        return new[:-1]

    @classmethod
    def from_spec(cls, spec, target, drafter_lm):
        return cls(drafter_lm, target.view, target_vocab_size=target.vocab_size, min_confidence=spec.min_confidence)

    def session(self, prompt):
        return _TextSession(self, min_confidence=self.min_confidence)

    def describe(self):
        return {
            "name": self.name,
            "model": self.lm.source,
            "drafter_tokens_per_target_token": round(self.ratio, 3),
            "min_confidence": self.min_confidence,
        }
