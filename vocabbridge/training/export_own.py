"""A head retrained from the target's own MTP weights (``train-head --init checkpoint``), written
back in the target's own layout, so that vLLM's native ``method: mtp`` serves it.

The export is the target's checkpoint with only the MTP tensors replaced, and nothing copied::

    heads/NAME/vllm/
      config.json, tokenizer files          copied from the target's folder (small)
      model-00001-of-00002.safetensors ...  symlinks to the target's own weight files
      vocabbridge-mtp.safetensors           the retrained MTP tensors, under the checkpoint's names and dtypes
      model.safetensors.index.json          every tensor → its file: the MTP tensors → the new file,
                                            everything else → the original shards
      vocabbridge-export.json               what was exported, and how to serve it

Which tensors are the head's is the layout's business (``heads/layouts.py``: ``head_key`` reads,
``checkpoint_tensors`` writes back); the layout's own embedding and lm_head copies (DeepSeek-V3's
``embed_tokens``, ``shared_head.head``) and further MTP layers stay the checkpoint's.

vLLM loads a native MTP head from the folder its speculative config names (the target's own when
it names none: ``vllm/config/speculative.py``), and turns the folder's config, the target's own,
into its MTP model (``SpeculativeConfig.hf_config_override``: DeepSeek-V3 → ``DeepSeekMTPModel``,
``MiMoForCausalLM`` → ``MiMoMTPModel``, Qwen3.5 → ``Qwen3_5MTP``, EXAONE 4.5 → ``Exaone4_5_MTP``).
So the target is served as always, and the export is its draft::

    vllm serve TARGET --speculative-config '{"method": "mtp", "model": "heads/NAME/vllm", "num_speculative_tokens": 3}'

(serving the export itself as the target, with ``{"method": "mtp", ...}`` and no model, runs the
same weights: its index resolves every tensor). Only the first MTP layer is retrained, re-run for
every draft position as our engine runs it; a checkpoint with more MTP layers keeps the others.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from ..errors import ConfigError, ModelLoadError
from ..heads import EXPORT_RECORD
from ..heads.layouts import checkpoint_files, checkpoint_tensors, layout_of
from ..heads.store import WEIGHTS_FILE, save_tensors
from ..util import atomic_write_text

INDEX = "model.safetensors.index.json"
MTP_FILE = "vocabbridge-mtp.safetensors"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".ckpt", ".onnx")  # never copied
DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}


def weight_map(folder: Path) -> dict[str, Path]:
    """Every tensor of a checkpoint folder → the file holding it: its index where it has one (as
    vLLM and transformers read it: files the index leaves out are not the model's), else every
    safetensors file in it."""
    index = folder / INDEX
    if index.is_file():
        try:
            wm = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError) as e:
            raise ModelLoadError(f"{index}: unreadable ({e}).") from None
        return {name: folder / f for name, f in wm.items()}
    out: dict[str, Path] = {}
    for f in checkpoint_files(str(folder)):
        with safe_open(str(f), "pt") as sf:
            out.update({k: f for k in sf.keys()})
    return out


def _headers(names: dict[str, Path]) -> dict[str, tuple[str, list[int]]]:
    """name → (safetensors dtype, shape), from the files' headers (no tensor is read)."""
    by_file: dict[Path, list[str]] = {}
    for name, f in names.items():
        by_file.setdefault(f, []).append(name)
    out = {}
    for f, keys in by_file.items():
        with safe_open(str(f), "pt") as sf:
            for k in keys:
                s = sf.get_slice(k)
                out[k] = (s.get_dtype(), list(s.get_shape()))
    return out


def _nbytes(dtype: str, shape: list[int]) -> int:
    size = {"F64": 8, "I64": 8, "U64": 8, "F32": 4, "I32": 4, "U32": 4, "F16": 2, "BF16": 2, "I16": 2, "U16": 2}.get(dtype, 1)
    n = size
    for x in shape:
        n *= x
    return n


def _fresh_folder(out_dir: Path) -> Path:
    """An empty staging folder beside ``out_dir`` (moved into place once complete); refuses to
    replace a folder that is not an export."""
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / EXPORT_RECORD).is_file():
        raise ConfigError(f"{out_dir} exists and is not a vocabbridge export; export into another folder.")
    tmp = out_dir.with_name(f".{out_dir.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)  # a staging folder an interrupted export left (symlinks are removed, not followed)
    tmp.mkdir(parents=True)
    return tmp


def export_own_layout(head_dir: Path, out_dir: Path, cfg: dict, folder: Path, k: int) -> dict:
    """Write ``head_dir``'s head (retrained from ``folder``'s own MTP weights) back into that
    checkpoint's layout in ``out_dir``; the ``--speculative-config`` that serves it."""
    names = weight_map(folder)
    num_layers = int(cfg["target"]["num_hidden_layers"])
    layout = layout_of(names, num_layers=num_layers)
    recorded = cfg.get("training", {}).get("checkpoint_mtp", {}).get("layout")
    if layout is None or layout != recorded:
        raise ModelLoadError(
            f"{folder}: the target's checkpoint no longer has the {recorded} MTP weights the head in {head_dir} was "
            f"retrained from (found: {layout or 'none'}); export from the checkpoint it was trained on."
        )
    state = load_file(str(head_dir / WEIGHTS_FILE))
    if state.pop("d2t", None) is not None:
        raise ModelLoadError(
            f"{head_dir}: a head retrained from the checkpoint drafts over the whole vocabulary; this one has d2t."
        )
    new = checkpoint_tensors(names, state, layout, num_layers=num_layers)
    headers = _headers(names)
    for name, t in new.items():
        dtype, shape = headers[name]
        if dtype not in DTYPES:
            raise ConfigError(
                f"{name} is {dtype} in the checkpoint; vocabbridge writes back float32/bfloat16/float16 MTP tensors only."
            )
        if list(t.shape) != shape:
            raise ModelLoadError(f"{name}: the head's tensor is {list(t.shape)}, the checkpoint's {shape}.")
        new[name] = t.to(DTYPES[dtype]).contiguous()
    shards = sorted({f for n, f in names.items() if n not in new})
    if MTP_FILE in {f.name for f in shards}:
        raise ConfigError(f"{folder} already has a file named {MTP_FILE}; the export cannot add its own beside it.")

    tmp = _fresh_folder(out_dir)
    for f in sorted(folder.iterdir()):  # config, generation config, tokenizer files, chat template, remote code
        if f.is_file() and f.name != INDEX and not f.name.endswith(WEIGHT_SUFFIXES):
            shutil.copyfile(f, tmp / f.name)
    for f in shards:
        os.symlink(os.path.abspath(f), tmp / f.name)  # the original weights, not copied
    save_tensors(new, tmp / MTP_FILE, metadata={"format": "pt"})
    wmap = {n: (MTP_FILE if n in new else names[n].name) for n in sorted(names)}
    total = sum(_nbytes(*headers[n]) for n in names)
    index = {"metadata": {"total_size": total}, "weight_map": wmap}
    atomic_write_text(tmp / INDEX, json.dumps(index, indent=2) + "\n")
    spec = {"method": "mtp", "model": str(out_dir), "num_speculative_tokens": k}
    record = {
        "exported_from": str(head_dir),
        "layout": "own",
        "checkpoint_layout": layout,
        "target": cfg["target"]["source"],
        "target_folder": str(folder),
        "mtp_tensors": sorted(new),
        "linked_shards": [str(f) for f in shards],
        "draft_vocabulary": "full (the model's own head)",
        "speculative_config": spec,
        "serve": (
            f"vllm serve {folder} --speculative-config '{json.dumps(spec)}'  "
            f"(or: vllm serve {out_dir} --speculative-config "
            f"'{json.dumps({'method': 'mtp', 'num_speculative_tokens': k})}')"
        ),
    }
    atomic_write_text(tmp / EXPORT_RECORD, json.dumps(record, indent=2) + "\n")
    if out_dir.exists():
        shutil.rmtree(out_dir)  # an earlier export (its symlinks are removed, not followed)
    tmp.rename(out_dir)
    return spec
