"""The MTP leg: a head trained by ``train-head`` against plain decoding and the same-family draft
model, same engine, same run, on the bench suite's prompts (which the head never saw).

    VOCABBRIDGE_MODELS=/path/to/models python benchmarks/bench_mtp.py \\
        [--head heads/qwen2.5-coder-1.5b] [--train] [--dtype int8] [--max-new-tokens 128] [-k 3] [--json out.json]

Target Qwen2.5-Coder-1.5B-Instruct (``--target``) on the CPU, greedy, the prompts of
``vocabbridge/data/prompts/suite.jsonl`` (``--categories``; the 10k-token summary left out by
default) with thinking on and off where the chat template has it. Configurations, interleaved per prompt: plain decoding; ``mtp`` (the head, int8 with one weight scale
per output row on the CPU by default; ``--head-dtype float32`` to compare); ``draft`` (Qwen2.5-Coder-0.5B, int8).
``--train`` trains the head first when ``--head`` does not exist (the default recipe, time-boxed
by ``--budget-minutes``, 45 by default: the CPU recipe for the 1.5B). Prints, per prompt and overall: decode tokens/s and the speedup over
plain, acceptance per draft position (drafts whose token j was accepted / drafts), mean
acceptance length (1 + accepted / drafts, vLLM's definition), whether the output is identical to
plain; then the issue's targets (first-position acceptance ≥ 0.6, mean acceptance length ≥ 2.0 at
k = 3, tokens/s above the 0.5B drafter) as yes/no. ``--json`` writes every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from vocabbridge.chat import chat_prompt_ids
from vocabbridge.engine import DraftModelDrafter, SamplingParams, SpecEngine
from vocabbridge.engine.drafters.mtp import MTPDrafter
from vocabbridge.engine.factory import load_drafter_lm
from vocabbridge.engine.invariant import INVARIANT_ROWS
from vocabbridge.engine.model import load_causal_lm
from vocabbridge.engine.stats import SpecStats
from vocabbridge.presets import resolve_model
from vocabbridge.prompts import load_prompts, select_prompts
from vocabbridge.spec import EngineSpec
from vocabbridge.training.train import Recipe, train_head


def variants(view, prompts) -> list[tuple[str, list[int]]]:
    """(label, prompt ids) per prompt, thinking on and off where the template knows it."""
    thinking = "enable_thinking" in (view.chat_template or "")
    out = []
    for p in prompts:
        for think in (True, False) if thinking else (None,):
            kw = {} if think is None else {"enable_thinking": think}
            label = p.id + ("" if think is None else " +think" if think else " -think")
            out.append((label, chat_prompt_ids(view, list(p.messages), **kw)))
    return out


def figures(stats: list[SpecStats]) -> dict:
    """Pooled figures of several generations: decode tokens/s, acceptance per position, MAL."""
    drafts = sum(s.drafts for s in stats)
    k = max((len(s.accepted_per_pos) for s in stats), default=0)
    per_pos = [sum(s.accepted_per_pos[i] if i < len(s.accepted_per_pos) else 0 for s in stats) for i in range(k)]
    decode_tokens = sum(s.generated - 1 for s in stats)
    decode_time = sum(s.time_total - s.ttft for s in stats)
    return {
        "decode_tokens_per_second": decode_tokens / decode_time if decode_time > 0 else float("nan"),
        "drafts": drafts,
        "acceptance_per_position": [a / drafts if drafts else float("nan") for a in per_pos],
        "mean_acceptance_length": 1 + sum(per_pos) / drafts if drafts else float("nan"),
        "acceptance_rate": sum(s.accepted for s in stats) / max(1, sum(s.draft_tokens for s in stats)),
        "drafter_forwards": sum(s.drafter_forwards for s in stats),
        "skipped_drafts": sum(s.skipped_drafts for s in stats),
        "target_forwards": sum(s.target_forwards for s in stats),
    }


def fmt_acc(xs: list[float]) -> str:
    return " ".join(f"{x:.2f}" for x in xs) or "—"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--head", type=Path, help="head folder (default heads/TARGET)")
    ap.add_argument("--train", action="store_true", help="train the head first when --head does not exist")
    ap.add_argument("--budget-minutes", type=float, default=45.0, help="the training run's budget, data included (--train)")
    ap.add_argument("--drafter", default="qwen2.5-coder-0.5b", help="the same-family draft model to compare with")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("-k", type=int, default=3)
    ap.add_argument(
        "--head-dtype", default="auto", help="auto (int8, one scale per output row, on the CPU), int8, float32, bfloat16"
    )
    ap.add_argument(
        "--dtype",
        default="auto",
        help="the target's dtype: auto (float32), int8 (per-row int8, batch-invariant: what train-head's CPU data come from)",
    )
    ap.add_argument("--prompts", help="JSONL prompt file (default: the bench suite)")
    ap.add_argument(
        "--categories",
        default="korean_chat,english_chat,code_review,code_generation",
        help="prompt categories (the suite's ~10k-token document_summary costs minutes of prefill per configuration on a CPU)",
    )
    ap.add_argument("--json", type=Path, help="write every figure here")
    args = ap.parse_args()
    torch.set_num_threads(os.cpu_count())
    head_dir = args.head or Path("heads") / args.target
    if not (head_dir / "config.json").is_file():
        if not args.train:
            print(f"no head in {head_dir}: pass --train, or run vocabbridge train-head --target {args.target} -o {head_dir}")
            return 2
        t0 = time.perf_counter()
        result = train_head(args.target, head_dir, Recipe(budget_minutes=args.budget_minutes))
        print(f"trained {head_dir} in {time.perf_counter() - t0:.0f} s: held-out {result.eval}", flush=True)

    src = resolve_model(args.target)
    target = load_causal_lm(src, dtype=args.dtype, rows=INVARIANT_ROWS if args.dtype == "int8" else None)
    mtp = MTPDrafter.from_spec(
        EngineSpec(target=args.target, drafter=f"mtp:{head_dir}", drafter_dtype=args.head_dtype), target, None
    )
    small = load_drafter_lm(resolve_model(args.drafter), "int8", device="cpu")
    engines = {
        "plain": SpecEngine(target),
        "mtp": SpecEngine(target, mtp, num_speculative_tokens=args.k),
        "draft": SpecEngine(
            target,
            DraftModelDrafter(small, target_vocab_size=target.vocab_size, target_view=target.view),
            num_speculative_tokens=args.k,
        ),
    }
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    warm = chat_prompt_ids(target.view, [{"role": "user", "content": "Hello!"}])
    for e in engines.values():  # first forwards pay for allocations and oneDNN's packing
        e.generate(warm, SamplingParams(max_new_tokens=8))

    prompts = variants(target.view, select_prompts(load_prompts(args.prompts), categories=args.categories.split(",")))
    runs: dict[str, list[SpecStats]] = {name: [] for name in engines}
    by_thinking: dict[str, list[SpecStats]] = {}  # "mtp +think" → its generations (templates with thinking only)
    rows = []
    print(f"{'prompt':18s} {'config':6s} {'tok/s':>6s} {'×plain':>6s} {'MAL':>5s}  acceptance/pos   identical", flush=True)
    for label, ids in prompts:
        out = {}
        for name, e in engines.items():
            r = e.generate(ids, params)
            out[name] = r
            runs[name].append(r.stats)
            if label.endswith("think"):
                by_thinking.setdefault(f"{name} {label.rsplit(' ', 1)[1]}", []).append(r.stats)
        base = out["plain"].stats.decode_tokens_per_second
        for name, r in out.items():
            f = figures([r.stats])
            same = r.tokens == out["plain"].tokens
            rows.append({"prompt": label, "config": name, "identical": same, **f})
            print(
                f"{label:18s} {name:6s} {f['decode_tokens_per_second']:6.2f} {f['decode_tokens_per_second'] / base:6.2f} "
                f"{f['mean_acceptance_length']:5.2f}  {fmt_acc(f['acceptance_per_position']):15s}  {'yes' if same else 'NO'}",
                flush=True,
            )
    overall = {name: figures(stats) for name, stats in runs.items()}
    print("\noverall (pooled over prompts)")
    for name, f in overall.items():
        ratio = f["decode_tokens_per_second"] / overall["plain"]["decode_tokens_per_second"]
        print(
            f"  {name:6s} {f['decode_tokens_per_second']:6.2f} tok/s  ×{ratio:.2f} plain  MAL {f['mean_acceptance_length']:.2f}  "
            f"acceptance/pos {fmt_acc(f['acceptance_per_position'])}  skipped drafts {f['skipped_drafts']}"
        )
    for key, stats in sorted(by_thinking.items()):
        f = figures(stats)
        print(
            f"  {key:12s} {f['decode_tokens_per_second']:6.2f} tok/s  MAL {f['mean_acceptance_length']:.2f}  "
            f"acceptance/pos {fmt_acc(f['acceptance_per_position'])}"
        )
    m, d = overall["mtp"], overall["draft"]
    targets = {
        "first-position acceptance >= 0.6": m["acceptance_per_position"][0] >= 0.6 if m["drafts"] else False,
        f"mean acceptance length >= 2.0 at k = {args.k}": m["mean_acceptance_length"] >= 2.0,
        f"tokens/s above the {args.drafter} drafter": m["decode_tokens_per_second"] > d["decode_tokens_per_second"],
        "every output identical to plain": all(r["identical"] for r in rows),
    }
    print("\nissue 13 targets (our engine)")
    for what, ok in targets.items():
        print(f"  {'yes' if ok else 'NO ':3s}  {what}")
    if args.json:
        record = {
            "target": args.target,
            "head": str(head_dir),
            "head_config": json.loads((head_dir / "config.json").read_text()),
            "k": args.k,
            "max_new_tokens": args.max_new_tokens,
            "rows": rows,
            "overall": overall,
            "by_thinking": {key: figures(stats) for key, stats in by_thinking.items()},
            "targets": targets,
        }
        args.json.write_text(json.dumps(record, indent=2, default=float) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
