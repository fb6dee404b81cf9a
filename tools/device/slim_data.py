"""A heal data folder made small enough to carry to the device: every shard without the target's
hidden states, which the transplant heal never reads (it computes the drafter's own; train-head's
EAGLE and MTP heads are what need the target's). The manifest and each shard's metadata stay, so
``transplant --heal-data`` takes the slim folder as it takes the original.

    python tools/device/slim_data.py drafters/heal-data-bf16 .device/heal-data   # 18 shards: 187 MB -> ~8 MB

A 16-prompt shard of 160 new tokens holds ~3,450 positions: its hidden states (1,536 float16 a
position for Qwen2.5-1.5B) are 10.1 MiB of its 10.6.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file


def slim(src: Path, dst: Path) -> tuple[int, int]:
    manifest = json.loads((src / "manifest.json").read_text())
    dst.mkdir(parents=True, exist_ok=True)
    before = after = 0
    for name in sorted(manifest.get("shards", {})):
        path = src / name
        if not path.is_file():
            continue
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
            st = {k: f.get_tensor(k) for k in f.keys()}
        if "hidden" in st:  # [positions, d] -> [positions, 0]: load_shard's slicing still works
            st["hidden"] = torch.empty((st["hidden"].shape[0], 0), dtype=st["hidden"].dtype)
        save_file(st, str(dst / name), metadata=meta)
        before, after = before + path.stat().st_size, after + (dst / name).stat().st_size
    shutil.copy(src / "manifest.json", dst / "manifest.json")
    return before, after


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    args = ap.parse_args()
    before, after = slim(args.src, args.dst)
    print(f"{args.dst}: {before / 2**20:.1f} MiB of shards -> {after / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
