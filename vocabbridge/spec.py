"""The speculative-decoding configuration and the drafter registry, in one place (no torch, no click).

``EngineSpec`` is one frozen dataclass. Each field carries its command-line flag, help text,
default, value type and what vLLM does with it (:class:`Option`). Everything else that spells a
configuration is derived from these fields, so adding an option is one edit here:

- the click options of ``generate``, ``eval-drafter``, ``serve`` and ``bench`` (``cli/common.py``);
- :func:`cli_args`, the ``vocabbridge serve`` options a bench launches a configuration with;
- vLLM's ``--speculative-config`` (``vocabbridge.vllm.config``, which reads each field's ``vllm`` note).

Drafters are registered by name in ``DRAFTERS`` (like tiktoken's encoding constructors): whether
each runs a drafter model and how the embedded engine builds it (``"module:Class"``, imported when
used, so this module never imports torch); ``vocabbridge.vllm.config.METHODS`` says what vLLM runs
for each. :func:`parse_drafter` is the one grammar of ``--drafter`` and bench's ``--drafters``.

>>> spec = EngineSpec(target="qwen2.5-coder-1.5b", drafter="ngram", num_speculative_tokens=3)
>>> cli_args(spec)
['--target', 'qwen2.5-coder-1.5b', '--drafter', 'ngram', '-k', '3']
>>> resolve_method(EngineSpec(target="t", drafter="m"), same_vocabulary=False).name
'text'
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .heads import head_target
from .presets import default_target_for

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
    vllm_help: str = ""  # help added in commands with --backend vllm (serve, bench), left out of the others


def _opt(default: Any, flag: str, help: str, **kw) -> Any:
    return field(default=default, metadata={"option": Option(flag, help, **kw)})


MAP_MODES = ("bytes", "vllm")
DEAR_ROWS = 1.8  # k + 1 rows costing more than this many times one row make the cost-aware length the default
BY_PROPOSERS = "honoured by vocabbridge's proposers in vLLM (bridged, text; draft with --ngram-first or --min-confidence)"
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
        "What drafts: none, ngram, mtp, or a drafter model (a preset, a folder, a .gguf file or a hub id), "
        "optionally MODEL:MODE or MODEL:ngram+MODE.",
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
        "Token map for --mode bridged or tli (built and cached when absent).",
        kind="path",
        metavar="FILE",
        vllm="VocabMapping (tli, the vocabbridge plugin)",
        vllm_help="With --backend vllm --mode tli, vLLM's VocabMapping is built from it.",
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
        False,
        "--adaptive-k",
        "Grow k after a fully accepted draft, shrink it after a miss.",
        kind="bool",
        off_flag="--no-adaptive-k",
    )
    cost_aware: bool | None = _opt(
        None,
        "--cost-aware",
        "Draft, each step, the length with the most expected tokens per second (0 = a plain step): from this "
        "request's acceptance per draft position and the target's measured seconds per forward by rows, so drafting "
        "never costs more than it saves. Unset: on where the engine measures at load that k + 1 rows cost more than "
        f"{DEAR_ROWS:g}x one row (llama.cpp's kernels on a small CPU), off where rows are cheap (int8, GPU). "
        "--fixed-k drafts k every step.",
        kind="bool",
        off_flag="--fixed-k",
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
        "Target dtype: auto (the embedded engine on a CPU: int8, or the GGUF as it is on llama.cpp's kernels; bf16 on "
        "CUDA; vLLM: its own), int8 (int8 weights and activations, batch-invariant by construction, so speculative "
        "output is token-identical to plain decoding; ~3x fp32's speed), float32, bfloat16, float16.",
        vllm="--dtype",
    )
    drafter_dtype: str = _opt(
        "auto",
        "--drafter-dtype",
        "Drafter dtype: auto (int8 weights on CPU, else the target's), int8 (each row's activations scaled on their "
        "own), int8-dynamic (one scale per forward), q4 (our 4-bit CPU kernels: faster steps, weaker drafts on a small "
        "drafter), float32, bfloat16.",
        vllm=BY_PROPOSERS,
    )
    device: str = _opt("auto", "--device", "Where the models run: auto (CUDA when present, else the CPU), cpu, cuda, cuda:1 …")
    kernels: str = _opt(
        "auto",
        "--kernels",
        "What the embedded engine runs the target on: auto (on a CPU, llama.cpp's kernels for a GGUF target where "
        "llama-cpp-python is installed, else torch's int8 invariant target; torch on a GPU), torch (transformers; "
        "--dtype picks int8, float32 …), llama.cpp (the GGUF files as they are, on llama.cpp's quantized CPU kernels; "
        "pip install 'vocabbridge[llama]'), or q4 (our own 4-bit CPU matmul, compiled when vocabbridge is installed: a "
        "GGUF's Q4_K tensors as they are, extra verification rows nearly free). Every choice keeps speculative output "
        "identical to plain decoding.",
        kind="choice",
        choices=("auto", "torch", "llama.cpp", "q4"),
    )

    def __post_init__(self):
        for f in dataclasses.fields(self):
            _check(f, getattr(self, f.name))
        choice = parse_drafter(self.drafter)  # "MODEL:text", "MODEL:ngram+text": the bench's grammar, here too
        if choice.drafter != self.drafter:
            if choice.mode != "auto" and self.mode not in ("auto", choice.mode):
                raise ConfigError(
                    f"--drafter {self.drafter} says --mode {choice.mode}, but --mode {self.mode} is given; give one."
                )
            object.__setattr__(self, "drafter", choice.drafter)
            object.__setattr__(self, "mode", choice.mode if choice.mode != "auto" else self.mode)
            object.__setattr__(self, "ngram_first", self.ngram_first or choice.ngram_first)
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


def cli_args(spec: EngineSpec) -> list[str]:
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


# ==== the drafter registry ======================================================================


@dataclass(frozen=True)
class DrafterMethod:
    """One way of drafting. Methods (``uses_model=False``) are named by ``--drafter``; model
    drafters by ``--drafter MODEL --mode NAME``."""

    name: str
    summary: str
    uses_model: bool
    engine: str | None  # "module:Class" with a ``from_spec(spec, target, drafter_lm)`` classmethod; None: not embedded
    engine_missing: str = ""  # why the embedded engine cannot run it (the error shown)

    def engine_class(self):
        """The embedded engine's drafter class (imports the engine: torch)."""
        if self.engine is None:
            raise ConfigError(self.engine_missing)
        module, _, attr = self.engine.partition(":")
        return getattr(importlib.import_module(module), attr)


DRAFTERS: dict[str, DrafterMethod] = {
    m.name: m
    for m in [
        DrafterMethod(
            "none",
            "plain decoding: one target forward per token",
            False,
            "vocabbridge.engine.drafters.base:NoDrafter",
        ),
        DrafterMethod(
            "ngram",
            "prompt lookup over prompt + output (--prompt-lookup-min/max)",
            False,
            "vocabbridge.engine.drafters.ngram:NgramDrafter",
        ),
        DrafterMethod(
            "ngram-map",
            "llama.cpp's n-gram map: the most frequent continuation of the last n tokens (--ngram-map-*)",
            False,
            "vocabbridge.engine.drafters.ngram:NgramMapDrafter",
        ),
        DrafterMethod(
            "suffix",
            "suffix decoding: the most frequent continuation of the context's end in the request's tokens and "
            "recent outputs (--suffix-*)",
            False,
            "vocabbridge.engine.drafters.suffix:SuffixDrafter",
        ),
        DrafterMethod(
            "mtp",
            "a multi-token-prediction head: the checkpoint's own, or one trained by train-head (mtp:PATH)",
            False,
            "vocabbridge.engine.drafters.mtp:MTPDrafter",
        ),
        DrafterMethod(
            "self",
            "self-speculation (LayerSkip, no training): the target's first L layers, final norm and lm_head (self:L)",
            False,
            "vocabbridge.engine.drafters.self_spec:SelfSpecDrafter",
        ),
        DrafterMethod(
            "draft",
            "a small model with the target's vocabulary",
            True,
            "vocabbridge.engine.drafters.model_based:DraftModelDrafter",
        ),
        DrafterMethod(
            "bridged",
            "a model with another vocabulary, through a token map and its input bridge",
            True,
            "vocabbridge.engine.drafters.model_based:BridgedDrafter",
        ),
        DrafterMethod(
            "text",
            "a model with another vocabulary drafting text, re-tokenized by the target",
            True,
            "vocabbridge.engine.drafters.text:TextDrafter",
        ),
        DrafterMethod(
            "tli",
            "vLLM's token-level intersection: one drafter token per target token through a map, unk where none",
            True,
            "vocabbridge.engine.drafters.model_based:TLIDrafter",
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


def served_name(target: str) -> str:
    """The model name clients send: the target as the user gave it (a preset, a hub id), or a path's last part."""
    return Path(target).name if Path(target).expanduser().exists() else target


# ==== the --drafter grammar =====================================================================

MODES = ("auto", *MODEL_MODES)
NGRAM_FIRST = "ngram+"


@dataclass(frozen=True)
class DrafterChoice:
    """One ``--drafter`` item, parsed: what drafts, how a model meets the target, and whether prompt
    lookup goes first. ``name`` is the item as a bench table shows it."""

    name: str  # as typed ("smollm2-135m:bridged"); paths by their last part in bench lists
    drafter: str  # none | ngram | … | mtp[:HEAD] | self:L | a model
    mode: str = "auto"  # model drafters: auto | draft | bridged | text | tli
    ngram_first: bool = False  # "MODEL:ngram+MODE" / "ngram+mtp[:HEAD]": prompt lookup first, the model otherwise


def parse_drafter(item: str) -> DrafterChoice:
    """One drafter item: ``METHOD``, ``mtp[:HEAD]``, ``self:L``, ``ngram+mtp[:HEAD]``, ``MODEL``,
    ``MODEL:MODE`` or ``MODEL:ngram+MODE`` (MODE one of auto, draft, bridged, text, tli). The one
    grammar of ``--drafter`` (generate, eval-drafter, serve) and of bench's ``--drafters`` list.

    >>> parse_drafter("smollm2-135m:ngram+text")
    DrafterChoice(name='smollm2-135m:ngram+text', drafter='smollm2-135m', mode='text', ngram_first=True)
    >>> parse_drafter("ngram+mtp:heads/q15").drafter, parse_drafter("/m/d.gguf").mode
    ('mtp:heads/q15', 'auto')
    """
    item = item.strip()
    if not item:
        raise ConfigError("an empty drafter; write e.g. ngram, qwen2.5-coder-0.5b or smollm2-135m:text.")
    if item == NGRAM_FIRST + "mtp" or item.startswith(NGRAM_FIRST + "mtp:"):
        return DrafterChoice(item, item[len(NGRAM_FIRST) :], "auto", True)
    head, colon, tail = item.rpartition(":")
    hybrid = tail.startswith(NGRAM_FIRST) and tail[len(NGRAM_FIRST) :] in MODES
    mode_part = tail[len(NGRAM_FIRST) :] if hybrid else tail
    drafter, mode = (head, mode_part) if colon and head and mode_part in MODES else (item, "auto")
    hybrid = hybrid and drafter == head
    if (mode != "auto" or hybrid) and drafter in METHOD_NAMES:
        raise ConfigError(f"{item}: a mode applies to model drafters only; write {drafter}.")
    return DrafterChoice(item, drafter, mode, hybrid)


def parse_drafters(text: str) -> list[DrafterChoice]:
    """A comma-separated list of :func:`parse_drafter` items (bench's ``--drafters``), each named
    for the tables: a path by its last part unless that makes two names alike.

    >>> [(d.name, d.drafter, d.mode) for d in parse_drafters("none, ngram, smollm2-135m:bridged")]
    [('none', 'none', 'auto'), ('ngram', 'ngram', 'auto'), ('smollm2-135m:bridged', 'smollm2-135m', 'bridged')]
    >>> [(d.name, d.drafter) for d in parse_drafters("mtp,mtp:heads/q15")]  # mtp:PATH: a trained head
    [('mtp', 'mtp'), ('mtp:q15', 'mtp:heads/q15')]
    >>> [(d.name, d.drafter, d.ngram_first) for d in parse_drafters("ngram+mtp:heads/q15")]
    [('ngram+mtp:q15', 'mtp:heads/q15', True)]
    """
    out: list[DrafterChoice] = []
    for item in text.split(","):
        if not item.strip():
            raise ConfigError(
                f"--drafters {text!r} has an empty item; write e.g. none,ngram,qwen2.5-coder-0.5b,smollm2-135m:text."
            )
        try:
            out.append(parse_drafter(item))
        except ConfigError as e:
            raise ConfigError(f"--drafters: {e}") from None
    names = [d.name for d in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"--drafters lists {', '.join(dup)} more than once.")
    short = [_display(d) if "/" in d.drafter else d.name for d in out]
    return [dataclasses.replace(d, name=s) for d, s in zip(out, short)] if len(set(short)) == len(short) else out


def _display(d: DrafterChoice) -> str:
    """A path drafter's configuration name: the path by its last part, the rest as typed.

    >>> _display(parse_drafter("mtp:heads/qwen-1.5b")), _display(parse_drafter("/models/draft.gguf:text"))
    ('mtp:qwen-1.5b', 'draft.gguf:text')
    """
    method, sep, path = d.drafter.partition(":")
    short = f"mtp:{Path(path).name}" if sep and method == "mtp" else Path(d.drafter).name
    prefix, _, rest = d.name.partition(d.drafter)
    return prefix + short + rest
