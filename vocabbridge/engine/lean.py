"""The q4 target's lean forward: a Llama / Qwen2 decoder run straight on the q4 kernels and a KV
cache preallocated and written in place, instead of through transformers' modules.

Why: on the 1.5B target a one-row forward spent ~48 ms in the q4 matmuls (reading the weights at
the memory's speed, as llama.cpp does) and ~30 ms around them: transformers' module calls, its
cache's ``torch.cat`` per layer and step (3.3 ms), the mask and position bookkeeping, a dozen small
torch ops a layer. Here a layer is seven calls into the extension and two torch ops: the residual
add and RMSNorm in one pass (``rms_norm``), the fused q/k/v matmul, RoPE on q and k in place with
the new keys and values copied into the cache's free room (``rope_kv``), the attention reading the
cache and the queries in place (``attend(..., room, q_row)``), the output projection, add and
RMSNorm, the fused gate/up matmul, SiLU·up (torch), the down matmul.

Exactness: every routine computes a row from that row's values alone, by one instruction sequence
whatever the row count, the cache's length, the thread or the vector unit (``csrc/q4/q4.c``), so a
verification row is its plain one-row result bit for bit (``tests/test_lean.py``). Against the
transformers q4 forward the results differ only by RMSNorm's summation order (~1e-7 on the logits);
RoPE and SiLU·up are transformers' arithmetic product by product. Cropping is setting the cache's
length: the entries past it are overwritten by the next feed.

An early-exit drafter (``--drafter self:L``) cannot share this cache as it shares a transformers
``DynamicCache`` (``drafters/self_spec.can_share`` says no): it runs its first L layers through
transformers over a cache of its own, exactly, at the cost of prefilling it.

What is not a plain Llama / Qwen2 decoder (a sliding window, another activation, linears not fused
by :func:`.q4.quantize_model`) keeps the transformers forward: :func:`lean_decoder` says why not.

>>> decoder = lean_decoder(model)  # a model after q4.make_q4  # doctest: +SKIP
>>> why_not(model) or "lean"  # doctest: +SKIP
'lean'

This module reads the q4 linears by their packed weights and calls the compiled extension directly,
so it never imports :mod:`.q4` (which imports it to build its sessions).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .invariant import FusedPart, RowInt8Linear
from .model import CausalLM, KVSession

FAMILIES = ("llama", "qwen2")  # model_type values whose decoder layer this module reproduces


@dataclass(frozen=True)
class LeanLayer:
    """One decoder layer's weights as the lean forward reads them."""

    norm_in: torch.Tensor  # input RMSNorm weight [D]
    eps_in: float
    qkv: object  # q4.Q4Linear over q, k and v stacked (its bias their biases)
    o: object  # q4.Q4Linear
    norm_post: torch.Tensor
    eps_post: float
    gate_up: object  # q4.Q4Linear over gate and up stacked
    down: object  # q4.Q4Linear


@dataclass(frozen=True)
class LeanDecoder:
    """A q4 model's decoder as plain data: what :class:`LeanSession` runs."""

    embed: torch.Tensor  # [V, D]
    layers: tuple[LeanLayer, ...]
    norm: torch.Tensor
    eps: float
    lm_head: object  # q4.Q4Linear
    rotary: torch.nn.Module  # the model's own rotary embedding module: cos/sin exactly as transformers computes them
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    scaling: float

    def session(self, lm: CausalLM) -> LeanSession:
        return LeanSession(lm, self)


def why_not(model: torch.nn.Module) -> str:
    """Why the lean forward cannot run ``model`` (a q4 model after :func:`.q4.make_q4`), or ``""``."""
    cfg = model.config
    kind = getattr(cfg, "model_type", "")
    if kind not in FAMILIES:
        return f"model type {kind!r} (the lean forward runs {', '.join(FAMILIES)})"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"activation {cfg.hidden_act!r}, not silu"
    if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or ()) or getattr(cfg, "use_sliding_window", False):
        return "sliding-window layers"
    if getattr(cfg, "pretraining_tp", 1) not in (None, 1):
        return "pretraining_tp > 1"
    base = getattr(model, "model", None)
    if base is None or not all(hasattr(base, n) for n in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return "no embed_tokens / layers / norm / rotary_emb in model.model"
    if not _on_lean(getattr(model, "lm_head", None)):
        return "the lm_head is not on the q4 kernel or a row-int8 linear"
    for i, layer in enumerate(base.layers):
        at, mlp = layer.self_attn, layer.mlp
        q, k, v = (getattr(at, n, None) for n in ("q_proj", "k_proj", "v_proj"))
        g, u = getattr(mlp, "gate_proj", None), getattr(mlp, "up_proj", None)
        parts = (q, k, v, g, u)
        if (
            not all(isinstance(p, FusedPart) for p in parts)
            or q.fused is not k.fused
            or k.fused is not v.fused
            or g.fused is not u.fused
        ):
            return f"layer {i}: q/k/v or gate/up not fused into one q4 matmul"
        if (q.start, k.start, v.start, g.start) != (0, q.stop, k.stop, 0) or u.start != g.stop:
            return f"layer {i}: fused parts out of order"
        if not (_on_lean(at.o_proj) and _on_lean(mlp.down_proj)):
            return f"layer {i}: o_proj / down_proj not on the q4 kernel or row-int8 linears"
        if not all(
            hasattr(n, "weight") and hasattr(n, "variance_epsilon")
            for n in (layer.input_layernorm, layer.post_attention_layernorm)
        ):
            return f"layer {i}: norms are not RMSNorm"
    return ""


def _on_q4(lin) -> bool:
    """Whether ``lin`` is a q4.Q4Linear: its weights packed for the kernel (:class:`.q4.Q4Matrix`)."""
    return isinstance(lin, torch.nn.Module) and hasattr(lin, "packed") and hasattr(lin.packed, "in_features")


def _on_lean(lin) -> bool:
    """Whether the lean forward runs ``lin``: a q4.Q4Linear (on the extension) or a
    :class:`.invariant.RowInt8Linear` (fbgemm's int8, each row scaled on its own: an int8 drafter's)."""
    return _on_q4(lin) or isinstance(lin, RowInt8Linear)


def lean_decoder(model: torch.nn.Module) -> LeanDecoder | None:
    """The lean form of a q4 model (its weights shared, not copied), or None where :func:`why_not` objects."""
    if why_not(model):
        return None
    base, cfg = model.model, model.config
    at0 = base.layers[0].self_attn
    layers = tuple(
        LeanLayer(
            norm_in=layer.input_layernorm.weight.detach(),
            eps_in=float(layer.input_layernorm.variance_epsilon),
            qkv=layer.self_attn.q_proj.fused,
            o=layer.self_attn.o_proj,
            norm_post=layer.post_attention_layernorm.weight.detach(),
            eps_post=float(layer.post_attention_layernorm.variance_epsilon),
            gate_up=layer.mlp.gate_proj.fused,
            down=layer.mlp.down_proj,
        )
        for layer in base.layers
    )
    return LeanDecoder(
        embed=base.embed_tokens.weight.detach(),
        layers=layers,
        norm=base.norm.weight.detach(),
        eps=float(base.norm.variance_epsilon),
        lm_head=model.lm_head,
        rotary=base.rotary_emb,
        heads=cfg.num_attention_heads,
        kv_heads=cfg.num_key_value_heads,
        head_dim=at0.head_dim,
        intermediate=base.layers[0].mlp.gate_proj.out_features,
        scaling=float(at0.scaling),
    )


class PreallocatedKV:
    """Every layer's keys and values in one buffer [layers, 2, kv_heads, room, head_dim], the first
    ``length`` positions valid. Feeding writes into the room past ``length``; cropping lowers it. The
    room grows (doubling, one copy, never past ``most`` unless a feed needs it) when a feed would pass
    it: rare, and the old values move as they are."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, room: int = 512, most: int = 1 << 30):
        self.shape = (layers, 2, kv_heads, head_dim)
        self.most = most  # the model's context: room past it is never used
        self.buf = torch.empty(layers, 2, kv_heads, min(room, most), head_dim)
        self.length = 0

    @property
    def room(self) -> int:
        return self.buf.shape[3]

    def reserve(self, n: int) -> None:
        """Room for ``n`` positions in all."""
        if n <= self.room:
            return
        room = self.room
        while room < n:
            room *= 2
        room = max(n, min(room, self.most))
        L, two, H, d = self.shape
        bigger = torch.empty(L, two, H, room, d)
        bigger[:, :, :, : self.length] = self.buf[:, :, :, : self.length]
        self.buf = bigger

    def crop(self, n: int) -> None:
        """Keep the first ``n`` positions (negative: drop the last ``-n``), as ``DynamicCache.crop``."""
        self.length = max(0, self.length + n if n < 0 else min(n, self.length))

    def get_seq_length(self) -> int:
        return self.length


class LeanSession(KVSession):
    """A :class:`.model.KVSession` whose forwards run :class:`LeanDecoder` over a :class:`PreallocatedKV`:
    the row plan, padding and cropping of ``extend`` / ``truncate`` are the base class's."""

    def __init__(self, lm: CausalLM, lean: LeanDecoder):
        self.lm, self.lean = lm, lean
        self.cache = PreallocatedKV(len(lean.layers), lean.kv_heads, lean.head_dim, most=lm.max_context)
        self.ids: list[int] = []

    def _run(self, tokens: list[int], keep: int, hidden) -> tuple[torch.Tensor, torch.Tensor | None]:
        from .. import _q4 as ext  # built: a model reaches here only after q4.make_q4, which requires it

        m, kv = self.lean, self.cache
        R, L0 = len(tokens), kv.length
        H, Hkv, d, I = m.heads, m.kv_heads, m.head_dim, m.intermediate  # noqa: E741
        kv.reserve(L0 + R)
        L, room, width = L0 + R, kv.room, (m.heads + 2 * m.kv_heads) * m.head_dim
        x = m.embed[torch.tensor(tokens)]  # [R, D], a copy: the residual stream, updated in place
        D = x.shape[1]
        cos, sin = m.rotary(x, torch.arange(L0, L).unsqueeze(0))  # [1, R, d] each, as transformers computes them
        cos, sin = cos.contiguous(), sin.contiguous()
        layers = hidden if isinstance(hidden, tuple) else ()
        streams = {}
        h, att = torch.empty(R, D), torch.empty(R, H * d)
        add = None  # the last layer's output, added to x by the next norm
        for i, layer in enumerate(m.layers):
            ext.rms_norm(
                x.data_ptr(), 0 if add is None else add.data_ptr(), layer.norm_in.data_ptr(), h.data_ptr(), R, D, layer.eps_in
            )
            if i in layers:
                streams[i] = x.clone()
            qkv = _matmul(ext, layer.qkv, h)
            keys, values = kv.buf[i, 0], kv.buf[i, 1]  # [Hkv, room, d]
            ext.rope_kv(
                qkv.data_ptr(), R, H, Hkv, d, cos.data_ptr(), sin.data_ptr(), keys.data_ptr(), values.data_ptr(), room, L0
            )
            ext.attend(
                qkv.data_ptr(), keys.data_ptr(), values.data_ptr(), att.data_ptr(), R, H, Hkv, d, L, m.scaling, room, width
            )
            o = _matmul(ext, layer.o, att)
            ext.rms_norm(x.data_ptr(), o.data_ptr(), layer.norm_post.data_ptr(), h.data_ptr(), R, D, layer.eps_post)
            gu = _matmul(ext, layer.gate_up, h)
            add = _matmul(ext, layer.down, torch.nn.functional.silu(gu[:, :I]) * gu[:, I:])
        kv.length = L
        normed = torch.empty(R, D)
        ext.rms_norm(x.data_ptr(), add.data_ptr(), m.norm.data_ptr(), normed.data_ptr(), R, D, m.eps)
        if len(m.layers) in layers:
            streams[len(m.layers)] = x
        logits = _matmul(ext, m.lm_head, normed[R - keep :])
        feats = normed if hidden is True else torch.cat([streams[i] for i in layers], dim=-1) if layers else None
        return logits, feats

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` cached tokens (rollback after a rejection): the cache's length, nothing moved."""
        if n < len(self.ids):
            self.cache.crop(n)
            del self.ids[n:]


def _matmul(ext, lin, x: torch.Tensor) -> torch.Tensor:
    """``lin(x)`` for a contiguous fp32 [R, in]: a q4.Q4Linear straight on the extension, a
    :class:`.invariant.RowInt8Linear` as it is."""
    x = x.contiguous()
    if not hasattr(lin, "packed"):
        return lin(x)
    R = x.shape[0]
    y = torch.empty(R, lin.out_features)
    w = lin.packed
    ext.matmul(
        w.ptr, w.out_features, w.in_features, x.data_ptr(), R, y.data_ptr(), 0 if lin.bias is None else lin.bias.data_ptr()
    )
    return y
