"""``build_token_map(drafter, target, mode=...)``: the two maps, as one pure function.

>>> tm = build_token_map(smollm2_view, qwen3_view)  # doctest: +SKIP
>>> tm.mode, tm.pairs, tm.draft_ids_for_target(151645)  # doctest: +SKIP
('bytes', 48876, (2,))
"""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError
from ..tokenizer.view import TokenizerView
from .bridge import build_input_bridge
from .bytes_mode import bytes_pairs
from .string_match import fallback_id, vllm_pairs
from .tokenmap import MODES, LazyBridge, MapSide, TokenMap


def _size(given: int | None, view: TokenizerView, what: str) -> int | None:
    if given is None:
        return view.model_vocab_size
    if not isinstance(given, int) or given < 1:
        raise ConfigError(f"{what}_vocab_size must be a positive integer (the model's embedding rows), got {given!r}.")
    return given


def build_token_map(
    drafter: TokenizerView,
    target: TokenizerView,
    *,
    mode: str = "bytes",
    drafter_vocab_size: int | None = None,
    target_vocab_size: int | None = None,
) -> TokenMap:
    """Pair drafter and target ids (``mode="bytes"``: by raw bytes and roles; ``"vllm"``: vLLM's
    string intersection), and attach the input bridge (computed on first use of ``input_bridge``).

    ``*_vocab_size`` are the models' vocabulary sizes (embedding rows); they default to what the
    views know (config.json, GGUF) and else to the tokenizers' sizes. Ids at or beyond them never pair.
    """
    if mode not in MODES:
        raise ConfigError(f"unknown map mode {mode!r}: use 'bytes' (pairs by raw bytes and roles) or 'vllm' (vLLM's rule).")
    dside = MapSide.of(drafter, _size(drafter_vocab_size, drafter, "drafter"))
    tside = MapSide.of(target, _size(target_vocab_size, target, "target"))
    d2t = np.full(dside.id_space, -1, dtype=np.int64)
    t2d = np.full(tside.id_space, -1, dtype=np.int64)
    if mode == "vllm":
        t_ids, d_ids, stats = vllm_pairs(drafter, target, drafter_vocab_size=dside.vocab_size, target_vocab_size=tside.vocab_size)
        t2d[t_ids] = d_ids
        d2t[d_ids] = t_ids
    else:
        t2d_writes, d2t_writes, stats = bytes_pairs(
            drafter, target, drafter_vocab_size=dside.vocab_size, target_vocab_size=tside.vocab_size
        )
        for idx, val in t2d_writes:
            t2d[idx] = val
        for idx, val in d2t_writes:
            d2t[idx] = val
    unk = fallback_id(drafter)

    def bridge() -> dict[int, tuple[int, ...]]:
        return build_input_bridge(drafter, target, t2d, fallback_id=unk)[0]

    return TokenMap(
        mode, dside, tside, d2t, t2d, LazyBridge(bridge), draft_unk_id=unk, target_unk_id=fallback_id(target), stats=stats
    )
