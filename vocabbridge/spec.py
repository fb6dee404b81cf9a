"""The speculative-decoding configuration and the drafter registry, in one place (no torch, no click).

``EngineSpec`` is one frozen dataclass. Each field carries its command-line flag, help text,
default, value type and what vLLM does with it (:class:`Option`). Everything else that spells a
configuration is derived from these fields, so adding an option is one edit here:

- the click options of ``generate``, ``eval-drafter``, ``serve`` and ``bench`` (``cli/options.py``);
- :func:`serve_argv`, the ``vocabbridge serve`` command a bench launches for a configuration;
- :func:`vllm_speculative_config` (vLLM's ``--speculative-config``) and :func:`engine_only_notes`.

Drafters are registered by name in ``DRAFTERS`` (like tiktoken's encoding constructors): whether
each runs a drafter model, how the embedded engine builds it (``"module:Class"``, imported when
used, so this module never imports torch) and what vLLM runs for it.

>>> spec = EngineSpec(target="qwen2.5-coder-1.5b", drafter="ngram", num_speculative_tokens=3)
>>> vllm_speculative_config(spec)
{'method': 'ngram', 'num_speculative_tokens': 3, 'prompt_lookup_min': 1, 'prompt_lookup_max': 4}
>>> serve_argv(spec)
['--target', 'qwen2.5-coder-1.5b', '--drafter', 'ngram', '-k', '3']
>>> resolve_method(EngineSpec(target="t", drafter="m"), same_vocabulary=False).name
'text'
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError, VocabBridgeError
from .heads import VLLM_EXPORT, head_arch, head_target
from .presets import PRESETS, default_target_for, vocab_family
from .tokenizer import load_tokenizer, same_vocabulary

# ==== options: one field, its flag, help and vLLM meaning ======================================


@dataclass(frozen=True)
class Option:
    """How a field of :class:`EngineSpec` appears on the command line and in vLLM."""

    flag: str  # the long flag, e.g. "--num-speculative-tokens"
    help: str
    kind: str = "str"  # str | int | float | bool | choice | path
    short: str | None = None  # e.g. "-k"
    off_flag: str | None = None  # bools: the flag that sets False (--fixed-k)
    choices: tuple[str, ...] = ()
    lo: float | None = None  # ranges (inclusive; ``hi_open`` makes the upper bound exclusive)
    hi: float | None = None
    hi_open: bool = False
    metavar: str | None = None
    vllm: str | None = None  # what vLLM does with it; None = the embedded engine only


def _opt(default: Any, flag: str, help: str, **kw) -> Any:
    return field(default=default, metadata={"option": Option(flag, help, **kw)})


MAP_MODES = ("bytes", "vllm")
BY_PROPOSERS = "honoured by vocabbridge's proposers in vLLM (bridged, text)"
BY_NGRAM_MAP = "honoured by vocabbridge's ngram-map proposer in vLLM"


@dataclass(frozen=True)
class EngineSpec:
    """One speculative-decoding configuration: target, drafter and the engine's options."""

    target: str | None = _opt(
        None,
        "--target",
        "Target: a preset (vocabbridge presets), a model folder, a .gguf file "
        "or a hub id. Defaults to the drafter preset's target.",
        metavar="MODEL",
        vllm="the model vLLM serves",
    )
    drafter: str = _opt(
        "none",
        "--drafter",
        "What drafts: none, ngram, mtp, or a drafter model (a preset, a folder, a .gguf file or a hub id).",
        metavar="DRAFTER",
        vllm="the speculative method (and draft model)",
    )
    mode: str = _opt(
        "auto",
        "--mode",
        "How a model drafter meets the target: draft (same vocabulary), bridged (token map and input "
        "bridge), text (re-tokenized drafted text), tli (vLLM's token-level intersection). auto: draft when "
        "the vocabularies match, else text.",
        kind="choice",
        choices=("auto", "draft", "bridged", "text", "tli"),
        vllm="the speculative method",
    )
    map_path: str | None = _opt(
        None,
        "--map",
        "Token map for --mode bridged or tli (built and cached when absent); with --backend vllm --mode tli, vLLM's "
        "VocabMapping is built from it.",
        kind="path",
        metavar="FILE",
        vllm="VocabMapping (tli, the vocabbridge plugin)",
    )
    map_mode: str = _opt(
        "bytes",
        "--map-mode",
        "How a missing token map is built: bytes (pairs by raw bytes and roles) or vllm (vLLM's string match).",
        kind="choice",
        choices=MAP_MODES,
        vllm=BY_PROPOSERS,
    )
    num_speculative_tokens: int = _opt(
        4,
        "--num-speculative-tokens",
        "Draft tokens per step (k).",
        kind="int",
        short="-k",
        lo=1,
        hi=64,
        vllm="num_speculative_tokens",
    )
    prompt_lookup_min: int = _opt(
        1,
        "--prompt-lookup-min",
        "n-gram drafting: the shortest context suffix matched (as vLLM's prompt_lookup_min).",
        kind="int",
        lo=1,
        vllm="prompt_lookup_min (ngram)",
    )
    prompt_lookup_max: int = _opt(
        4,
        "--prompt-lookup-max",
        "n-gram drafting: the longest context suffix matched (as vLLM's prompt_lookup_max).",
        kind="int",
        lo=1,
        vllm="prompt_lookup_max (ngram)",
    )
    ngram_map_n: int = _opt(
        12,
        "--ngram-map-n",
        "ngram-map: key length in tokens (llama.cpp's size-n; 12-16 suit code, 8-10 text).",
        kind="int",
        lo=1,
        vllm=BY_NGRAM_MAP,
    )
    ngram_map_value: int = _opt(
        8,
        "--ngram-map-value",
        "ngram-map: tokens of continuation stored per key (the longest proposal).",
        kind="int",
        lo=1,
        vllm=BY_NGRAM_MAP,
    )
    ngram_map_min_hits: int = _opt(
        1,
        "--ngram-map-min-hits",
        "ngram-map: propose a continuation only once it has followed its key this many times (2 suits text).",
        kind="int",
        lo=1,
        vllm=BY_NGRAM_MAP,
    )
    suffix_max_depth: int = _opt(
        24,
        "--suffix-max-depth",
        "suffix: the longest substring its trees keep, so the longest context suffix matched plus the tokens proposed after it.",
        kind="int",
        lo=2,
        vllm="suffix_decoding_max_tree_depth (suffix)",
    )
    suffix_max_spec_factor: float = _opt(
        1.0,
        "--suffix-max-spec-factor",
        "suffix: propose at most this many tokens per matched context token (and at most k).",
        kind="float",
        lo=0.0,
        vllm="suffix_decoding_max_spec_factor (suffix)",
    )
    suffix_min_prob: float = _opt(
        0.1,
        "--suffix-min-prob",
        "suffix: stop the draft where its estimated probability (the product of how often each token followed "
        "the one before) falls below this.",
        kind="float",
        lo=0.0,
        hi=1.0,
        vllm="suffix_decoding_min_token_prob (suffix)",
    )
    suffix_max_cached_requests: int = _opt(
        1000,
        "--suffix-max-cached-requests",
        "suffix: draft also from the outputs of this many recent requests (the oldest forgotten first; about "
        "0.4 KB per output token in the embedded engine); 0 = the request's own prompt and output only.",
        kind="int",
        lo=0,
        vllm="suffix_decoding_max_cached_requests (suffix; vLLM's own default is 10000)",
    )
    adaptive_k: bool = _opt(
        False, "--adaptive-k", "Grow k after a fully accepted draft, shrink it after a miss.", kind="bool", off_flag="--fixed-k"
    )
    cost_aware: bool = _opt(
        False,
        "--cost-aware",
        "Draft, each step, the length with the most expected tokens per second (0 = a plain step): from this "
        "request's acceptance per draft position and the target's measured seconds per forward by rows. For kernels on "
        "which rows are dear (llama.cpp's on a small CPU), so that drafting never costs more than it saves.",
        kind="bool",
        off_flag="--no-cost-aware",
    )
    min_confidence: float = _opt(
        0.0,
        "--min-confidence",
        "Model drafters: stop drafting when the product of the "
        "drafter's top probabilities (its own estimate that the draft survives) falls below "
        "this; 0 = always draft k.",
        kind="float",
        lo=0.0,
        hi=1.0,
        hi_open=True,
        vllm=BY_PROPOSERS,
    )
    ngram_first: bool = _opt(
        False,
        "--ngram-first",
        "Model drafters and mtp: propose a prompt-lookup match when there is one, the model (or head) otherwise.",
        kind="bool",
        off_flag="--no-ngram-first",
        vllm=BY_PROPOSERS,
    )
    backoff: bool = _opt(
        True,
        "--backoff",
        "Skip drafting for 1, 2, 4 … 16 steps after 3 costly misses in a row.",
        kind="bool",
        off_flag="--no-backoff",
        vllm=BY_PROPOSERS,
    )
    prefill_chunk: int = _opt(
        256,
        "--prefill-chunk",
        "Prompt tokens per prefill forward: a long prompt is prefilled in chunks, between the other requests' steps.",
        kind="int",
        lo=1,
    )
    dtype: str = _opt(
        "auto",
        "--dtype",
        "Target dtype: auto (the embedded engine: fp32 on CPU, bf16 on CUDA; vLLM: its own), float32, bfloat16, "
        "float16, or int8 (the embedded engine on a CPU: int8 weights and activations, batch-invariant by construction, "
        "so speculative output is token-identical to plain decoding; ~3x fp32's speed).",
        vllm="--dtype",
    )
    drafter_dtype: str = _opt(
        "auto",
        "--drafter-dtype",
        "Drafter dtype: auto (int8 weights on CPU, else the target's), int8, float32, bfloat16.",
        vllm=BY_PROPOSERS,
    )
    device: str = _opt("auto", "--device", "Where the models run: auto (CUDA when present, else the CPU), cpu, cuda, cuda:1 …")
    kernels: str = _opt(
        "torch",
        "--kernels",
        "What the embedded engine runs the models on: torch (transformers; fp32 on the CPU, or --dtype int8) or "
        "llama.cpp (the GGUF files as they are, on llama.cpp's quantized CPU kernels, the target's forwards shaped so "
        "that speculative output stays identical to plain; pip install 'vocabbridge[llama]').",
        kind="choice",
        choices=("torch", "llama.cpp"),
    )

    def __post_init__(self):
        for f in dataclasses.fields(self):
            _check(f, getattr(self, f.name))
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ConfigError(
                f"--prompt-lookup-min ({self.prompt_lookup_min}) must not exceed --prompt-lookup-max ({self.prompt_lookup_max})."
            )
        if self.drafter in DRAFTERS and DRAFTERS[self.drafter].uses_model:
            raise ConfigError(f"--drafter {self.drafter} is a mode, not a drafter; write --drafter MODEL --mode {self.drafter}.")
        if self.drafter_method == "mtp" and self.drafter != "mtp" and not self.drafter_path:
            raise ConfigError(
                "--drafter mtp: needs a head folder after the colon (--drafter mtp:heads/NAME), or use --drafter mtp."
            )
        if self.drafter_method == "self" and not (self.drafter[5:].isdecimal() and int(self.drafter[5:]) >= 1):
            raise ConfigError(
                f"--drafter {self.drafter}: write --drafter self:L, L the number of the target's first layers that draft "
                "(1 … its layers − 1), e.g. self:8; eval-drafter --drafter self:8 --layers 4,12 compares several."
            )

    @property
    def target_name(self) -> str:
        """The target as given, else the drafter preset's own target (or the one an MTP head was trained for)."""
        if self.target:
            return self.target
        if self.drafter_path and (trained_for := head_target(self.drafter_path)):
            return trained_for
        if not self.uses_model:
            raise ConfigError(f"--drafter {self.drafter} needs --target.")
        return default_target_for(self.drafter)

    @property
    def uses_model(self) -> bool:
        """True when ``drafter`` names a model rather than a method (none, ngram, mtp, mtp:PATH)."""
        return self.drafter_method not in DRAFTERS

    @property
    def drafter_method(self) -> str:
        """``drafter`` without a method's argument: ``mtp:heads/x`` → ``mtp``; anything else unchanged.

        >>> EngineSpec(target="t", drafter="mtp:heads/x").drafter_method, EngineSpec(target="t", drafter="m").drafter_method
        ('mtp', 'm')
        """
        method, sep, _ = self.drafter.partition(":")
        return method if sep and method in ("mtp", "self") else self.drafter

    @property
    def self_layers(self) -> int | None:
        """L of ``--drafter self:L`` (the target's first L layers draft); None for any other drafter.

        >>> EngineSpec(target="t", drafter="self:8").self_layers
        8
        """
        return int(self.drafter.partition(":")[2]) if self.drafter_method == "self" else None

    @property
    def drafter_path(self) -> str | None:
        """The head folder of ``--drafter mtp:PATH`` (None for a plain ``mtp``: the checkpoint's own MTP weights)."""
        method, sep, path = self.drafter.partition(":")
        return path or None if sep and method == "mtp" else None

    def replace(self, **changes) -> EngineSpec:
        return dataclasses.replace(self, **changes)


def options() -> list[tuple[str, Option, Any]]:
    """(field name, option, default) for every field of :class:`EngineSpec`, in order."""
    return [(f.name, f.metadata["option"], f.default) for f in dataclasses.fields(EngineSpec)]


def _check(f: dataclasses.Field, value: Any) -> None:
    o: Option = f.metadata["option"]
    name = o.flag
    if o.kind == "choice" and value not in o.choices:
        raise ConfigError(f"{name} must be one of {', '.join(o.choices)}, got {value!r}.")
    if o.kind in ("int", "float"):
        if o.kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"{name} must be an integer, got {value!r}.")
        if o.lo is not None and value < o.lo:
            raise ConfigError(f"{name} must be at least {o.lo:g}, got {value}.")
        if o.hi is not None and (value >= o.hi if o.hi_open else value > o.hi):
            raise ConfigError(f"{name} must be {'below' if o.hi_open else 'at most'} {o.hi:g}, got {value}.")


def serve_argv(spec: EngineSpec) -> list[str]:
    """The spec as ``vocabbridge serve`` options: target and drafter, then every field that differs
    from its default, spelt as the CLI spells it (derived from the fields, so none is forgotten)."""
    argv = ["--target", spec.target_name, "--drafter", spec.drafter]
    for name, o, default in options():
        value = getattr(spec, name)
        if name in ("target", "drafter") or value == default:
            continue
        if o.kind == "bool":
            argv.append(o.flag if value else o.off_flag)
        else:
            argv += [o.short or o.flag, str(value)]
    return argv


def engine_only_notes(spec: EngineSpec, method: str | None = None) -> list[str]:
    """What vLLM ignores in ``spec``: the fields set away from their default that have no vLLM
    meaning, or that only vocabbridge's own proposers honour when ``method`` is not one of them."""
    ours = method in ("bridged", "text")
    flags = [
        o.flag
        for name, o, default in options()
        if getattr(spec, name) != default
        and (o.vllm is None or (o.vllm == BY_PROPOSERS and not ours) or (o.vllm == BY_NGRAM_MAP and method != "ngram-map"))
    ]
    return [f"{'/'.join(flags)} apply to the embedded engine only" + ("" if ours else " here")] if flags else []


# ==== the drafter registry ======================================================================


@dataclass(frozen=True)
class DrafterMethod:
    """One way of drafting. Methods (``uses_model=False``) are named by ``--drafter``; model
    drafters by ``--drafter MODEL --mode NAME``."""

    name: str
    summary: str
    uses_model: bool
    engine: str | None  # "module:Class" with a ``from_spec(spec, target, drafter_lm)`` classmethod; None: not embedded
    vllm: Callable[[EngineSpec, Callable[[str], str], list[str]], dict | None]  # → --speculative-config
    engine_missing: str = ""  # why the embedded engine cannot run it (the error shown)

    def engine_class(self):
        """The embedded engine's drafter class (imports the engine: torch)."""
        if self.engine is None:
            raise ConfigError(self.engine_missing)
        module, _, attr = self.engine.partition(":")
        return getattr(importlib.import_module(module), attr)


def _vllm_none(spec, model_for, notes):
    return None


def _vllm_ngram(spec, model_for, notes):
    return {
        "method": "ngram",
        "num_speculative_tokens": spec.num_speculative_tokens,
        "prompt_lookup_min": spec.prompt_lookup_min,
        "prompt_lookup_max": spec.prompt_lookup_max,
    }


def _vllm_suffix(spec, model_for, notes):
    """vLLM's own suffix decoding; it runs Arctic Inference's suffix trees and refuses the method without them."""
    notes.append(
        "vLLM's suffix method needs the arctic-inference package beside vLLM: pip install arctic-inference "
        '(where its build misses the Python headers: CMAKE_ARGS="-DPython_EXECUTABLE=$(which python)" pip install …)'
    )
    return {
        "method": "suffix",
        "num_speculative_tokens": spec.num_speculative_tokens,
        "suffix_decoding_max_tree_depth": spec.suffix_max_depth,
        "suffix_decoding_max_cached_requests": spec.suffix_max_cached_requests,
        "suffix_decoding_max_spec_factor": spec.suffix_max_spec_factor,
        "suffix_decoding_min_token_prob": spec.suffix_min_prob,
    }


def _vllm_mtp(spec, model_for, notes):
    """The checkpoint's own MTP layer; with ``mtp:PATH``, a trained head exported for vLLM
    (``vocabbridge.heads.export.export_for_vllm`` writes it in ``PATH/vllm``: an EAGLE-3 head as vLLM's
    EAGLE-3 checkpoint, an MTP head in MiMo's MTP layout)."""
    if spec.drafter_path:
        exported = Path(spec.drafter_path).expanduser() / VLLM_EXPORT
        eagle3 = head_arch(spec.drafter_path) == "eagle3"
        layout = "vLLM's EAGLE-3 layout, drafting over its own vocabulary (d2t)" if eagle3 else "MiMo's MTP layout"
        notes.append(f"the head {spec.drafter_path} reaches vLLM as its export in {layout} ({exported}, written when stale)")
        method = "eagle3" if eagle3 else "mtp"
        return {"method": method, "model": str(exported), "num_speculative_tokens": spec.num_speculative_tokens}
    p = PRESETS.get(spec.target_name)
    if p is not None and not p.has_mtp:
        raise ConfigError(
            f"{spec.target_name} has no MTP head; use --drafter ngram or a draft model with it, or train a head "
            f"(vocabbridge train-head --target {spec.target_name} -o heads/NAME) and pass --drafter mtp:heads/NAME."
        )
    return {"method": "mtp", "num_speculative_tokens": spec.num_speculative_tokens}


def _vllm_self(spec, model_for, notes):
    raise ConfigError(
        f"--drafter {spec.drafter} (self-speculation) runs in the embedded engine only (serve --backend embedded): "
        "vLLM has no early-exit (LayerSkip) method; in vLLM use --drafter ngram, mtp or a draft model."
    )


def _vllm_draft(spec, model_for, notes):
    return {"method": "draft_model", "model": model_for(spec.drafter), "num_speculative_tokens": spec.num_speculative_tokens}


def _vllm_tli(spec, model_for, notes):
    """vLLM's token-level intersection (TLI): draft_model with use_heterogeneous_vocab, greedy
    draft sampling only. With ``--map``, our plugin builds its VocabMapping from the map file."""
    if spec.map_path:
        notes.append(f"vLLM's VocabMapping comes from {spec.map_path} (the vocabbridge plugin), not from its string match")
    return _vllm_draft(spec, model_for, notes) | {"use_heterogeneous_vocab": True, "draft_sample_method": "greedy"}


def _vllm_proposer(name: str):
    """Our drafter inside vLLM, as a ``custom_class`` proposer (vocabbridge/vllm/proposers.py)."""

    def build(spec, model_for, notes):
        return {"method": "custom_class", "model": f"{PROPOSERS}.{name}", "num_speculative_tokens": spec.num_speculative_tokens}

    return build


PROPOSERS = "vocabbridge.vllm.proposers"
PROPOSER_METHODS = {"TextProposer": "text", "BridgedProposer": "bridged", "NgramMapProposer": "ngram-map"}  # class → method

DRAFTERS: dict[str, DrafterMethod] = {
    m.name: m
    for m in [
        DrafterMethod(
            "none",
            "plain decoding: one target forward per token",
            False,
            "vocabbridge.engine.drafters.base:NoDrafter",
            _vllm_none,
        ),
        DrafterMethod(
            "ngram",
            "prompt lookup over prompt + output (--prompt-lookup-min/max)",
            False,
            "vocabbridge.engine.drafters.ngram:NgramDrafter",
            _vllm_ngram,
        ),
        DrafterMethod(
            "ngram-map",
            "llama.cpp's n-gram map: the most frequent continuation of the last n tokens (--ngram-map-*)",
            False,
            "vocabbridge.engine.drafters.ngram:NgramMapDrafter",
            _vllm_proposer("NgramMapProposer"),
        ),
        DrafterMethod(
            "suffix",
            "suffix decoding: the most frequent continuation of the context's end in the request's tokens and "
            "recent outputs (--suffix-*)",
            False,
            "vocabbridge.engine.drafters.suffix:SuffixDrafter",
            _vllm_suffix,
        ),
        DrafterMethod(
            "mtp",
            "a multi-token-prediction head: the checkpoint's own, or one trained by train-head (mtp:PATH)",
            False,
            "vocabbridge.engine.drafters.mtp:MTPDrafter",
            _vllm_mtp,
        ),
        DrafterMethod(
            "self",
            "self-speculation (LayerSkip, no training): the target's first L layers, final norm and lm_head (self:L)",
            False,
            "vocabbridge.engine.drafters.self_spec:SelfSpecDrafter",
            _vllm_self,
        ),
        DrafterMethod(
            "draft",
            "a small model with the target's vocabulary",
            True,
            "vocabbridge.engine.drafters.model_based:DraftModelDrafter",
            _vllm_draft,
        ),
        DrafterMethod(
            "bridged",
            "a model with another vocabulary, through a token map and its input bridge",
            True,
            "vocabbridge.engine.drafters.model_based:BridgedDrafter",
            _vllm_proposer("BridgedProposer"),
        ),
        DrafterMethod(
            "text",
            "a model with another vocabulary drafting text, re-tokenized by the target",
            True,
            "vocabbridge.engine.drafters.text:TextDrafter",
            _vllm_proposer("TextProposer"),
        ),
        DrafterMethod(
            "tli",
            "vLLM's token-level intersection: one drafter token per target token through a map, unk where none",
            True,
            "vocabbridge.engine.drafters.model_based:TLIDrafter",
            _vllm_tli,
        ),
    ]
}

METHOD_NAMES = tuple(n for n, m in DRAFTERS.items() if not m.uses_model)  # what --drafter takes besides a model
MODEL_MODES = tuple(n for n, m in DRAFTERS.items() if m.uses_model)


def resolve_method(spec: EngineSpec, *, same_vocabulary: bool | None) -> DrafterMethod:
    """The registered method ``spec`` runs: its drafter method, or for a model its mode
    (``auto``: draft when the vocabularies are the same, else text).

    ``same_vocabulary`` is needed for model drafters with ``mode`` auto or draft; None = unknown
    (then auto picks text, which works for any pair).
    """
    if not spec.uses_model:
        return DRAFTERS[spec.drafter_method]
    mode = spec.mode
    if mode == "auto":
        mode = "draft" if same_vocabulary else "text"
    if mode == "draft" and same_vocabulary is False:
        raise ConfigError(f"{spec.drafter} has another vocabulary than {spec.target_name}; use --mode bridged or --mode text.")
    return DRAFTERS[mode]


# ==== vLLM ========================================================================================


def served_name(target: str) -> str:
    """The model name clients send: the target as the user gave it (a preset, a hub id), or a path's last part."""
    return Path(target).name if Path(target).expanduser().exists() else target


def vllm_model(name: str) -> str:
    """A preset → its hub id (what vLLM loads); anything else unchanged."""
    p = PRESETS.get(name)
    return p.hub_id if p else name


def vllm_speculative_config(
    spec: EngineSpec,
    *,
    same_vocabulary: bool | None = None,
    model_for: Callable[[str], str] = vllm_model,
    notes: list[str] | None = None,
) -> dict | None:
    """vLLM's ``--speculative-config`` for ``spec`` (None without a drafter): one source for
    ``serve --backend vllm``, ``build-map``'s hand-off and the bench.

    A model drafter whose vocabulary differs (or is unknown) gets vLLM's heterogeneous-vocabulary
    path with greedy draft sampling, which vLLM requires for it. ``notes`` collects how it was decided.

    >>> vllm_speculative_config(EngineSpec(drafter="exaone-1.2b", mode="tli", num_speculative_tokens=3), same_vocabulary=False)
    {'method': 'draft_model', 'model': 'LGAI-EXAONE/EXAONE-4.0-1.2B', 'num_speculative_tokens': 3, \
'use_heterogeneous_vocab': True, 'draft_sample_method': 'greedy'}
    """
    notes = notes if notes is not None else []
    method = resolve_method(spec, same_vocabulary=same_vocabulary)
    if method.name == "draft" and same_vocabulary is None:  # unknown: the heterogeneous path is safe either way
        method = DRAFTERS["tli"]
    return method.vllm(spec, model_for, notes)


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
    return _compare(vllm_model(drafter), vllm_model(target))
