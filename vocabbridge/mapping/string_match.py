"""vLLM's ``use_heterogeneous_vocab`` token map, rule for rule, so a user can predict what vLLM builds.

What vLLM does at start-up (``VocabMapping`` in ``vllm/v1/spec_decode/vocab_mapping.py``):

1. **Space marker**, per tokenizer: encode ``" a"`` without special tokens and look at the first
   token's string. If it is longer than one character, ends in ``a`` and does not start with a
   space or tab, the marker is that string without the ``a`` (``Ġ`` for byte-level BPE, ``▁`` for
   SentencePiece). Otherwise both ``Ġ`` and ``▁`` are tried, in that order.
2. **Strings**: every ``get_vocab()`` entry (the model vocabulary *and* the added tokens, so special
   tokens take part) has a leading marker replaced by one real space. Nothing else changes: no
   byte-level decoding (``ĠìķĪ`` never meets ``▁안``), no NFC, no role matching
   (``[|endofturn|]`` never meets ``<|endofturn|>``).
3. **First wins**, per side: the first id seen for a normalized string keeps it. ``get_vocab()``
   is built from a Rust ``HashMap``, so "first" follows hash order, which changes from process to
   process; it matters only where two strings normalize alike (``Ġx`` and a literal `` x``), which
   none of the real tokenizers we checked have. We take the lowest id and count such strings in
   ``BuildStats.ambiguous`` so the report can say where vLLM's choice is not predictable.
4. **Pairs**: strings on both sides pair up; a pair is dropped when either id is at or beyond its
   model's vocabulary size (the embedding rows, not the tokenizer's length).
5. At run time a target id outside the intersection reaches the drafter as the drafter's unk id,
   else its eos id, and drafter logits outside the intersection are masked to -inf.

Where the strings come from: ``view.backend.get_vocab(with_added_tokens=True)`` on a
``tokenizers.Tokenizer`` built from the view's own ``tokenizer.json`` text. That is the exact call
transformers' fast tokenizers make for ``get_vocab()`` (checked equal, dict for dict, against
``AutoTokenizer.from_pretrained(...).get_vocab()`` on every tokenizer in ``../shared/tokenizers``),
and it keeps the original strings, which the view's bytes cannot give back (``<0x41>`` and ``A``
have the same bytes).

>>> normalize_token("Ġhello", ("Ġ",)), normalize_token("▁hello", ("Ġ", "▁")), normalize_token("ĠĠx", ("Ġ",))
(' hello', ' hello', ' Ġx')
"""

from __future__ import annotations

import numpy as np

from ..tokenizer.view import TokenizerView
from .tokenmap import BuildStats

FALLBACK_MARKERS = ("\u0120", "\u2581")  # Ġ, ▁


def space_markers(view: TokenizerView) -> tuple[str, ...]:
    """The space marker(s) vLLM detects for this tokenizer (step 1)."""
    try:
        ids = view.backend.encode(" a", add_special_tokens=False).ids
    except Exception:  # noqa: BLE001 - vLLM falls back on any failure too
        ids = []
    if ids:
        s = view.backend.id_to_token(ids[0])
        if isinstance(s, str) and len(s) > 1 and s.endswith("a") and s[0] not in (" ", "\t"):
            return (s[:-1],)
    return FALLBACK_MARKERS


def normalize_token(s: str, markers: tuple[str, ...]) -> str:
    """Replace one leading space marker with a space (the first marker that matches)."""
    for m in markers:
        if s.startswith(m):
            return " " + s[len(m) :]
    return s


def normalized_vocab(view: TokenizerView) -> tuple[dict[str, int], int, tuple[str, ...]]:
    """normalized string → id (lowest id where several share a string), the number of such
    strings, and the markers used."""
    vocab: dict[str, int] = view.backend.get_vocab(with_added_tokens=True)
    markers = space_markers(view)
    if len(markers) == 1:
        m, n = markers[0], len(markers[0])
        items = [(" " + s[n:] if s.startswith(m) else s, i) for s, i in vocab.items()]
    else:
        items = [(normalize_token(s, markers), i) for s, i in vocab.items()]
    out = dict(items)
    ambiguous = len(items) - len(out)
    if ambiguous:  # rebuild so that the lowest id keeps each string (later writes win: descending ids)
        out = dict(sorted(items, key=lambda kv: -kv[1]))
    return out, ambiguous, markers


def fallback_id(view: TokenizerView) -> int | None:
    """vLLM's replacement for an id outside the intersection: ``unk_token_id``, else ``eos_token_id``.

    transformers sets those from the tokenizer config, so only roles with config evidence count
    (a token merely *named* ``<unk>`` is not the tokenizer's unk for transformers).
    """
    for role in ("unk", "eos"):
        if role in view.roles and view.role_evidence.get(role) == "config":
            return view.roles[role]
    return None


def vllm_pairs(
    drafter: TokenizerView, target: TokenizerView, *, drafter_vocab_size: int, target_vocab_size: int
) -> tuple[np.ndarray, np.ndarray, BuildStats]:
    """(target ids, drafter ids, stats) of vLLM's intersection (steps 1-4)."""
    t_norm, t_amb, t_markers = normalized_vocab(target)
    d_norm, d_amb, d_markers = normalized_vocab(drafter)
    common = t_norm.keys() & d_norm.keys()
    n = len(common)
    t_ids = np.fromiter((t_norm[s] for s in common), dtype=np.int64, count=n)
    d_ids = np.fromiter((d_norm[s] for s in common), dtype=np.int64, count=n)
    keep = (t_ids < target_vocab_size) & (d_ids < drafter_vocab_size)
    stats = BuildStats(
        byte_pairs=int(keep.sum()),
        ambiguous=t_amb + d_amb,
        dropped_beyond_vocab=int(n - keep.sum()),
        space_markers={"drafter": list(d_markers), "target": list(t_markers)},
    )
    return t_ids[keep], d_ids[keep], stats
