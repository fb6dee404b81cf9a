"""An :class:`~vocabbridge.spec.EngineSpec` in vLLM's terms: its ``--speculative-config``, what vLLM
loads for a name, and which of our options vLLM ignores (pure: no vLLM, no torch).

One source for ``serve --backend vllm``, ``build-map``'s hand-off and the bench. Per drafter, field
names as in vLLM's ``SpeculativeConfig``:

- a model with the target's vocabulary: ``{"method": "draft_model", "model": D, "num_speculative_tokens": k}``;
- a model with another vocabulary (``--mode auto`` or ``tli``): the same plus
  ``"use_heterogeneous_vocab": true, "draft_sample_method": "greedy"``, vLLM's token-level path,
  with *our* token map in place of its string match (the vocabbridge plugin; measured fastest in
  vLLM: 5.32 tok/s against 4.05 for our text proposer and 4.67 with no speculation);
- ``--mode text`` / ``bridged``, ``--drafter ngram-map``, and a model with the target's vocabulary
  given ``--ngram-first`` or ``--min-confidence`` (which vLLM's ``draft_model`` lacks): our drafters
  as ``custom_class`` proposers;
- ``ngram``, ``suffix``, ``mtp[:HEAD]``: vLLM's own methods; ``none``: no ``--speculative-config``.

>>> from vocabbridge.spec import EngineSpec
>>> speculative_config(EngineSpec(target="qwen2.5-coder-1.5b", drafter="ngram", num_speculative_tokens=3))
{'method': 'ngram', 'num_speculative_tokens': 3, 'prompt_lookup_min': 1, 'prompt_lookup_max': 4}
>>> speculative_config(EngineSpec(drafter="exaone-1.2b", num_speculative_tokens=3), same_vocabulary=False)
{'method': 'draft_model', 'model': 'LGAI-EXAONE/EXAONE-4.0-1.2B', 'num_speculative_tokens': 3, \
'use_heterogeneous_vocab': True, 'draft_sample_method': 'greedy'}
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from pathlib import Path

from ..errors import ConfigError, VocabBridgeError
from ..heads import VLLM_EXPORT, head_arch, head_from_checkpoint, head_parallel_tokens
from ..presets import PRESETS, vocab_family
from ..spec import BY_NGRAM_MAP, BY_PROPOSERS, DRAFTERS, DrafterMethod, EngineSpec, options, resolve_method
from ..tokenizer import load_tokenizer, same_vocabulary

PROPOSERS = "vocabbridge.vllm.proposers"
PROPOSER_METHODS = {  # class → method
    "TextProposer": "text",
    "BridgedProposer": "bridged",
    "DraftProposer": "draft",
    "NgramMapProposer": "ngram-map",
}

ModelFor = Callable[[str], str]


def hub_model(name: str) -> str:
    """A preset → its hub id (what vLLM loads); anything else unchanged.

    >>> hub_model("qwen2.5-coder-0.5b"), hub_model("/models/x")
    ('Qwen/Qwen2.5-Coder-0.5B-Instruct', '/models/x')
    """
    p = PRESETS.get(name)
    return p.hub_id if p else name


# ==== one translation per registered method =====================================================


def _none(spec: EngineSpec, model_for: ModelFor, notes: list[str]) -> dict | None:
    return None


def _ngram(spec, model_for, notes):
    return {
        "method": "ngram",
        "num_speculative_tokens": spec.num_speculative_tokens,
        "prompt_lookup_min": spec.prompt_lookup_min,
        "prompt_lookup_max": spec.prompt_lookup_max,
    }


def _suffix(spec, model_for, notes):
    """vLLM's own suffix decoding; it runs Arctic Inference's suffix trees and refuses the method without them."""
    if importlib.util.find_spec("arctic_inference") is None:
        notes.append("vLLM's suffix method needs the arctic-inference package beside vLLM, and it is not installed here")
    return {
        "method": "suffix",
        "num_speculative_tokens": spec.num_speculative_tokens,
        "suffix_decoding_max_tree_depth": spec.suffix_max_depth,
        "suffix_decoding_max_cached_requests": spec.suffix_max_cached_requests,
        "suffix_decoding_max_spec_factor": spec.suffix_max_spec_factor,
        "suffix_decoding_min_token_prob": spec.suffix_min_prob,
    }


HEAD_LAYOUTS = {  # a trained head's architecture → how vLLM serves its export (method, what the notes say)
    "mtp": ("mtp", "MiMo's MTP layout"),
    "eagle3": ("eagle3", "vLLM's EAGLE-3 layout, drafting over its own vocabulary (d2t)"),
    "peagle": ("eagle3", "vLLM's EAGLE-3 layout with its mask position, drafting in parallel (parallel_drafting)"),
    "own": ("mtp", "the target's own MTP layout (its weight files linked, only the MTP tensors replaced)"),
}  # "own": the target's own MTP head retrained (train-head --init checkpoint), served by vLLM's native mtp


def _mtp(spec, model_for, notes):
    """The checkpoint's own MTP layer; with ``mtp:PATH``, a trained head exported for vLLM
    (``vocabbridge.training.export.export_for_vllm`` writes it in ``PATH/vllm``: an EAGLE-3 head as
    vLLM's EAGLE-3 checkpoint, a P-EAGLE head as the same with ``parallel_drafting`` on, an MTP head
    in MiMo's MTP layout, the target's own MTP head retrained back in the target's own layout)."""
    if spec.drafter_path:
        exported = Path(spec.drafter_path).expanduser() / VLLM_EXPORT
        arch = "own" if head_from_checkpoint(spec.drafter_path) else head_arch(spec.drafter_path)
        method, layout = HEAD_LAYOUTS.get(arch, HEAD_LAYOUTS["mtp"])
        notes.append(f"the head {spec.drafter_path} reaches vLLM as its export in {layout} ({exported}, written when stale)")
        out = {"method": method, "model": str(exported), "num_speculative_tokens": spec.num_speculative_tokens}
        if arch == "peagle":
            out["parallel_drafting"] = True  # vLLM's P-EAGLE: the k − 1 mask positions in the same forward
            most = head_parallel_tokens(spec.drafter_path)
            if most and spec.num_speculative_tokens > most:
                notes.append(
                    f"the P-EAGLE head was trained for {most} parallel tokens: vLLM drafts {most}, not {out['num_speculative_tokens']}"
                )
                out["num_speculative_tokens"] = most
        return out
    p = PRESETS.get(spec.target_name)
    if p is not None and not p.has_mtp:
        raise ConfigError(
            f"{spec.target_name} has no MTP head; use --drafter ngram or a draft model with it, or train a head "
            f"(vocabbridge train-head --target {spec.target_name} -o heads/NAME) and pass --drafter mtp:heads/NAME."
        )
    return {"method": "mtp", "num_speculative_tokens": spec.num_speculative_tokens}


def _self(spec, model_for, notes):
    raise ConfigError(
        f"--drafter {spec.drafter} (self-speculation) runs in the embedded engine only (serve --backend embedded): "
        "vLLM has no early-exit (LayerSkip) method; in vLLM use --drafter ngram, mtp or a draft model."
    )


def _draft(spec, model_for, notes):
    """vLLM's own ``draft_model``, or our DraftProposer where an option only ours honours is set
    (prompt lookup first, the confidence gate): vLLM's drafts k tokens every step."""
    if spec.ngram_first or spec.min_confidence > 0:
        asked = [f for f, on in (("--ngram-first", spec.ngram_first), ("--min-confidence", spec.min_confidence > 0)) if on]
        notes.append(
            f"{' and '.join(asked)}: vocabbridge's draft proposer runs the drafter, not vLLM's draft_model (which drafts "
            "k tokens every step, with no prompt lookup)"
        )
        return _proposer("DraftProposer")(spec, model_for, notes)
    return _plain_draft(spec, model_for)


def _plain_draft(spec, model_for):
    return {"method": "draft_model", "model": model_for(spec.drafter), "num_speculative_tokens": spec.num_speculative_tokens}


def _tli(spec, model_for, notes):
    """vLLM's token-level path (draft_model with use_heterogeneous_vocab, greedy draft sampling only),
    its VocabMapping built by our plugin from our token map (--map, else ours built and cached at start)."""
    source = spec.map_path or f"our {spec.map_mode} map, built and cached before vLLM starts"
    notes.append(f"vLLM's VocabMapping comes from {source} (the vocabbridge plugin), not from vLLM's string match")
    return _plain_draft(spec, model_for) | {"use_heterogeneous_vocab": True, "draft_sample_method": "greedy"}


def _proposer(name: str):
    """Our drafter inside vLLM, as a ``custom_class`` proposer (vocabbridge/vllm/proposers.py)."""

    def build(spec, model_for, notes):
        return {"method": "custom_class", "model": f"{PROPOSERS}.{name}", "num_speculative_tokens": spec.num_speculative_tokens}

    return build


METHODS: dict[str, Callable[[EngineSpec, ModelFor, list[str]], dict | None]] = {
    "none": _none,
    "ngram": _ngram,
    "ngram-map": _proposer("NgramMapProposer"),
    "suffix": _suffix,
    "mtp": _mtp,
    "self": _self,
    "draft": _draft,
    "bridged": _proposer("BridgedProposer"),
    "text": _proposer("TextProposer"),
    "tli": _tli,
}
assert set(METHODS) == set(DRAFTERS), "every registered drafter needs its vLLM translation"


def vllm_method(spec: EngineSpec, *, same_vocabulary: bool | None) -> DrafterMethod:
    """The method vLLM runs for ``spec``: as :func:`~vocabbridge.spec.resolve_method`, except that a
    model drafter with ``--mode auto`` and another (or an unknown) vocabulary takes vLLM's token-level
    path with our map (``tli``), which we measured fastest inside vLLM, not our text proposer.

    >>> vllm_method(EngineSpec(target="t", drafter="m"), same_vocabulary=False).name
    'tli'
    >>> vllm_method(EngineSpec(target="t", drafter="m", mode="text"), same_vocabulary=False).name
    'text'
    """
    if spec.uses_model and spec.mode == "auto":
        return DRAFTERS["draft" if same_vocabulary else "tli"]
    return resolve_method(spec, same_vocabulary=same_vocabulary)


def speculative_config(
    spec: EngineSpec,
    *,
    same_vocabulary: bool | None = None,
    model_for: ModelFor = hub_model,
    notes: list[str] | None = None,
) -> dict | None:
    """vLLM's ``--speculative-config`` for ``spec`` (None without a drafter). ``same_vocabulary``:
    whether a model drafter shares the target's vocabulary (None: unknown, and the heterogeneous
    path, safe either way, is taken). ``model_for``: what vLLM loads for a model name. ``notes``
    collects how it was decided."""
    notes = notes if notes is not None else []
    method = vllm_method(spec, same_vocabulary=same_vocabulary)
    if method.name == "draft" and same_vocabulary is None:
        method = DRAFTERS["tli"]
    return METHODS[method.name](spec, model_for, notes)


def spec_method(cfg: dict | None) -> str:
    """The registered method a ``--speculative-config`` runs: ``text`` for our TextProposer, ``tli``
    for a heterogeneous draft model, ``none`` for no config …

    >>> spec_method({"method": "custom_class", "model": "vocabbridge.vllm.proposers.TextProposer"}), spec_method(None)
    ('text', 'none')
    """
    if cfg is None:
        return "none"
    if (ours := our_proposer(cfg)) is not None:
        return ours
    if cfg["method"] == "draft_model":
        return "tli" if cfg.get("use_heterogeneous_vocab") else "draft"
    return cfg["method"]


def our_proposer(cfg: dict | None) -> str | None:
    """The method of the vocabbridge proposer a ``--speculative-config`` runs, None for vLLM's own.

    >>> our_proposer({"method": "custom_class", "model": "vocabbridge.vllm.proposers.DraftProposer"})
    'draft'
    >>> our_proposer({"method": "draft_model", "model": "drafters/smollm2-qwen"}) is None
    True
    """
    if cfg is not None and cfg["method"] == "custom_class" and cfg["model"].startswith(PROPOSERS):
        return PROPOSER_METHODS[cfg["model"].rsplit(".", 1)[-1]]
    return None


def engine_only_notes(spec: EngineSpec, cfg: dict | None) -> list[str]:
    """What vLLM ignores in ``spec`` run as ``cfg`` (its ``--speculative-config``): the fields set
    away from their default that have no vLLM meaning, or that only vocabbridge's own model
    proposers (text, bridged, draft) honour when ``cfg`` does not run one of them."""
    method = spec_method(cfg)
    ours = our_proposer(cfg) in ("text", "bridged", "draft")
    flags = [
        o.flag
        for name, o, default in options()
        if getattr(spec, name) != default
        and (o.vllm is None or (o.vllm == BY_PROPOSERS and not ours) or (o.vllm == BY_NGRAM_MAP and method != "ngram-map"))
    ]
    return [f"{'/'.join(flags)} apply to the embedded engine only" + ("" if ours else " here")] if flags else []


# ==== whether two models share a vocabulary =====================================================


def _stamp(path: str) -> tuple:
    """What identifies a local tokenizer's version: each file's size and modification time."""
    p = Path(path).expanduser()
    files = [p] if p.is_file() else sorted(x for x in p.iterdir() if x.is_file())
    return tuple((x.name, x.stat().st_size, x.stat().st_mtime_ns) for x in files)


@functools.lru_cache(maxsize=32)
def _compare_local(d: str, t: str, _d_stamp: tuple, _t_stamp: tuple) -> tuple[bool | None, str]:
    """Two local tokenizers compared token by token, remembered while their files are unchanged
    (loading a GGUF's vocabulary takes seconds; bench and the vLLM command builder ask again and again)."""
    return _compare(d, t)


def _compare(d: str, t: str) -> tuple[bool | None, str]:
    try:
        dv, tv = load_tokenizer(d), load_tokenizer(t)
    except VocabBridgeError as e:
        return None, f"could not load the tokenizers to compare them ({e})"
    return same_vocabulary(dv, tv), "tokenizers compared token by token"


def vocabularies_match(drafter: str, target: str, *, resolve: Callable[[str], str]) -> tuple[bool | None, str]:
    """Whether two models (by name) share a vocabulary, and how that was decided: local
    tokenizers compared token by token; else the presets' vocabulary families; else the
    tokenizers loaded from wherever they live (None when that fails)."""

    local = [resolve(n) for n in (drafter, target)]
    if all(Path(p).expanduser().exists() for p in local):
        return _compare_local(*local, *(_stamp(p) for p in local))
    fd, ft = vocab_family(drafter), vocab_family(target)
    if fd and ft:
        return fd == ft, f"presets: {fd} vs {ft} vocabulary"
    return _compare(hub_model(drafter), hub_model(target))
