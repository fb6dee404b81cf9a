"""Tokenizer views: load any BPE tokenizer into one byte-exact, frozen picture."""

from .loaders import PATTERNS, load_tokenizer
from .view import AddedToken, TokenizerView
from .vocabulary import same_vocabulary

__all__ = ["AddedToken", "PATTERNS", "TokenizerView", "load_tokenizer", "same_vocabulary"]
