"""Build an engine from names: a target and a drafter given as presets, paths, hub ids or
methods (``none``, ``ngram``, ``mtp``). Shared by ``generate``, ``serve`` and ``bench``.

>>> spec = EngineSpec(target="qwen2.5-coder-1.5b", drafter="smollm2-135m", mode="text")  # doctest: +SKIP
>>> built = build_engine(spec)  # doctest: +SKIP
>>> built.engine.generate(built.target.view.encode("def f(x):")).text  # doctest: +SKIP
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ConfigError
from ..presets import PRESETS, default_target_for, resolve_model
from .drafters import BridgedDrafter, DraftModelDrafter, Drafter, NgramDrafter, NgramFirstDrafter, NoDrafter, TextDrafter
from .engine import SpecEngine
from .model import CausalLM, load_causal_lm

MODES = ("auto", "draft", "bridged", "text")
MTP_UNSUPPORTED = (
    "the embedded engine has no MTP drafter: no checkpoint with an MTP head is available to build and test one "
    "here. Use --backend vllm on a GPU machine (vLLM runs EXAONE 4.5's MTP layer with method 'mtp'), or pick "
    "--drafter ngram / a small model."
)


@dataclass(frozen=True)
class EngineSpec:
    target: str | None = None  # None: the drafter preset's own target
    drafter: str = "none"  # none | ngram | mtp | a preset / path / hub id
    mode: str = "auto"  # for model drafters: draft (same vocab) | bridged (token map) | text (re-tokenize)
    map_path: str | None = None
    map_mode: str = "bytes"  # how a missing map is built
    num_speculative_tokens: int = 4
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    adaptive_k: bool = False
    min_confidence: float = 0.0
    ngram_first: bool = False  # model drafters: try prompt lookup first, the model when it finds nothing
    dtype: str = "auto"  # target: fp32 on CPU (exact greedy), bf16 on CUDA
    drafter_dtype: str = "auto"  # drafter: int8 weights on CPU (its numerics never change the output)
    device: str = "auto"

    def __post_init__(self):
        if self.mode not in MODES:
            raise ConfigError(f"--mode must be one of {', '.join(MODES)}, got {self.mode!r}.")
        if self.num_speculative_tokens < 1:
            raise ConfigError("--num-speculative-tokens must be at least 1.")
        if not 0 <= self.min_confidence < 1:
            raise ConfigError("--min-confidence must be in [0, 1).")

    @property
    def target_name(self) -> str:
        if self.target:
            return self.target
        if self.drafter in ("none", "ngram", "mtp"):
            raise ConfigError(f"--drafter {self.drafter} needs --target.")
        return default_target_for(self.drafter)


@dataclass
class BuiltEngine:
    engine: SpecEngine
    target: CausalLM
    drafter_lm: CausalLM | None
    spec: EngineSpec
    mode: str  # what actually runs: none | ngram | draft | bridged | text
    notes: list[str] = field(default_factory=list)

    def describe(self) -> dict:
        return {"target": self.target.source, "drafter": self.engine.drafter.describe(), "mode": self.mode,
                "num_speculative_tokens": self.engine.k, "adaptive_k": self.engine.adaptive_k,
                "dtype": str(self.target.dtype).replace("torch.", ""), "device": self.target.device, "notes": self.notes}  # fmt: skip


def same_vocabulary(a, b) -> bool:
    """True when two views give the same bytes to every id both have (the drafter may be shorter)."""
    n = min(a.size, b.size)
    return n > 0 and a.tokens[:n] == b.tokens[:n]


def _map_cache_path(drafter_fp: str, target_fp: str, mode: str) -> Path:
    root = Path(os.environ.get("VOCABBRIDGE_CACHE", Path.home() / ".cache" / "vocabbridge"))
    return root / "maps" / f"{drafter_fp[:16]}_to_{target_fp[:16]}_{mode}.json"


def token_map_for(drafter: CausalLM, target: CausalLM, *, path: str | None, mode: str = "bytes"):
    """Load ``path`` (checked against both tokenizers), or build the map and cache it."""
    from ..mapping import build_token_map, load_map, save_map

    if path:
        return load_map(path, drafter=drafter.view, target=target.view)
    cached = _map_cache_path(drafter.view.fingerprint, target.view.fingerprint, mode)
    if cached.is_file():
        return load_map(cached, drafter=drafter.view, target=target.view)
    tm = build_token_map(drafter.view, target.view, mode=mode, drafter_vocab_size=drafter.vocab_size,
                         target_vocab_size=target.vocab_size)  # fmt: skip
    save_map(tm, cached)
    return tm


def make_drafter(spec: EngineSpec, target: CausalLM, drafter_lm: CausalLM | None) -> tuple[Drafter, str, list[str]]:
    """The drafter object for ``spec`` and the mode it runs in."""
    drafter, mode, notes = _make_drafter(spec, target, drafter_lm)
    if spec.ngram_first and drafter_lm is not None:
        lookup_min = max(2, spec.prompt_lookup_min)
        drafter = NgramFirstDrafter(drafter, prompt_lookup_min=lookup_min, prompt_lookup_max=max(lookup_min, spec.prompt_lookup_max))
        mode = f"ngram+{mode}"
    return drafter, mode, notes


def _make_drafter(spec: EngineSpec, target: CausalLM, drafter_lm: CausalLM | None) -> tuple[Drafter, str, list[str]]:
    d = spec.drafter
    if d == "none":
        return NoDrafter(), "none", []
    if d == "ngram":
        return NgramDrafter(prompt_lookup_min=spec.prompt_lookup_min, prompt_lookup_max=spec.prompt_lookup_max), "ngram", []
    if d == "mtp":
        raise ConfigError(MTP_UNSUPPORTED)
    assert drafter_lm is not None
    same = same_vocabulary(drafter_lm.view, target.view)
    mode = spec.mode
    notes = []
    if mode == "auto":
        mode = "draft" if same else "text"
        notes.append(f"mode auto → {mode} ({'same' if same else 'different'} vocabulary)")
    kw = {"target_vocab_size": target.vocab_size, "min_confidence": spec.min_confidence}
    if mode == "draft":
        if not same:
            raise ConfigError(
                f"{drafter_lm.source} has another vocabulary than {target.source}; use --mode bridged or --mode text."
            )
        return DraftModelDrafter(drafter_lm, **kw), mode, notes
    if mode == "bridged":
        tm = token_map_for(drafter_lm, target, path=spec.map_path, mode=spec.map_mode)
        return BridgedDrafter(drafter_lm, tm, **kw), mode, notes
    return TextDrafter(drafter_lm, target.view, **kw), mode, notes


def drafter_dtype(spec: EngineSpec) -> str:
    """``auto``: int8 dynamic quantization on CPU (2-3× faster drafting), the target's dtype elsewhere."""
    if spec.drafter_dtype != "auto":
        return spec.drafter_dtype
    from .model import resolve_device

    return "int8" if resolve_device(spec.device) == "cpu" else spec.dtype


def build_engine(spec: EngineSpec, *, loaded: dict[str, CausalLM] | None = None) -> BuiltEngine:
    """Load (or reuse from ``loaded``, keyed by resolved source) the models and wire the engine."""
    loaded = loaded if loaded is not None else {}

    def get(name: str, dtype: str) -> CausalLM:
        src = resolve_model(name)
        key = src if dtype == spec.dtype else f"{src}@{dtype}"
        if key not in loaded:
            loaded[key] = load_causal_lm(src, dtype=dtype, device=spec.device)
        return loaded[key]

    target = get(spec.target_name, spec.dtype)
    drafter_lm = None if spec.drafter in ("none", "ngram", "mtp") else get(spec.drafter, drafter_dtype(spec))
    drafter, mode, notes = make_drafter(spec, target, drafter_lm)
    engine = SpecEngine(target, drafter, num_speculative_tokens=spec.num_speculative_tokens, adaptive_k=spec.adaptive_k)
    if spec.drafter in PRESETS and PRESETS[spec.drafter].pairs_with and not spec.target:
        notes.append(f"target {spec.target_name} chosen by the drafter preset")
    return BuiltEngine(engine, target, drafter_lm, spec, mode, notes)
