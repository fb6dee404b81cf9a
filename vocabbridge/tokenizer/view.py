"""TokenizerView: the one frozen picture of a BPE tokenizer that every other module reads.

For every id its raw bytes, the added/special tokens with their roles, the merges as byte
pairs, the normalizer and pre-tokenizer (specs verbatim, regexes, a runnable pipeline), the
model type, where it came from, and a fingerprint of the content (not of the path).

>>> from vocabbridge.tokenizer.view import view_from_doc
>>> doc = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]},
...        "pre_tokenizer": None, "normalizer": None, "decoder": None, "added_tokens": []}
>>> v = view_from_doc(doc, source="inline")
>>> v.tokens, v.merges
((b'a', b'b', b'ab'), ((b'a', b'b'),))
"""

from __future__ import annotations

import hashlib
import json
from array import array
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from tokenizers import Tokenizer

from ..errors import UnsupportedTokenizerError
from .encoding import BYTE_LEVEL, RAW, SENTENCEPIECE, SPM_SPACE, decode_many
from .pipeline import Pipeline, describe_normalizer, describe_pre_tokenizer, pre_tokenizer_regexes
from .roles import Roles, detect_roles


@dataclass(frozen=True)
class AddedToken:
    """A token added on top of the BPE model (specials, chat markers, tool tags...)."""

    id: int
    content: str
    special: bool  # skipped when decoding with skip_special_tokens
    roles: tuple[str, ...] = ()


@dataclass(frozen=True, eq=False)
class TokenizerView:
    source: str  # what the user passed: a path, a hub id, a GGUF file...
    format: str  # tokenizer.json | hf-slow | gguf | tiktoken | hub:<format>
    model_type: str  # BPE
    encoding: str  # byte_level | sentencepiece | raw (see encoding.py)
    tokens: tuple[bytes | None, ...]  # id → raw bytes; None for ids nobody uses
    base_size: int  # entries of the BPE model's vocabulary that are not added tokens
    added: tuple[AddedToken, ...]
    roles: dict[str, int]  # role → id (bos, eos, end_of_turn, role:user, ...)
    role_evidence: dict[str, str]  # role → config | chat_template | name
    merges: tuple[tuple[bytes, bytes], ...]
    normalizer: dict | None  # tokenizer.json spec, verbatim
    pre_tokenizer: dict | None  # tokenizer.json spec, verbatim
    byte_fallback: bool
    chat_template: str | None
    model_vocab_size: int | None  # rows of the model's embedding, when known (config.json, GGUF)
    fingerprint: str
    doc_json: str = field(repr=False)  # the tokenizer.json this view was read from (for encode)

    # ==== identity ===================================================================

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TokenizerView) and other.fingerprint == self.fingerprint

    def __hash__(self) -> int:
        return hash(self.fingerprint)

    def __repr__(self) -> str:
        return (
            f"TokenizerView({self.source!r}, {self.model_type}/{self.encoding}, {self.size} ids, "
            f"{len(self.added)} added, fingerprint={self.fingerprint[:12]})"
        )

    # ==== vocabulary =================================================================

    @property
    def size(self) -> int:
        """Number of ids (max id + 1), holes included."""
        return len(self.tokens)

    @cached_property
    def added_ids(self) -> frozenset[int]:
        return frozenset(a.id for a in self.added)

    @cached_property
    def special_ids(self) -> frozenset[int]:
        return frozenset(a.id for a in self.added if a.special)

    @cached_property
    def base_ids(self) -> tuple[int, ...]:
        """Ids of the BPE model's own tokens (added tokens excluded)."""
        added = self.added_ids
        return tuple(i for i, b in enumerate(self.tokens) if b is not None and i not in added)

    @cached_property
    def ids_by_bytes(self) -> dict[bytes, tuple[int, ...]]:
        """bytes → every id with those bytes, ascending (byte-fallback pieces can duplicate)."""
        out: dict[bytes, list[int]] = {}
        for i, b in enumerate(self.tokens):
            if b is not None:
                out.setdefault(b, []).append(i)
        return {b: tuple(v) for b, v in out.items()}

    def id_of(self, b: bytes, *, base_only: bool = True) -> int | None:
        """The lowest id whose bytes are ``b`` (base tokens only, by default)."""
        for i in self.ids_by_bytes.get(b, ()):
            if not base_only or i not in self.added_ids:
                return i
        return None

    def role_of(self, token_id: int) -> tuple[str, ...]:
        return tuple(r for r, i in self.roles.items() if i == token_id)

    # ==== behaviour ==================================================================

    @cached_property
    def pipeline(self) -> Pipeline:
        return Pipeline(self.normalizer, self.pre_tokenizer)

    @property
    def pre_tokenizer_regexes(self) -> list[str]:
        return pre_tokenizer_regexes(self.pre_tokenizer)

    def describe(self, *, full_patterns: bool = True) -> dict[str, list[str]]:
        """One line per normalizer / pre-tokenizer stage (long regexes elided unless ``full_patterns``)."""
        return {
            "normalizer": describe_normalizer(self.normalizer),
            "pre_tokenizer": describe_pre_tokenizer(self.pre_tokenizer, full_patterns=full_patterns),
        }

    def normalize(self, text: str) -> str:
        return self.pipeline.normalize(text)

    def split(self, text: str) -> list[str]:
        """The pre-tokenizer's pieces of ``text`` (after normalization), as text."""
        return self.pipeline.split(text)

    @cached_property
    def backend(self):
        """The full ``tokenizers.Tokenizer`` (built on first use: it costs a few hundred ms)."""

        return Tokenizer.from_str(self.doc_json)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (added tokens recognised, no bos/eos added)."""
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=False)]

    def decode_bytes(self, ids) -> bytes:
        """The exact bytes of a token sequence (no cleanup, no space stripping)."""
        toks = self.tokens
        return b"".join(toks[i] or b"" for i in ids)


# ==== building a view from tokenizer.json =================================================


def _leaves(spec: dict | None, key: str) -> list[dict]:
    if not spec:
        return []
    if spec.get("type") == "Sequence":
        return [leaf for c in spec.get(key) or [] if isinstance(c, dict) for leaf in _leaves(c, key)]
    return [spec]


def detect_encoding(doc: dict) -> str:
    """byte_level | sentencepiece | raw, read off the pre-tokenizer, decoder and normalizer."""
    pre = _leaves(doc.get("pre_tokenizer"), "pretokenizers")
    dec = _leaves(doc.get("decoder"), "decoders")
    norm = _leaves(doc.get("normalizer"), "normalizers")
    if any(x.get("type") == "ByteLevel" for x in pre + dec):
        return BYTE_LEVEL
    spm = any(x.get("type") == "Metaspace" for x in pre + dec)
    spm |= any(x.get("type") in ("Replace", "Prepend") and SPM_SPACE in json.dumps(x, ensure_ascii=False) for x in dec + norm)
    spm |= bool(doc.get("model", {}).get("byte_fallback"))
    return SENTENCEPIECE if spm else RAW


def _merge_pair(m: Any) -> tuple[str, str]:
    if isinstance(m, str):
        a, _, b = m.partition(" ")
        return a, b
    return m[0], m[1]


def fingerprint_of(
    *, model_type: str, encoding: str, tokens, added, merges, normalizer, pre_tokenizer, byte_fallback: bool
) -> str:
    """sha256 of the canonical content: bytes per id, added tokens, merges, normalizer, pre-tokenizer."""
    h = hashlib.sha256()
    h.update(f"vocabbridge-view/1|{model_type}|{encoding}|{byte_fallback}|{len(tokens)}".encode())
    # Lengths then contents: unambiguous, and each a single C-level join.
    h.update(array("i", [-1 if t is None else len(t) for t in tokens]).tobytes())
    h.update(b"".join(t for t in tokens if t is not None))
    h.update(json.dumps([[a.id, a.content, a.special] for a in added], ensure_ascii=False).encode())
    h.update(array("i", [len(x) for pair in merges for x in pair]).tobytes())
    h.update(b"".join(x for pair in merges for x in pair))
    h.update(json.dumps([normalizer, pre_tokenizer], sort_keys=True, ensure_ascii=False).encode())
    return h.hexdigest()


def view_from_doc(
    doc: dict,
    *,
    source: str,
    fmt: str = "tokenizer.json",
    config: dict | None = None,
    chat_template: str | None = None,
    config_ids: dict[str, int] | None = None,
    model_vocab_size: int | None = None,
    doc_json: str | None = None,
) -> TokenizerView:
    """Build a view from a parsed ``tokenizer.json`` (plus tokenizer_config-like ``config``)."""
    model = doc.get("model") or {}
    model_type = model.get("type") or ("BPE" if "merges" in model else None)
    if model_type != "BPE":
        raise UnsupportedTokenizerError(
            f"{source}: the tokenizer model is {model_type or 'unknown'}, not BPE. vocabbridge reads byte-level "
            "and SentencePiece-style BPE tokenizers (GPT-2, Llama, Qwen, EXAONE, DeepSeek families); "
            "WordPiece and Unigram vocabularies have no merges to compare or bytes to map. "
            "Pass the BPE tokenizer of the model instead."
        )
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise UnsupportedTokenizerError(
            f"{source}: BPE with a continuing-subword prefix or end-of-word suffix "
            f"({model.get('continuing_subword_prefix')!r}/{model.get('end_of_word_suffix')!r}) is not supported; "
            "its tokens' bytes depend on position. Use a byte-level or SentencePiece-style BPE tokenizer."
        )
    encoding = detect_encoding(doc)
    byte_fallback = bool(model.get("byte_fallback"))
    vocab: dict[str, int] = model.get("vocab") or {}
    added_raw = doc.get("added_tokens") or []
    n = max([*vocab.values(), *(a["id"] for a in added_raw), -1]) + 1
    tokens: list[bytes | None] = [None] * n
    for i, b in zip(vocab.values(), decode_many(list(vocab), encoding, byte_fallback=byte_fallback)):
        tokens[i] = b
    for a in added_raw:
        tokens[a["id"]] = a["content"].encode("utf-8")
    added_ids = {a["id"] for a in added_raw}
    base_size = sum(1 for i in vocab.values() if i not in added_ids)
    pairs = [_merge_pair(m) for m in model.get("merges") or []]
    lefts = decode_many([a for a, _ in pairs], encoding, byte_fallback=byte_fallback)
    rights = decode_many([b for _, b in pairs], encoding, byte_fallback=byte_fallback)
    merges = tuple(zip(lefts, rights))
    config = config or {}
    template = chat_template if chat_template is not None else config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    roles: Roles = detect_roles(
        [(a["id"], a["content"]) for a in added_raw], config=config, chat_template=template, config_ids=config_ids
    )
    added = tuple(
        AddedToken(a["id"], a["content"], bool(a.get("special", False)), tuple(r for r, i in roles.ids.items() if i == a["id"]))
        for a in sorted(added_raw, key=lambda a: a["id"])
    )
    normalizer, pre_tokenizer = doc.get("normalizer"), doc.get("pre_tokenizer")
    fp = fingerprint_of(
        model_type=model_type,
        encoding=encoding,
        tokens=tokens,
        added=added,
        merges=merges,
        normalizer=normalizer,
        pre_tokenizer=pre_tokenizer,
        byte_fallback=byte_fallback,
    )
    return TokenizerView(
        source=source,
        format=fmt,
        model_type=model_type,
        encoding=encoding,
        tokens=tuple(tokens),
        base_size=base_size,
        added=added,
        roles=dict(roles.ids),
        role_evidence=dict(roles.evidence),
        merges=merges,
        normalizer=normalizer,
        pre_tokenizer=pre_tokenizer,
        byte_fallback=byte_fallback,
        chat_template=template,
        model_vocab_size=model_vocab_size,
        fingerprint=fp,
        doc_json=doc_json if doc_json is not None else json.dumps(doc, ensure_ascii=False),
    )
