"""Hugging Face formats: a ``tokenizer.json`` file, or a folder (fast ``tokenizer.json`` or slow
``vocab.json`` + ``merges.txt``) with its ``tokenizer_config.json`` and friends.

Loaders only read and parse; every error names the file and what was expected.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...errors import TokenizerSourceError, UnsupportedTokenizerError
from ..view import TokenizerView, view_from_doc
from .gguf import load_gguf
from .tiktoken import load_tiktoken, looks_like_tiktoken


def read_json(path: Path, *, what: str = "JSON") -> tuple[Any, str]:
    """Parse ``path``; a corrupt or truncated file raises with the file, line, column and offset."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise TokenizerSourceError(f"{path}: not UTF-8 text (byte {e.start}); expected a {what} file.") from e
    except OSError as e:
        raise TokenizerSourceError(f"{path}: cannot read it ({e.strerror}).") from e
    try:
        return json.loads(text), text
    except json.JSONDecodeError as e:
        hint = " The file looks truncated; download or export it again." if e.pos >= len(text.rstrip()) - 1 else ""
        raise TokenizerSourceError(
            f"{path}: invalid {what} at line {e.lineno}, column {e.colno} (char {e.pos}): {e.msg}.{hint}"
        ) from e


def _read_optional_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    data, _ = read_json(path)
    return data if isinstance(data, dict) else {}


def folder_metadata(folder: Path) -> tuple[dict, str | None, dict[str, int], int | None]:
    """tokenizer_config (+ special_tokens_map), chat template, role ids from configs, model vocab size."""
    config = _read_optional_json(folder / "tokenizer_config.json")
    for k, v in _read_optional_json(folder / "special_tokens_map.json").items():
        config.setdefault(k, v)
    template = config.get("chat_template")
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        template = jinja.read_text(encoding="utf-8")
    elif (folder / "chat_template.json").is_file():
        template = _read_optional_json(folder / "chat_template.json").get("chat_template", template)
    model_cfg = _read_optional_json(folder / "config.json")
    vocab_size = model_cfg.get("vocab_size") or (model_cfg.get("text_config") or {}).get("vocab_size")
    config_ids: dict[str, int] = {}
    gen = _read_optional_json(folder / "generation_config.json")
    for role in ("bos", "eos", "pad"):
        v = gen.get(f"{role}_token_id")
        if isinstance(v, list) and v:
            v = v[0]
        if isinstance(v, int):
            config_ids[role] = v
    return config, template, config_ids, vocab_size


def _check_doc(doc: Any, path: Path) -> dict:
    if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
        raise TokenizerSourceError(
            f"{path}: no 'model' object; this is not a Hugging Face tokenizer.json "
            "(expected keys 'model', 'pre_tokenizer', 'added_tokens', ...)."
        )
    model = doc["model"]
    if model.get("type", "BPE") == "BPE" and not isinstance(model.get("vocab"), dict):
        raise TokenizerSourceError(f"{path}: 'model.vocab' is missing or not an object.")
    return doc


def load_tokenizer_json(path: Path, *, source: str | None = None, fmt: str = "tokenizer.json") -> TokenizerView:
    """A ``tokenizer.json`` file; its folder's configs are read when present."""
    doc, text = read_json(path, what="tokenizer.json")
    doc = _check_doc(doc, path)
    config, template, config_ids, vocab_size = folder_metadata(path.parent)
    return view_from_doc(
        doc,
        source=source or str(path),
        fmt=fmt,
        config=config,
        chat_template=template,
        config_ids=config_ids,
        model_vocab_size=vocab_size,
        doc_json=text,
    )


def load_slow_folder(folder: Path, *, source: str | None = None, fmt: str = "hf-slow") -> TokenizerView:
    """``vocab.json`` + ``merges.txt``: converted to a fast tokenizer by transformers itself."""
    vocab, _ = read_json(folder / "vocab.json", what="vocab.json")
    if not isinstance(vocab, dict):
        raise TokenizerSourceError(f"{folder / 'vocab.json'}: expected an object mapping token → id.")
    for lineno, line in enumerate((folder / "merges.txt").read_text(encoding="utf-8").splitlines(), 1):
        if line and not line.startswith("#version") and len(line.split(" ")) != 2:
            raise TokenizerSourceError(
                f"{folder / 'merges.txt'}:{lineno}: expected two tokens separated by a space, got {line!r}."
            )
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as e:  # noqa: BLE001 - transformers raises many types; we add the file context
        raise TokenizerSourceError(f"{folder}: transformers could not load the slow tokenizer files: {e}") from e
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        raise UnsupportedTokenizerError(f"{folder}: transformers gave no fast (tokenizers) backend for {type(tok).__name__}.")
    text = backend.to_str()
    config, template, config_ids, vocab_size = folder_metadata(folder)
    return view_from_doc(
        json.loads(text),
        source=source or str(folder),
        fmt=fmt,
        config=config,
        chat_template=template,
        config_ids=config_ids,
        model_vocab_size=vocab_size,
        doc_json=text,
    )


def load_folder(folder: Path, *, source: str | None = None, pattern: str | None = None, fmt_prefix: str = "") -> TokenizerView:
    """A folder: prefers ``tokenizer.json``; else slow files; else a GGUF or tiktoken file inside."""
    if (folder / "tokenizer.json").is_file():
        return load_tokenizer_json(folder / "tokenizer.json", source=source or str(folder), fmt=fmt_prefix + "tokenizer.json")
    if (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
        return load_slow_folder(folder, source=source, fmt=fmt_prefix + "hf-slow")
    ggufs = sorted(folder.glob("*.gguf"))
    if len(ggufs) == 1:
        return load_gguf(ggufs[0], source=source)
    ranks = sorted([*folder.glob("*.tiktoken"), *folder.glob("tokenizer.model")])
    if ranks:
        if looks_like_tiktoken(ranks[0]):
            return load_tiktoken(ranks[0], pattern=pattern, source=source)
    if (folder / "tokenizer.model").is_file():
        raise UnsupportedTokenizerError(
            f"{folder}: only a SentencePiece tokenizer.model is here. Convert it once with transformers "
            "(AutoTokenizer.from_pretrained(folder).save_pretrained(out)) and pass the folder with tokenizer.json."
        )
    present = ", ".join(sorted(p.name for p in folder.iterdir())[:12]) or "nothing"
    raise TokenizerSourceError(
        f"{folder}: no tokenizer found. Expected tokenizer.json, or vocab.json + merges.txt, "
        f"or one .gguf / .tiktoken file; the folder holds: {present}."
    )
