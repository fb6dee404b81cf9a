"""A trained head on disk, and the checks that keep it with its target.

A head folder (``vocabbridge train-head -o heads/NAME``)::

    heads/NAME/
      config.json        format, the layer's index, the draft vocabulary size, the target it was
                         trained for (model type, sizes, tokenizer fingerprint, a weights signature),
                         and the training record (recipe, seed, timings, held-out acceptance)
      head.safetensors   the head's weights (MTP: enorm, hnorm, eh_proj, the decoder layer, norm; EAGLE-3:
                         fc_norm, fc, the layer, hidden_norm, norm; P-EAGLE: EAGLE-3's and mask_hidden,
                         mask_embed) and d2t (draft id → target id)
      train/             features, checkpoints, curves (PNG), metrics.jsonl, eval.json

A head is refused for another target: another tokenizer, other sizes, or other weights (the
signature compares a few fixed weights with a tolerance that bf16 rounding stays inside).

>>> head = load_head("heads/qwen2.5-coder-1.5b", parts, tokenizer_fingerprint=view.fingerprint)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..errors import ConfigError, ModelLoadError
from ..util import atomic_write_text
from .draft_head import DraftHead, MTPHead, TargetParts, signatures_match, weights_signature
from .eagle3 import Eagle3Head
from .peagle import PEagleHead

FORMAT = "vocabbridge.mtp-head/1"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "head.safetensors"


def save_tensors(state: dict[str, torch.Tensor], path: Path, *, metadata: dict[str, str] | None = None) -> None:
    """Write a safetensors file atomically, with the permissions a plain open() would give it
    (safetensors creates files readable by their owner only)."""
    tmp = path.with_name(f".{path.name}.tmp")
    save_file(state, str(tmp), metadata=metadata)
    os.chmod(tmp, 0o666 & ~_UMASK)
    tmp.replace(path)


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def target_record(parts: TargetParts, *, source: str, tokenizer_fingerprint: str, resolved: str | None = None) -> dict:
    """What identifies a target: recorded when a head is trained, checked when it is loaded
    (``source`` as the user named it, ``resolved`` the file or folder it was loaded from)."""
    cfg = parts.config
    return {
        "source": source,
        "resolved": resolved or source,
        "model_type": getattr(cfg, "model_type", None),
        "layer_class": type(parts.last_layer).__name__,
        "hidden_size": parts.hidden_size,
        "num_hidden_layers": parts.num_layers,
        "vocab_size": int(parts.embed.weight.shape[0]),
        "tokenizer_fingerprint": tokenizer_fingerprint,
        "weights_signature": weights_signature(parts),
    }


def read_head_config(folder: str | Path) -> dict:
    """A head folder's config.json (errors say what to do)."""
    folder = Path(folder).expanduser()
    path = folder / CONFIG_FILE
    if not path.is_file():
        hint = " (a GGUF file or a model folder is not a head)" if folder.is_file() or (folder / "config.json").exists() else ""
        raise ModelLoadError(
            f"{folder}: not an MTP head folder{hint}: no {CONFIG_FILE} from `vocabbridge train-head`. "
            f"Train one with `vocabbridge train-head --target TARGET -o {folder}`."
        )
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{path}: unreadable ({e}); train the head again with `vocabbridge train-head`.") from None
    if cfg.get("format") != FORMAT:
        raise ModelLoadError(f"{path}: format {cfg.get('format')!r}, expected {FORMAT!r}; train the head again.")
    return cfg


def save_head(head: DraftHead, folder: str | Path, *, target: dict, training: dict) -> Path:
    """Write ``head.safetensors`` and ``config.json`` (each atomically)."""
    folder = Path(folder).expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().float().contiguous().cpu() for k, v in head.trainable_state().items()}
    if head.d2t is not None:
        state["d2t"] = head.d2t.cpu()
    save_tensors(state, folder / WEIGHTS_FILE)
    config = {
        "format": FORMAT,
        "layout": "vocabbridge",
        "arch": head.arch,
        "layer_index": head.layer_index,
        **({"aux_layers": list(head.aux_layers)} if hasattr(head, "aux_layers") else {}),
        **({"parallel_tokens": head.parallel_tokens} if hasattr(head, "parallel_tokens") else {}),
        "hidden_size": target["hidden_size"],
        "draft_vocab_size": head.draft_vocab_size,
        "target": target,
        "training": training,
    }
    atomic_write_text(folder / CONFIG_FILE, json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    return folder


def check_target(config: dict, record: dict, *, folder: Path) -> None:
    """Refuse a head trained for another target, naming what differs and the fix."""
    want = config["target"]
    why = []
    for key in ("hidden_size", "num_hidden_layers", "vocab_size", "model_type"):
        if want.get(key) != record.get(key):
            why.append(f"{key} {want.get(key)} ≠ {record.get(key)}")
    if want.get("tokenizer_fingerprint") != record.get("tokenizer_fingerprint"):
        why.append("another tokenizer")
    if not why and not signatures_match(want.get("weights_signature", []), record.get("weights_signature", [])):
        why.append("other weights (another checkpoint of the same architecture)")
    if why:
        raise ConfigError(
            f"the MTP head in {folder} was trained for {want.get('source')}, not for {record.get('source')} "
            f"({'; '.join(why)}). Train one for this target: "
            f"vocabbridge train-head --target {record.get('source')} -o heads/NAME"
        )


def load_head(folder: str | Path, parts: TargetParts, *, tokenizer_fingerprint: str, source: str) -> DraftHead:
    """The head in ``folder`` on ``parts``' target (refused for another target)."""
    folder = Path(folder).expanduser()
    config = read_head_config(folder)
    check_target(config, target_record(parts, source=source, tokenizer_fingerprint=tokenizer_fingerprint), folder=folder)
    try:
        state = load_file(str(folder / WEIGHTS_FILE))
    except (OSError, RuntimeError) as e:
        raise ModelLoadError(f"{folder / WEIGHTS_FILE}: unreadable ({e}); train the head again.") from None
    d2t = state.pop("d2t", None)
    arch = config.get("arch", "mtp")
    if arch == "peagle":
        head: DraftHead = PEagleHead(
            parts, aux_layers=tuple(config["aux_layers"]), draft_ids=d2t, parallel_tokens=int(config["parallel_tokens"])
        )
    elif arch == "eagle3":
        head = Eagle3Head(parts, aux_layers=tuple(config["aux_layers"]), draft_ids=d2t)
    else:
        head = MTPHead(parts, layer_index=int(config["layer_index"]), draft_ids=d2t)
    missing, unexpected = head.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("lm_head.")]
    if missing or unexpected:
        raise ModelLoadError(
            f"{folder / WEIGHTS_FILE}: does not fit the head (missing {missing[:3]}, unexpected {unexpected[:3]})."
        )
    return head.to(parts.embed.weight.device)


def is_head_folder(path: str | Path) -> bool:
    p = Path(path).expanduser()
    return (p / CONFIG_FILE).is_file() and (p / WEIGHTS_FILE).is_file()
