"""``load_tokenizer(source)``: one entry point for every tokenizer format.

A source is a path (``tokenizer.json``, an HF folder, a ``.gguf`` file, a tiktoken rank file)
or a Hugging Face hub id (``LGAI-EXAONE/EXAONE-4.0-1.2B``).

>>> load_tokenizer("../shared/tokenizers/qwen3")  # doctest: +SKIP
TokenizerView('../shared/tokenizers/qwen3', BPE/byte_level, 151669 ids, 26 added, ...)
"""

from __future__ import annotations

from pathlib import Path

from ...errors import TokenizerSourceError
from ...util import looks_like_hub_id
from ..view import TokenizerView
from .gguf import load_gguf
from .hf import load_folder, load_tokenizer_json
from .hub import load_hub
from .tiktoken import PATTERNS, load_tiktoken, looks_like_tiktoken

__all__ = ["load_tokenizer", "PATTERNS", "looks_like_hub_id"]


def load_tokenizer(source: str | Path, *, pattern: str | None = None, revision: str | None = None) -> TokenizerView:
    """Load any supported tokenizer source into a :class:`TokenizerView`.

    ``pattern`` is the split regex (or a name in ``PATTERNS``) for tiktoken rank files.
    """
    src = str(source)
    path = Path(src).expanduser()
    if path.is_dir():
        return load_folder(path, source=src, pattern=pattern)
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix == ".gguf":
            return load_gguf(path, source=src)
        if suffix == ".json":
            return load_tokenizer_json(path, source=src)
        if looks_like_tiktoken(path):
            return load_tiktoken(path, pattern=pattern, source=src)
        with path.open("rb") as f:
            head = f.read(4)
        if head == b"GGUF":
            return load_gguf(path, source=src)
        if head[:1] == b"{":
            return load_tokenizer_json(path, source=src)
        raise TokenizerSourceError(
            f"{src}: unrecognised file. Expected a tokenizer.json, a .gguf file, or a tiktoken rank file "
            "('<base64> <rank>' per line)."
        )
    if looks_like_hub_id(src) and not src.startswith((".", "/", "~")):
        return load_hub(src, revision=revision, pattern=pattern)
    raise TokenizerSourceError(
        f"{src}: no such file or folder. Pass a tokenizer.json, an HF tokenizer folder, a .gguf file, "
        "a tiktoken rank file, or a hub id like 'Qwen/Qwen3-8B'."
    )
