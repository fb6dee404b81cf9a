"""The ridge strength of the least-squares start, swept on the 1.5B head's cached training data.

    python benchmarks/mtp_ridge_sweep.py [MAX_POSITIONS] [EH_RIDGES] [DOWN_RIDGES]

For each eh_proj ridge: fit eh_proj, accumulate the down_proj normal equations once (up to
MAX_POSITIONS training positions), then solve them for each down_proj ridge and score the start
alone (no gradient step) on the held-out split: greedy acceptance at draft positions 1/2/3, mean
acceptance length, soft cross-entropy. Reads the data a 1.5B head's train-head run cached
(heads/qwen2.5-coder-1.5b/train/data, from the repository root; VOCABBRIDGE_HEAD_DATA to point
elsewhere) and writes ridge-sweep-MAX_POSITIONS.json in the current folder. The run of 2026-12-01
(2-core AVX2 machine): benchmarks/results/2026-12-01-mtp-head/ridge-sweep/.
"""

import json
import os
import sys
import time
from pathlib import Path

import torch

from vocabbridge.engine import load_causal_lm
from vocabbridge.heads.draft_head import new_head, target_parts
from vocabbridge.presets import resolve_model
from vocabbridge.training import chain
from vocabbridge.training.data import draft_vocabulary, load_shard
from vocabbridge.training.train import Recipe, split_heldout

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("VOCABBRIDGE_HEAD_DATA", ROOT / "heads/qwen2.5-coder-1.5b/train/data"))


def ridges(i: int, default: str) -> list[float]:
    return [float(x) for x in (sys.argv[i] if len(sys.argv) > i else default).split(",")]


def main() -> None:
    torch.manual_seed(0)
    max_pos = int(sys.argv[1]) if len(sys.argv) > 1 else 32768
    seqs = [s for p in sorted(DATA.glob("shard-*.safetensors")) for s in load_shard(p)]
    recipe = Recipe()
    train, held = split_heldout(seqs, recipe.heldout, recipe.seed)
    print("train", sum(s.positions for s in train), "held", sum(s.positions for s in held), flush=True)
    lm = load_causal_lm(resolve_model("qwen2.5-coder-1.5b"), dtype="float32", pack=False)
    lm.model.requires_grad_(False)
    parts = target_parts(lm.model)
    vocab = parts.embed.weight.shape[0]
    roles = lm.view.roles
    stops = {roles[x] for x in ("eos", "end_of_turn") if x in roles}
    ids = draft_vocabulary(train, size=recipe.draft_vocab, vocab_size=vocab, always=stops)
    t2d = torch.full((vocab,), -1, dtype=torch.long)
    t2d[ids] = torch.arange(len(ids))
    no_autocast = lambda: torch.autocast("cpu", enabled=False)  # noqa: E731
    results = []
    for eh_r in ridges(2, "1e-3"):
        head = new_head(parts, draft_ids=ids)
        t = time.time()
        r2 = chain.fit_projection(head, train, ridge=eh_r)
        print(f"eh ridge {eh_r}: R2 {r2:.3f} {time.time() - t:.0f}s", flush=True)
        module = chain.residual_output(head, "mlp.down_proj")
        base = module.weight.detach().clone()
        t = time.time()
        normal = chain.output_normal_equations(head, module, train, t2d, max_positions=max_pos)
        print(f"normal eqs over {normal.count} positions {time.time() - t:.0f}s", flush=True)
        for dr in ridges(3, "1e-3,1e-2,3e-2,1e-1,3e-1"):
            t = time.time()
            m, r2 = normal.solve(dr)
            with torch.no_grad():
                module.weight.copy_(base + m.T.float())
            e = chain.evaluate(head, held, t2d, k=3, batch_tokens=512, device="cpu", autocast=no_autocast)
            row = {
                "eh_ridge": eh_r,
                "down_ridge": dr,
                "positions": normal.count,
                "r2_train": r2,
                "acc": [round(a, 4) for a in e["acceptance_per_position"]],
                "mal": round(e["mean_acceptance_length"], 3),
                "loss": round(e["loss"], 3),
            }
            print(row, f"{time.time() - t:.0f}s", flush=True)
            results.append(row)
    Path(f"ridge-sweep-{max_pos}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
