"""MTP weights in real checkpoints, read into an :class:`~vocabbridge.heads.draft_head.MTPHead`.

Three layouts, as vLLM's loaders read them (``deepseek_mtp.py``, ``exaone4_5_mtp.py``,
``qwen3_5_mtp.py``, ``mimo_mtp.py``), with L = the target's number of decoder layers:

==========  ==================================  ===================================================
layout      where                               names
==========  ==================================  ===================================================
deepseek    DeepSeek-V3 (``model.layers.L.*``)  enorm, hnorm, eh_proj, shared_head.norm, the layer
mtp         EXAONE 4.5, Qwen3.5 (``mtp.*``)     pre_fc_norm_embedding, pre_fc_norm_hidden, fc,
                                                layers.0.*, norm
mimo        MiMo (``model.mtp_layers.0.*``),    token_layernorm, hidden_layernorm, input_proj
            and our own vLLM export             ([hidden, embedding] order), final_layernorm
==========  ==================================  ===================================================

The embedding and the lm_head are the target's in every layout (vLLM shares them too); a layout's
own copies (DeepSeek's ``embed_tokens`` and ``shared_head.head``) are skipped. Only the first MTP
layer is read: vLLM runs the same layer for every draft position when a checkpoint has one.

>>> layout_of({"mtp.fc.weight", "mtp.norm.weight"}, num_layers=40)
'mtp'
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from huggingface_hub import snapshot_download
from safetensors import safe_open

from ..errors import ModelLoadError
from .draft_head import MTPHead, TargetParts

LAYOUTS = ("deepseek", "mtp", "mimo")
KNOWN = (
    "DeepSeek-V3 (model.layers.L.eh_proj ...), EXAONE 4.5 / Qwen3.5 (mtp.fc ...), "
    "MiMo (model.mtp_layers.0.input_proj ...)"
)  # the layouts read, as an error message names them


def layout_of(keys, *, num_layers: int) -> str | None:
    """Which MTP layout a checkpoint's tensor names follow (None: no MTP weights)."""
    keys = set(keys)
    if f"model.layers.{num_layers}.eh_proj.weight" in keys:
        return "deepseek"
    if "mtp.fc.weight" in keys:
        return "mtp"
    if "model.mtp_layers.0.input_proj.weight" in keys:
        return "mimo"
    return None


def head_key(name: str, layout: str, *, num_layers: int) -> str | None:
    """The MTPHead state-dict key for a checkpoint tensor of ``layout`` (None: not the head's).

    >>> head_key("model.layers.61.self_attn.q_a_proj.weight", "deepseek", num_layers=61)
    'layer.self_attn.q_a_proj.weight'
    >>> head_key("mtp.pre_fc_norm_hidden.weight", "mtp", num_layers=40), head_key("lm_head.weight", "mtp", num_layers=40)
    ('hnorm.weight', None)
    """
    if layout == "deepseek":
        prefix, own = f"model.layers.{num_layers}.", {"enorm": "enorm", "hnorm": "hnorm", "eh_proj": "eh_proj"}
        own["shared_head.norm"] = "norm"
        skip = ("embed_tokens.", "shared_head.head.")
    elif layout == "mtp":
        prefix = "mtp."
        own = {"pre_fc_norm_embedding": "enorm", "pre_fc_norm_hidden": "hnorm", "fc": "eh_proj", "norm": "norm"}
        skip = ("embed_tokens.",)
    elif layout == "mimo":
        prefix = "model.mtp_layers.0."
        own = {"token_layernorm": "enorm", "hidden_layernorm": "hnorm", "input_proj": "eh_proj", "final_layernorm": "norm"}
        skip = ()
    else:
        raise ValueError(f"unknown MTP layout {layout!r}; one of {', '.join(LAYOUTS)}")
    if not name.startswith(prefix):
        return None
    rest = name[len(prefix) :]
    if rest.startswith(skip):
        return None
    module, _, param = rest.rpartition(".")
    if module in own:
        return f"{own[module]}.{param}"
    if layout == "mtp":
        if not rest.startswith("layers.0."):
            return None  # further MTP layers: vLLM runs the first for every draft position too
        rest = rest[len("layers.0.") :]
    return f"layer.{rest}"


# ==== reading a checkpoint =======================================================================


def checkpoint_files(source: str) -> list[Path]:
    """The safetensors files of a model folder or a hub id already in the local cache ([] for a
    GGUF file, which carries no MTP weights, or when nothing is found)."""
    p = Path(source).expanduser()
    if p.is_file():
        return [p] if p.suffix == ".safetensors" else []
    if p.is_dir():
        return sorted(p.glob("*.safetensors"))
    try:
        folder = snapshot_download(source, allow_patterns=["*.safetensors", "*.json"], local_files_only=True)
    except Exception:  # noqa: BLE001 - not cached, not a hub id, offline: no files either way
        return []
    return sorted(Path(folder).glob("*.safetensors"))


def read_mtp_weights(files: list[Path], *, num_layers: int) -> tuple[str | None, dict[str, torch.Tensor]]:
    """(layout, {head key: tensor}) with only the MTP tensors read from ``files``."""
    names: dict[str, Path] = {}
    for f in files:
        with safe_open(str(f), "pt") as sf:
            names.update({k: f for k in sf.keys()})
    layout = layout_of(names, num_layers=num_layers)
    if layout is None:
        return None, {}
    wanted: dict[Path, dict[str, str]] = {}
    for name, f in names.items():
        key = head_key(name, layout, num_layers=num_layers)
        if key is not None:
            wanted.setdefault(f, {})[name] = key
    out = {}
    for f, keys in wanted.items():
        with safe_open(str(f), "pt") as sf:
            out.update({key: sf.get_tensor(name) for name, key in keys.items()})
    return layout, out


def layer_index_for(layout: str, parts: TargetParts) -> int:
    """The index the MTP layer is built as: DeepSeek's MTP layer is layer L (a MoE layer); the
    ``mtp.*`` layouts' is a full-attention layer (Qwen3.5's main stack mixes in linear attention)."""
    if layout == "deepseek":
        return parts.num_layers
    types = getattr(parts.config, "layer_types", None)
    if types and "full_attention" in types:
        return types.index("full_attention")
    return parts.num_layers - 1


def fuse_experts(weights: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-expert MoE tensors (``mlp.experts.{e}.gate_proj.weight``...) stacked into transformers'
    fused ones (``mlp.experts.gate_up_proj`` [E, 2I, d], ``mlp.experts.down_proj`` [E, d, I])
    where the layer has fused parameters; everything else unchanged."""
    out = dict(weights)
    for fused in [k for k in want if k.endswith("experts.gate_up_proj") or k.endswith("experts.down_proj")]:
        if fused in out:
            continue
        base = fused.rsplit(".", 1)[0]
        n = want[fused].shape[0]
        if fused.endswith("gate_up_proj"):
            parts = [
                torch.cat([out.pop(f"{base}.{e}.gate_proj.weight"), out.pop(f"{base}.{e}.up_proj.weight")], dim=0)
                for e in range(n)
            ]
        else:
            parts = [out.pop(f"{base}.{e}.down_proj.weight") for e in range(n)]
        out[fused] = torch.stack(parts)
    return out


def head_from_weights(parts: TargetParts, layout: str, weights: dict[str, torch.Tensor], *, source: str) -> MTPHead:
    """An MTPHead holding a checkpoint's MTP weights (the target's embedding and lm_head)."""
    head = MTPHead(parts, layer_index=layer_index_for(layout, parts), draft_ids=None)
    want = head.state_dict()
    weights = dict(weights)
    if layout == "mimo":  # MiMo concatenates [hidden, embedding]; ours is DeepSeek's [embedding, hidden]
        w = weights["eh_proj.weight"]
        d = w.shape[1] // 2
        weights["eh_proj.weight"] = torch.cat([w[:, d:], w[:, :d]], dim=1)
    try:
        weights = fuse_experts(weights, want)
    except KeyError as e:
        raise ModelLoadError(f"{source}: the MTP layer's experts are incomplete (missing {e}).") from None
    for k in [k for k in weights if k not in want and k.endswith(".bias") and not weights[k].any()]:
        del weights[k]  # a zero bias the layer lacks is no bias (a Llama layer exported as Qwen2's)
    missing = sorted(set(want) - set(weights))
    unexpected = sorted(set(weights) - set(want))
    if missing or unexpected:
        raise ModelLoadError(
            f"{source}: its {layout} MTP weights do not fit a {type(parts.last_layer).__name__}: "
            f"missing {', '.join(missing[:4]) or 'none'}; unexpected {', '.join(unexpected[:4]) or 'none'}."
        )
    head.load_state_dict({k: v.to(want[k].dtype) for k, v in weights.items()})
    return head


# ==== writing a head back under a checkpoint's names =================================================

_PER_EXPERT = re.compile(r"^(?P<base>.*experts)\.(?P<e>\d+)\.(?P<proj>gate|up|down)_proj\.weight$")


def checkpoint_tensors(names, state: dict[str, torch.Tensor], layout: str, *, num_layers: int) -> dict[str, torch.Tensor]:
    """The inverse of :func:`read_mtp_weights` and :func:`head_from_weights`: for each of a
    checkpoint's tensor ``names`` that holds a head weight, that weight taken from ``state`` (an
    MTPHead's state dict) in the checkpoint's form: MiMo's projection halves swapped back,
    transformers' fused experts split per expert. Names the head does not hold are left out: the
    layout's own embedding and lm_head copies, further MTP layers, a zero bias the layer lacks.

    >>> w = torch.arange(4.0).view(1, 4)  # ours: [embedding | hidden], d = 2
    >>> checkpoint_tensors(["model.mtp_layers.0.input_proj.weight"], {"eh_proj.weight": w}, "mimo", num_layers=2)
    {'model.mtp_layers.0.input_proj.weight': tensor([[2., 3., 0., 1.]])}
    """
    out = {}
    for name in names:
        key = head_key(name, layout, num_layers=num_layers)
        if key is None:
            continue
        if key in state:
            t = state[key]
            if layout == "mimo" and key == "eh_proj.weight":  # ours is [embedding, hidden]; MiMo's [hidden, embedding]
                d = t.shape[1] // 2
                t = torch.cat([t[:, d:], t[:, :d]], dim=1)
        elif (m := _PER_EXPERT.match(key)) and f"{m['base']}.{'down' if m['proj'] == 'down' else 'gate_up'}_proj" in state:
            e = int(m["e"])
            if m["proj"] == "down":
                t = state[f"{m['base']}.down_proj"][e]  # [E, d, I] → [d, I]
            else:
                gate_up = state[f"{m['base']}.gate_up_proj"][e]  # [2I, d]: gate then up
                half = gate_up.shape[0] // 2
                t = gate_up[:half] if m["proj"] == "gate" else gate_up[half:]
        elif key.endswith(".bias"):
            continue  # a zero bias the layer lacks (head_from_weights dropped it): the checkpoint's stays
        else:
            raise ModelLoadError(f"{name}: the head has no weight {key} for it ({layout} layout).")
        out[name] = t.contiguous()
    return out
