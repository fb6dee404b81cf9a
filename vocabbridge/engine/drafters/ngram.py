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
    free = True

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


# ==== n-gram map (llama.cpp's ngram-map-k) ======================================================


class NgramMap:
    """A hash table from every ``n``-token key seen in the context to the ``m``-token continuations
    that followed it, with how often each did (llama.cpp's ``ngram-map-k``). A proposal is the most
    frequent continuation of the last ``n`` tokens (the most recent among equals), only once it has
    followed that key at least ``min_hits`` times. Unlike prompt lookup, which takes whatever
    followed the last occurrence of the longest matching suffix, a long key and a hit count make
    it propose less and miss less.

    >>> m = NgramMap(n=2, m=2, min_hits=2)
    >>> m.propose([1, 2, 3, 4, 1, 2, 3, 4, 1, 2], k=4)   # "1 2" was followed by "3 4" twice
    [3, 4]
    >>> NgramMap(n=2, m=2, min_hits=3).propose([1, 2, 3, 4, 1, 2, 3, 4, 1, 2], k=4)   # only twice
    []
    """

    def __init__(self, n: int, m: int, min_hits: int = 1):
        if n < 1 or m < 1 or min_hits < 1:
            raise ConfigError(f"ngram-map needs n, value length and min-hits ≥ 1, got {n}, {m}, {min_hits}.")
        self.n, self.m, self.min_hits = n, m, min_hits
        self.table: dict[tuple[int, ...], dict[tuple[int, ...], list[int]]] = {}  # key → value → [hits, last start]
        self.indexed = 0  # occurrences starting before this position are in the table

    def update(self, tokens: Sequence[int]) -> None:
        """Add every occurrence whose continuation is now complete (key and value inside ``tokens``)."""
        n, m = self.n, self.m
        last = len(tokens) - n - m  # the last start with a complete value
        for i in range(self.indexed, last + 1):
            key, value = tuple(tokens[i : i + n]), tuple(tokens[i + n : i + n + m])
            seen = self.table.setdefault(key, {}).setdefault(value, [0, i])
            seen[0] += 1
            seen[1] = i
        self.indexed = max(self.indexed, last + 1)

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        self.update(tokens)
        if len(tokens) < self.n:
            return []
        values = self.table.get(tuple(tokens[len(tokens) - self.n :]))
        if not values:
            return []
        value, (hits, _) = max(values.items(), key=lambda kv: (kv[1][0], kv[1][1]))
        return list(value[:k]) if hits >= self.min_hits else []


class _NgramMapSession(DraftSession):
    free = True

    def __init__(self, n: int, m: int, min_hits: int):
        self.map = NgramMap(n, m, min_hits)

    def propose(self, context, k, params, generator):
        return Proposal(self.map.propose(context, k))


class NgramMapDrafter(Drafter):
    """``--drafter ngram-map``: :class:`NgramMap` over prompt + output, per request."""

    name = "ngram-map"

    def __init__(self, *, n: int = 12, m: int = 8, min_hits: int = 1):
        NgramMap(n, m, min_hits)  # checks the settings
        self.n, self.m, self.min_hits = n, m, min_hits

    @classmethod
    def from_spec(cls, spec, target, drafter_lm):
        return cls(n=spec.ngram_map_n, m=spec.ngram_map_value, min_hits=spec.ngram_map_min_hits)

    def session(self, prompt):
        return _NgramMapSession(self.n, self.m, self.min_hits)

    def describe(self):
        return {"name": self.name, "n": self.n, "value_length": self.m, "min_hits": self.min_hits}
