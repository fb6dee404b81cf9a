"""The tokenizer stored in a GGUF file's metadata, converted exactly as transformers does when
it loads the model with ``gguf_file=`` (so the view matches what the model runs with)."""

from __future__ import annotations

import json
from pathlib import Path

from ...errors import TokenizerSourceError, UnsupportedTokenizerError
from ..view import TokenizerView, view_from_doc


def load_gguf(path: Path, *, source: str | None = None) -> TokenizerView:
    try:
        from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer
    except ImportError as e:  # pragma: no cover - depends on the transformers version
        raise TokenizerSourceError(f"{path}: this transformers has no GGUF tokenizer support ({e}); upgrade transformers.") from e
    try:
        architecture, tok_dict, tok_config = get_gguf_tokenizer(str(path))
    except ImportError as e:
        raise TokenizerSourceError(f"{path}: reading GGUF needs the 'gguf' package: pip install gguf ({e}).") from e
    except Exception as e:  # noqa: BLE001 - gguf raises bare ValueError/struct errors on bad files
        raise TokenizerSourceError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e}).") from e
    kind = tok_dict.get("tokenizer_type") or tok_dict.get("model")
    if not tok_dict.get("tokens"):
        raise TokenizerSourceError(f"{path}: the GGUF metadata holds no tokenizer.ggml.tokens.")
    if kind not in ("gpt2", "llama"):
        raise UnsupportedTokenizerError(f"{path}: GGUF tokenizer model {kind!r} is not BPE (gpt2/llama); it is not supported.")
    try:
        fast, _ = convert_gguf_tokenizer(architecture, tok_dict)
    except Exception as e:  # noqa: BLE001
        raise TokenizerSourceError(f"{path}: transformers could not convert the GGUF tokenizer ({e}).") from e
    text = fast.to_str()
    config_ids = {
        role: tok_dict[f"{role}_token_id"]
        for role in ("bos", "eos", "unk", "pad")
        if isinstance(tok_dict.get(f"{role}_token_id"), int)
    }
    config = {"chat_template": tok_config.get("chat_template"), "add_bos_token": tok_config.get("add_bos_token")}
    return view_from_doc(
        json.loads(text),
        source=source or str(path),
        fmt="gguf",
        config=config,
        config_ids=config_ids,
        model_vocab_size=len(tok_dict["tokens"]),
        doc_json=text,
    )
