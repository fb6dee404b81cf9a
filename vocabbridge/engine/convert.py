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

A folder is keyed by what decides its weights: the GGUF file (its path, size and mtime) and
``FORMAT`` (what a converted folder holds), not by the transformers version that wrote it (the
vLLM extra pins another one, and every model was converted again: 13 GB of copies). A folder
written by another transformers version is used as long as this one reads its config; a folder
of the old key (which held the version) is found by that key and renamed, not converted again; a
new conversion removes the folders of earlier versions of the same GGUF file. Each folder records
its source in ``SOURCE_FILE``.

>>> folder = converted_folder("/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")  # doctest: +SKIP
>>> sorted(p.name for p in folder.iterdir())  # doctest: +SKIP
['chat_template.jinja', 'config.json', 'generation_config.json', 'model.safetensors', 'tokenizer.json', ...]
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from ..errors import ModelLoadError
from ..mapping.cache import cache_root
from ..util import heartbeat

FORMAT = "1"  # bump when what a converted folder holds changes
SOURCE_FILE = "vocabbridge-source.json"  # in each folder: the GGUF it was converted from, FORMAT, transformers' version


def _identity(gguf: Path) -> dict:
    st = gguf.stat()
    return {"gguf": str(gguf.resolve()), "size": st.st_size, "mtime": int(st.st_mtime), "format": FORMAT}


def _name(gguf: Path, *key: object) -> str:
    """``STEM-HASH``, the hash of the file's path, size and mtime and ``key``."""
    i = _identity(gguf)
    text = "|".join(str(x) for x in (i["gguf"], i["size"], i["mtime"], *key))
    return f"{gguf.stem}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def converted_dir(gguf: str | Path) -> Path:
    """Where ``gguf``'s converted folder lives (keyed by the file's path, size and mtime, and FORMAT)."""
    gguf = Path(gguf).expanduser()
    return cache_root() / "converted" / _name(gguf, FORMAT)


def is_converted(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (folder / "tokenizer_config.json").is_file()


def _source(folder: Path) -> dict | None:
    try:
        return json.loads((folder / SOURCE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _written_by(folder: Path) -> str | None:
    """The transformers version that wrote ``folder`` (its config's ``transformers_version``)."""
    try:
        return json.loads((folder / "config.json").read_text(encoding="utf-8")).get("transformers_version")
    except (OSError, ValueError, AttributeError):
        return None


def _is_old_key_of(folder: Path, gguf: Path) -> bool:
    """``folder`` was keyed the old way (path, size, mtime, FORMAT and the transformers version that
    wrote it) from this very file: its name's hash is that key's."""
    version = _written_by(folder)
    return version is not None and folder.name == _name(gguf, "1", version)


def _readable(folder: Path) -> bool:
    """This transformers reads the folder's config (one written by another version usually is)."""
    if _written_by(folder) == transformers.__version__:
        return True
    try:
        AutoConfig.from_pretrained(str(folder))
    except (OSError, ValueError, KeyError):
        return False
    return True


def _mark(folder: Path, gguf: Path) -> None:
    record = _identity(gguf) | {"transformers": _written_by(folder)}
    (folder / SOURCE_FILE).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


def _others(gguf: Path, dest: Path) -> list[Path]:
    """Converted folders of ``gguf`` other than ``dest``: of earlier versions of the file (recorded
    in their SOURCE_FILE), or of this version under the old key (another transformers version)."""
    me = _identity(gguf)["gguf"]
    out = []
    for folder in sorted(dest.parent.glob(f"{gguf.stem}-*")):
        if folder == dest or not folder.is_dir() or ".tmp" in folder.name:
            continue
        src = _source(folder)
        if (src is not None and src.get("gguf") == me) or (src is None and _is_old_key_of(folder, gguf)):
            out.append(folder)
    return out


def converted_folder(gguf: str | Path, *, say=None) -> Path:
    """The HF folder for ``gguf``, converting it first if needed (``say``: a progress callback)."""
    gguf = Path(gguf).expanduser()
    if not gguf.is_file():
        raise ModelLoadError(f"{gguf}: no such GGUF file.")
    dest = converted_dir(gguf)
    say = say or (lambda msg: print(f"vocabbridge: {msg}", file=sys.stderr, flush=True))
    if is_converted(dest):
        if _readable(dest):
            return dest
        say(f"{dest} was written by transformers {_written_by(dest)}, whose config this one cannot read; converting again")
        shutil.rmtree(dest, ignore_errors=True)
    for old in _others(gguf, dest):  # this file, converted under the old key (which held transformers' version)
        if _source(old) is None and is_converted(old) and _readable(old):
            with contextlib.suppress(OSError):
                os.replace(old, dest)
                _mark(dest, gguf)
                _prune(gguf, dest, say)
                return dest
    say(f"converting {gguf.name} to an HF folder once ({dest}; later loads take seconds)…")
    t0 = time.perf_counter()
    tmp = dest.with_name(f"{dest.name}.tmp{os.getpid()}")
    try:
        with heartbeat(lambda s: f"vocabbridge: still converting {gguf.name} ({s:.0f} s)"):  # off a terminal
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
            save_dequantized(model, tmp)
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            tokenizer.save_pretrained(str(tmp))
            GenerationConfig.from_model_config(model.config).save_pretrained(str(tmp))
            del model
        _mark(tmp, gguf)
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
    _prune(gguf, dest, say)
    return dest


def _prune(gguf: Path, dest: Path, say) -> None:
    """Remove the other converted folders of ``gguf`` (earlier versions of the file, other transformers versions)."""
    for old in _others(gguf, dest):
        shutil.rmtree(old, ignore_errors=True)
        say(f"removed {old} (an older conversion of {gguf.name})")


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
