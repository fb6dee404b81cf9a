"""A head folder as files small enough to come back from the device (at most 16 MiB each), and back.

    python tools/device/pack.py HEAD_DIR PACK_DIR        # on the device: weights as float16 pieces
    python tools/device/pack.py --unpack PACK_DIR HEAD_DIR   # here: head.safetensors (float32) again

A drafter folder (a healed transplant) travels the same way with ``--file model.safetensors``, and
``--changed ZERO_SHOT`` packs only the tensors that differ from that folder's; unpacked into a folder
that already holds the weights file (the zero-shot transplant made here), the packed tensors replace
theirs and the others stay.

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
SMALL = (
    "config.json",
    "train/eval.json",
    "train/metrics.jsonl",
    "train/loss.png",
    "train/acceptance.png",
    "transplant.json",
    "heal/metrics.jsonl",
    "heal/loss.png",
    "heal/acceptance.png",
)


def pack(
    head: Path, out: Path, file: str = "head.safetensors", keys: list[str] | None = None, changed: Path | None = None
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    state = load_file(str(head / file))
    if changed is not None:  # only the tensors that differ from the same file in that folder
        ref = load_file(str(changed / file))
        keys = [k for k, v in state.items() if k not in ref or ref[k].shape != v.shape or not torch.equal(ref[k], v)]
        print(f"{len(keys)} of {len(state)} tensors differ from {changed / file}: {', '.join(keys)}")
    if keys:
        missing = sorted(set(keys) - set(state))
        if missing:
            raise SystemExit(f"pack: {head / file} has no {', '.join(missing)} (it has {', '.join(sorted(state))})")
        state = {k: state[k] for k in keys}
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


def unpack(src: Path, head: Path, file: str = "head.safetensors") -> None:
    head.mkdir(parents=True, exist_ok=True)
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
    if (head / file).is_file():  # a subset of the tensors (--keys): the others stay as they are
        state = load_file(str(head / file)) | state
    save_file(state, str(head / file))
    for f in SMALL:
        flat = src / f.replace("/", "-")
        if flat.is_file():
            (head / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(flat, head / f)
    print(f"{src} -> {head}: {len(state)} tensors")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--unpack", action="store_true")
    ap.add_argument("--file", default="head.safetensors", help="the weights file of the folder (model.safetensors: a drafter)")
    ap.add_argument("--keys", help="pack only these tensors, comma-separated")
    ap.add_argument("--changed", type=Path, help="pack only the tensors that differ from this folder's (a zero-shot transplant)")
    args = ap.parse_args()
    if args.unpack:
        unpack(args.src, args.dst, args.file)
    else:
        pack(args.src, args.dst, args.file, args.keys.split(",") if args.keys else None, args.changed)


if __name__ == "__main__":
    main()
