"""GGUF checkpoints as Hugging Face folders: converted once, cached, shared by our engine and vLLM.

transformers loads a GGUF file by de-quantizing every tensor (minutes for a 1.5B model on two
cores), and vLLM 0.32 has no GGUF loader at all. So a GGUF file is converted once into a plain HF
folder (fp32 safetensors holding exactly the de-quantized values, the tokenizer as transformers
converts it from the GGUF metadata, the chat template, and a generation config) under
``$VOCABBRIDGE_CACHE/converted/`` (default ``~/.cache/vocabbridge/converted``). Our engine loads
the folder in seconds; ``serve --backend vllm`` hands the same folder to vLLM, so both engines run
the very same weights.

The folder is written to a temporary name and renamed when complete, so an interrupted conversion
never leaves a half folder that later loads would trust.

>>> folder = converted_folder("/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")  # doctest: +SKIP
>>> sorted(p.name for p in folder.iterdir())  # doctest: +SKIP
['chat_template.jinja', 'config.json', 'generation_config.json', 'model.safetensors', 'tokenizer.json', ...]
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from ..errors import ModelLoadError
from ..mapping.cache import cache_root

FORMAT = "1"  # bump when what a converted folder holds changes


def converted_dir(gguf: str | Path) -> Path:
    """Where ``gguf``'s converted folder lives (keyed by the file's path, size and mtime)."""
    gguf = Path(gguf).expanduser()
    st = gguf.stat()
    key = f"{gguf.resolve()}|{st.st_size}|{int(st.st_mtime)}|{FORMAT}|{transformers.__version__}"
    return cache_root() / "converted" / f"{gguf.stem}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def is_converted(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (folder / "tokenizer_config.json").is_file()


def converted_folder(gguf: str | Path, *, say=None) -> Path:
    """The HF folder for ``gguf``, converting it first if needed (``say``: a progress callback)."""
    gguf = Path(gguf).expanduser()
    if not gguf.is_file():
        raise ModelLoadError(f"{gguf}: no such GGUF file.")
    dest = converted_dir(gguf)
    if is_converted(dest):
        return dest
    say = say or (lambda msg: print(f"vocabbridge: {msg}", file=sys.stderr, flush=True))
    say(f"converting {gguf.name} to an HF folder once ({dest}; later loads take seconds)…")
    t0 = time.perf_counter()
    tmp = dest.with_name(f"{dest.name}.tmp{os.getpid()}")
    try:
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        save_dequantized(model, tmp)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tokenizer.save_pretrained(str(tmp))
        GenerationConfig.from_model_config(model.config).save_pretrained(str(tmp))
        del model
        if is_converted(dest):  # another process finished first (and may be reading it): keep its folder
            return dest
        if dest.exists():  # an older, incomplete layout
            shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    except (OSError, ValueError, RuntimeError) as e:
        raise ModelLoadError(f"{gguf}: transformers could not convert the GGUF checkpoint: {e}") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    say(f"converted in {time.perf_counter() - t0:.0f} s")
    return dest


def save_dequantized(model, dest: Path) -> None:
    """Save a GGUF-loaded (already de-quantized) model as plain safetensors.

    transformers marks GGUF-loaded models as quantized and refuses to save them, although the
    weights are plain tensors by then; the marker is dropped for the save only.
    """
    quantizer, qcfg = getattr(model, "hf_quantizer", None), getattr(model.config, "quantization_config", None)
    try:
        model.hf_quantizer = None
        if qcfg is not None:
            del model.config.quantization_config
        model.save_pretrained(str(dest))
    finally:
        model.hf_quantizer = quantizer
        if qcfg is not None:
            model.config.quantization_config = qcfg
