"""Suffix decoding (SuffixDecoding, Oliaro et al. 2024; Arctic Inference, vLLM's ``method: "suffix"``):
propose what most often followed the end of the context, in this request's prompt and output and
in the outputs of earlier requests.

:class:`SuffixTree` counts every substring of at most ``max_depth`` tokens of its sequences. A
draft matches each suffix of the last ``max_depth`` context tokens but the whole of them (1 …
``max_depth`` - 1 tokens long), follows the most frequent continuation while its estimated
probability (the product of count ratios along the path) stays at or above ``min_prob``, for at
most ``max_spec_factor`` × the match length tokens (and k), and keeps the draft with the highest
score: the sum of its tokens' probabilities, the number of tokens expected to be accepted (ties →
the longer match). Among equally frequent continuations, of those seen once the first seen wins,
of those seen more often the last to reach that count: nearly Arctic Inference's order (its sibling
lists differ in rare ties and after evictions), so the embedded engine and vLLM mostly propose the
same drafts. :func:`find_suffix_draft` is the same rule by brute force. A session drafts from two
trees, its own (prompt + output) and the drafter's (the outputs of the last
``max_cached_requests`` requests, this one's among them as it grows), and takes the better draft
(ties → its own).

Cost: appending a token touches one node per suffix shorter than ``max_depth`` that has occurred
before (the others ride on a "tail": a substring seen once is not stored, only where its one
occurrence lies), so memory grows with the repeated substrings, not with tokens × depth. A draft
walks at most ``max_depth`` nodes per match length: O(max_depth²) dictionary lookups, whatever
the context length.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from ...errors import ConfigError
from .base import Drafter, DraftSession, Proposal


class Draft(NamedTuple):
    tokens: list[int]
    score: float  # Σ of the tokens' estimated probabilities: the expected number accepted


def find_suffix_draft(
    sequences: Sequence[Sequence[int]],
    context: Sequence[int],
    k: int,
    *,
    max_depth: int = 24,
    max_spec_factor: float = 1.0,
    min_prob: float = 0.1,
) -> Draft:
    """The best draft for ``context`` from the substrings of ``sequences`` (oldest first), by brute force.

    A continuation's probability is its count over the match's count (the occurrence at a
    sequence's very end, with nothing after it, counts too).

    >>> find_suffix_draft([[1, 2, 3, 4, 1, 2]], [4, 1, 2], k=4)   # "1 2" twice, once followed by "3 4"
    Draft(tokens=[3, 4], score=1.0)
    >>> find_suffix_draft([[5, 6, 5, 7, 5, 8, 5, 7]], [9, 5], k=4)   # "5" was followed by 6, 7, 8 and 7
    Draft(tokens=[7], score=0.5)
    >>> find_suffix_draft([[5, 6, 5, 7, 5, 8, 5]], [9, 5], k=4)   # each once (1/4): the first seen
    Draft(tokens=[6], score=0.25)
    >>> find_suffix_draft([[5, 6, 5, 7, 5, 8, 5]], [9, 5], k=4, min_prob=0.3).tokens   # 1/4 is too unlikely
    []
    """
    context = context[max(0, len(context) - max_depth) :]
    start = [sum(len(s) for s in sequences[:i]) for i in range(len(sequences))]  # when each was seen, in order

    def occurrences(pattern: list[int]) -> list[int]:  # when each occurrence ended
        n = len(pattern)
        return [t + i + n for seq, t in zip(sequences, start) for i in range(len(seq) - n + 1) if list(seq[i : i + n]) == pattern]

    flat = [t for seq in sequences for t in seq]
    ends = {t + len(seq) for seq, t in zip(sequences, start)}
    best = Draft([], 0.0)
    for m in range(1, len(context)):
        path = list(context[len(context) - m :])
        if not occurrences(path):
            break
        tokens, prob, score = [], 1.0, 0.0
        while len(tokens) < min(k, int(m * max_spec_factor + 1e-6)) and len(path) < max_depth:
            seen = occurrences(path)
            follow: dict[int, list[int]] = {}  # token → when it followed
            for end in seen:
                if end not in ends:
                    follow.setdefault(flat[end], []).append(end)
            if not follow:
                break
            token, times = max(follow.items(), key=lambda kv: (len(kv[1]), kv[1][-1] if len(kv[1]) > 1 else -kv[1][0]))
            prob *= len(times) / len(seen)
            if prob < min_prob:
                break
            tokens.append(token)
            score += prob
            path.append(token)
        if score >= best.score:
            best = Draft(tokens, score)
    return best


# ==== the incremental tree ======================================================================


class SuffixTree:
    """Every substring of at most ``max_depth`` tokens of some sequences, with its count, updated a
    token at a time (:meth:`append`) and a sequence at a time (:meth:`remove`).

    Node ``n`` (0 is the root, the empty string) is a substring that occurred ``count[n]`` times;
    ``kids[n]`` maps a next token to the longer substring's node. A "tail" (``kids[n]`` None)
    occurred once, at ``seqs[seq[n]][pos[n]]``, and so stands for the longer substrings along that
    one occurrence too, without nodes of their own. The fields live in flat arrays: cheap to keep,
    and nothing for the garbage collector to walk. A position is ``(node, off)``: ``off`` tokens
    past ``node`` along its tail (0 at an explicit node). Each sequence keeps the positions of its
    suffixes shorter than ``max_depth``, so appending extends them rather than walking from the root.

    >>> tree = SuffixTree(max_depth=8)
    >>> tree.extend(0, [1, 2, 3, 4, 1, 2])
    >>> tree.count_of([1, 2]), tree.count_of([2, 3, 4]), tree.count_of([4, 2])
    (2, 1, 0)
    >>> tree.draft(tree.ends(0), k=4, max_spec_factor=1.0, min_prob=0.1)
    Draft(tokens=[3, 4], score=1.0)
    """

    def __init__(self, max_depth: int = 24):
        if max_depth < 2:
            raise ConfigError(f"a suffix tree needs max_depth ≥ 2 (one token to match, one to propose), got {max_depth}.")
        self.max_depth = max_depth
        self.seqs: dict[int, list[int]] = {}  # in the order they began
        self.token, self.count = array("q", [-1]), array("q", [0])
        self.stamp = array("q", [0])  # when count last grew
        self.best = array("q", [-1])  # the kid to propose (see the module's docstring); -1: none
        self.seq, self.pos = array("q", [-1]), array("q", [0])  # a tail's one occurrence
        self.kids: list[dict[int, int] | None] = [{}]
        self._free: list[int] = []  # node ids to reuse
        self._open: dict[int, list[tuple[int, int, int]]] = {}  # sequence → (start, node, off) of its short suffixes
        self._clock = 0

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self.seqs

    def start(self, seq_id: int) -> None:
        """Begin an empty sequence."""
        self.seqs.setdefault(seq_id, [])

    def extend(self, seq_id: int, tokens: Sequence[int]) -> None:
        for t in tokens:
            self.append(seq_id, t)

    def append(self, seq_id: int, token: int) -> None:
        """Add ``token`` to the end of sequence ``seq_id`` (begun if new): every suffix ending there
        occurs once more."""
        seq = self.seqs.setdefault(seq_id, [])
        end = len(seq)
        seq.append(token)
        self._clock += 1
        kids, count, best = self.kids, self.count, self.best
        kept = []
        for start, node, off in [*self._open.get(seq_id, ()), (end, 0, 0)]:  # oldest first: see _split
            if off:
                node, off = self._resolve(seq, end, node, off)
            here = kids[node]
            if here is None:  # its own tail: the one occurrence just got longer
                off += 1
            else:  # one more occurrence of node + token (the common case inline: this loop is the cost)
                kid = here.get(token, -1)
                if kid < 0:  # a new tail: the best only when alone (among those seen once, the first seen)
                    kid = here[token] = self._new(token, 1, self._clock, seq_id, end)
                    if best[node] < 0:
                        best[node] = kid
                else:  # among equals seen more often, the last to reach that count
                    if kids[kid] is None:
                        self._split(kid, end + 1 - start)
                    count[kid] += 1
                    self.stamp[kid] = self._clock
                    if count[kid] >= count[best[node]]:
                        best[node] = kid
                node = kid
            if end + 1 - start < self.max_depth:
                kept.append((start, node, off))
        self._open[seq_id] = kept

    def remove(self, seq_id: int) -> None:
        """Forget sequence ``seq_id``: every substring of it occurs once less (nodes left with no
        occurrence are freed)."""
        seq = self.seqs.pop(seq_id)
        self._open.pop(seq_id, None)
        kids, count, stamp, best = self.kids, self.count, self.stamp, self.best
        for start in range(len(seq)):
            node, here = 0, kids[0]
            for token in seq[start : start + self.max_depth]:
                kid = here[token]
                below = kids[kid]  # None: a tail (this occurrence's own), the end of the walk
                count[kid] -= 1
                if not count[kid]:
                    del here[token]
                    kids[kid] = None
                    self._free.append(kid)
                if best[node] == kid:
                    best[node] = max(here.values(), key=lambda n: (count[n], stamp[n] if count[n] > 1 else -stamp[n]), default=-1)
                if below is None:
                    break
                node, here = kid, below

    def count_of(self, pattern: Sequence[int]) -> int:
        """How often ``pattern`` (at most ``max_depth`` tokens) occurs in the sequences."""
        at = self._walk(pattern)
        return 0 if at is None else self.count[at[0]]  # (a tail and what rides on it occurred once)

    # ==== matching and drafting =================================================================

    def match(self, context: Sequence[int]) -> list[tuple[int, int, int]]:
        """``(m, node, off)`` for each suffix of ``context`` of m = 1, 2 … tokens that occurs (m < ``max_depth``
        and m < len(context), as Arctic Inference matches)."""
        out = []
        for m in range(1, min(len(context), self.max_depth)):
            at = self._walk(context[len(context) - m :])
            if at is None:
                break
            out.append((m, *at))
        return out

    def ends(self, seq_id: int) -> list[tuple[int, int, int]]:
        """:meth:`match` of sequence ``seq_id``'s own end, read off its open suffixes (no walk)."""
        seq = self.seqs.get(seq_id, [])
        return [(len(seq) - s, *self._resolve(seq, len(seq), n, o)) for s, n, o in reversed(self._open.get(seq_id, [])) if s]

    def draft(self, matches: list[tuple[int, int, int]], k: int, max_spec_factor: float, min_prob: float) -> Draft:
        """The best-scoring draft over ``matches`` (ascending m, as :meth:`match` gives them; see the
        module's docstring). Longest match first: a draft of n tokens scores at most n, so once the
        best so far reaches a shorter match's token limit, no shorter match can beat it."""
        best = Draft([], 0.0)
        for m, node, off in reversed(matches):
            n = min(k, int(m * max_spec_factor + 1e-6))
            if best.score >= n:
                break
            d = self._follow(node, off, m, n, min_prob)
            if d.score > best.score:
                best = d
        return best

    def _follow(self, node: int, off: int, depth: int, n: int, min_prob: float) -> Draft:
        """Up to ``n`` tokens along the most frequent continuation of ``(node, off)`` at ``depth``."""
        tokens: list[int] = []
        prob, score = 1.0, 0.0
        while len(tokens) < n and depth < self.max_depth:
            if self.kids[node] is None:  # a tail: one occurrence, so what followed it follows with its probability
                seq, j = self.seqs[self.seq[node]], self.pos[node] + off + 1
                if j >= len(seq):
                    break
                token, off = seq[j], off + 1
            else:
                kid = self.best[node]
                if kid < 0:
                    break
                prob *= self.count[kid] / self.count[node]
                if prob < min_prob:
                    break
                token, node = self.token[kid], kid
            tokens.append(token)
            score += prob
            depth += 1
        return Draft(tokens, score)

    # ==== internals =============================================================================

    def _walk(self, pattern: Sequence[int]) -> tuple[int, int] | None:
        """The position of ``pattern`` from the root, None when it does not occur."""
        node, off = 0, 0
        for token in pattern:
            here = self.kids[node]
            if here is None:
                seq, j = self.seqs[self.seq[node]], self.pos[node] + off + 1
                if j >= len(seq) or seq[j] != token:
                    return None
                off += 1
            else:
                node = here.get(token, -1)
                if node < 0:
                    return None
        return node, off

    def _resolve(self, seq: list[int], end: int, node: int, off: int) -> tuple[int, int]:
        """A suffix's position again, after its tail was split by another occurrence (``_split``):
        the last ``off`` tokens before ``end`` lead down from the now explicit node."""
        while off and self.kids[node] is not None:
            node, off = self.kids[node][seq[end - off]], off - 1
        return node, off

    def _split(self, tail: int, depth: int) -> None:
        """A tail seen a second time (``depth`` tokens long) becomes explicit, with a kid for where its
        first occurrence went on (when it did, within ``max_depth``). That occurrence's own open
        suffix, if it has one, finds its way down with :meth:`_resolve`; it was extended earlier in
        the same ``append`` (older suffixes first), so its continuation is already in the sequence."""
        self.kids[tail] = {}
        s, nxt = self.seq[tail], self.pos[tail] + 1
        seq = self.seqs[s]
        if depth < self.max_depth and nxt < len(seq):  # (the kid is older than any that comes later)
            self.kids[tail][seq[nxt]] = self.best[tail] = self._new(seq[nxt], 1, self.stamp[tail], s, nxt)

    def _new(self, token: int, count: int, stamp: int, seq: int, pos: int) -> int:
        """A tail node, its fields set (a freed id when there is one)."""
        fields, values = (self.token, self.count, self.stamp, self.best, self.seq, self.pos), (token, count, stamp, -1, seq, pos)
        if self._free:
            n = self._free.pop()
            for a, v in zip(fields, values):
                a[n] = v
            self.kids[n] = None
        else:
            n = len(self.kids)
            for a, v in zip(fields, values):
                a.append(v)
            self.kids.append(None)
        return n


# ==== the drafter ===============================================================================


class _SuffixSession(DraftSession):
    free = True

    def __init__(self, drafter: SuffixDrafter, prompt: list[int]):
        self.drafter = drafter
        self.own = SuffixTree(drafter.max_depth)  # prompt + output
        self.n_prompt = len(prompt)
        self.slot = drafter._open_slot()  # this request's output in the shared tree (None: no shared tree)

    def _catch_up(self, context: list[int]) -> None:
        """Add the tokens committed since the last call (the context only grows)."""
        done = len(self.own.seqs.get(0, ()))
        self.own.extend(0, context[done:])
        shared = self.drafter.shared
        if self.slot is not None and self.slot in shared:  # (it may have been evicted meanwhile)
            shared.extend(self.slot, context[self.n_prompt + len(shared.seqs[self.slot]) :])

    def warm(self, context: list[int], chunk: int) -> Iterator[None]:
        for end in range(chunk, len(context), chunk):  # a long prompt is indexed between other requests' steps
            self._catch_up(context[:end])
            yield

    def propose(self, context, k, params, generator):
        self._catch_up(context)
        d = self.drafter
        own = self.own.draft(self.own.ends(0), k, d.max_spec_factor, d.min_prob)
        tail = context[max(0, len(context) - d.max_depth) :]
        shared = d.shared.draft(d.shared.match(tail), k, d.max_spec_factor, d.min_prob) if d.shared.seqs else Draft([], 0.0)
        return Proposal((own if own.score >= shared.score else shared).tokens)

    def finish(self, context):
        self._catch_up(context)


class SuffixDrafter(Drafter):
    """``--drafter suffix``: suffix decoding over the request's own tokens and the outputs of the
    last ``max_cached_requests`` requests (0: its own tokens only), as vLLM's ``method: "suffix"``.

    One drafter serves every request of an engine and is not thread-safe: the engine runs its
    requests' steps one at a time.
    """

    name = "suffix"

    def __init__(
        self, *, max_depth: int = 24, max_spec_factor: float = 1.0, min_prob: float = 0.1, max_cached_requests: int = 1000
    ):
        if max_spec_factor < 0 or not 0 <= min_prob <= 1 or max_cached_requests < 0:
            raise ConfigError(
                "suffix decoding needs max_spec_factor ≥ 0, 0 ≤ min_prob ≤ 1 and max_cached_requests ≥ 0, "
                f"got {max_spec_factor}, {min_prob}, {max_cached_requests}."
            )
        self.shared = SuffixTree(max_depth)  # the outputs of recent requests, oldest first
        self.max_depth, self.max_spec_factor, self.min_prob = max_depth, max_spec_factor, min_prob
        self.max_cached_requests = max_cached_requests
        self._next_slot = 0

    @classmethod
    def from_spec(cls, spec, target, drafter_lm):
        return cls(
            max_depth=spec.suffix_max_depth,
            max_spec_factor=spec.suffix_max_spec_factor,
            min_prob=spec.suffix_min_prob,
            max_cached_requests=spec.suffix_max_cached_requests,
        )

    def session(self, prompt):
        return _SuffixSession(self, prompt)

    def _open_slot(self) -> int | None:
        """A new sequence in the shared tree, evicting the oldest beyond ``max_cached_requests`` (FIFO)."""
        if not self.max_cached_requests:
            return None
        slot, self._next_slot = self._next_slot, self._next_slot + 1
        self.shared.start(slot)
        while len(self.shared.seqs) > self.max_cached_requests:
            self.shared.remove(next(iter(self.shared.seqs)))
        return slot

    def describe(self):
        return {
            "name": self.name,
            "max_depth": self.max_depth,
            "max_spec_factor": self.max_spec_factor,
            "min_prob": self.min_prob,
            "max_cached_requests": self.max_cached_requests,
            "cached_requests": len(self.shared.seqs),
        }
