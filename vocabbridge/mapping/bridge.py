"""The input bridge: for a target id without a single-token partner, the drafter ids for its bytes.

How a target token's bytes become drafter ids:

1. the drafter's own BPE model (its vocabulary and merges, byte fallback included) runs on exactly
   those bytes as one piece: no normalizer, no pre-tokenizer, no added prefix space, so the
   result spells the bytes exactly (``Ġ``-aliases for a byte-level drafter, ``▁`` for spaces in a
   SentencePiece one);
2. where that does not give the bytes back (a character the drafter cannot spell, partial UTF-8
   for a SentencePiece drafter), the drafter's single-byte tokens spell them one byte at a time
   (a byte-level vocabulary has all 256; a byte-fallback one has ``<0xNN>``);
3. where neither works (no byte tokens), the closest the drafter has is kept and counted as lossy.

Special tokens of the target without a role or content partner are bridged the same way: the
drafter reads their text (``<|box_start|>`` as ``<``, ``|``, ``box`` ...), never ``unk``.

Speed: the pieces go through a few ``encode_batch`` strings joined by a separator (a
pre-tokenizer that only splits there), ~10× cheaper than one call per token; entries are cut
apart and checked in bulk by byte lengths (numpy), entry by entry only where that fails.
"""

from __future__ import annotations

import numpy as np
from tokenizers import Tokenizer, pre_tokenizers

from ..tokenizer.encoding import BYTE_LEVEL, SENTENCEPIECE, byte_level_encode
from ..tokenizer.view import TokenizerView
from .bytes_mode import byte_fallback_pieces

_SEPARATORS = ("\n", "\x00", "\ufdd0", "\U0010fffd")  # "\n" never occurs in byte-level alias strings


def _model_tokenizer(drafter: TokenizerView, sep: str):

    tok = Tokenizer(drafter.backend.model)  # shares the (already built) model; no copy
    tok.pre_tokenizer = pre_tokenizers.Split(sep, behavior="removed")
    return tok


def _model_inputs(pieces: list[bytes], encoding: str) -> list[str | None]:
    """What the drafter's BPE model reads for each byte string (None: not representable as its text)."""
    if encoding == BYTE_LEVEL:  # one character per byte: alias everything at once, then cut
        big = byte_level_encode(b"".join(pieces))
        ends = np.cumsum([len(b) for b in pieces]).tolist()
        return [big[a:z] for a, z in zip([0, *ends[:-1]], ends)]
    out: list[str | None] = []
    for b in pieces:
        try:
            s = b.decode("utf-8")
        except UnicodeDecodeError:
            out.append(None)
            continue
        out.append(s.replace(" ", "\u2581") if encoding == SENTENCEPIECE else s)
    return out


def _single_bytes(drafter: TokenizerView) -> dict[int, int]:
    """byte value → drafter id of a single-byte token (a plain token preferred to a ``<0xNN>`` piece)."""
    pieces = byte_fallback_pieces(drafter)
    added = drafter.added_ids
    out: dict[int, int] = {}
    for i, b in enumerate(drafter.tokens):
        if b is not None and len(b) == 1 and i not in added and i not in pieces and b[0] not in out:
            out[b[0]] = i
    for i, b in sorted(pieces.items()):
        out.setdefault(b[0], i)
    return out


def _spell(drafter: TokenizerView, items: list[tuple[int, str, bytes]], sep: str) -> tuple[dict[int, tuple[int, ...]], set[int]]:
    """target id → the drafter model's ids for each (target id, model input, bytes), and the ids
    whose entry may not be exact (the rest is checked)."""
    dtoks = drafter.tokens
    dlen = np.fromiter((len(b) if b else 0 for b in dtoks), dtype=np.int64, count=len(dtoks))
    n_chunks = max(1, min(8, len(items) // 2000))  # a few strings: encode_batch spreads them over the cores
    bounds = np.linspace(0, len(items), n_chunks + 1).astype(int).tolist()
    chunks = [items[a:z] for a, z in zip(bounds, bounds[1:])]
    encs = _model_tokenizer(drafter, sep).encode_batch([sep.join(s for _, s, _ in c) for c in chunks], add_special_tokens=False)
    bridge: dict[int, tuple[int, ...]] = {}
    unsure: set[int] = set()
    for chunk, enc in zip(chunks, encs):
        ids = enc.ids
        cum = np.cumsum(dlen[np.asarray(ids, dtype=np.int64)]) if ids else np.zeros(0, dtype=np.int64)
        want = np.cumsum([len(b) for _, _, b in chunk])
        ends = np.searchsorted(cum, want, "left")
        aligned = bool(len(cum)) and (ends < len(cum)).all() and (cum[np.minimum(ends, len(cum) - 1)] == want).all()
        if aligned and b"".join(map(dtoks.__getitem__, ids)) == b"".join(b for _, _, b in chunk):
            # Token boundaries fall exactly on the pieces' boundaries and the bytes agree: all exact.
            starts = [0, *(ends[:-1] + 1).tolist()]
            for (t, _, _), a, z in zip(chunk, starts, (ends + 1).tolist()):
                bridge[t] = tuple(ids[a:z])
            continue
        words = np.asarray([-1 if w is None else w for w in enc.word_ids], dtype=np.int64)
        k = np.arange(len(chunk))
        for (t, _, _), a, z in zip(
            chunk, np.searchsorted(words, k, "left").tolist(), np.searchsorted(words, k, "right").tolist()
        ):
            bridge[t] = tuple(ids[a:z])
            unsure.add(t)
    return bridge, unsure


def build_input_bridge(
    drafter: TokenizerView, target: TokenizerView, target_to_draft: np.ndarray, *, fallback_id: int | None = None
) -> tuple[dict[int, tuple[int, ...]], int]:
    """(target id → drafter ids, number of lossy entries) for every target id with bytes and no partner."""
    ttoks = target.tokens
    n = min(len(ttoks), len(target_to_draft))
    missing = [t for t in np.flatnonzero(target_to_draft[:n] < 0).tolist() if ttoks[t]]
    inputs = _model_inputs([ttoks[t] for t in missing], drafter.encoding)
    items = [(t, s, ttoks[t]) for t, s in zip(missing, inputs) if s]
    used = "".join(s for _, s, _ in items)
    sep = next((c for c in _SEPARATORS if c not in used), None)
    if sep is not None:
        bridge, unsure = _spell(drafter, items, sep) if items else ({}, set())
    else:  # pragma: no cover - every separator candidate occurs in the pieces
        tok = _model_tokenizer(drafter, "\x00")
        bridge, unsure = {t: tuple(tok.encode(s, add_special_tokens=False).ids) for t, s, _ in items}, {t for t, _, _ in items}
    # Repair with single-byte tokens where the model's spelling is missing or not exact.
    dtoks = drafter.tokens
    check = unsure | {t for t in missing if t not in bridge}
    singles: dict[int, int] | None = None
    lossy = 0
    for t in sorted(check):
        want, got = ttoks[t], bridge.get(t, ())
        if got and b"".join(dtoks[i] or b"" for i in got) == want:
            continue
        if singles is None:
            singles = _single_bytes(drafter)
        if all(x in singles for x in want):
            bridge[t] = tuple(singles[x] for x in want)
            continue
        lossy += 1
        bridge[t] = got or ((fallback_id,) if fallback_id is not None else ())
    return bridge, lossy
