"""Whether two tokenizers share a vocabulary (the one place this is decided)."""

from __future__ import annotations

from .view import TokenizerView


def same_vocabulary(a: TokenizerView, b: TokenizerView) -> bool:
    """True when every id both tokenizers have stands for the same bytes (one may be longer,
    as a small drafter's vocabulary often is a prefix of its target's)."""
    n = min(a.size, b.size)
    return n > 0 and a.tokens[:n] == b.tokens[:n]
