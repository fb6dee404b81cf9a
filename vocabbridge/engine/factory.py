"""Build an engine from an :class:`~vocabbridge.spec.EngineSpec`: the models, the drafter the
registry names, the engine. Shared by ``generate``, ``eval-drafter``, ``serve`` and ``bench``.

Cheap checks come before the expensive ones: the tokenizers are read first (seconds), so a map
built for other tokenizers, a ``--mode draft`` drafter with another vocabulary, or a model too
big for this machine's memory is refused before any weights load (minutes).

>>> spec = EngineSpec(target="qwen2.5-coder-1.5b", drafter="smollm2-135m", mode="text")  # doctest: +SKIP
>>> built = build_engine(spec)  # doctest: +SKIP
>>> built.engine.generate(built.target.view.encode("def f(x):")).text  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..errors import ConfigError
from ..mapping import load_map
from ..presets import PRESETS, resolve_model
from ..spec import DEAR_ROWS, EngineSpec, resolve_method
from ..tokenizer import TokenizerView, load_tokenizer, same_vocabulary
from .drafters import Drafter, NgramFirstDrafter
from .engine import SpecEngine
from .invariant import INVARIANT_ROWS
from .llama_cpp import load_llama_cpp_lm
from .memory import check_fits
from .model import QUANTIZED, CausalLM, drafter_dtype_for, load_causal_lm, resolve_device
from .path import TargetPath, choose_path, is_gguf
from .policies import row_cost_ratio
from .static import STATIC_ROWS, static_lm
from .threads import govern_threads

__all__ = ["BuiltEngine", "EngineSpec", "build_engine", "drafter_dtype", "load_drafter_lm", "make_drafter"]


@dataclass
class BuiltEngine:
    engine: SpecEngine
    target: CausalLM
    drafter_lm: CausalLM | None
    spec: EngineSpec  # as run: --kernels and --dtype made concrete (see ``path``)
    mode: str  # what actually runs: none | ngram | draft | bridged | text, or ngram+MODE
    notes: list[str] = field(default_factory=list)
    path: TargetPath | None = None  # the target path chosen, and why
    length_policy: str = ""  # how the draft length is chosen, and why

    @property
    def drafter_label(self) -> str:
        """The drafter as people name it: ``ngram``, ``smollm2-135m (text)``, ``none``."""
        return f"{self.spec.drafter} ({self.mode})" if self.drafter_lm is not None else self.mode

    def describe(self) -> dict:
        return {
            "target": self.target.source,
            "drafter": self.engine.drafter.describe(),
            "mode": self.mode,
            "num_speculative_tokens": self.engine.k,
            "adaptive_k": self.engine.adaptive_k,
            "cost_aware": self.engine.cost_aware,
            "dtype": str(self.target.dtype).replace("torch.", ""),
            "device": self.target.device,
            "kernels": self.spec.kernels,
            "path": self.path.label() if self.path else None,
            "path_why": self.path.why if self.path else None,
            "draft_length": self.length_policy,
            "plain_step_rows": self.target.plain_rows,
            "notes": self.notes,
        }

    def ready_line(self) -> str:
        """One line for people: what runs and why (every command prints it once the models are loaded)."""
        path = f"target on {self.path.label()} ({self.path.why})" if self.path else ""
        length = f"; draft length {self.length_policy}" if self.length_policy else ""
        return f"{path}; drafter {self.drafter_label}, k={self.engine.k}{length}"


def make_drafter(spec: EngineSpec, target: CausalLM, drafter_lm: CausalLM | None) -> tuple[Drafter, str, list[str]]:
    """The drafter object the registry builds for ``spec``, the mode it runs in, and notes."""
    same = same_vocabulary(drafter_lm.view, target.view) if drafter_lm is not None else None
    method = resolve_method(spec, same_vocabulary=same)
    notes = []
    if spec.uses_model and spec.mode == "auto":
        notes.append(f"mode auto → {method.name} ({'same' if same else 'different'} vocabulary)")
    drafter = method.engine_class().from_spec(spec, target, drafter_lm)
    mode = method.name
    if spec.ngram_first and (drafter_lm is not None or method.name == "mtp"):
        lookup_min = max(2, spec.prompt_lookup_min)
        drafter = NgramFirstDrafter(
            drafter, prompt_lookup_min=lookup_min, prompt_lookup_max=max(lookup_min, spec.prompt_lookup_max)
        )
        mode = f"ngram+{mode}"
    return drafter, mode, notes


def load_drafter_lm(source: str, dtype: str, *, device: str, tokenizer=None) -> CausalLM:
    """A drafter model in ``dtype`` (:func:`drafter_dtype`'s answer): ``q4`` on our q4 kernels'
    lean forward (4-bit weights: one-row steps ~1.8x faster than int8's on the transplanted
    SmolLM2-135M, and weaker drafts there), anything else through :func:`.model.load_causal_lm` (``int8``: row-int8
    linears on the lean forward where it runs)."""
    if dtype == "q4":
        from .q4 import load_q4_lm

        return load_q4_lm(source, tokenizer=tokenizer, drafter=True)
    lm = load_causal_lm(source, tokenizer=tokenizer, dtype=dtype, device=device)
    if dtype == "int8":
        from .q4 import int8_drafter_lean

        lm.lean = int8_drafter_lean(lm.model)
    return lm


def drafter_dtype(spec: EngineSpec) -> str:
    """``auto``: row-int8 linears on CPU (each row's activations scaled on their own, the lean forward where it runs), the target's dtype elsewhere."""
    return drafter_dtype_for(spec.drafter_dtype, resolve_device(spec.device), spec.dtype)


def preflight(spec: EngineSpec, loaded: dict[str, CausalLM] | None = None) -> dict[str, TokenizerView]:
    """The cheap checks, before any weights load: both models fit in memory; for a model drafter,
    the tokenizers (read once and reused by the model loads), the method they allow, and a given
    map checked against them. Returns the views read, by resolved source."""
    device = resolve_device(spec.device)
    llama = spec.kernels == "llama.cpp"
    if spec.kernels == "q4":
        if device != "cpu":
            raise ConfigError(f"--kernels q4 runs on the CPU; drop --device {spec.device} or use --kernels torch.")
        from . import q4

        q4.require()  # built with vocabbridge, or a message saying how to build it
    if llama and device != "cpu":
        raise ConfigError(
            f"--kernels llama.cpp runs on the CPU (this build of it); drop --device {spec.device} or use --kernels torch."
        )
    if llama and spec.drafter_method == "mtp":
        raise ConfigError(
            "--drafter mtp reads the target's hidden states, which the llama.cpp kernels do not expose; use --kernels torch."
        )
    if llama and spec.drafter_method == "self":
        raise ConfigError(
            f"--drafter {spec.drafter} runs the target's first layers alone (an early exit), which the llama.cpp kernels "
            "cannot; use --kernels torch (with --dtype int8 for the fast exact CPU target)."
        )
    weights = "gguf" if llama else "float32" if spec.kernels == "q4" else spec.dtype  # q4 loads fp32 first, then packs
    check_fits(
        [(spec.target_name, resolve_model(spec.target_name), weights)]
        + ([(spec.drafter, resolve_model(spec.drafter), "gguf" if llama else drafter_dtype(spec))] if spec.uses_model else []),
        device=device,
    )
    if not spec.uses_model:
        resolve_method(spec, same_vocabulary=None).engine_class()  # mtp in the embedded engine fails here
        return {}
    have = {src: lm.view for src, lm in (loaded or {}).items()}
    t_src, d_src = resolve_model(spec.target_name), resolve_model(spec.drafter)
    views = {src: have.get(src) or load_tokenizer(src) for src in (t_src, d_src)}
    method = resolve_method(spec, same_vocabulary=same_vocabulary(views[d_src], views[t_src]))
    method.engine_class()  # a method the embedded engine lacks fails here
    if method.name == "bridged" and spec.map_path:
        load_map(spec.map_path, drafter=views[d_src], target=views[t_src])
    return views


def concrete(spec: EngineSpec) -> tuple[EngineSpec, TargetPath]:
    """``spec`` with ``--kernels auto`` / ``--dtype auto`` made concrete (:func:`.path.choose_path`)."""
    path = choose_path(spec, device=resolve_device(spec.device))
    return path.apply(spec), path


def build_engine(spec: EngineSpec, *, loaded: dict[str, CausalLM] | None = None) -> BuiltEngine:
    """Load (or reuse from ``loaded``, keyed by resolved source) the models and wire the engine."""
    loaded = loaded if loaded is not None else {}
    resolve_model(spec.target_name)  # a mistyped name fails here, before the path choice reads the target's file
    if spec.uses_model:
        resolve_model(spec.drafter)
    spec, path = concrete(spec)
    views = preflight(spec, loaded)
    static_rows = max(STATIC_ROWS, spec.num_speculative_tokens + 1)

    def get(name: str, dtype: str, target: bool = False) -> CausalLM:
        src = resolve_model(name)
        if spec.kernels == "llama.cpp" and (target or is_gguf(name)):  # the GGUF as it is; the target batch-invariant
            key = f"{src}@llama.cpp" + ("/invariant" if target else "")
            if key not in loaded:
                loaded[key] = load_llama_cpp_lm(src, tokenizer=views.get(src), invariant=target)
            return loaded[key]
        if spec.kernels == "q4" and target:  # loaded in fp32, its linears then on the q4 kernel (engine/q4.py)
            from .q4 import load_q4_lm

            key = f"{src}@q4"
            if key not in loaded:
                loaded[key] = load_q4_lm(src, tokenizer=views.get(src))
            # torch's ops (the sampling, a torch drafter) on one thread too: after an op it splits, torch's
            # OpenMP thread spins for milliseconds on the core the q4 kernel's worker needs (~7 ms a step)
            torch.set_num_threads(1)
            return loaded[key]
        if dtype == "q4" and not target:  # a drafter on our q4 kernels' lean forward (--drafter-dtype q4)
            key = f"{src}@q4-drafter"
            if key not in loaded:
                loaded[key] = load_drafter_lm(src, dtype, device=path.device, tokenizer=views.get(src))
            return loaded[key]
        rows = INVARIANT_ROWS if target and dtype in QUANTIZED else None  # an int8 target: batch-invariant
        key = (src if dtype == spec.dtype else f"{src}@{dtype}") + (f"/rows={rows}" if rows else "")
        if path.device != "cpu":  # a GPU: the static cache and CUDA graphs, the target batch-invariant (static.py)
            key += f"/static={static_rows}" + ("/invariant" if target else "")
        if key not in loaded:
            if target:
                lm = load_causal_lm(src, tokenizer=views.get(src), dtype=dtype, device=spec.device, rows=rows)
            else:
                lm = load_drafter_lm(src, dtype, device=spec.device, tokenizer=views.get(src))
            loaded[key] = static_lm(lm, rows=static_rows, invariant=target) if path.device != "cpu" else lm
        return loaded[key]

    target = get(spec.target_name, spec.dtype, target=True)
    drafter_lm = get(spec.drafter, drafter_dtype(spec)) if spec.uses_model else None
    drafter, mode, notes = make_drafter(spec, target, drafter_lm)
    threads, thread_notes = govern_threads(target, drafter_lm)  # sized to the free cores, where output cannot change
    notes += thread_notes
    cost_aware, length_policy = draft_length_policy(spec, target)
    engine = SpecEngine(
        target,
        drafter,
        num_speculative_tokens=spec.num_speculative_tokens,
        adaptive_k=spec.adaptive_k,
        backoff=spec.backoff,
        cost_aware=cost_aware,
        prefill_chunk=spec.prefill_chunk,
        threads=threads,
    )
    if spec.drafter in PRESETS and PRESETS[spec.drafter].pairs_with and not spec.target:
        notes.append(f"target {spec.target_name} chosen by the drafter preset")
    return BuiltEngine(engine, target, drafter_lm, spec, mode, notes, path, length_policy)


def draft_length_policy(spec: EngineSpec, target: CausalLM) -> tuple[bool, str]:
    """Whether the cost-aware length runs, and why: as asked (--cost-aware / --fixed-k), else from
    the target's measured cost of a (k + 1)-row forward in one-row forwards (dear above
    :data:`~vocabbridge.spec.DEAR_ROWS`)."""
    if spec.drafter_method == "none":
        return False, ""
    if spec.cost_aware is not None:
        return (
            spec.cost_aware,
            "cost-aware (asked for)" if spec.cost_aware else f"fixed k={spec.num_speculative_tokens} (asked for)",
        )
    rows = min(spec.num_speculative_tokens + 1, getattr(target, "rows", None) or spec.num_speculative_tokens + 1)
    ratio = row_cost_ratio(target, rows)
    if ratio > DEAR_ROWS:
        return True, f"cost-aware ({rows} rows measured {ratio:.2f}x one row: dear, so a draft must pay for itself)"
    return False, f"fixed k={spec.num_speculative_tokens} ({rows} rows measured {ratio:.2f}x one row: cheap)"
