"""The ``self`` drafter: self-speculation (LayerSkip's early exit, no training). ``--drafter self:L``
drafts with the target's own first L decoder layers, then its final norm and lm_head; the
verification runs all the layers as usual, so the output is the target's own.

No second model: :func:`early_exit_view` is a view of the target whose decoder holds only its
first L layers (the same modules, no weight copied). No second KV cache either: the target's cache
already holds what the early exit needs for the committed prefix, layer by layer (layer i of the
view is layer i of the target, and the cache is indexed by layer). A proposal:

    the target's cache holds context[:n] (the last committed token is fed by the next verification)
    feed context[n:], then k−1 draft tokens, through the first L layers   → layers < L grow, the rest do not
    crop layers < L back to n                                             → the cache is as it was, bit for bit

so the verification forward computes exactly what it would without drafting (greedy output
token-identical to plain decoding, whatever L). Where the engine gives no target cache (offline
evaluation), the session keeps its own cache over the first L layers.

>>> drafter = SelfSpecDrafter(target, layers=8)  # doctest: +SKIP
>>> SpecEngine(target, drafter).generate(prompt).tokens == SpecEngine(target).generate(prompt).tokens  # doctest: +SKIP
True
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers.cache_utils import DynamicLayer

from ...errors import ConfigError
from ...heads.draft_head import decoder_of
from ..model import CausalLM, KVSession
from .base import Drafter, Proposal
from .model_based import ModelDraftSession


def _shallow(module: nn.Module, **children: nn.Module) -> nn.Module:
    """A new module object sharing everything with ``module`` (parameters, config, hooks) but the given children."""
    view = copy.copy(module)
    view._modules = {**module._modules, **children}
    return view


def early_exit_view(model: nn.Module, layers: int) -> nn.Module:
    """``model`` (a transformers causal LM) running only its first ``layers`` decoder layers, then its
    final norm and lm_head: shallow copies of the modules on the way to the decoder's layer list,
    every other module (and every weight) shared with ``model``, which is left untouched.

    >>> early_exit_view(model, 4)(input_ids=x).logits  # [B, S, V]: layers 0-3, norm, lm_head  # doctest: +SKIP
    """
    decoder = decoder_of(model)
    path = next(name for name, m in model.named_modules() if m is decoder).split(".")  # "model", "model.language_model"
    view = _shallow(decoder, layers=nn.ModuleList(list(decoder.layers[:layers])))
    for i in reversed(range(len(path))):
        view = _shallow(model.get_submodule(".".join(path[:i])), **{path[i]: view})
    return view


def crop_layers(cache, layers: int, length: int) -> None:
    """Cut layers 0 … ``layers``−1 of a DynamicCache back to ``length`` positions."""
    for layer in cache.layers[:layers]:
        extra = layer.get_seq_length() - length
        if extra > 0:
            layer.crop(-extra)  # negative = remove that many (the same in every transformers version)


def can_share(cache, layers: int) -> bool:
    """Whether an early exit can run over ``cache`` and be undone by a crop: the first ``layers``
    layers are plain growing layers (a sliding-window or recurrent layer cannot be cropped back)."""
    held = getattr(cache, "layers", None)
    return held is not None and len(held) >= layers and all(type(x) is DynamicLayer for x in held[:layers])


class _SelfSpecSession(ModelDraftSession):
    def __init__(self, d: SelfSpecDrafter):
        super().__init__(d.early, min_confidence=d.min_confidence)
        self.d = d
        self.own = self.kv  # its own cache over the first L layers: only without a target cache to share
        self.target: KVSession | None = None

    def attach_target(self, target):
        self.target = target if getattr(target, "lm", None) is self.d.target else None  # another model's cache: not ours

    def drafter_context(self, context):
        return context

    def warm(self, context, chunk):
        return iter(()) if self.target is not None else super().warm(context, chunk)

    @torch.inference_mode()
    def propose(self, context, k, params, generator):
        t = self.target
        n = len(t.ids) if t is not None else 0
        if t is None or n >= len(context) or t.ids != context[:n] or not can_share(t.cache, self.d.layers):
            self.kv = self.own
            logits = self._feed(context, k)
            return Proposal(*self.draft_loop(logits, k, params, generator))
        self.kv = KVSession(self.d.early)  # the target's cache, seen through the first L layers
        self.kv.cache, self.kv.ids = t.cache, t.ids[:]
        try:
            self.forwards += 1
            logits = self.kv.extend(context[n:], keep=1)[-1]  # [V]
            return Proposal(*self.draft_loop(logits, k, params, generator))
        finally:
            crop_layers(t.cache, self.d.layers, n)
            self.kv = self.own


class SelfSpecDrafter(Drafter):
    """The target's first ``layers`` decoder layers + its final norm and lm_head draft for it."""

    name = "self"
    uses_model = False

    def __init__(self, target: CausalLM, *, layers: int, min_confidence: float = 0.0):
        model = getattr(target, "model", None)
        if not isinstance(model, nn.Module):
            raise ConfigError(
                "--drafter self:L runs the target's first L layers alone (an early exit), which the llama.cpp kernels "
                "cannot; use --kernels torch (with --dtype int8 for the fast exact CPU target)."
            )
        self.num_layers = len(decoder_of(model).layers)
        if not 1 <= layers < self.num_layers:
            raise ConfigError(
                f"--drafter self:{layers}: L must be 1 … {self.num_layers - 1} ({target.name} has {self.num_layers} "
                f"decoder layers and drafts with the first L); e.g. --drafter self:{max(1, self.num_layers // 4)}."
            )
        self.target = target
        self.layers = layers
        self.min_confidence = min_confidence
        self.early = CausalLM(
            early_exit_view(model, layers),
            target.view,
            f"{target.source} (first {layers} of {self.num_layers} layers)",
            target.device,
            target.dtype,
            target.vocab_size,
            target.max_context,
        )

    @classmethod
    def from_spec(cls, spec, target, drafter_lm):
        return cls(target, layers=spec.self_layers, min_confidence=spec.min_confidence)

    def session(self, prompt):
        return _SelfSpecSession(self)

    def describe(self):
        return {
            "name": self.name,
            "layers": self.layers,
            "of_layers": self.num_layers,
            "kv_cache": "the target's own (layers below L), cropped back after each draft",
            "min_confidence": self.min_confidence,
        }
