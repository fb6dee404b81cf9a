"""A head in the engine's loop against the same head teacher-forced, per suite prompt: whether the
engine drafts what the head predicts offline, whether in-loop first-position acceptance matches the
offline accuracy, and what the int8 head (one weight scale per row, the CPU default) changes.

    VOCABBRIDGE_MODELS=/work/models python benchmarks/head_in_loop.py --target smollm2-135m \
        --head heads/smollm2 --out benchmarks/results/2026-12-02-head-in-loop/smollm2.md

Per prompt: the target's greedy answer (k = 3, the float32 head; the int8 head's run gives the same
answer), one target forward over the finished text and one head pass over all its pairs (the
offline prediction of every token two ahead), then for each engine run: the drafts it started,
their first tokens' acceptance, the offline accuracy at exactly the positions where the loop
started drafts, and how many drafts equal the float32 head's offline argmax there.

Why the two accuracies differ: the loop does not draft at every position. A stretch the head
predicts well is crossed in a few drafts of k + 1 tokens each; a stretch it predicts badly takes a
draft per token. So the draft starts over-sample the hard positions, and the acceptance per draft
sits below the accuracy over all positions, with the engine drafting exactly what the head predicts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vocabbridge.bench import load_prompts, select_prompts
from vocabbridge.chat import chat_prompt_ids
from vocabbridge.engine import SamplingParams
from vocabbridge.engine.drafters.base import record_proposals
from vocabbridge.engine.factory import build_engine
from vocabbridge.spec import EngineSpec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--head", required=True)
    ap.add_argument("--dtype", default="auto", help="the target's dtype")
    ap.add_argument("--prompt-ids", default="ko-chat,en-chat,code-review,code-gen")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    prompts = select_prompts(load_prompts(), ids=args.prompt_ids.split(","))
    loaded: dict = {}
    engines = {}
    for hd in ("float32", "int8"):
        spec = EngineSpec(
            target=args.target, drafter=f"mtp:{args.head}", dtype=args.dtype, drafter_dtype=hd, num_speculative_tokens=3
        )
        engines[hd] = build_engine(spec, loaded=loaded).engine
    lines = [
        "| prompt | offline first-position accuracy (all answer tokens) | head | drafts | first token accepted "
        "| offline accuracy at the engine's draft starts | = float32 head offline |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for p in prompts:
        ids = chat_prompt_ids(engines["float32"].target.view, list(p.messages))
        offline, full = None, None
        for hd, engine in engines.items():
            log: list = []
            record_proposals(engine.drafter, log)
            answer = engine.generate(ids, SamplingParams(max_new_tokens=args.max_tokens)).tokens
            if full is None:
                full = ids + answer
                reference = engines["float32"]
                offline = reference.drafter.teacher_forced(reference.target, full)
                answer_at = range(len(ids) - 2, len(full) - 2)
                accuracy = sum(offline[i] == full[i + 2] for i in answer_at) / len(answer_at)
            assert ids + answer == full, "greedy answers differ between the two heads' runs"
            drafts = [(n, toks) for n, toks in log if toks]
            first = sum(n < len(full) and toks[0] == full[n] for n, toks in drafts)
            same = sum(toks[0] == offline[n - 2] for n, toks in drafts)
            at_starts = sum(n < len(full) and offline[n - 2] == full[n] for n, toks in drafts)  # the positions the loop drafts at
            row = (
                f"| {p.id} | {accuracy:.1%} | {hd} | {len(drafts)} | {first / max(1, len(drafts)):.1%} "
                f"| {at_starts / max(1, len(drafts)):.1%} | {same} of {len(drafts)} |"
            )
            lines.append(row)
            print(row, file=sys.stderr, flush=True)
    cmd = "VOCABBRIDGE_MODELS=... python benchmarks/head_in_loop.py " + " ".join(sys.argv[1:])
    text = f"# A head in the loop and teacher-forced\n\n`{cmd}`\n\n" + "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
