"""Benchmark: token-map build for qwen3 ↔ exaone-3.5 (both directions), loading excluded, against
transformers' ``AssistantToTargetTranslator`` construction for the same pair in the same run.

    python benchmarks/bench_map.py [A B] [--repeats 5]

Target: under 1 s and at least 5× faster than the peer.

Loading is excluded on both sides and is the same work: ``load_tokenizer`` plus building the
``tokenizers`` backend from the tokenizer.json (``view.backend``) for us, ``AutoTokenizer.from_pretrained``
(which builds that same backend) for the peer. Timed:

- ours, ``build_token_map(drafter, target)`` (bytes mode, the default): pairs by bytes and roles,
  normalizer check; what ``build-map`` needs for its coverage figures;
- ours, the input bridge (``tm.input_bridge``, computed on first use: the drafter's BPE over every
  unpaired target token), shown separately and added up in "with bridge";
- ours, ``mode="vllm"`` (vLLM's string rule; most of it is the two ``get_vocab()`` calls);
- the peer, ``AssistantToTargetTranslator(target_tokenizer=, assistant_tokenizer=, target_vocab_size=)``:
  the string intersection transformers builds for universal assisted generation (no bridge).

Prints the median of the repeats per direction and the ratios peer / ours.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHARED = HERE.parent.parent / "shared" / "tokenizers"


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", nargs="?", default=str(SHARED / "qwen3"))
    ap.add_argument("b", nargs="?", default=str(SHARED / "exaone-3.5"))
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    for p in (args.a, args.b):
        if not Path(p).exists():
            print(f"missing {p}: this benchmark needs ../shared/tokenizers (or pass two tokenizer paths)", file=sys.stderr)
            return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    warnings.filterwarnings("ignore")
    from transformers import AutoTokenizer
    from transformers.generation.candidate_generator import AssistantToTargetTranslator

    from vocabbridge.mapping import build_token_map
    from vocabbridge.tokenizer import load_tokenizer

    # Loading (excluded from the timings).
    views = {p: load_tokenizer(p) for p in (args.a, args.b)}
    for v in views.values():
        v.backend  # noqa: B018 - build the tokenizers backend now, as AutoTokenizer does for the peer
    hf = {p: AutoTokenizer.from_pretrained(p) for p in (args.a, args.b)}

    rows = []
    for drafter, target in ((args.a, args.b), (args.b, args.a)):
        dv, tv, dh, th = views[drafter], views[target], hf[drafter], hf[target]
        build_token_map(dv, tv)  # warm imports and caches that are not per-build
        t_map, t_bridge, t_vllm, t_peer = [], [], [], []
        for _ in range(args.repeats):
            holder = {}
            t_map.append(timed(lambda: holder.setdefault("tm", build_token_map(dv, tv))))
            t_bridge.append(timed(lambda: holder["tm"].input_bridge))
            t_vllm.append(timed(lambda: build_token_map(dv, tv, mode="vllm")))
            t_peer.append(
                timed(lambda: AssistantToTargetTranslator(target_tokenizer=th, assistant_tokenizer=dh, target_vocab_size=len(th)))
            )
        tm = holder["tm"]
        med = {k: statistics.median(v) for k, v in (("map", t_map), ("bridge", t_bridge), ("vllm", t_vllm), ("peer", t_peer))}
        rows.append((Path(drafter).name, Path(target).name, tm, med))

    print(f"token map build, loading excluded, median of {args.repeats}")
    for d, t, tm, m in rows:
        total = m["map"] + m["bridge"]
        print(f"\n{d} → {t}: {tm.pairs:,} pairs (bytes), {len(tm.input_bridge):,} bridged target ids")
        print(f"  vocabbridge build_token_map (bytes)        : {m['map']:6.3f} s   ratio peer/ours {m['peer'] / m['map']:5.1f}×")
        print(f"  vocabbridge input bridge (first use)       : {m['bridge']:6.3f} s")
        print(f"  vocabbridge bytes map with bridge          : {total:6.3f} s   ratio peer/ours {m['peer'] / total:5.1f}×")
        print(
            f"  vocabbridge build_token_map (vllm mode)    : {m['vllm']:6.3f} s   ratio peer/ours {m['peer'] / m['vllm']:5.1f}×"
        )
        print(f"  peer: AssistantToTargetTranslator(...)     : {m['peer']:6.3f} s")
    worst_map = max(m["map"] for *_, m in rows)
    worst_ratio = min(m["peer"] / m["map"] for *_, m in rows)
    worst_total = max(m["map"] + m["bridge"] for *_, m in rows)
    ok = worst_map < 1 and worst_ratio >= 5
    print(
        f"\ntarget (< 1 s and >= 5x the peer) on build_token_map: {'PASS' if ok else 'FAIL'} "
        f"(slowest {worst_map:.3f} s, lowest ratio {worst_ratio:.1f}x); "
        f"with the bridge: slowest {worst_total:.3f} s ({'under' if worst_total < 1 else 'over'} 1 s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
