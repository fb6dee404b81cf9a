"""Draft heads: the modules the engine runs beside the target, and the folders they live in.

- ``draft_head.py``: the ``DraftHead`` base and the MTP head (DeepSeek-V3's MTP module on a decoder
  layer of the target's own class);
- ``eagle3.py``: the EAGLE-3 head (vLLM's eagle3 layer over the streams entering a few target layers);
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
    """A head folder's architecture, ``mtp`` or ``eagle3`` (``mtp`` for heads from before EAGLE-3 and
    for unreadable folders, which the loader then refuses with the reason).

    >>> head_arch("no/such/head")
    'mtp'
    """
    return str(_config(folder).get("arch", "mtp"))
