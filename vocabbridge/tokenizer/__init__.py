"""Tokenizer views: load any BPE tokenizer into one byte-exact, frozen picture."""

from .loaders import PATTERNS, load_tokenizer
from .view import AddedToken, TokenizerView

__all__ = ["AddedToken", "PATTERNS", "TokenizerView", "load_tokenizer"]
