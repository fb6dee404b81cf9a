"""The heal's new-rows stage with each loss, on one data folder: the exact full-vocabulary softmax
against the candidates' gradient (the teacher's top-k and the drafter's own 64 likeliest rows, one
[positions × vocabulary] product a step instead of three). The GPU heal of 2026-12-06 saw the
candidates' training loss fall to 2.9 by step 60 and rise to 4.2 by step 686; this says whether the
exact loss does the same on the same kind of data.

    python benchmarks/heal_rows_loss.py FOLDER DATA [--epochs 8] [--lr 1e-3] [--out results.json]

FOLDER: a zero-shot transplant (its rows are the start, nothing is written to it); DATA: a heal or
train-head data folder for its target. Both losses start from the same rows, see the same batches
in the same order and are scored on the same held-out positions (greedy acceptance per draft
position, teacher-forced, and the exact loss). Prints one line per evaluation and a table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from vocabbridge.training.train import split_heldout
from vocabbridge.transplant.build import read_rows
from vocabbridge.transplant.heal import HealRecipe, _Healing, drafter_hidden, folder_data, positions_of
from vocabbridge.transplant.plan import COPIED, SPECIAL


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("data", type=Path)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--losses", default="candidates,exact")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM

    kind, _ = read_rows(args.folder)
    seqs, _ = folder_data(args.data, vocab_size=len(kind))
    recipe = HealRecipe(budget_minutes=0, epochs=args.epochs, lr_rows=args.lr, batch_positions=args.batch)
    train_seqs, held_seqs = split_heldout(seqs, recipe.heldout, recipe.seed)
    train, held = positions_of(train_seqs), positions_of(held_seqs)
    model = AutoModelForCausalLM.from_pretrained(str(args.folder), dtype=torch.float32)
    t = time.perf_counter()
    train.hidden, held.hidden = drafter_hidden(model, train_seqs), drafter_hidden(model, held_seqs)
    print(
        f"{len(seqs)} answers: {len(train):,} training and {len(held):,} held-out positions; features in {time.perf_counter() - t:.0f} s"
    )
    new = torch.from_numpy(~np.isin(kind, (COPIED, SPECIAL)))
    head = model.get_output_embeddings()
    if head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr():
        head.weight = torch.nn.Parameter(model.get_input_embeddings().weight.detach().clone())
    start = head.weight.detach().clone()
    out = {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__, "runs": {}}
    for loss in args.losses.split(","):
        with torch.no_grad():
            head.weight.copy_(start)
        r = dataclasses.replace(recipe, rows_loss=loss)
        said: list[str] = []
        with tempfile.TemporaryDirectory() as work:
            run = _Healing(
                model,
                new,
                train,
                held,
                r,
                Path(work),
                device="cpu",
                say=lambda m, s=said, n=loss: (s.append(m), print(f"[{n}] {m}")),
            )
            run.evaluate(step=0, stage="rows")
            t = time.perf_counter()
            run.rows_stage(deadline=None, quiet=True)
            seconds = time.perf_counter() - t
        evals = [{"step": h["step"], "kept": "kept_step" in h, **h["eval"]} for h in run.history if "eval" in h]
        steps = [h for h in run.history if "loss" in h and "eval" not in h]
        out["runs"][loss] = {"seconds": seconds, "steps": len(steps), "evals": evals, "train_loss": [h["loss"] for h in steps]}
    print("| loss | steps | s a step | held out at the start | best | last |")
    print("| --- | --- | --- | --- | --- | --- |")
    for loss, r in out["runs"].items():
        ev = [e for e in r["evals"] if not e["kept"]]

        def cell(e):
            return f"{' / '.join(f'{100 * a:.0f}' for a in e['acceptance_per_position'])} %, {e['mean_acceptance_length']:.3f}, loss {e['loss']:.3f}"

        best = max(ev, key=lambda e: (round(e["mean_acceptance_length"], 4), -e["loss"]))
        s_step = r["seconds"] / max(1, r["steps"])
        print(f"| {loss} | {r['steps']} | {s_step:.2f} | {cell(ev[0])} | step {best['step']}: {cell(best)} | {cell(ev[-1])} |")
    if args.out:
        args.out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
