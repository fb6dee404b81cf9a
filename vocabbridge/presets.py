"""Named models: hub ids, local GGUF files, and which target a drafter pairs with.

A preset resolves to a local GGUF file when ``VOCABBRIDGE_MODELS`` points at a folder holding it
(``../shared/tools/fetch-models.sh`` assembles them), else to its hub id. Plain paths and hub ids
(``org/name``) are accepted everywhere a preset is; any other name is refused at once, with the
presets it may have meant (a typo never reaches the hub).

>>> resolve_model("qwen2.5-coder-0.5b", models_dir=None)
'Qwen/Qwen2.5-Coder-0.5B-Instruct'
>>> resolve_model("qwen2.5-coder-05b")
Traceback (most recent call last):
...
vocabbridge.errors.ConfigError: unknown model 'qwen2.5-coder-05b': ... Did you mean qwen2.5-coder-0.5b or qwen2.5-coder-1.5b? ...
>>> PRESETS["exaone-1.2b"].pairs_with
'exaone-4.5-33b'
>>> resolve_model("exaone-1.2b-4.5vocab")  # vocabbridge transplant writes it (TRANSPLANT_EXAONE)
'drafters/exaone-1.2b-4.5vocab'
"""

from __future__ import annotations

import difflib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError
from .util import looks_like_hub_id


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
    transplanted: str | None = None  # a drafter given its target's tokenizer: its folder under drafters_dir()


TRANSPLANT_EXAONE = (
    "vocabbridge transplant LGAI-EXAONE/EXAONE-4.0-1.2B --to LGAI-EXAONE/EXAONE-4.5-33B -o drafters/exaone-1.2b-4.5vocab"
)

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
            notes="102,400-token vocabulary: needs the bridged or text drafter for 4.5, or its transplant (exaone-1.2b-4.5vocab)",
        ),
        Preset(
            "exaone-1.2b-4.5vocab",
            "LGAI-EXAONE/EXAONE-4.0-1.2B",
            "drafter",
            pairs_with="exaone-4.5-33b",
            vocab="exaone-4.5",
            params_b=1.28 + 0.1,  # 51,200 more embedding rows (tied) than the 1.2B
            transplanted="exaone-1.2b-4.5vocab",
            notes="the 1.2B with EXAONE 4.5's tokenizer, a plain same-vocabulary drafter; make it once with "
            f"`{TRANSPLANT_EXAONE}`",
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


def drafters_dir() -> Path:
    """Where transplanted drafter presets live: ``$VOCABBRIDGE_DRAFTERS``, else ``./drafters``."""
    return Path(os.environ.get("VOCABBRIDGE_DRAFTERS", "drafters")).expanduser()


def models_dir_problem() -> str | None:
    """Why ``VOCABBRIDGE_MODELS`` cannot be used (it names no folder), or None (unset, or a folder)."""
    folder = models_dir()
    if folder is None or folder.is_dir():
        return None
    what = "is a file, not a folder" if folder.exists() else "does not exist"
    return (
        f"VOCABBRIDGE_MODELS={folder} {what}, so presets resolve to their hub ids, not to local GGUF files; "
        "point it at the folder of GGUF files (../shared/tools/fetch-models.sh DEST) or unset it"
    )


_said: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        print(f"vocabbridge: warning: {message}", file=sys.stderr, flush=True)


def resolve_model(name: str, *, models_dir: Path | None | str = "env") -> str:
    """A preset name → a local GGUF path (when present) or its hub id; a path or a hub id unchanged;
    any other name → a ConfigError naming the presets it may have meant. A ``VOCABBRIDGE_MODELS``
    that names no folder is said on stderr (once), not passed over in silence."""
    p = PRESETS.get(name)
    if p is None:
        check_model_name(name)
        return name
    if p.transplanted:  # the folder `vocabbridge transplant` writes (`vocabbridge presets` shows the command)
        return str(drafters_dir() / p.transplanted)
    from_env = models_dir == "env"
    folder = globals()["models_dir"]() if from_env else (Path(models_dir) if models_dir else None)
    if p.gguf_file and folder is not None and (folder / p.gguf_file).is_file():
        return str(folder / p.gguf_file)
    if p.gguf_file and from_env and (problem := models_dir_problem()):
        _warn_once(problem)
    return p.hub_id


def check_model_name(name: str) -> None:
    """Refuse a name that is neither a preset, an existing file or folder, nor a hub id (``org/name``):
    a typo of a preset would otherwise go to the hub (and retry there for half a minute)."""
    if name in PRESETS or Path(name).expanduser().exists() or looks_like_hub_id(name):
        return
    if "/" in name or name.startswith((".", "~")) or name.endswith(".gguf"):
        raise ConfigError(f"{name}: no such file or folder; give a model folder, a .gguf file, a preset or a hub id (org/name).")
    close = difflib.get_close_matches(name, PRESETS, n=3, cutoff=0.6)
    guess = f" Did you mean {' or '.join(close)}?" if close else ""
    raise ConfigError(
        f"unknown model {name!r}: not a preset, a file or folder here, nor a hub id (org/name).{guess} "
        f"Presets: {', '.join(PRESETS)} (vocabbridge presets lists them)."
    )


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
    """Every preset with what it resolves to here: a local GGUF file (``VOCABBRIDGE_MODELS``), a
    transplanted drafter's folder, or its hub id."""
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
                "local": Path(where).exists(),
                "notes": p.notes,
            }
        )
    return out
