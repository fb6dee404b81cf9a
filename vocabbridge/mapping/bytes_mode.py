"""The ``bytes`` map: pair tokens by what they *are* (raw bytes, roles), not by how they are spelled.

Rules, in order:

1. **Special tokens by role.** For each role both tokenizers know, most useful first
   (:data:`ROLE_PRIORITY`: end-of-turn and the chat markers, then eos and bos), the two ids pair
   up unless either is already taken. So ``[|endofturn|]`` (EXAONE 4.0, 361) pairs with
   ``<|endofturn|>`` (EXAONE 4.5, 53) although the strings differ.
2. **Other added tokens by content.** Added tokens with identical content on both sides pair up
   when neither is taken (``<|endoftext|>`` ↔ ``<|endoftext|>`` whatever its role on each side).
   Then the weak roles, unk and pad (often aliases of another token), pair the same way as rule 1,
   so a pad that reuses eos never steals eos's partner.
3. **Everything else by raw bytes.** Special added tokens never pair by bytes (only by rules 1-2).
   A byte-level ``Ġ안`` and a SentencePiece ``▁안`` are the same bytes ``b" \\xec\\x95\\x88"``
   and pair up. Ids at or beyond a side's model vocabulary size take no part.
4. **The target's normalizer decides.** A drafter token whose text the target's Unicode
   normalization would rewrite (NFD Hangul under an NFC target) is not a partner: the target never
   produces those bytes from text. Partial UTF-8 fragments are not text and are kept. Only the
   Unicode stages (NFC, NFD, NFKC, NFKD, Lowercase) are applied; SentencePiece's Replace/Prepend
   stages are already reflected in the view's bytes.
5. **Deterministic choice** where several ids of one side share bytes (``A`` and its byte-fallback
   piece ``<0x41>``, an added token spelling a base token): the *canonical* id is the lowest id
   that is not a byte-fallback piece, else the piece. Every target id with those bytes maps to the
   drafter's canonical id; every drafter id with those bytes maps to the target's canonical id.
   Hence ``draft_to_target[target_to_draft[t]] == t`` for canonical target ids, and the bytes agree
   for the others.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from itertools import repeat

import numpy as np

from ..tokenizer.pipeline import _flatten
from ..tokenizer.roles import ROLE_ORDER
from ..tokenizer.view import TokenizerView
from .tokenmap import BuildStats

try:  # current Unicode tables, closer to the tokenizers crate's than an older Python's
    import unicodedata2 as _ud
except ImportError:  # pragma: no cover - a declared dependency
    _ud = unicodedata

SPECIAL_TOKEN_ROLES = ("bos", "eos", "pad", "unk")
# The chat-structure roles first (in ROLE_ORDER's order), then eos and bos, then the weak ones.
ROLE_PRIORITY = (*(r for r in ROLE_ORDER if r not in SPECIAL_TOKEN_ROLES), "eos", "bos", "unk", "pad")
WEAK_ROLES = ("unk", "pad")  # paired after exact-content matches (rule 2)

_PIECE = re.compile(r'"<0x([0-9A-Fa-f]{2})>"\s*:\s*(\d+)')


def byte_fallback_pieces(view: TokenizerView) -> dict[int, bytes]:
    """id → byte of the ``<0xNN>`` pieces of a byte-fallback vocabulary (``{}`` otherwise).

    Read off the tokenizer.json text (``"<0x41>": 68`` entries) and checked against the view's bytes.
    """
    if not view.byte_fallback:
        return {}
    out = {}
    for m in _PIECE.finditer(view.doc_json):
        i, b = int(m.group(2)), bytes([int(m.group(1), 16)])
        if i < view.size and view.tokens[i] == b:
            out[i] = b
    return out


def unicode_normalizer(spec: dict | None) -> Callable[[str], str] | None:
    """The Unicode stages of a normalizer spec as one function (None when it has none)."""
    stages = []
    for leaf in _flatten(spec, "normalizers"):
        kind = leaf.get("type")
        if kind in ("NFC", "NFD", "NFKC", "NFKD"):
            stages.append(lambda s, form=kind: _ud.normalize(form, s))
        elif kind == "Lowercase":
            stages.append(str.lower)
    if not stages:
        return None

    def run(s: str) -> str:
        for f in stages:
            s = f(s)
        return s

    run.lowercases = any(s is str.lower for s in stages)  # type: ignore[attr-defined]
    return run


def _keeps(normalize: Callable[[str], str], b: bytes) -> bool:
    """True when ``normalize`` leaves the token's text as it is (fragments: always)."""
    try:
        s = b.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return normalize(s) == s


def _canonical(view: TokenizerView, excluded: set[int], size: int, pieces: dict[int, bytes]) -> tuple[dict, np.ndarray]:
    """bytes → canonical id over the ids that may pair, and the ids that may pair but are not canonical."""
    toks = list(view.tokens[:size])
    for i in excluded:
        if i < len(toks):
            toks[i] = None
    for i in pieces:
        if i < len(toks):
            toks[i] = None
    # Later writes win, so walking ids downwards leaves the lowest id for each byte string.
    canon = dict(zip(reversed(toks), range(len(toks) - 1, -1, -1)))
    canon.pop(None, None)
    canon.pop(b"", None)
    eligible = np.fromiter(map(bool, toks), dtype=bool, count=len(toks))
    for i, b in sorted(pieces.items()):
        if i < len(toks) and i not in excluded:
            canon.setdefault(b, i)
            eligible[i] = True
    if int(eligible.sum()) == len(canon):
        return canon, np.empty(0, dtype=np.int64)
    eligible[np.fromiter(canon.values(), dtype=np.int64, count=len(canon))] = False
    return canon, np.flatnonzero(eligible)


def special_pairs(drafter: TokenizerView, target: TokenizerView, *, drafter_size: int, target_size: int):
    """Rules 1-2: [(target id, drafter id)], the role-pair count and the content-pair count."""
    pairs: list[tuple[int, int]] = []
    used_t: set[int] = set()
    used_d: set[int] = set()

    def take(t: int | None, d: int | None) -> bool:
        if t is None or d is None or t in used_t or d in used_d or t >= target_size or d >= drafter_size:
            return False
        pairs.append((t, d))
        used_t.add(t)
        used_d.add(d)
        return True

    n_roles = sum(take(target.roles.get(r), drafter.roles.get(r)) for r in ROLE_PRIORITY if r not in WEAK_ROLES)
    by_content = {a.content: a.id for a in reversed(drafter.added)}
    n_content = sum(take(a.id, by_content.get(a.content)) for a in target.added)
    n_roles += sum(take(target.roles.get(r), drafter.roles.get(r)) for r in WEAK_ROLES)
    return pairs, n_roles, n_content


def bytes_pairs(
    drafter: TokenizerView, target: TokenizerView, *, drafter_vocab_size: int, target_vocab_size: int
) -> tuple[list[tuple[np.ndarray, np.ndarray]], list[tuple[np.ndarray, np.ndarray]], BuildStats]:
    """The bytes map as index arrays: ``(t2d_writes, d2t_writes, stats)``, each a list of
    ``(index array, value array)`` to assign in order."""
    specials, n_roles, n_content = special_pairs(drafter, target, drafter_size=drafter_vocab_size, target_size=target_vocab_size)
    ex_t = set(target.special_ids) | {t for t, _ in specials}
    ex_d = set(drafter.special_ids) | {d for _, d in specials}
    pieces_t, pieces_d = byte_fallback_pieces(target), byte_fallback_pieces(drafter)
    canon_t, dups_t = _canonical(target, ex_t, target_vocab_size, pieces_t)
    canon_d, dups_d = _canonical(drafter, ex_d, drafter_vocab_size, pieces_d)
    # One pass over the smaller side: its keys looked up in the other side's dict (C speed).
    small, big, small_is_t = (canon_t, canon_d, True) if len(canon_t) <= len(canon_d) else (canon_d, canon_t, False)
    small_keys = list(small)
    small_ids = np.fromiter(small.values(), dtype=np.int64, count=len(small))
    big_ids = np.fromiter(map(big.get, small_keys, repeat(-1)), dtype=np.int64, count=len(small))
    hit = np.flatnonzero(big_ids >= 0)
    rejected = 0
    normalize = unicode_normalizer(target.normalizer)
    if normalize is not None:
        check_ascii = getattr(normalize, "lowercases", False)
        bad = [k for k in hit.tolist() if (check_ascii or not small_keys[k].isascii()) and not _keeps(normalize, small_keys[k])]
        rejected = len(bad)
        hit = np.setdiff1d(hit, np.array(bad, dtype=np.int64), assume_unique=True)
    common = {small_keys[k] for k in hit.tolist()} if (len(dups_t) or len(dups_d)) else set()
    t_ids, d_ids = (small_ids[hit], big_ids[hit]) if small_is_t else (big_ids[hit], small_ids[hit])
    t2d = [(t_ids, d_ids)]
    d2t = [(d_ids, t_ids)]
    # Non-canonical ids (several ids with the same bytes) map to the other side's canonical id.
    for dups, view, other, writes in ((dups_t, target, canon_d, t2d), (dups_d, drafter, canon_t, d2t)):
        pairs = [(i, other[view.tokens[i]]) for i in dups.tolist() if view.tokens[i] in common]
        if pairs:
            writes.append((np.array([i for i, _ in pairs], dtype=np.int64), np.array([j for _, j in pairs], dtype=np.int64)))
    ambiguous = len(dups_t) + len(dups_d)
    n = len(hit)
    if specials:
        st = np.array([t for t, _ in specials], dtype=np.int64)
        sd = np.array([d for _, d in specials], dtype=np.int64)
        t2d.append((st, sd))
        d2t.append((sd, st))
    stats = BuildStats(
        role_pairs=n_roles, content_pairs=n_content, byte_pairs=n, normalizer_rejected=rejected, ambiguous=ambiguous
    )
    return t2d, d2t, stats
