"""Token maps for a drafter/target pair, built once and cached by both tokenizers' fingerprints.

The engine and the vLLM plugin need a map for the tokenizers they actually run with; a map given
by the user is checked against them, a missing one is built (bytes or vllm rule) and kept under
``$VOCABBRIDGE_CACHE/maps`` (default ``~/.cache/vocabbridge/maps``).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..tokenizer.view import TokenizerView
from .build import build_token_map
from .mapfile import load_map, save_map
from .tokenmap import TokenMap


def cache_root() -> Path:
    return Path(os.environ.get("VOCABBRIDGE_CACHE", Path.home() / ".cache" / "vocabbridge"))


def map_cache_path(drafter_fp: str, target_fp: str, mode: str) -> Path:
    return cache_root() / "maps" / f"{drafter_fp[:16]}_to_{target_fp[:16]}_{mode}.json"


def token_map_for(
    drafter: TokenizerView,
    target: TokenizerView,
    *,
    path: str | Path | None = None,
    mode: str = "bytes",
    drafter_vocab_size: int | None = None,
    target_vocab_size: int | None = None,
) -> TokenMap:
    """``path`` checked against both tokenizers, else the cached map, else a new one (then cached)."""
    if path:
        return load_map(path, drafter=drafter, target=target)
    cached = map_cache_path(drafter.fingerprint, target.fingerprint, mode)
    if cached.is_file():
        return load_map(cached, drafter=drafter, target=target)
    tm = build_token_map(drafter, target, mode=mode, drafter_vocab_size=drafter_vocab_size, target_vocab_size=target_vocab_size)
    save_map(tm, cached)
    return tm
