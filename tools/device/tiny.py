"""A tiny random Llama with a trained byte-level tokenizer and a chat template, for rehearsing the
GPU run without sending a checkpoint: every code path of tools/device/pipeline.sh runs on it.

    python3 tools/device/tiny.py /tmp/vb/models/tiny
"""

from __future__ import annotations

import sys
from pathlib import Path

from vocabbridge.testing import tiny_model, train_base

out = Path(sys.argv[1])
train_base(out.parent / "tiny-tokenizer", vocab_size=900)
tiny_model(out, out.parent / "tiny-tokenizer", seed=0, layers=4, hidden=128, max_positions=32768)
print(f"tiny model in {out}")
