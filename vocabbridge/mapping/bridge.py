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

All pieces go through one ``encode`` call on a separator-joined string (a pre-tokenizer that only
splits on the separator), which is ~10× cheaper than one call per token.
"""

from __future__ import annotations

import numpy as np

from ..tokenizer.encoding import BYTE_LEVEL, SENTENCEPIECE, byte_level_encode
from ..tokenizer.view import TokenizerView
from .bytes_mode import byte_fallback_pieces

_SEPARATORS = ("\n", "\x00", "\ufdd0", "\U0010fffd")  # "\n" never occurs in byte-level alias strings


def _model_tokenizer(drafter: TokenizerView, sep: str):
    from tokenizers import Tokenizer, pre_tokenizers

    tok = Tokenizer(drafter.backend.model)  # shares the (already built) model; no copy
    tok.pre_tokenizer = pre_tokenizers.Split(sep, behavior="removed")
    return tok


def _model_input(b: bytes, encoding: str) -> str | None:
    """What the drafter's BPE model reads for these bytes (None: not representable as its text)."""
    if encoding == BYTE_LEVEL:
        return byte_level_encode(b)
    try:
        s = b.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return s.replace(" ", "\u2581") if encoding == SENTENCEPIECE else s


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


def build_input_bridge(
    drafter: TokenizerView, target: TokenizerView, target_to_draft: np.ndarray, *, fallback_id: int | None = None
) -> tuple[dict[int, tuple[int, ...]], int]:
    """(target id → drafter ids, number of lossy entries) for every target id with bytes and no partner."""
    ttoks = target.tokens
    n = min(len(ttoks), len(target_to_draft))
    missing = [t for t in np.flatnonzero(target_to_draft[:n] < 0).tolist() if ttoks[t]]
    inputs = [_model_input(ttoks[t], drafter.encoding) for t in missing]
    text_items = [(t, s) for t, s in zip(missing, inputs) if s]
    used = "".join(s for _, s in text_items)
    sep = next((c for c in _SEPARATORS if c not in used), None)
    bridge: dict[int, tuple[int, ...]] = {}
    if text_items and sep is not None:
        enc = _model_tokenizer(drafter, sep).encode(sep.join(s for _, s in text_items), add_special_tokens=False)
        ids = np.asarray(enc.ids, dtype=np.int64)
        words = np.asarray([-1 if w is None else w for w in enc.word_ids], dtype=np.int64)
        k = np.arange(len(text_items))
        starts, ends = np.searchsorted(words, k, "left"), np.searchsorted(words, k, "right")
        id_list = ids.tolist()
        for (t, _), a, z in zip(text_items, starts.tolist(), ends.tolist()):
            bridge[t] = tuple(id_list[a:z])
    elif text_items:  # pragma: no cover - every separator candidate occurs in the vocabulary
        for t, s in text_items:
            bridge[t] = tuple(_model_tokenizer(drafter, "\x00").encode(s, add_special_tokens=False).ids)
    # Check every entry; repair with single-byte tokens where the model's spelling is not exact.
    dtoks = drafter.tokens
    singles: dict[int, int] | None = None
    lossy = 0
    for t in missing:
        want = ttoks[t]
        got = bridge.get(t, ())
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
