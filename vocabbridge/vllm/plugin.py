"""A vLLM plugin: vLLM's ``VocabMapping`` built from a ``vocabbridge.map/1`` file.

vLLM loads every ``vllm.general_plugins`` entry point in each of its processes (the API server,
the engine core, the workers), before the model runner and its drafter exist; ``register`` below
is ours (pyproject.toml). It does nothing unless ``VOCABBRIDGE_VLLM_MAP`` names a map file, which
``vocabbridge serve --backend vllm --drafter MODEL --mode tli --map FILE`` sets. Then, in
``draft_model`` speculative decoding with ``use_heterogeneous_vocab``, vLLM's string-intersection
map is replaced by ours:

- pairs from the map (``--mode bytes`` maps pair by raw bytes and special tokens by role, e.g.
  EXAONE 4.0 ``[|endofturn|]`` with 4.5 ``<|endofturn|>``);
- a target id without a partner reaches the drafter as one drafter id: the first token of the
  input bridge's spelling of it (``VOCABBRIDGE_VLLM_MAP_UNPAIRED=first``, the default) or the
  drafter's unk as vLLM does (``=unk``);
- both tokenizers' fingerprints are checked against the map when the mapping is built: a map for
  other tokenizers stops vLLM at start-up with the message that says how to rebuild it.

On a vLLM whose ``VocabMapping`` is not the one this was written for (0.32: the class in
``vllm.v1.spec_decode.vocab_mapping``, constructed by ``vllm.v1.spec_decode.draft_model``), it
changes nothing and logs why.
"""

from __future__ import annotations

import inspect
import logging
import os

import numpy as np

from ..mapping import load_map
from ..mapping.tokenmap import unpaired_choice
from ..tokenizer import load_tokenizer

MAP_ENV = "VOCABBRIDGE_VLLM_MAP"
EXPECTED_ARGS = ("target_tokenizer", "draft_tokenizer", "target_vocab_size", "draft_vocab_size", "device")
EXPECTED_METHODS = ("map_target_to_draft_ids", "map_draft_to_target_ids", "constrain_draft_logits")

log = logging.getLogger("vocabbridge.vllm.plugin")


def register() -> None:
    """The entry point vLLM calls in each process; idempotent."""
    path = os.environ.get(MAP_ENV)
    if not path:
        return
    try:
        from vllm.v1.spec_decode import draft_model, vocab_mapping
    except ImportError as e:
        log.warning(
            "vocabbridge: %s is set but this vLLM has no vllm.v1.spec_decode.vocab_mapping (%s); its own map is used.", MAP_ENV, e
        )
        return
    original = getattr(vocab_mapping, "VocabMapping", None)
    why = _unknown(original, draft_model)
    if why:
        log.warning("vocabbridge: not replacing vLLM's VocabMapping (%s); vLLM's own map is used.", why)
        return
    if getattr(draft_model.VocabMapping, "_vocabbridge", False):
        return
    draft_model.VocabMapping = mapping_class(original, path)


def _unknown(cls, draft_model) -> str | None:
    if cls is None or not inspect.isclass(cls):
        return "no VocabMapping class"
    params = list(inspect.signature(cls.__init__).parameters)[1:]
    if tuple(params) != EXPECTED_ARGS:
        return f"its constructor takes ({', '.join(params)}), not ({', '.join(EXPECTED_ARGS)})"
    missing = [m for m in EXPECTED_METHODS if not hasattr(cls, m)]
    if missing:
        return f"it lacks {', '.join(missing)}"
    if getattr(draft_model, "VocabMapping", None) is None:
        return "vllm.v1.spec_decode.draft_model does not use it"
    return None


def mapping_class(original, path: str):
    """A subclass of vLLM's VocabMapping whose arrays come from the map file at ``path``."""

    class MapFileVocabMapping(original):
        _vocabbridge = True

        def __init__(self, target_tokenizer, draft_tokenizer, target_vocab_size, draft_vocab_size, device):
            import torch

            arrays = build_arrays(
                path,
                _source(target_tokenizer),
                _source(draft_tokenizer),
                target_vocab_size,
                draft_vocab_size,
                unpaired_choice(),
            )
            self.target_vocab_size, self.draft_vocab_size, self.device = target_vocab_size, draft_vocab_size, device
            self.target_unk_token_id = arrays["target_unk"]
            self.draft_unk_token_id = arrays["draft_unk"]
            self.draft_to_target_ids = torch.from_numpy(arrays["draft_to_target"]).to(device)
            self.target_to_draft_ids = torch.from_numpy(arrays["target_to_draft"]).to(device)
            self.intersection_mask_draft = torch.from_numpy(arrays["draft_to_target"] >= 0).to(device)
            self.intersection_size = int(self.intersection_mask_draft.sum().item())
            log.warning(
                "vocabbridge: VocabMapping from %s: %d drafter tokens paired (%.1f %% of the drafter's vocabulary), "
                "unpaired target tokens reach the drafter as %s",
                path,
                self.intersection_size,
                100 * self.intersection_size / max(draft_vocab_size, 1),
                arrays["unpaired"],
            )

    return MapFileVocabMapping


def _source(tokenizer) -> str:
    return getattr(tokenizer, "name_or_path", None) or str(tokenizer)


def build_arrays(
    path: str, target_source: str, draft_source: str, target_vocab_size: int, draft_vocab_size: int, unpaired: str = "first"
) -> dict:
    """vLLM's VocabMapping arrays from a map file, checked against the two tokenizers vLLM runs.

    ``target_to_draft`` has no -1: every target id has the one drafter id the drafter reads for it
    (its partner, else per ``unpaired``); ``draft_to_target`` is -1 for drafter ids without a
    partner (vLLM masks those drafter logits).
    """
    tm = load_map(path, drafter=load_tokenizer(draft_source), target=load_tokenizer(target_source))
    d2t = np.full(draft_vocab_size, -1, dtype=np.int64)
    n = min(draft_vocab_size, len(tm.draft_to_target))
    d2t[:n] = tm.draft_to_target[:n]
    d2t[d2t >= target_vocab_size] = -1
    inputs = tm.single_token_inputs(unpaired)
    t2d = np.full(target_vocab_size, tm.draft_unk_id or 0, dtype=np.int64)
    n = min(target_vocab_size, len(inputs))
    t2d[:n] = inputs[:n]
    t2d[t2d >= draft_vocab_size] = tm.draft_unk_id or 0
    return {
        "draft_to_target": d2t,
        "target_to_draft": t2d,
        "draft_unk": tm.draft_unk_id or 0,
        "target_unk": tm.target_unk_id or 0,
        "unpaired": unpaired,
    }
