"""Drafters side by side in our engine on one target, in one process, on whatever device it runs:
plain decoding first, then each drafter on the same prompts, greedy; tokens/s, the speed-up over
plain in the same run, acceptance (overall and per draft position), accepted tokens per target
forward, the drafter's time per draft step (and its forwards per step: a chained head runs once per
draft token, a P-EAGLE head once per step), and whether every answer is token-identical to plain.
The GPU run of issues 27/31 (an H200) and CPU runs use the same script.

    python benchmarks/bench_engine_drafters.py --target qwen2.5-coder-1.5b --device cuda \\
        --drafters none,ngram,suffix,smollm2-135m:text,smollm2-135m:ngram+text,mtp:heads/q15-mtp \\
        --out benchmarks/results/2026-12-03-h200/engine.md

Each configuration: one warm-up request (not counted), then every prompt once. The target loads
once (its loaded models are shared between configurations). Prints a markdown table and writes
it (and the JSON beside it) with ``--out``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from vocabbridge.chat import chat_prompt_ids
from vocabbridge.engine import SamplingParams
from vocabbridge.engine.factory import build_engine
from vocabbridge.prompts import load_prompts, select_prompts
from vocabbridge.spec import EngineSpec, parse_drafters


def _cell(x: float, fmt: str) -> str:
    """A table cell; a figure that has no meaning for the row (plain decoding drafts nothing) reads –."""
    return "–" if x != x else format(x, fmt)


def run(built, prompts, max_tokens: int) -> dict:
    engine, view = built.engine, built.target.view
    params = SamplingParams(max_new_tokens=max_tokens)
    ids = [chat_prompt_ids(view, list(p.messages)) for p in prompts]
    engine.generate(ids[0], SamplingParams(max_new_tokens=8))  # warm-up: graphs, caches, allocations
    answers, tokens, seconds = [], 0, 0.0
    stats = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "target_forwards": 0, "drafter_forwards": 0, "time_draft": 0.0}
    per_pos: list[int] = []
    for x in ids:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        r = engine.generate(x, params)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        seconds += time.perf_counter() - t0
        answers.append(r.tokens)
        tokens += len(r.tokens)
        s = r.stats
        stats["drafts"] += s.drafts
        stats["draft_tokens"] += s.draft_tokens
        stats["accepted"] += s.accepted
        stats["target_forwards"] += s.target_forwards
        stats["drafter_forwards"] += s.drafter_forwards
        stats["time_draft"] += s.time_draft
        per_pos += [0] * (len(s.accepted_per_pos) - len(per_pos))
        per_pos = [a + b for a, b in zip(per_pos, s.accepted_per_pos + [0] * len(per_pos))]
    return {"answers": answers, "tokens": tokens, "seconds": seconds, "accepted_per_pos": per_pos, **stats}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafters", default="none,ngram")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--drafter-dtype", default="auto", help="as the CLI's --drafter-dtype (a model drafter's or a head's)")
    ap.add_argument("--kernels", default="auto", help="as the CLI's --kernels (auto, torch, llama.cpp, …)")
    ap.add_argument("-k", type=int, default=3)
    ap.add_argument("--fixed-k", action="store_true", help="draft k every step (no cost-aware draft length)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt-ids", default="ko-chat,en-chat,code-review,doc-summary,code-gen")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    prompts = select_prompts(load_prompts(), ids=args.prompt_ids.split(","))
    loaded: dict = {}
    rows, results = [], {}
    plain = None
    for d in parse_drafters(args.drafters):
        spec = EngineSpec(
            target=args.target,
            drafter=d.drafter,
            mode=d.mode,
            ngram_first=d.ngram_first,
            device=args.device,
            dtype=args.dtype,
            drafter_dtype=args.drafter_dtype,
            kernels=args.kernels,
            num_speculative_tokens=args.k,
            **({"cost_aware": False} if args.fixed_k else {}),
        )
        t0 = time.perf_counter()
        built = build_engine(spec, loaded=loaded)
        print(f"{d.name}: loaded in {time.perf_counter() - t0:.1f} s; {built.ready_line()}", file=sys.stderr, flush=True)
        r = run(built, prompts, args.max_tokens)
        results[d.name] = {k: v for k, v in r.items() if k != "answers"} | {"path": built.describe()}
        tps = r["tokens"] / r["seconds"]
        if plain is None:
            plain = (r["answers"], tps)
        same = sum(a == b for a, b in zip(r["answers"], plain[0]))
        acc = r["accepted"] / r["draft_tokens"] if r["draft_tokens"] else float("nan")
        per_fwd = r["tokens"] / r["target_forwards"] if r["target_forwards"] else float("nan")
        mal = 1 + r["accepted"] / r["drafts"] if r["drafts"] else float("nan")
        # acceptance at draft position j: drafts whose tokens 1 … j were all accepted, of all drafts
        by_pos = [a / r["drafts"] for a in r["accepted_per_pos"]] if r["drafts"] else []
        ms_step = 1000 * r["time_draft"] / r["drafts"] if r["drafts"] else float("nan")
        fwd_step = r["drafter_forwards"] / r["drafts"] if r["drafts"] and r["drafter_forwards"] else float("nan")
        results[d.name] |= {
            "tokens_per_s": tps,
            "identical": same,
            "of": len(prompts),
            "acceptance_per_position": by_pos,
            "draft_ms_per_step": ms_step,
            "drafter_forwards_per_step": fwd_step,
        }
        pos = " / ".join(f"{a:.0%}" for a in by_pos) or "–"
        cells = [_cell(acc, ".1%"), pos, _cell(mal, ".2f"), _cell(per_fwd, ".2f"), _cell(ms_step, ".1f"), _cell(fwd_step, ".2f")]
        rows.append(f"| {d.name} | {tps:.1f} | ×{tps / plain[1]:.2f} | {' | '.join(cells)} | {same}/{len(prompts)} |")
        print(rows[-1], file=sys.stderr, flush=True)
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() and args.device != "cpu" else platform.processor() or "CPU"
    head = [
        f"Target {args.target} on {dev} ({results[next(iter(results))]['path']['path']}); k = {args.k}, greedy, "
        f"{args.max_tokens} tokens, prompts {args.prompt_ids}; torch {torch.__version__}; each row's draft length "
        "policy in the JSON (path.draft_length).",
        "",
        "| drafter | tok/s | × plain | acceptance | acceptance per position | mean acceptance length | tokens per target "
        "forward | draft ms per step | drafter forwards per step | identical to plain |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    text = "\n".join(head + rows) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(f"`python benchmarks/bench_engine_drafters.py {' '.join(sys.argv[1:])}`\n\n" + text)
        args.out.with_suffix(".json").write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
