"""Named models: hub ids, local GGUF files, and which target a drafter pairs with.

A preset resolves to a local GGUF file when ``VOCABBRIDGE_MODELS`` points at a folder holding it
(``../shared/tools/fetch-models.sh`` assembles them), else to its hub id. Plain paths and hub ids
are accepted everywhere a preset is.

>>> resolve_model("qwen2.5-coder-0.5b", models_dir=None)
'Qwen/Qwen2.5-Coder-0.5B-Instruct'
>>> PRESETS["exaone-1.2b"].pairs_with
'exaone-4.5-33b'
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError


@dataclass(frozen=True)
class Preset:
    name: str
    hub_id: str
    role: str  # "target" | "drafter"
    gguf_file: str | None = None  # file name looked up under VOCABBRIDGE_MODELS
    pairs_with: str | None = None  # for drafters: the target preset it is meant for
    has_mtp: bool = False  # the checkpoint carries a multi-token-prediction head
    notes: str = ""
    vocab: str | None = None  # tokenizer family: presets with the same value share one vocabulary
    params_b: float | None = None  # parameters, in billions (memory checks before loading)


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset(
            "exaone-4.5-33b",
            "LGAI-EXAONE/EXAONE-4.5-33B",
            "target",
            has_mtp=True,
            vocab="exaone-4.5",
            params_b=33.0,
            notes="153,600-token byte-level BPE; one MTP layer; end-of-turn <|endofturn|> = 53",
        ),
        Preset(
            "exaone-4.5-33b-fp8",
            "LGAI-EXAONE/EXAONE-4.5-33B-FP8",
            "target",
            has_mtp=True,
            notes="FP8 weights",
            vocab="exaone-4.5",
            params_b=33.0,
        ),
        Preset(
            "exaone-1.2b",
            "LGAI-EXAONE/EXAONE-4.0-1.2B",
            "drafter",
            pairs_with="exaone-4.5-33b",
            vocab="exaone-4.0",
            params_b=1.28,
            notes="102,400-token vocabulary: needs the bridged or text drafter for 4.5",
        ),
        Preset(
            "qwen2.5-coder-1.5b",
            "Qwen/Qwen2.5-Coder-1.5B-Instruct",
            "target",
            gguf_file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            vocab="qwen2.5",
            params_b=1.54,
            notes="runs on CPU here",
        ),
        Preset(
            "qwen2.5-coder-0.5b",
            "Qwen/Qwen2.5-Coder-0.5B-Instruct",
            "drafter",
            gguf_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            pairs_with="qwen2.5-coder-1.5b",
            vocab="qwen2.5",
            params_b=0.49,
            notes="same vocabulary as the 1.5B target",
        ),
        Preset(
            "smollm2-135m",
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            "drafter",
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            pairs_with="qwen2.5-coder-1.5b",
            vocab="smollm2",
            params_b=0.135,
            notes="49,152-token vocabulary: bridged or text drafter for Qwen",
        ),
    ]
}


def models_dir() -> Path | None:
    d = os.environ.get("VOCABBRIDGE_MODELS")
    return Path(d).expanduser() if d else None


def resolve_model(name: str, *, models_dir: Path | None | str = "env") -> str:
    """A preset name → a local GGUF path (when present) or its hub id; anything else unchanged."""
    p = PRESETS.get(name)
    if p is None:
        return name
    folder = globals()["models_dir"]() if models_dir == "env" else (Path(models_dir) if models_dir else None)
    if p.gguf_file and folder is not None and (folder / p.gguf_file).is_file():
        return str(folder / p.gguf_file)
    return p.hub_id


def vocab_family(name: str) -> str | None:
    """The preset's vocabulary family (presets with the same family share one vocabulary); None for other names."""
    p = PRESETS.get(name)
    return p.vocab if p else None


def default_target_for(drafter: str) -> str:
    """The target a drafter preset pairs with; a ConfigError naming the fix otherwise."""
    p = PRESETS.get(drafter)
    if p is not None and p.pairs_with:
        return p.pairs_with
    raise ConfigError(
        f"--drafter {drafter} names no target; pass --target (a preset, a model folder, a .gguf file or a hub id). "
        f"Drafter presets that imply their target: {', '.join(n for n, q in PRESETS.items() if q.pairs_with)}."
    )


def describe_presets() -> list[dict]:
    """Every preset with what it resolves to here: a local GGUF file (``VOCABBRIDGE_MODELS``) or its hub id."""
    out = []
    for p in PRESETS.values():
        where = resolve_model(p.name)
        out.append(
            {
                "name": p.name,
                "role": p.role,
                "hub_id": p.hub_id,
                "pairs_with": p.pairs_with,
                "vocab": p.vocab,
                "has_mtp": p.has_mtp,
                "gguf_file": p.gguf_file,
                "resolves_to": where,
                "local": where != p.hub_id,
                "notes": p.notes,
            }
        )
    return out
