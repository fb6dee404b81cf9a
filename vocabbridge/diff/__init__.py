"""Diff two tokenizer views: ``diff_tokenizers`` (data) and ``render`` (table, markdown, JSON)."""

from .compute import TokenizerDiff, diff_tokenizers

__all__ = ["TokenizerDiff", "diff_tokenizers"]
