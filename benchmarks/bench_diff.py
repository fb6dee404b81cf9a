"""Benchmark: `vocabbridge diff` of two real tokenizers, loading included (target: < 2 s).

    python benchmarks/bench_diff.py [A B] [--repeats 5]

Defaults to qwen3 vs deepseek-v3 from ../shared/tokenizers. The peer, timed in the same run, is
what a user does by hand: load both with transformers' AutoTokenizer and intersect get_vocab()
strings (which gives far less: no bytes, merges, roles or behaviour). Prints the median of the
repeats and the ratio peer / ours.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHARED = HERE.parent.parent / "shared" / "tokenizers"


def ours(a: str, b: str) -> float:
    # A fresh import each time would measure Python start-up; caches that persist across calls
    # (tokenizer pipelines) are cleared instead so every repeat loads and diffs from scratch.
    from vocabbridge.diff import diff_tokenizers
    from vocabbridge.tokenizer import load_tokenizer
    from vocabbridge.tokenizer.pipeline import _stages

    _stages.cache_clear()
    t = time.perf_counter()
    d = diff_tokenizers(load_tokenizer(a), load_tokenizer(b))
    dt = time.perf_counter() - t
    assert d.vocab.shared > 0
    return dt


def peer(a: str, b: str) -> float:
    from transformers import AutoTokenizer

    t = time.perf_counter()
    va = AutoTokenizer.from_pretrained(a).get_vocab()
    vb = AutoTokenizer.from_pretrained(b).get_vocab()
    shared = set(va) & set(vb)
    dt = time.perf_counter() - t
    assert shared
    return dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", nargs="?", default=str(SHARED / "qwen3"))
    ap.add_argument("b", nargs="?", default=str(SHARED / "deepseek-v3"))
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    for p in (args.a, args.b):
        if not Path(p).exists():
            print(f"missing {p}: this benchmark needs ../shared/tokenizers (or pass two tokenizer paths)", file=sys.stderr)
            return 2
    ours(args.a, args.b)  # warm the OS file cache and imports
    peer(args.a, args.b)
    t_ours = statistics.median(ours(args.a, args.b) for _ in range(args.repeats))
    t_peer = statistics.median(peer(args.a, args.b) for _ in range(args.repeats))
    print(f"diff {Path(args.a).name} vs {Path(args.b).name}, loading included, median of {args.repeats}")
    print(f"  vocabbridge diff_tokenizers : {t_ours:6.3f} s   (target < 2 s: {'PASS' if t_ours < 2 else 'FAIL'})")
    print(f"  peer: 2× AutoTokenizer + vocab-string intersection : {t_peer:6.3f} s")
    print(f"  ratio peer / ours : {t_peer / t_ours:.2f}×")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
