"""How a vocabulary string becomes raw bytes, for the three encodings BPE tokenizers use.

- ``byte_level`` (GPT-2, Llama 3, Qwen, EXAONE): every byte is drawn as a printable character
  (``Ġ`` is the space byte 0x20); decoding is a fixed 256-entry table.
- ``sentencepiece`` (Llama 2, Mistral, Gemma style BPE): ``▁`` is a space and, with byte
  fallback, ``<0xNN>`` is the single byte NN; everything else is UTF-8.
- ``raw``: the string is the token's text, UTF-8 encoded (tiktoken ranks are already bytes).

>>> token_bytes("Ġhello", "byte_level")
b' hello'
>>> token_bytes("▁안녕", "sentencepiece")
b' \\xec\\x95\\x88\\xeb\\x85\\x95'
>>> token_bytes("<0x0A>", "sentencepiece", byte_fallback=True)
b'\\n'
"""

from __future__ import annotations

import re
from bisect import bisect_right
from functools import lru_cache
from itertools import accumulate

BYTE_LEVEL = "byte_level"
SENTENCEPIECE = "sentencepiece"
RAW = "raw"
ENCODINGS = (BYTE_LEVEL, SENTENCEPIECE, RAW)

SPM_SPACE = "\u2581"  # ▁
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_NOT_LATIN1 = re.compile(r"[^\x00-\xff]")


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable alias for each byte (0x20 → 'Ġ', 0x0A → 'Ċ', printable ASCII as is)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


@lru_cache(maxsize=1)
def _unicode_to_latin1() -> dict[int, int]:
    """str.translate table: byte-level alias char → the latin-1 char of its byte."""
    return {ord(ch): b for b, ch in bytes_to_unicode().items()}


@lru_cache(maxsize=1)
def _latin1_to_unicode() -> dict[int, str]:
    return {b: ch for b, ch in bytes_to_unicode().items()}


def byte_level_decode(s: str) -> bytes | None:
    """Byte-level string → bytes; None when ``s`` has a character outside the 256 aliases."""
    t = s.translate(_unicode_to_latin1())
    try:
        return t.encode("latin-1")
    except UnicodeEncodeError:
        return None


def byte_level_encode(b: bytes) -> str:
    """Bytes → byte-level string (the inverse of :func:`byte_level_decode`)."""
    return b.decode("latin-1").translate(_latin1_to_unicode())


def token_bytes(s: str, encoding: str, *, byte_fallback: bool = False) -> bytes:
    """The raw bytes a vocabulary string stands for under ``encoding``."""
    if encoding == BYTE_LEVEL:
        b = byte_level_decode(s)
        # A character outside the alphabet (rare hand-added entries) is taken as UTF-8 text.
        return b if b is not None else s.encode("utf-8")
    if encoding == SENTENCEPIECE:
        if byte_fallback and len(s) == 6:
            m = _BYTE_FALLBACK.fullmatch(s)
            if m:
                return bytes([int(m.group(1), 16)])
        return s.replace(SPM_SPACE, " ").encode("utf-8")
    return s.encode("utf-8")


def decode_many(strings: list[str], encoding: str, *, byte_fallback: bool = False) -> list[bytes]:
    """:func:`token_bytes` over a whole vocabulary at C speed (byte-level: one translate call).

    >>> decode_many(["Ġa", "bc"], "byte_level")
    [b' a', b'bc']
    """
    if encoding != BYTE_LEVEL:
        return [token_bytes(s, encoding, byte_fallback=byte_fallback) for s in strings]
    text = "".join(strings).translate(_unicode_to_latin1())
    # Characters outside the byte alphabet (added tokens kept in the vocab, e.g. DeepSeek's
    # "<｜begin▁of▁sentence｜>") are masked for the bulk encode and those strings redone one by one.
    odd = [m.start() for m in _NOT_LATIN1.finditer(text)]
    blob = (_NOT_LATIN1.sub("?", text) if odd else text).encode("latin-1")
    out, pos = [], 0
    for s in strings:  # byte-level: one character per byte, so lengths carry over
        n = len(s)
        out.append(blob[pos : pos + n])
        pos += n
    if odd:
        starts = list(accumulate((len(s) for s in strings), initial=0))
        for i in sorted({bisect_right(starts, p) - 1 for p in odd}):
            out[i] = token_bytes(strings[i], encoding)
    return out


_VISIBLE = {" ": "␠", "\n": "↵", "\t": "⇥", "\r": "␍"}


def display(b: bytes | None) -> str:
    """A one-line readable form of token bytes: spaces as ␠, newlines as ↵, bad UTF-8 as \\xNN.

    >>> display(b" give them")
    '␠give␠them'
    >>> display(b"\\xec\\x95")
    '\\\\xec\\\\x95'
    """
    if b is None:
        return "∅"
    text = b.decode("utf-8", errors="backslashreplace")
    return "".join(_VISIBLE.get(c, c) if c in _VISIBLE else (c if c.isprintable() else repr(c)[1:-1]) for c in text)
