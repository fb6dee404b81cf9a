"""A trained head as a checkpoint vLLM serves: an EAGLE-3 head (``train-head --arch eagle3``) as vLLM's
own EAGLE-3 checkpoint (``method: eagle3``, the draft vocabulary as ``d2t``: below), a P-EAGLE head
(``--arch peagle``) as the same with vLLM's parallel drafting turned on, an MTP head in MiMo's MTP
layout (``method: mtp``), and the target's own MTP head retrained (``--init checkpoint``) back in
the target's own layout (``method: mtp``; export_own.py).

**MTP heads.**

vLLM has no MTP class for Qwen2 or Llama targets, but MiMo (``mimo_mtp.py``) is a Qwen2 model with
exactly our head on a Qwen2 decoder layer: ``token_layernorm`` (enorm), ``hidden_layernorm``
(hnorm), ``input_proj`` (eh_proj, with the halves in [hidden, embedding] order), ``mtp_block``
(the layer), ``final_layernorm`` (norm). A folder whose config names ``MiMoForCausalLM`` is turned
by vLLM's ``SpeculativeConfig.hf_config_override`` into ``MiMoMTPModel``, so::

    --speculative-config '{"method": "mtp", "model": "heads/NAME/vllm", "num_speculative_tokens": 3}'
    --hf-overrides '{"num_nextn_predict_layers": 1}'

serves the head beside any Qwen2 or Llama target. The ``--hf-overrides`` is needed because vLLM's
MiMo MTP layer reads its layer count from the target's config, not the draft's (MiMo ships its MTP
layer inside its own checkpoint); ``vocabbridge serve --backend vllm --drafter mtp:HEAD`` adds it.

A Llama layer is a Qwen2 layer with zero q/k/v biases. vLLM re-runs the one layer for k > 1, on
its own output, as our engine does, and shares the target's embedding and lm_head with it (the
copies written here only satisfy its loader's completeness check). The export drafts over the
whole vocabulary: MiMo's layout has no draft vocabulary (``train-head`` reports the held-out
acceptance of both).

EAGLE (``llama_eagle.py``) cannot hold this head: its fc takes un-normalized inputs and its layer
has no input norm; EAGLE-3 normalizes the two inputs but feeds their concatenation to a 2d-wide
attention with the hidden state as residual. Neither computes enorm/hnorm → eh_proj → layer.

**EAGLE-3 heads** are trained in vLLM's own form (heads/eagle3.py), so the export only renames:
``midlayer.*`` for the layer (``hidden_norm`` in it), ``fc`` and ``fc_norm.i`` (the config's
``fc_norm``), ``norm``, the draft vocabulary's ``lm_head`` rows, and ``d2t`` as offsets (target id =
draft id + d2t); the config names the target layers (``eagle_config.eagle_aux_hidden_state_layer_ids``)
and the draft vocabulary's size. vLLM then drafts over those rows only::

    --speculative-config '{"method": "eagle3", "model": "heads/NAME/vllm", "num_speculative_tokens": 3}'

**P-EAGLE heads** are EAGLE-3 checkpoints with the mask position vLLM's parallel drafting reads
(``llama_eagle3.py``, ``llm_base_proposer.py``): ``mask_hidden`` [1, n·d] (the mask position's
layer streams, which vLLM passes through ``fc`` as we do), and the mask token's embedding as the
row ``ptd_token_id`` (the config names it) of the head's own ``embed_tokens``: the target's
embedding with that one row replaced, so vLLM does not share the target's. The row is one the
tokenizer never produces (an embedding row past its last id, as Qwen2.5 has 271), else a special
token without a role that the chat template does not write (the record says which)::

    --speculative-config '{"method": "eagle3", "model": "heads/NAME/vllm", "num_speculative_tokens": 4,
                           "parallel_drafting": true}'

>>> export_for_vllm("heads/qwen2.5-coder-1.5b")  # doctest: +SKIP
{'method': 'mtp', 'model': 'heads/qwen2.5-coder-1.5b/vllm', 'num_speculative_tokens': 3}
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from ..engine.convert import converted_folder
from ..errors import ConfigError, ModelLoadError
from ..heads import VLLM_EXPORT, head_from_checkpoint
from ..heads.eagle3 import HOSTS as EAGLE3_HOSTS
from ..heads.layouts import checkpoint_files
from ..heads.store import WEIGHTS_FILE, read_head_config, save_tensors
from ..presets import resolve_model
from ..tokenizer import load_tokenizer
from ..util import atomic_write_text
from .export_own import export_own_layout

HOSTS = ("qwen2", "llama", "mistral")  # targets whose decoder layer vLLM's MiMo MTP layer (Qwen2's) reproduces
QKV = ("q_proj", "k_proj", "v_proj")


def target_folder(source: str, resolved: str | None = None) -> Path:
    """The HF folder holding the target's config and weights (a GGUF file's converted folder): the
    file or folder the head was trained from when it is still there, else ``source`` resolved here."""
    here = Path(resolved).expanduser() if resolved else None
    p = here if here is not None and here.exists() else Path(resolve_model(source)).expanduser()
    if p.is_file() and p.suffix == ".gguf":
        return converted_folder(p)
    if p.is_dir():
        return p
    files = checkpoint_files(str(p))
    if not files:
        raise ModelLoadError(
            f"{source}: no local checkpoint (folder, .gguf file or hub cache) to read the target's config from; "
            "set VOCABBRIDGE_MODELS for a preset, or download the model."
        )
    return files[0].parent


def _target_tensor(files: list[Path], names: tuple[str, ...]) -> torch.Tensor:
    for f in files:
        with safe_open(str(f), "pt") as sf:
            for name in names:
                if name in sf.keys():
                    return sf.get_tensor(name)
    raise ModelLoadError(f"the target checkpoint has none of {', '.join(names)}.")


def mimo_state(head_state: dict[str, torch.Tensor], *, hidden_size: int) -> dict[str, torch.Tensor]:
    """Our head's tensors under MiMo's MTP names (``model.mtp_layers.0.*``), q/k/v biases added
    where the layer has none (a Llama layer in vLLM's Qwen2 layer)."""
    prefix = "model.mtp_layers.0."
    own = {"enorm": "token_layernorm", "hnorm": "hidden_layernorm", "eh_proj": "input_proj", "norm": "final_layernorm"}
    out = {}
    for key, t in head_state.items():
        module, _, param = key.partition(".")
        if module in own:
            if module == "eh_proj":  # ours is [embedding, hidden]; MiMo's is [hidden, embedding]
                t = torch.cat([t[:, hidden_size:], t[:, :hidden_size]], dim=1)
            out[f"{prefix}{own[module]}.{param}"] = t
        elif module == "layer":
            out[prefix + param] = t
    for proj in QKV:
        w = out.get(f"{prefix}self_attn.{proj}.weight")
        if w is not None and f"{prefix}self_attn.{proj}.bias" not in out:
            out[f"{prefix}self_attn.{proj}.bias"] = torch.zeros(w.shape[0], dtype=w.dtype)
    return out


def export_for_vllm(head_dir: str | Path, out_dir: str | Path | None = None, *, num_speculative_tokens: int = 3) -> dict:
    """Write ``head_dir``'s head as a checkpoint vLLM serves (default ``head_dir/vllm``) and return the
    ``--speculative-config`` that serves it: an MTP head in MiMo's MTP layout (``method: mtp``), an
    EAGLE-3 head as vLLM's own EAGLE-3 checkpoint with its draft vocabulary as ``d2t`` (``method: eagle3``)."""
    head_dir = Path(head_dir).expanduser()
    out_dir = Path(out_dir).expanduser() if out_dir is not None else head_dir / VLLM_EXPORT
    cfg = read_head_config(head_dir)
    tgt = cfg["target"]
    folder = target_folder(tgt["source"], tgt.get("resolved"))
    target_cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    text_cfg = target_cfg.get("text_config", target_cfg)
    if cfg.get("arch", "mtp") in ("eagle3", "peagle"):
        return _export_eagle3(head_dir, out_dir, cfg, folder, text_cfg, num_speculative_tokens)
    if head_from_checkpoint(head_dir):
        return export_own_layout(head_dir, out_dir, cfg, folder, num_speculative_tokens)
    if text_cfg.get("model_type") not in HOSTS:
        raise ConfigError(
            f"vLLM serves our heads through MiMo's MTP layout, whose layer is a Qwen2 layer; a {text_cfg.get('model_type')} "
            f"head cannot be exported (targets: {', '.join(HOSTS)}). Serve this target with --backend embedded "
            f"--drafter mtp:{head_dir}."
        )
    state = load_file(str(head_dir / WEIGHTS_FILE))
    state.pop("d2t", None)
    d = int(cfg["hidden_size"])
    named = text_cfg.get("dtype") or text_cfg.get("torch_dtype") or ""  # transformers 5 writes "dtype"
    dtype = torch.float16 if named == "float16" else torch.bfloat16  # vLLM casts to the dtype it serves in
    weights = mimo_state(state, hidden_size=d)
    files = checkpoint_files(str(folder))
    embed = _target_tensor(files, ("model.embed_tokens.weight",))
    weights["model.embed_tokens.weight"] = embed
    weights["lm_head.weight"] = _target_tensor(files, ("lm_head.weight", "model.embed_tokens.weight"))
    weights = {k: v.to(dtype).contiguous() for k, v in weights.items()}

    config = dict(text_cfg)
    config.update(
        {
            "architectures": ["MiMoForCausalLM"],  # vLLM turns it into MiMoMTPModel (hf_config_override)
            "model_type": "qwen2",
            "num_nextn_predict_layers": 1,
            "use_sliding_window": False,
            "dtype": str(dtype).replace("torch.", ""),
            "torch_dtype": str(dtype).replace("torch.", ""),
        }
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    save_tensors(weights, out_dir / "model.safetensors", metadata={"format": "pt"})
    atomic_write_text(out_dir / "config.json", json.dumps(config, indent=2) + "\n")
    spec = {"method": "mtp", "model": str(out_dir), "num_speculative_tokens": num_speculative_tokens}
    record = {
        "exported_from": str(head_dir),
        "layout": "mimo",
        "target": tgt["source"],
        "target_folder": str(folder),
        "draft_vocabulary": "full (the draft vocabulary of the head is not used by this layout)",
        "speculative_config": spec,
    }
    atomic_write_text(out_dir / "vocabbridge-export.json", json.dumps(record, indent=2) + "\n")
    return spec


# ==== EAGLE-3 ======================================================================================

EAGLE3_LAYER = "midlayer."  # vLLM's name for the one EAGLE-3 layer (mapped to layers.0)
COPIED_CONFIG = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "rms_norm_eps",
    "max_position_embeddings",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "vocab_size",
)


def eagle3_state(head_state: dict[str, torch.Tensor], *, lm_head_rows: torch.Tensor, d2t: torch.Tensor, o_bias: bool) -> dict:
    """Our EAGLE-3 head's tensors under vLLM's names: ``midlayer.*`` (the layer, with ``hidden_norm``),
    ``fc``, ``fc_norm.i``, ``norm``, the draft vocabulary's ``lm_head`` rows and ``d2t`` as vLLM reads
    it: the offset of each draft id's target id (target id = draft id + d2t[draft id])."""
    out = {}
    for key, t in head_state.items():
        module, _, rest = key.partition(".")
        if module == "layer":
            out[EAGLE3_LAYER + rest] = t
        elif module == "hidden_norm":
            out[f"{EAGLE3_LAYER}hidden_norm.{rest}"] = t
        elif module in ("fc", "fc_norm", "norm"):
            out[key] = t
    w = out.get(f"{EAGLE3_LAYER}self_attn.o_proj.weight")
    if o_bias and w is not None and f"{EAGLE3_LAYER}self_attn.o_proj.bias" not in out:
        out[f"{EAGLE3_LAYER}self_attn.o_proj.bias"] = torch.zeros(w.shape[0], dtype=w.dtype)  # vLLM's o_proj has one with q/k/v's
    out["lm_head.weight"] = lm_head_rows
    out["d2t"] = (d2t.long() - torch.arange(len(d2t))).contiguous()
    return out


def mask_token_id(folder: Path, rows: int) -> tuple[int, str]:
    """The id whose embedding row a P-EAGLE export gives the mask token, and why that one: the last
    embedding row the target's tokenizer never produces, else the last special token without a role
    that the chat template does not write (its embedding in the head changes; text holding it drafts
    worse, never wrongly: the target verifies)."""
    view = load_tokenizer(str(folder))
    unused = [i for i in range(rows) if i >= view.size or view.tokens[i] is None]
    if unused:
        return unused[-1], f"embedding row {unused[-1]}, past the tokenizer's ids (unused by any text)"
    template = view.chat_template or ""
    spare = [a for a in view.added if a.special and not a.roles and a.content not in template and a.id < rows]
    if spare:
        a = max(spare, key=lambda a: a.id)
        return a.id, f"special token {a.content!r} (id {a.id}: no role, not written by the chat template)"
    raise ConfigError(
        f"{folder}: no embedding row is free for P-EAGLE's mask token (every id is a token, and every special token "
        f"has a role or is written by the chat template); serve this head with --backend embedded."
    )


def _export_eagle3(head_dir: Path, out_dir: Path, cfg: dict, folder: Path, text_cfg: dict, k: int) -> dict:
    if text_cfg.get("model_type") not in EAGLE3_HOSTS:
        raise ConfigError(
            f"vLLM serves EAGLE-3 heads as a Llama layer; a {text_cfg.get('model_type')} target's head cannot be exported "
            f"(targets: {', '.join(EAGLE3_HOSTS)}). Serve it with --backend embedded --drafter mtp:{head_dir}."
        )
    state = load_file(str(head_dir / WEIGHTS_FILE))
    vocab = int(cfg["target"]["vocab_size"])
    d2t = state.pop("d2t", None)
    if d2t is None:
        d2t = torch.arange(vocab)
    lm_head = _target_tensor(checkpoint_files(str(folder)), ("lm_head.weight", "model.embed_tokens.weight"))
    has_bias = any(k.endswith("self_attn.q_proj.bias") for k in state)
    named = text_cfg.get("dtype") or text_cfg.get("torch_dtype") or ""
    dtype = torch.float16 if named == "float16" else torch.bfloat16
    weights = eagle3_state(state, lm_head_rows=lm_head[d2t.long()], d2t=d2t, o_bias=has_bias)
    parallel = cfg.get("arch") == "peagle"
    if parallel:  # the mask position vLLM's parallel drafting reads
        ptd, why = mask_token_id(folder, vocab)
        embed = _target_tensor(checkpoint_files(str(folder)), ("model.embed_tokens.weight",)).clone()
        embed[ptd] = state["mask_embed"].to(embed.dtype)
        weights["embed_tokens.weight"] = embed
        weights["mask_hidden"] = state["mask_hidden"].view(1, -1)
    weights = {n: (t if n == "d2t" else t.to(dtype)).contiguous() for n, t in weights.items()}
    aux = [int(i) for i in cfg["aux_layers"]]
    config = {key: text_cfg[key] for key in COPIED_CONFIG if key in text_cfg}
    config.update(
        {
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "num_hidden_layers": 1,
            "draft_vocab_size": len(d2t),
            "target_hidden_size": int(cfg["hidden_size"]),
            "tie_word_embeddings": False,
            "attention_bias": has_bias,  # vLLM's EAGLE-3 layer gives q/k/v (and o_proj) a bias when set
            "fc_norm": True,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux, "use_aux_hidden_state": True},
            "dtype": str(dtype).replace("torch.", ""),
            "torch_dtype": str(dtype).replace("torch.", ""),
        }
    )
    if parallel:
        config["ptd_token_id"] = ptd  # the mask token vLLM feeds at the parallel positions
        k = min(k, int(cfg["parallel_tokens"]))
    out_dir.mkdir(parents=True, exist_ok=True)
    save_tensors(weights, out_dir / "model.safetensors", metadata={"format": "pt"})
    atomic_write_text(out_dir / "config.json", json.dumps(config, indent=2) + "\n")
    spec = {"method": "eagle3", "model": str(out_dir), "num_speculative_tokens": k}
    if parallel:
        spec["parallel_drafting"] = True
    record = {
        "exported_from": str(head_dir),
        "layout": "peagle" if parallel else "eagle3",
        **({"mask_token": why, "parallel_tokens": int(cfg["parallel_tokens"])} if parallel else {}),
        "target": cfg["target"]["source"],
        "target_folder": str(folder),
        "draft_vocabulary": f"{len(d2t)} of {vocab} target tokens (d2t)",
        "aux_layers": aux,
        "speculative_config": spec,
    }
    atomic_write_text(out_dir / "vocabbridge-export.json", json.dumps(record, indent=2) + "\n")
    return spec
