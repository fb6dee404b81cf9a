"""Give a drafter the target's tokenizer: rows copied where the bytes agree, composed from the
drafter's own spelling elsewhere (mean, first, decay:F, omp), healed on the target's answers; the
result is a plain same-vocabulary drafter for every engine (ours, vLLM's draft_model, llama.cpp).

``plan_rows`` needs the tokenizers only (no torch); the rest is imported when first used.

>>> from vocabbridge.transplant import plan_rows, transplant  # doctest: +SKIP
>>> plan_rows(drafter_view, target_view).counts  # doctest: +SKIP
"""

import importlib

from .plan import RowPlan, plan_rows

_LAZY = {
    "TransplantResult": "build",
    "read_record": "build",
    "transplant": "build",
    "Init": "rows",
    "build_rows": "rows",
    "heal": "heal",
    "HealRecipe": "heal",
}

__all__ = ["RowPlan", "plan_rows", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
