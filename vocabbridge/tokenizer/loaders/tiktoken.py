"""tiktoken rank files (``<base64 token> <rank>`` per line, e.g. ``cl100k_base.tiktoken`` or
Llama 3's original ``tokenizer.model``). The file carries no split pattern, so one must be given:
a regex, or a name from :data:`PATTERNS`.

Merges are recovered from the ranks by transformers' ``TikTokenConverter`` (the same conversion
transformers applies to these files); we only parse the file, with errors that name the line.
"""

from __future__ import annotations

import base64
import binascii
import json
from pathlib import Path

from tokenizers import AddedToken

from ...errors import TokenizerSourceError
from ..view import TokenizerView, view_from_doc

_CL100K = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
PATTERNS = {
    "gpt2": r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
    "cl100k": _CL100K,
    "llama3": _CL100K,
    "o200k": "|".join(
        [
            r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
            r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
            r"""\p{N}{1,3}""",
            r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
            r"""\s*[\r\n]+""",
            r"""\s+(?!\S)""",
            r"""\s+""",
        ]
    ),
}


def looks_like_tiktoken(path: Path) -> bool:
    """True when the first line is ``<base64> <int>``."""
    try:
        with path.open("rb") as f:
            first = f.readline(4096).split()
        return len(first) == 2 and first[1].isdigit() and bool(base64.b64decode(first[0], validate=True) or True)
    except (OSError, binascii.Error, ValueError):
        return False


def parse_ranks(path: Path) -> dict[bytes, int]:
    """``{token bytes: rank}``; a bad line raises naming the file and line."""
    ranks: dict[bytes, int] = {}
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TokenizerSourceError(f"{path}: cannot read it ({e.strerror}).") from e
    for lineno, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            raise TokenizerSourceError(f"{path}:{lineno}: expected '<base64 token> <rank>', got {line[:60]!r}.")
        try:
            token = base64.b64decode(parts[0], validate=True)
        except binascii.Error as e:
            raise TokenizerSourceError(f"{path}:{lineno}: the token is not valid base64 ({e}).") from e
        ranks[token] = int(parts[1])
    if not ranks:
        raise TokenizerSourceError(f"{path}: no ranks found; expected lines of '<base64 token> <rank>'.")
    return ranks


def load_tiktoken(
    path: Path, *, pattern: str | None, special_tokens: dict[str, int] | None = None, source: str | None = None
) -> TokenizerView:
    if not pattern:
        raise TokenizerSourceError(
            f"{path}: a tiktoken rank file does not say how to split text. Pass --pattern with the regex "
            f"or one of: {', '.join(PATTERNS)} (e.g. --pattern cl100k)."
        )
    regex = PATTERNS.get(pattern, pattern)
    ranks = parse_ranks(path)
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class _Converter(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(_url):
            return ranks

    tok = _Converter(vocab_file=str(path), pattern=regex).converted()
    if special_tokens:
        base = len(ranks)
        for content, tid in sorted(special_tokens.items(), key=lambda kv: kv[1]):
            if tid < base:
                raise TokenizerSourceError(f"special token {content!r} id {tid} collides with rank ids (< {base}).")
        tok.add_special_tokens(
            [AddedToken(c, normalized=False, special=True) for c, _ in sorted(special_tokens.items(), key=lambda kv: kv[1])]
        )
    text = tok.to_str()
    doc = json.loads(text)
    if special_tokens:  # tokenizers numbers added tokens consecutively; put them at the ids the user gave
        for a in doc["added_tokens"]:
            a["id"] = special_tokens[a["content"]]
        text = json.dumps(doc, ensure_ascii=False)
    return view_from_doc(doc, source=source or str(path), fmt="tiktoken", config={"eos_token": None}, doc_json=text)
