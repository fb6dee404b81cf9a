"""The EAGLE-3 head: vLLM's ``eagle3`` draft layer, trained by ``train-head --arch eagle3`` and drafted
with in our engine. Its checkpoint is what vLLM serves, with the reduced draft vocabulary as ``d2t``.

It reads several of the target's layers at once (EAGLE-3's feature fusion), where the MTP head
(model.py) reads only the final hidden state. At position t, with a_t the residual streams entering
the chosen target layers (``aux_layers``; the number of layers stands for the final norm's input)::

    H_t   = fc([fc_norm_1(a_t^1), …, fc_norm_n(a_t^n)])                    # [n·d] → [d]   (combine)
    x     = [input_layernorm(embed(x_{t+1})), hidden_norm(H_t)]             # [2d]
    r     = H_t + attn(x)                                                   # q/k/v read 2d, one KV cache
    s_t   = r + mlp(post_attention_layernorm(r))                            # the step's state
    p(x_{t+2}) = softmax(lm_head(norm(s_t)))                                # own rows: d2t → target ids

For a k-token draft the layer runs again on its own state: (s_t, x_{t+2}) → x_{t+3}, … (``fc`` reads
the target's features only). This is ``Eagle3LlamaForCausalLM`` of vLLM 0.32
(``llama_eagle3.py``: one layer, ``fc_norm``, the residual taken before ``hidden_norm``), so the
layer is a Llama/Qwen2 decoder layer: q/k/v of the target's last layer widened to 2d inputs (the
embedding half starting at zero), its MLP and norms.

>>> head = new_eagle3_head(parts, aux_layers=(14, 25, 28), draft_ids=ids)  # doctest: +SKIP
>>> s = head(head.combine(aux), tokens, positions)   # [B, S, 3d] → [B, S, d]  # doctest: +SKIP
>>> head.logits(s).shape                              # [B, S, V_draft]  # doctest: +SKIP
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from ..errors import ConfigError
from .draft_head import RESIDUAL_OUTPUTS, DraftHead, TargetParts, _norm_like, build_layer, norm_scale, set_norm_scale

HOSTS = ("qwen2", "llama", "mistral")  # targets whose decoder layer vLLM's EAGLE-3 layer (a Llama layer) reproduces
QKV = ("q_proj", "k_proj", "v_proj")


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """Three residual streams: the middle of the stack, three layers before its end, and its end (the
    final norm's input). Chosen by a linear probe on Qwen2.5-Coder-1.5B (the ridge regression of the
    target's next hidden state h_{t+1} on the embedding of x_{t+1} and the features, 13.7k training
    positions of its own int8 continuations; greedy agreement at 1,536 held-out generated positions,
    best ridge; benchmarks/results/2026-12-02-eagle3-head/feature-probe/): the MTP head's final hidden
    state 24.7 %; streams entering layers 14, 25, 28: 26.4 %; 20, 28: 26.4 %; 7, 20, 28: 26.2 %; 27, 28:
    25.3 %; EAGLE-3's usual 2, 14, 25 (no final stream): 25.4 %.

    >>> default_aux_layers(28), default_aux_layers(2)
    ((14, 25, 28), (0, 1, 2))
    """
    return tuple(sorted({num_layers // 2, max(0, num_layers - 3), num_layers}))


def check_host(parts: TargetParts) -> None:
    model_type = getattr(parts.config, "model_type", None)
    if model_type not in HOSTS:
        raise ConfigError(
            f"an EAGLE-3 head is a Llama/Qwen2 decoder layer (vLLM's eagle3); a {model_type} target cannot host one "
            f"(targets: {', '.join(HOSTS)}). Train an MTP head instead: vocabbridge train-head --arch mtp."
        )


class Eagle3Head(DraftHead):
    """fc (with a norm per target layer), one EAGLE-3 decoder layer, a final norm, and the draft
    vocabulary's own lm_head rows."""

    arch = "eagle3"
    features = "aux"

    def __init__(self, parts: TargetParts, *, aux_layers: tuple[int, ...], draft_ids: torch.Tensor | None):
        check_host(parts)
        super().__init__(parts, layer_index=parts.num_layers - 1, draft_ids=draft_ids)
        d = parts.hidden_size
        self.aux_layers = tuple(int(i) for i in aux_layers)
        if not self.aux_layers or not all(0 <= i <= parts.num_layers for i in self.aux_layers):
            raise ConfigError(f"aux layers must lie in 0 … {parts.num_layers} (the target's layers); got {aux_layers}.")
        self.fc_norm = nn.ModuleList(_norm_like(parts) for _ in self.aux_layers)
        self.fc = nn.Linear(len(self.aux_layers) * d, d, bias=False)
        self.layer = build_layer(parts, parts.num_layers - 1)
        attn = self.layer.self_attn
        for name in QKV:  # the first EAGLE-3 layer's attention reads [embedding, hidden]: 2d wide
            old = getattr(attn, name)
            setattr(attn, name, nn.Linear(2 * d, old.out_features, bias=old.bias is not None))
        self.hidden_norm = _norm_like(parts)
        self.norm = _norm_like(parts)
        params = inspect.signature(attn.forward).parameters  # the cache's keyword across transformers versions
        self._cache_kw = next((k for k in ("past_key_values", "past_key_value", "cache") if k in params), "past_key_values")

    @property
    def target_features(self) -> tuple[int, ...]:
        return self.aux_layers

    @property
    def feature_size(self) -> int:
        return self.parts.hidden_size * len(self.aux_layers)

    # ==== the step ==============================================================================

    def combine(self, features: torch.Tensor) -> torch.Tensor:
        """[..., n·d] residual streams of the aux layers → [..., d] (vLLM's ``combine_hidden_states``)."""
        return self.fc(self.projection_inputs(features))

    def projection_inputs(self, features: torch.Tensor, tokens=None, positions=None) -> torch.Tensor:
        """What ``fc`` reads: each layer's stream through its own norm, [..., n·d]."""
        chunks = features.chunk(len(self.aux_layers), dim=-1)
        return torch.cat([norm(c) for norm, c in zip(self.fc_norm, chunks)], dim=-1)

    @property
    def projection(self) -> nn.Linear:
        """The linear the least-squares start fits first (chain.fit_projection)."""
        return self.fc

    def forward(
        self,
        hidden: torch.Tensor,  # [B, S, d] combined target features, or the head's own state
        tokens: torch.Tensor,  # [B, S] the token after each position
        positions: torch.Tensor,  # [B, S]
        *,
        cache=None,
        mask: torch.Tensor | None = None,  # [1, 1, S, past + S] bool, True = may attend; None = everything cached
    ) -> torch.Tensor:
        """The step's state [B, S, d] (before the final norm: vLLM's ``aux_output``)."""
        return self.layer_output(hidden, tokens, positions, cache=cache, mask=mask)

    def layer_output(
        self, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, *, cache=None, mask=None
    ) -> torch.Tensor:
        lay = self.layer
        e = self.embed(tokens).to(hidden.dtype)
        x = torch.cat([lay.input_layernorm(e), self.hidden_norm(hidden)], dim=-1)  # [B, S, 2d]
        rope = self.parts.rotary(hidden, positions)
        attn = lay.self_attn(
            hidden_states=x,
            position_embeddings=rope,
            attention_mask=self._attention_mask(mask, hidden),
            position_ids=positions,
            **{self._cache_kw: cache},
        )
        r = hidden + (attn[0] if isinstance(attn, tuple) else attn)
        return r + lay.mlp(lay.post_attention_layernorm(r))

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The embeddings the layer reads for ``tokens`` (the target's; P-EAGLE adds its mask token)."""
        return self.parts.embed(tokens)

    def final_hidden(self, state: torch.Tensor) -> torch.Tensor:
        return self.norm(state)


def new_eagle3_head(parts: TargetParts, *, aux_layers: tuple[int, ...], draft_ids: torch.Tensor | None) -> Eagle3Head:
    """A head to train, started from the target's last layer so that its first step is the identity on
    the target's own final state where ``aux_layers`` holds it (then it proposes, for x_{t+2}, what
    the target predicted for x_{t+1}; the least-squares start refits ``fc`` at once):

    - q/k/v: the target's weights on the hidden half, zeros on the embedding half; the residual
      branches' output projections (o_proj, down_proj) zeroed, so the layer starts as the identity;
    - hidden_norm and input_layernorm: the target's last layer's input norm; the final norm the target's;
    - fc: the identity on the final norm's input (the last aux layer, when it is the stack's end):
      its fc_norm makes it unit RMS, and the final norm (the target's) then gives back h_t.
    """
    head = Eagle3Head(parts, aux_layers=aux_layers, draft_ids=draft_ids)
    state = {  # the engine's packed linears hold their weights as .inner, in oneDNN's layout
        k.replace(".inner.", "."): v.to_dense() if v.is_mkldnn else v for k, v in parts.last_layer.state_dict().items()
    }
    d = parts.hidden_size
    own = head.layer.state_dict()
    with torch.no_grad():
        for key, t in own.items():
            src = state[key].to(t.dtype)
            if any(f"self_attn.{p}.weight" in key for p in QKV):
                t.zero_()
                t[:, d:] = src  # the hidden half; the embedding half starts at zero
            elif key.endswith(RESIDUAL_OUTPUTS):
                t.zero_()
            else:
                t.copy_(src)
        head.hidden_norm.weight.copy_(head.layer.input_layernorm.weight)
        w = norm_scale(parts.final_norm).float()
        w = torch.where(w.abs() < 1e-3, torch.full_like(w, 1e-3), w)
        set_norm_scale(head.norm, w)
        head.fc.weight.zero_()
        if head.aux_layers[-1] == parts.num_layers:
            head.fc.weight[:, -d:] = torch.eye(d)
    return head.float()
