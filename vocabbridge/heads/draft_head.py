"""The MTP head: one decoder layer of the target's own architecture that drafts from the target's
hidden states (DeepSeek-V3's multi-token prediction module, as vLLM runs it).

At position t the head reads the target's last hidden state h_t (after the final norm: what the
target's lm_head reads) and the embedding of the next token x_{t+1}, and predicts x_{t+2}::

    z   = eh_proj([enorm(embed(x_{t+1})), hnorm(h_t)])        # [2d] → [d]
    g_t = norm(layer(z))                                       # one decoder layer, its own KV cache
    p(x_{t+2}) = softmax(lm_head(g_t))                         # the target's lm_head (rows d2t)

For a k-token draft the same layer runs again on its own output: (g_t, x_{t+2}) → x_{t+3}, ...
The embedding, the rotary embedding and the lm_head are the target's (borrowed, never saved with
the head); a reduced draft vocabulary keeps only the lm_head rows ``d2t`` (draft id → target id).
The layer is built from the target's own decoder-layer class, so one module serves our trained
heads and the MTP weights of real checkpoints (layouts.py).

>>> head = new_head(target_parts(model), draft_ids=None)  # doctest: +SKIP
>>> g = head(hidden, tokens, positions)      # [B, S, d] → [B, S, d]  # doctest: +SKIP
>>> head.logits(g).shape                     # [B, S, V_draft]  # doctest: +SKIP
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class TargetParts:
    """What a head borrows from its target: never trained, never saved with the head."""

    config: object  # the target's text config
    embed: nn.Module  # token embedding
    rotary: nn.Module  # rotary embedding: (x, position_ids) → (cos, sin)
    lm_head: nn.Module  # [d] → [V] (nn.Linear, or the engine's packed version of it)
    final_norm: nn.Module  # the target's final norm (its class builds the head's norms)
    last_layer: nn.Module  # the target's last decoder layer (its class builds the head's layer)
    num_layers: int

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def lm_head_weight(self) -> torch.Tensor:  # [V, d]
        return self.lm_head.weight

    @property
    def norm_eps(self) -> float:
        return float(getattr(self.config, "rms_norm_eps", None) or getattr(self.config, "layer_norm_eps", 1e-6))


def decoder_of(model) -> nn.Module:
    """The decoder stack of a transformers causal LM (the part that returns final hidden states),
    inside a multimodal wrapper too."""
    base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    if not hasattr(base, "layers") and hasattr(base, "language_model"):
        base = base.language_model
    return base


def target_parts(model) -> TargetParts:
    """The parts of a transformers causal LM a head needs (text models and multimodal wrappers)."""
    cfg = model.config
    text_cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    base = decoder_of(model)
    return TargetParts(
        config=text_cfg,
        embed=model.get_input_embeddings(),
        rotary=base.rotary_emb,
        lm_head=model.get_output_embeddings(),
        final_norm=base.norm,
        last_layer=base.layers[-1],
        num_layers=len(base.layers),
    )


def _norm_like(parts: TargetParts) -> nn.Module:
    """A fresh norm of the target's class (so offset-style norms such as Qwen3.5's 1 + w stay right)."""
    return type(parts.final_norm)(parts.hidden_size, eps=parts.norm_eps)


def build_layer(parts: TargetParts, layer_index: int) -> nn.Module:
    """A decoder layer of the target's class, built as layer ``layer_index`` (which decides its
    attention or MLP type where the architecture mixes them), caching as layer 0 of the head's cache."""
    layer = type(parts.last_layer)(parts.config, layer_index)
    attn = getattr(layer, "self_attn", None)
    if attn is not None and hasattr(attn, "layer_idx"):
        attn.layer_idx = 0
    return layer


class DraftHead(nn.Module):
    """What every head shares: the target's borrowed parts, the lm_head rows it drafts over (``d2t``:
    draft id → target id; the target's own lm_head, shared, when it drafts over the whole vocabulary),
    and one interface the trainer and the engine drive:

    - ``combine(features)``: the target's features as the head reads them (identity for the MTP head;
      EAGLE-3's ``fc`` over several layers' hidden states);
    - ``forward(state, tokens, positions, cache=, mask=)``: one step; the state it returns is the
      next step's input (the layer re-runs on its own output for k > 1);
    - ``logits(state)``: that state's draft-vocabulary logits.
    """

    arch = ""
    features = "hidden"  # which target features the data stores for it: the final hidden state, or "aux" (EAGLE-3)

    def __init__(self, parts: TargetParts, *, layer_index: int, draft_ids: torch.Tensor | None):
        super().__init__()
        d = parts.hidden_size
        self.parts = parts  # a plain attribute: borrowed modules stay out of state_dict() and parameters()
        self.layer_index = layer_index
        self.lm_head: nn.Linear | None = None  # None: the target's lm_head, shared (as vLLM shares it)
        if draft_ids is not None:
            rows = parts.lm_head_weight[draft_ids.to(parts.lm_head_weight.device)]
            self.lm_head = nn.Linear(d, rows.shape[0], bias=False)  # [V_draft, d], frozen
            self.lm_head.weight = nn.Parameter(rows.detach().float().clone(), requires_grad=False)
        self.register_buffer("d2t", None if draft_ids is None else draft_ids.clone().long(), persistent=False)
        self.softcap = getattr(parts.config, "final_logit_softcapping", None)

    @property
    def draft_vocab_size(self) -> int:
        return (self.lm_head or self.parts.lm_head).out_features

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """What a head file stores: everything but the lm_head rows (rebuilt from the target and d2t)."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("lm_head.")}

    @property
    def target_features(self) -> bool | tuple[int, ...]:
        """What the head reads of the target, as ``KVSession.extend(hidden=...)`` takes it: True, the
        final hidden states (EAGLE-3: the layers whose input streams it reads)."""
        return True

    @property
    def feature_size(self) -> int:
        """The width F of those features."""
        return self.parts.hidden_size

    def combine(self, features: torch.Tensor) -> torch.Tensor:
        """The target's features [..., F] → the head's first-step input [..., d]."""
        return features

    def final_hidden(self, state: torch.Tensor) -> torch.Tensor:
        """A step's state → what the lm_head reads."""
        return state

    def logits(self, state: torch.Tensor) -> torch.Tensor:
        """[..., d] → [..., V_draft] logits (float32)."""
        y = (self.lm_head or self.parts.lm_head)(self.final_hidden(state)).float()
        if self.softcap:
            y = torch.tanh(y / self.softcap) * self.softcap
        return y

    def _attention_mask(self, mask: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
        """A boolean mask (True = may attend) as the target's attention implementation wants it."""
        if mask is not None and getattr(self.parts.config, "_attn_implementation", None) != "sdpa":
            mask = torch.zeros(mask.shape, dtype=like.dtype, device=like.device).masked_fill(~mask, torch.finfo(like.dtype).min)
        return mask


class MTPHead(DraftHead):
    """enorm, hnorm, eh_proj, one decoder layer and a final norm; the lm_head rows it drafts over
    (the target's own lm_head, shared, when it drafts over the whole vocabulary)."""

    arch = "mtp"

    def __init__(self, parts: TargetParts, *, layer_index: int, draft_ids: torch.Tensor | None):
        super().__init__(parts, layer_index=layer_index, draft_ids=draft_ids)
        d = parts.hidden_size
        self.enorm = _norm_like(parts)
        self.hnorm = _norm_like(parts)
        self.eh_proj = nn.Linear(2 * d, d, bias=False)
        self.layer = build_layer(parts, layer_index)
        self.norm = _norm_like(parts)
        params = inspect.signature(self.layer.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    def forward(
        self,
        hidden: torch.Tensor,  # [B, S, d] the target's (or the head's own) final hidden states
        tokens: torch.Tensor,  # [B, S] the token after each hidden state's position
        positions: torch.Tensor,  # [B, S] the hidden state's position
        *,
        cache=None,
        mask: torch.Tensor | None = None,  # [1, 1, S, past + S] bool, True = may attend; None = everything cached
    ) -> torch.Tensor:
        """The head's final hidden states [B, S, d], after its norm (what the lm_head reads)."""
        return self.norm(self.layer_output(hidden, tokens, positions, cache=cache, mask=mask))

    def layer_output(
        self, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, *, cache=None, mask=None
    ) -> torch.Tensor:
        """The decoder layer's output [B, S, d], before the final norm (forward's arguments)."""
        z = self.eh_proj(self.inputs(hidden, tokens, positions))
        rope = self.parts.rotary(z, positions)
        out = self.layer(
            z,
            attention_mask=self._attention_mask(mask, z),
            position_ids=positions,
            position_embeddings=rope,
            use_cache=cache is not None,
            **{self._cache_kw: cache},
        )
        return out[0] if isinstance(out, tuple) else out

    def inputs(self, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """What eh_proj reads: [enorm(embed(x_{t+1})), hnorm(h_t)], [..., 2d]."""
        e = self.parts.embed(tokens).to(hidden.dtype)
        e = torch.where(positions.unsqueeze(-1) == 0, torch.zeros_like(e), e)  # as vLLM: no embedding at position 0
        return torch.cat([self.enorm(e), self.hnorm(hidden)], dim=-1)

    @property
    def projection(self) -> nn.Linear:
        """The linear the least-squares start fits first (chain.fit_projection)."""
        return self.eh_proj

    def projection_inputs(self, features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.inputs(features, tokens, positions)


def causal_mask(q: int, past: int, *, device=None) -> torch.Tensor | None:
    """Mask [1, 1, q, past + q] (True = may attend) for q new positions after ``past`` cached ones
    (None for q = 1: a single new position sees everything cached).

    >>> causal_mask(2, 1)[0, 0].tolist()
    [[True, True, False], [True, True, True]]
    """
    if q == 1:
        return None
    i = torch.arange(q, device=device).unsqueeze(1) + past
    j = torch.arange(past + q, device=device).unsqueeze(0)
    return (j <= i)[None, None]


def new_head(parts: TargetParts, *, draft_ids: torch.Tensor | None) -> MTPHead:
    """A head to train, initialised so that its first output *is* the target's hidden state h_t (it
    then proposes, for x_{t+2}, what the target predicted for x_{t+1}: a sane start):

    - the decoder layer is a copy of the target's last layer with its residual branches' output
      projections (``o_proj``, ``down_proj``) zeroed: it starts as the identity and learns its
      update (the attention and MLP inputs keep the target's weights);
    - the final norm is a copy of the target's (scale w), and hnorm's scale is c / w: the residual
      stream starts as the target's pre-norm direction (unit RMS), and norm(·) gives back h_t;
    - eh_proj passes the hidden half and nothing of the embedding yet; enorm is plain.

    Why: an lm_head reads hidden states at the final norm's scale (Qwen2.5's weights average 7), and
    Adam moves a norm weight by about the learning rate per step, so a head whose output starts at
    unit scale spends its training growing it (Qwen2.5-Coder-0.5B stayed near 7 nats). A head that
    adds the two inputs into the unmodified last layer starts far worse (26 nats on SmolLM2-135M).
    """
    head = MTPHead(parts, layer_index=parts.num_layers - 1, draft_ids=draft_ids)
    state = {  # the engine's packed linears hold their weights as .inner, in oneDNN's layout
        k.replace(".inner.", "."): v.to_dense() if v.is_mkldnn else v for k, v in parts.last_layer.state_dict().items()
    }
    head.layer.load_state_dict({k: state[k] for k in head.layer.state_dict()})
    d = parts.hidden_size
    with torch.no_grad():
        for name, p in head.layer.named_parameters():
            if name.endswith(RESIDUAL_OUTPUTS):
                p.zero_()
        w = norm_scale(parts.final_norm).float()
        w = torch.where(w.abs() < 1e-3, torch.full_like(w, 1e-3), w)  # no division by a dead channel
        set_norm_scale(head.norm, w)
        set_norm_scale(head.hnorm, (1 / w) / (1 / w).pow(2).mean().sqrt())
        head.eh_proj.weight.copy_(torch.cat([torch.zeros(d, d), torch.eye(d)], dim=1))
    return head.float()


def _offset_style(norm: nn.Module) -> bool:
    """True for norms that scale by 1 + weight (Qwen3.5, Gemma): a fresh one's weight is zeros."""
    fresh = type(norm)(norm.weight.shape[0])
    return bool((fresh.weight == 0).all())


def norm_scale(norm: nn.Module) -> torch.Tensor:
    """The per-channel scale a norm applies (weight, or 1 + weight for offset-style norms)."""
    return norm.weight.detach() + (1.0 if _offset_style(norm) else 0.0)


def set_norm_scale(norm: nn.Module, scale: torch.Tensor) -> None:
    norm.weight.copy_(scale - (1.0 if _offset_style(norm) else 0.0))


RESIDUAL_OUTPUTS = ("o_proj.weight", "o_proj.bias", "down_proj.weight", "down_proj.bias", "experts.down_proj")


# ==== weights fingerprint ========================================================================

SIGNATURE_SIZE = 16


@torch.no_grad()
def weights_signature(parts: TargetParts) -> list[float]:
    """A few fixed entries of the target's embedding and final norm: enough to tell checkpoints apart,
    the same whatever the dtype the target was loaded in (compare with :func:`signatures_match`)."""
    w = parts.embed.weight
    rows = torch.linspace(0, w.shape[0] - 1, SIGNATURE_SIZE).long()
    cols = torch.linspace(0, w.shape[1] - 1, 4).long()
    emb = w[rows][:, cols].float().flatten()
    norm = parts.final_norm.weight.float()
    norm = norm[torch.linspace(0, norm.shape[0] - 1, SIGNATURE_SIZE).long()]
    return [round(float(x), 6) for x in torch.cat([emb, norm])]


def signatures_match(a: list[float], b: list[float], *, rel: float = 0.02) -> bool:
    """True when two signatures come from the same weights (bf16 rounding is within ``rel``).

    >>> signatures_match([0.5, -0.25, 1.0], [0.501, -0.2505, 1.0]), signatures_match([0.5], [0.6])
    (True, False)
    """
    if len(a) != len(b):
        return False
    scale = max((abs(x) for x in a), default=0.0) or 1.0
    close = sum(abs(x - y) <= rel * max(abs(x), abs(y)) + 1e-3 * scale for x, y in zip(a, b))
    return close >= 0.95 * len(a)
