"""Reading what a transplant needs: the drafter as a transformers model, the target's embedding
matrices (for ``--init omp``), the target's model vocabulary size and its tokenizer files.

A GGUF drafter is converted once into an HF folder (``engine.convert``, the folder our engine and
vLLM load too); a GGUF target is only read for its two matrices (``gguf``'s reader de-quantizes
them) and its tokenizer (transformers converts it from the GGUF metadata).

>>> model_source("/models/SmolLM2-135M-Instruct.Q4_1.gguf")  # doctest: +SKIP
PosixPath('~/.cache/vocabbridge/converted/SmolLM2-135M-Instruct.Q4_1-0e7cb7684e50')
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from ..engine.convert import converted_folder
from ..errors import ModelLoadError
from ..presets import resolve_model

GGUF_INPUT, GGUF_OUTPUT = "token_embd.weight", "output.weight"


def _gguf_of(source: str) -> Path | None:
    path = Path(source).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir() and not (path / "config.json").is_file():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ggufs[0]
    return None


def model_source(source: str, *, say=None) -> str | Path:
    """What transformers loads for ``source`` (a preset, folder, GGUF file or hub id): a GGUF file
    becomes its converted HF folder; a folder and a hub id stay as they are."""
    src = resolve_model(source)
    gguf = _gguf_of(src)
    if gguf is not None:
        return converted_folder(gguf, say=say)
    path = Path(src).expanduser()
    if path.exists() and not (path / "config.json").is_file():
        raise ModelLoadError(
            f"{src}: no config.json (and not exactly one .gguf file); pass a model folder, a .gguf file or a hub id."
        )
    return path if path.exists() else src


def load_drafter_model(source: str, *, say=None):
    """The drafter as a float32 transformers causal LM on the CPU."""
    from transformers import AutoModelForCausalLM

    src = model_source(source, say=say)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32)
    except (OSError, ValueError, RuntimeError) as e:
        raise ModelLoadError(f"{source}: transformers could not load the drafter: {e}") from e
    if getattr(model.get_output_embeddings(), "bias", None) is not None:
        raise ModelLoadError(
            f"{source}: its lm_head has a bias, which transplanting does not carry over; use a drafter without one."
        )
    return model.eval()


def target_rows(source: str, tokenizer_size: int, model_vocab_size: int | None) -> int:
    """The target model's embedding rows: its config's (or GGUF's) vocabulary size, else the tokenizer's."""
    return max(model_vocab_size or 0, tokenizer_size)


def target_embeddings(source: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The target's (input embedding, lm_head or None when tied) matrices, float32: read from a GGUF
    file (de-quantized), a folder's safetensors, or a hub id's (only the shards holding them)."""
    src = resolve_model(source)
    gguf = _gguf_of(src)
    if gguf is not None:
        return _gguf_matrices(gguf)
    path = Path(src).expanduser()
    if path.is_dir():
        return _safetensors_matrices(path, lambda name: path / name)
    if path.exists():
        raise ModelLoadError(f"{src}: not a model folder, a .gguf file or a hub id; --init omp reads the target's embeddings.")
    from huggingface_hub import hf_hub_download

    return _safetensors_matrices(Path(src), lambda name: Path(hf_hub_download(src, name)))


def _gguf_matrices(path: Path) -> tuple[torch.Tensor, torch.Tensor | None]:
    import gguf

    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors if t.name in (GGUF_INPUT, GGUF_OUTPUT)}
    if GGUF_INPUT not in tensors:
        raise ModelLoadError(f"{path}: no {GGUF_INPUT} tensor; is it a language model GGUF?")

    def read(t) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32))

    return read(tensors[GGUF_INPUT]), read(tensors[GGUF_OUTPUT]) if GGUF_OUTPUT in tensors else None


def _safetensors_matrices(folder: Path, fetch) -> tuple[torch.Tensor, torch.Tensor | None]:
    from safetensors import safe_open

    try:
        index = json.loads(fetch("model.safetensors.index.json").read_text())["weight_map"]
    except (OSError, ValueError, KeyError):
        index = None
    if index is None:
        f = fetch("model.safetensors")
        with safe_open(str(f), "pt") as s:
            index = {k: "model.safetensors" for k in s.keys()}
    emb = next((k for k in index if k.endswith("embed_tokens.weight") and "visual" not in k), None)
    head = next((k for k in index if k.endswith("lm_head.weight") and "mtp" not in k), None)
    if emb is None:
        raise ModelLoadError(f"{folder}: no *embed_tokens.weight in its safetensors; --init omp reads the target's embeddings.")

    def read(key: str) -> torch.Tensor:
        with safe_open(str(fetch(index[key])), "pt") as s:
            return s.get_tensor(key).float()

    return read(emb), (read(head) if head else None)


def save_target_tokenizer(source: str, dest: Path) -> None:
    """The target's tokenizer files (chat template included), written by transformers' save_pretrained."""
    from transformers import AutoTokenizer

    src = resolve_model(source)
    gguf = _gguf_of(src)
    try:
        if gguf is not None:
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        else:
            path = Path(src).expanduser()
            tok = AutoTokenizer.from_pretrained(str(path.parent if path.is_file() else src))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{source}: transformers could not load the target's tokenizer: {e}") from e
    tok.save_pretrained(str(dest))


def target_generation_config(source: str) -> dict | None:
    """The target folder's generation_config.json, when it has one."""
    path = Path(resolve_model(source)).expanduser()
    f = (path if path.is_dir() else path.parent) / "generation_config.json"
    if path.exists() and _gguf_of(str(path)) is None and f.is_file():
        return json.loads(f.read_text())
    return None
