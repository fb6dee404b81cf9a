"""The normalizer and pre-tokenizer of a tokenizer: described, their regexes verbatim, and runnable.

The specs are the ``tokenizer.json`` objects; they run through the ``tokenizers`` library itself
(a tokenizer with an empty model and only these two stages), so behaviour is the real thing,
not a re-implementation.

>>> describe_pre_tokenizer({"type": "ByteLevel", "add_prefix_space": False, "use_regex": True})
['ByteLevel(add_prefix_space=False, use_regex=True)']
>>> pre_tokenizer_regexes({"type": "Split", "pattern": {"Regex": "\\\\p{N}"}, "behavior": "Isolated"})
['\\\\p{N}']
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from tokenizers import Tokenizer

from .encoding import byte_level_decode

# What ``ByteLevel(use_regex=True)`` splits on (GPT-2's pattern, built into the tokenizers crate).
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

_SKIP_KEYS = {"type", "pretokenizers", "normalizers", "pattern"}


def _children(spec: dict, key: str) -> list[dict]:
    return [c for c in (spec.get(key) or []) if isinstance(c, dict)]


def _flatten(spec: dict | None, key: str) -> list[dict]:
    if not spec:
        return []
    if spec.get("type") == "Sequence":
        return [leaf for c in _children(spec, key) for leaf in _flatten(c, key)]
    return [spec]


def _pattern_text(p: Any) -> str:
    if isinstance(p, dict):
        if "Regex" in p:
            return p["Regex"]
        if "String" in p:
            return p["String"]
    return str(p)


def _describe(leaf: dict, *, full_patterns: bool = True) -> str:
    args = []
    if "pattern" in leaf:
        kind = "regex" if isinstance(leaf["pattern"], dict) and "Regex" in leaf["pattern"] else "string"
        text = _pattern_text(leaf["pattern"])
        args.append(f"{kind}={text!r}" if full_patterns or len(text) <= 24 else f"{kind}=<{len(text)} chars, below>")
    args += [f"{k}={v!r}" for k, v in leaf.items() if k not in _SKIP_KEYS and k != "trim_offsets"]
    return f"{leaf.get('type')}({', '.join(args)})"


def describe_pre_tokenizer(spec: dict | None, *, full_patterns: bool = True) -> list[str]:
    """One line per stage, in order; ``[]`` for no pre-tokenizer."""
    return [_describe(leaf, full_patterns=full_patterns) for leaf in _flatten(spec, "pretokenizers")]


def describe_normalizer(spec: dict | None) -> list[str]:
    """One line per stage, in order; ``[]`` for no normalizer."""
    return [_describe(leaf) for leaf in _flatten(spec, "normalizers")]


def pre_tokenizer_regexes(spec: dict | None) -> list[str]:
    """Every regex the pre-tokenizer splits on, verbatim, in order (GPT-2's for ByteLevel+regex)."""
    out = []
    for leaf in _flatten(spec, "pretokenizers"):
        if leaf.get("type") == "Split" and "pattern" in leaf:
            out.append(_pattern_text(leaf["pattern"]))
        elif leaf.get("type") == "ByteLevel" and leaf.get("use_regex", True):
            out.append(GPT2_PATTERN)
    return out


def normalizer_forms(spec: dict | None) -> list[str]:
    """Unicode normal forms applied (``['NFC']`` for Qwen3, ``[]`` for GPT-2)."""
    return [leaf["type"] for leaf in _flatten(spec, "normalizers") if leaf.get("type") in ("NFC", "NFD", "NFKC", "NFKD")]


def is_byte_level(spec: dict | None) -> bool:
    return any(leaf.get("type") == "ByteLevel" for leaf in _flatten(spec, "pretokenizers"))


@lru_cache(maxsize=64)
def _stages(normalizer_json: str, pre_tokenizer_json: str):

    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": json.loads(normalizer_json),
        "pre_tokenizer": json.loads(pre_tokenizer_json),
        "post_processor": None,
        "decoder": None,
        "model": {"type": "BPE", "vocab": {}, "merges": []},
    }
    return Tokenizer.from_str(json.dumps(doc))


class Pipeline:
    """Runs a normalizer + pre-tokenizer pair from their tokenizer.json specs.

    >>> p = Pipeline({"type": "NFC"}, {"type": "Whitespace"})
    >>> p.split("a b")
    ['a', 'b']
    """

    def __init__(self, normalizer: dict | None, pre_tokenizer: dict | None):
        self.normalizer_spec = normalizer
        self.pre_tokenizer_spec = pre_tokenizer
        self._tok = _stages(json.dumps(normalizer, sort_keys=True), json.dumps(pre_tokenizer, sort_keys=True))
        self._byte_level = is_byte_level(pre_tokenizer)

    def normalize(self, text: str) -> str:
        n = self._tok.normalizer
        return n.normalize_str(text) if n is not None else text

    def split(self, text: str) -> list[str]:
        """Normalize, then pre-tokenize; pieces are shown as text (byte-level aliases decoded)."""
        text = self.normalize(text)
        pt = self._tok.pre_tokenizer
        if pt is None:
            return [text] if text else []
        pieces = [p for p, _ in pt.pre_tokenize_str(text)]
        if self._byte_level:
            pieces = [(byte_level_decode(p) or p.encode()).decode("utf-8", errors="replace") for p in pieces]
        return pieces
