"""Prompt lookup (n-gram) drafting: if the last n tokens occurred before, propose what followed.

The matching rule is a pure function, :func:`find_ngram_proposal`; the session keeps an
incremental index so each step costs O(max_n), not O(context), and gives the same answers.
Like vLLM's ``prompt_lookup_min`` / ``prompt_lookup_max``: the longest n in [min_n, max_n] that
matches wins; among earlier occurrences of that n-gram the most recent one is used.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import ConfigError
from .base import Drafter, DraftSession, Proposal


def find_ngram_proposal(tokens: Sequence[int], k: int, min_n: int = 1, max_n: int = 4) -> list[int]:
    """Tokens that followed the most recent earlier occurrence of the longest matching suffix.

    >>> find_ngram_proposal([1, 2, 3, 4, 1, 2], k=2, min_n=1, max_n=3)   # "1 2" seen before, "3 4" followed
    [3, 4]
    >>> find_ngram_proposal([5, 6, 7], k=2)   # no earlier occurrence of any suffix
    []
    """
    L = len(tokens)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        pattern = list(tokens[L - n :])
        for end in range(L - 1, n - 1, -1):  # occurrences ending before the suffix's own end
            if list(tokens[end - n : end]) == pattern:
                return list(tokens[end : end + k])
    return []


class NgramIndex:
    """Incremental index: n-gram → end position of its most recent occurrence (for each n)."""

    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        self.last: dict[tuple[int, ...], int] = {}
        self.indexed = 0  # n-grams ending at positions ≤ indexed are in ``last``

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        L = len(tokens)
        # Index every n-gram that ends before the current end (ends 1 .. L-1).
        for end in range(max(self.indexed + 1, 1), L):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self.last[tuple(tokens[end - n : end])] = end
        self.indexed = max(self.indexed, L - 1)
        for n in range(min(self.max_n, L - 1), self.min_n - 1, -1):
            end = self.last.get(tuple(tokens[L - n :]))
            if end is not None:
                return list(tokens[end : end + k])
        return []


class _NgramSession(DraftSession):
    def __init__(self, min_n: int, max_n: int):
        self.index = NgramIndex(min_n, max_n)

    def propose(self, context, k, params, generator):
        return Proposal(self.index.propose(context, k))


class NgramDrafter(Drafter):
    name = "ngram"

    def __init__(self, *, prompt_lookup_min: int = 1, prompt_lookup_max: int = 4):
        if not 1 <= prompt_lookup_min <= prompt_lookup_max:
            raise ConfigError(f"need 1 ≤ prompt_lookup_min ≤ prompt_lookup_max, got {prompt_lookup_min}, {prompt_lookup_max}.")
        self.min_n, self.max_n = prompt_lookup_min, prompt_lookup_max

    @classmethod
    def from_spec(cls, spec, target, drafter_lm):
        return cls(prompt_lookup_min=spec.prompt_lookup_min, prompt_lookup_max=spec.prompt_lookup_max)

    def session(self, prompt):
        return _NgramSession(self.min_n, self.max_n)

    def describe(self):
        return {"name": self.name, "prompt_lookup_min": self.min_n, "prompt_lookup_max": self.max_n}
