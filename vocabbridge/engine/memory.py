"""Will these models fit? A check that runs before any weights load.

Loading a 33B target on a CPU box takes minutes before it fails (or swaps the machine to a halt),
so the engine first estimates what the weights need in the dtype they will run in, from what is
cheap to read: a preset's parameter count, a safetensors header, a GGUF file's size. Sources whose
size cannot be known without downloading them (a hub id that is not a preset) are not checked.

>>> need_bytes(1e9, "auto", device="cpu") / 1e9   # fp32 on the CPU: 4 bytes a parameter
4.0
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import torch

from ..errors import ModelLoadError
from ..presets import PRESETS

# Bytes per parameter as the weights are held while loading. On the CPU, int8 drafters are
# quantized after an fp32 load, and GGUF files are dequantized to fp32 first.
_BYTES = {"bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}
_ST_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}
GGUF_MAX_BITS = 8.5  # Q8_0; fewer bits per weight mean more parameters: the estimate is a lower bound


def need_bytes(params: float, dtype: str, *, device: str) -> float:
    if dtype == "gguf":  # llama.cpp holds the GGUF's quantized weights as they are (mapped from the file)
        return params * GGUF_MAX_BITS / 8
    if device.startswith("cuda"):
        return params * _BYTES.get(dtype, 2 if dtype == "auto" else 4)
    return params * _BYTES.get(dtype, 4)


def parameter_count(name: str, source: str) -> float | None:
    """Parameters of a model (a lower bound for GGUF files), or None when unknown without a download."""
    p = PRESETS.get(name)
    path = Path(source).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path.stat().st_size * 8 / GGUF_MAX_BITS
    if path.is_dir():
        shards = sorted(path.glob("*.safetensors"))
        if shards:
            return sum(_safetensors_elements(s) for s in shards)
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ggufs[0].stat().st_size * 8 / GGUF_MAX_BITS
        return None
    if p is not None and p.params_b:
        return p.params_b * 1e9
    return None


def _safetensors_elements(path: Path) -> float:
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
    except (OSError, ValueError, struct.error):
        return 0.0
    total = 0
    for key, t in header.items():
        if key == "__metadata__":
            continue
        elems = 1
        for d in t.get("shape", []):
            elems *= d
        total += elems
    return float(total)


def available_bytes(device: str) -> float | None:
    """Free memory for weights: MemAvailable on the CPU, free GPU memory on CUDA; None if unknown."""
    if device.startswith("cuda"):
        try:
            return float(torch.cuda.mem_get_info(torch.device(device))[0])
        except (RuntimeError, AssertionError):
            return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError):
        return None


def check_fits(models: list[tuple[str, str, str]], *, device: str) -> None:
    """Refuse (ModelLoadError naming the way out) when (name, source, dtype) models cannot fit."""
    avail = available_bytes(device)
    if avail is None:
        return
    known = [
        (name, need_bytes(n, dtype, device=device))
        for name, src, dtype in models
        if (n := parameter_count(name, src)) is not None
    ]
    need = sum(b for _, b in known)
    if not known or need <= avail:
        return
    parts = ", ".join(f"{name} ~{b / 2**30:.0f} GiB" for name, b in known)
    where = "GPU memory" if device.startswith("cuda") else "memory"
    raise ModelLoadError(
        f"the models do not fit: {parts} for their weights on {device}, but this machine has {avail / 2**30:.0f} GiB "
        f"of {where} available. Serve a model this size with --backend vllm on a GPU machine (e.g. "
        f"`vocabbridge serve ... --backend vllm --tensor-parallel-size 2`), or pick a smaller target (vocabbridge presets)."
    )
