"""Which writing system a token belongs to, and whether it spans several words.

Categories, checked in this order (first match wins):

- ``fragment``: bytes that are not complete UTF-8 (a piece of a multi-byte character);
- ``whitespace``: only spaces, tabs, newlines;
- ``hangul`` / ``han`` / ``kana``: contains a Hangul syllable or jamo / a CJK ideograph / kana;
- ``latin``: contains a Latin letter;
- ``other_letters``: any other letter (Cyrillic, Arabic, Greek, ...);
- ``digits``: digits, possibly with spaces or punctuation, and no letter;
- ``punct_code``: everything else (punctuation, symbols, operators, emoji).

>>> script_of(" 안녕".encode())
'hangul'
>>> script_of(b"\\xec\\x95")
'fragment'
>>> is_multiword(" give them".encode())
True
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import regex

SCRIPTS = ("hangul", "latin", "han", "kana", "other_letters", "digits", "whitespace", "punct_code", "fragment")
SCRIPT_LABELS = {
    "hangul": "Hangul",
    "latin": "Latin",
    "han": "Han",
    "kana": "Kana",
    "other_letters": "other letters",
    "digits": "digits",
    "whitespace": "whitespace",
    "punct_code": "punctuation/code",
    "fragment": "byte fragments",
}

_WS = regex.compile(r"\s+")
_ASCII_LETTERS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_HANGUL = regex.compile(r"\p{Script=Hangul}")
_HAN = regex.compile(r"\p{Script=Han}")
_KANA = regex.compile(r"[\p{Script=Hiragana}\p{Script=Katakana}]")
_LATIN = regex.compile(r"\p{Script=Latin}")
_LETTER = regex.compile(r"\p{L}")
_DIGIT = regex.compile(r"\p{N}")
# A space with a letter on both sides: "␠give␠them", "된다면␠문의".
_MULTIWORD = regex.compile(r"\p{L}[ \u00a0]+\p{L}")


def script_of(b: bytes) -> str:
    """The category of one token's bytes (see module docstring)."""
    if b.isascii():  # most tokens: answer with bytes methods, no regex
        if not b or b.isspace():
            return "whitespace"
        if any(c in _ASCII_LETTERS for c in b):
            return "latin"
        return "digits" if any(48 <= c <= 57 for c in b) else "punct_code"
    try:
        text = b.decode("utf-8")
    except UnicodeDecodeError:
        return "fragment"
    if not text or _WS.fullmatch(text):
        return "whitespace"
    if _HANGUL.search(text):
        return "hangul"
    if _HAN.search(text):
        return "han"
    if _KANA.search(text):
        return "kana"
    if _LATIN.search(text):
        return "latin"
    if _LETTER.search(text):
        return "other_letters"
    if _DIGIT.search(text):
        return "digits"
    return "punct_code"


def is_multiword(b: bytes) -> bool:
    """True when the token's text has a space with a letter on both sides."""
    if b" " not in b and b"\xc2\xa0" not in b:
        return False
    return bool(_MULTIWORD.search(b.decode("utf-8", errors="ignore")))


def script_counts(items: Iterable[bytes]) -> dict[str, int]:
    """How many of ``items`` fall in each category (every category present, zeros included)."""
    c = Counter(script_of(b) for b in items)
    return {s: c.get(s, 0) for s in SCRIPTS}
