"""Split a model file into parts that fit one device call, with a manifest (sha256, part count).

    python tools/device/split.py /work/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf   # 25 parts of 43 MiB

Parts go to .device/parts/NAME.partNN, the manifest to .device/meta/NAME.json (both ignored by git:
.git/info/exclude holds /.device/). Each `run` call carries one part and .device/meta; step.py
appends the parts in order on the device and checks the sha256 once the last one is in.

Measured on 2026-12-07: a call's 64 MiB counts the working tree too (its tracked files are ~20 MiB),
so parts of 58 MiB were refused and 43 MiB is the default. The machine goes back ~30 s after a call
ends: put every part call, the --launch call and the --fetch calls in one batch of tool calls, after
a first call alone that shows the machine warm. Between two separate replies it went back twice,
with 23 of 25 parts sent (and the budget of a whole heal spent on transfers).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("file", type=Path)
    ap.add_argument("--mib", type=int, default=43)
    args = ap.parse_args()
    parts, meta = ROOT / ".device" / "parts", ROOT / ".device" / "meta"
    parts.mkdir(parents=True, exist_ok=True)
    meta.mkdir(parents=True, exist_ok=True)
    size, sha, n = args.mib << 20, hashlib.sha256(), 0
    with args.file.open("rb") as f:
        while chunk := f.read(size):
            n += 1
            sha.update(chunk)
            (parts / f"{args.file.name}.part{n:02d}").write_bytes(chunk)
    (meta / f"{args.file.name}.json").write_text(json.dumps({"name": args.file.name, "parts": n, "sha256": sha.hexdigest()}))
    print(f"{args.file.name}: {n} parts of at most {args.mib} MiB in {parts}")


if __name__ == "__main__":
    main()
