"""Draft heads: the modules the engine runs beside the target, and the folders they live in.

- ``draft_head.py``: the ``DraftHead`` base and the MTP head (DeepSeek-V3's MTP module on a decoder
  layer of the target's own class);
- ``eagle3.py``: the EAGLE-3 head (vLLM's eagle3 layer over the streams entering a few target layers);
- ``peagle.py``: the P-EAGLE head (EAGLE-3's layer proposing all k draft tokens in one forward);
- ``layouts.py``: real checkpoints' MTP weights (DeepSeek-V3, EXAONE 4.5 / Qwen3.5, MiMo);
- ``store.py``: a trained head on disk, refused for another target.

What makes heads (self-distillation data, training, export for vLLM) is ``vocabbridge.training``,
a floor above; this package never imports it. The engine's drafter is
``vocabbridge/engine/drafters/mtp.py`` (``--drafter mtp[:PATH]``). This package's ``__init__``
imports nothing heavy (``vocabbridge.spec`` reads it without torch).
"""

import json
from pathlib import Path

VLLM_EXPORT = "vllm"  # the vLLM export's folder inside a head folder (heads/NAME/vllm)
EXPORT_RECORD = "vocabbridge-export.json"  # written last by every export: its time says when the export was made


def _config(folder: str | Path) -> dict:
    try:
        cfg = json.loads((Path(folder).expanduser() / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return cfg if isinstance(cfg, dict) else {}


def head_target(folder: str | Path) -> str | None:
    """The target a head folder was trained for, as given to train-head (None when unreadable).

    >>> head_target("no/such/head") is None
    True
    """
    try:
        return _config(folder)["target"]["source"]
    except (KeyError, TypeError):
        return None


def head_arch(folder: str | Path) -> str:
    """A head folder's architecture, ``mtp``, ``eagle3`` or ``peagle`` (``mtp`` for heads from before
    EAGLE-3 and for unreadable folders, which the loader then refuses with the reason).

    >>> head_arch("no/such/head")
    'mtp'
    """
    return str(_config(folder).get("arch", "mtp"))


def head_from_checkpoint(folder: str | Path) -> bool:
    """Whether a head folder holds the target's own MTP head retrained (``train-head --init
    checkpoint``): vLLM then serves it in the target's own layout (``training/export_own.py``).

    >>> head_from_checkpoint("no/such/head")
    False
    """
    training = _config(folder).get("training")
    recipe = training.get("recipe") if isinstance(training, dict) else None
    return isinstance(recipe, dict) and recipe.get("init") == "checkpoint"


def head_parallel_tokens(folder: str | Path) -> int | None:
    """The draft tokens a P-EAGLE head folder proposes in one forward (None for other heads).

    >>> head_parallel_tokens("no/such/head") is None
    True
    """
    n = _config(folder).get("parallel_tokens")
    return int(n) if isinstance(n, int) else None
