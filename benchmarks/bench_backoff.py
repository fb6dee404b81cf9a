"""Drafter back-off on and off, same models, same prompts, interleaved.

    VOCABBRIDGE_MODELS=/path/to/models python benchmarks/bench_backoff.py [--max-new-tokens 96]

Target Qwen2.5-Coder-1.5B-Instruct on CPU, greedy, the Korean and English chat prompts of
bench_engine.py; drafters SmolLM2-135M (bridged, text; the weak drafter back-off is for) and
Qwen2.5-Coder-0.5B (draft; the strong one it must not hurt). The peer is the same engine with
``backoff=False``. Prints decode tokens/s of both, the ratio, drafter forwards, skipped steps,
and whether the outputs are identical to plain decoding.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import prompts  # noqa: E402

from vocabbridge.chat import chat_prompt_ids  # noqa: E402
from vocabbridge.engine import BridgedDrafter, DraftModelDrafter, SamplingParams, SpecEngine, TextDrafter  # noqa: E402
from vocabbridge.engine.factory import load_drafter_lm  # noqa: E402
from vocabbridge.engine.model import load_causal_lm  # noqa: E402
from vocabbridge.mapping import build_token_map  # noqa: E402
from vocabbridge.presets import resolve_model  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--prompts", default="korean_chat,english_chat")
    ap.add_argument("-k", type=int, default=6)
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count())
    src = {n: resolve_model(n) for n in ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2-135m")}
    if not all(Path(s).is_file() for s in src.values()):
        print("run ../shared/tools/fetch-models.sh DIR and set VOCABBRIDGE_MODELS=DIR", file=sys.stderr)
        return 2
    target = load_causal_lm(src["qwen2.5-coder-1.5b"])
    d05 = load_drafter_lm(src["qwen2.5-coder-0.5b"], "int8", device="cpu")
    smol = load_drafter_lm(src["smollm2-135m"], "int8", device="cpu")
    V = target.vocab_size
    tm = build_token_map(smol.view, target.view, drafter_vocab_size=smol.vocab_size, target_vocab_size=V)
    drafters = {
        "bridged": BridgedDrafter(smol, tm, target_vocab_size=V, min_confidence=0.3),
        "text": TextDrafter(smol, target.view, target_vocab_size=V, min_confidence=0.3),
        "draft": DraftModelDrafter(d05, target_vocab_size=V, target_view=target.view, min_confidence=0.3),
    }
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    print(
        f"{'prompt':13s} {'mode':8s} {'on tok/s':>9s} {'off tok/s':>9s} {'on/off':>7s} {'fwd on':>7s} {'fwd off':>7s} "
        f"{'skipped':>7s} {'acc on':>7s} {'acc off':>7s}  identical"
    )
    for name, text in prompts().items():
        if name not in args.prompts.split(","):
            continue
        ids = chat_prompt_ids(target.view, [{"role": "user", "content": text}])
        plain = SpecEngine(target).generate(ids, params)
        for mode, d in drafters.items():
            off = SpecEngine(target, d, num_speculative_tokens=args.k, backoff=False).generate(ids, params)
            r_on = SpecEngine(target, d, num_speculative_tokens=args.k).generate(ids, params)
            same = r_on.tokens == plain.tokens == off.tokens
            a, b = r_on.stats, off.stats
            print(
                f"{name:13s} {mode:8s} {a.decode_tokens_per_second:9.2f} {b.decode_tokens_per_second:9.2f} "
                f"{a.decode_tokens_per_second / b.decode_tokens_per_second:7.2f} {a.drafter_forwards:7d} "
                f"{b.drafter_forwards:7d} {a.skipped_drafts:7d} {a.acceptance_rate:7.2f} {b.acceptance_rate:7.2f}  "
                f"{'yes' if same else 'NO'}",
                flush=True,
            )
        print(f"{name:13s} plain    {plain.stats.decode_tokens_per_second:9.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
