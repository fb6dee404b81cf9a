"""A head folder as files small enough to come back from the device (at most 16 MiB each), and back.

    python tools/device/pack.py HEAD_DIR PACK_DIR        # on the device: weights as float16 pieces
    python tools/device/pack.py --unpack PACK_DIR HEAD_DIR   # here: head.safetensors (float32) again

The weights travel as float16 (a relative rounding of 5e-4; the head computes in float32 or bf16),
cut into pieces of at most 15 MiB; config.json, the curves and the metrics travel as they are.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

PIECE = 15 << 20
SMALL = ("config.json", "train/eval.json", "train/metrics.jsonl", "train/loss.png", "train/acceptance.png")


def pack(head: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    state = load_file(str(head / "head.safetensors"))
    pieces, cur, size = [], {}, 0
    for k, v in state.items():
        v = v.half() if v.is_floating_point() else v
        flat = v.contiguous().view(-1)
        step = max(1, PIECE // flat.element_size())
        for i in range(0, flat.numel(), step):  # a tensor larger than a piece is cut in slices
            part = flat[i : i + step].clone()
            if size + part.numel() * part.element_size() > PIECE and cur:
                pieces.append(cur)
                cur, size = {}, 0
            cur[f"{k}@{i}@{'x'.join(map(str, v.shape))}@{v.dtype}"] = part
            size += part.numel() * part.element_size()
    if cur:
        pieces.append(cur)
    for n, p in enumerate(pieces):
        save_file(p, str(out / f"weights-{n:02d}.safetensors"))
    for f in SMALL:
        if (head / f).is_file():
            shutil.copy(head / f, out / f.replace("/", "-"))
    (out / "pack.json").write_text(json.dumps({"pieces": len(pieces), "dtype": "float16"}))
    print(f"{head} -> {out}: {len(pieces)} weight pieces")


def unpack(src: Path, head: Path) -> None:
    head.mkdir(parents=True, exist_ok=True)
    (head / "train").mkdir(exist_ok=True)
    slices: dict[str, list] = {}
    for f in sorted(src.glob("weights-*.safetensors")):
        for key, t in load_file(str(f)).items():
            name, start, shape, dtype = key.split("@")
            slices.setdefault(name, []).append((int(start), t, shape, dtype))
    state = {}
    for name, parts in slices.items():
        parts.sort(key=lambda p: p[0])
        shape = tuple(int(x) for x in parts[0][2].split("x") if x)
        t = torch.cat([p[1] for p in parts]).view(shape)
        state[name] = t.float() if t.is_floating_point() else t
    save_file(state, str(head / "head.safetensors"))
    for f in SMALL:
        flat = src / f.replace("/", "-")
        if flat.is_file():
            shutil.copy(flat, head / f)
    print(f"{src} -> {head}: {len(state)} tensors")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--unpack", action="store_true")
    args = ap.parse_args()
    (unpack if args.unpack else pack)(args.src, args.dst)


if __name__ == "__main__":
    main()
