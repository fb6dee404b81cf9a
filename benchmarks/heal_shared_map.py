"""Healing a transplanted drafter's lm_head: free rows against the shared row map, on one data folder.

Held-out, teacher-forced acceptance per draft position (k = 4) of four recipes on the same positions
and the same drafter hidden states: zero-shot, the free new rows (``heal``'s rows stage, candidate
gradient), the shared map (``transplant.shared_map``: every composed row moved by two d × d matrices
and one scale per piece count, exact full-vocabulary loss), and the map followed by free rows.

    python benchmarks/heal_shared_map.py drafters/smollm2-qwen-mean drafters/heal-data \
        --map-epochs 2 --free-epochs 1.5 | tee run.log

The data folder is a heal or train-head data folder (``heal_data``'s shards); the hidden states are
cached there as ``features.pt``.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from vocabbridge.training.data import load_shard
from vocabbridge.training.train import split_heldout
from vocabbridge.transplant.build import load_views, read_record, read_rows
from vocabbridge.transplant.heal import _lr, acceptance, candidate_soft_ce, drafter_hidden, positions_of, soft_ce
from vocabbridge.transplant.plan import COMPOSED, COPIED, SPECIAL, plan_rows
from vocabbridge.transplant.shared_map import SharedRowMap
from vocabbridge.transplant.weights import load_drafter_model


def evaluate(held, logits_of, tag: str, t0: float) -> dict:
    argmax, loss = [], 0.0
    with torch.no_grad():
        for s in range(0, len(held), 2048):
            lg = logits_of(held.hidden[s : s + 2048])
            argmax.append(lg.argmax(-1))
            loss += float(soft_ce(lg, held.topk_ids[s : s + 2048], held.topk_p[s : s + 2048])) * len(lg)
    ev = acceptance(torch.cat(argmax), held, 4) | {"loss": loss / len(held)}
    accs = " / ".join(f"{100 * a:.1f}" for a in ev["acceptance_per_position"])
    print(
        f"{tag}: {accs} %, mean acceptance length {ev['mean_acceptance_length']:.3f}, loss {ev['loss']:.3f} "
        f"({time.perf_counter() - t0:.0f} s)",
        flush=True,
    )
    return ev


def batches(n: int, size: int, epochs: float):
    per = math.ceil(n / size)
    total = int(per * epochs)
    for step in range(total):
        ep, i = divmod(step, per)
        yield step, total, torch.randperm(n, generator=torch.Generator().manual_seed(ep))[i * size : (i + 1) * size]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path, help="a zero-shot transplanted drafter folder")
    ap.add_argument("data", type=Path, help="a heal data folder (shards)")
    ap.add_argument("--map-epochs", type=float, default=2.0)
    ap.add_argument("--map-lr", type=float, default=1e-4)
    ap.add_argument("--free-epochs", type=float, default=1.5)
    ap.add_argument("--free-lr", type=float, default=1e-3)
    ap.add_argument("--batch", type=int, default=1024)
    a = ap.parse_args()
    torch.manual_seed(0)
    t0 = time.perf_counter()
    rec = read_record(a.folder)
    model = AutoModelForCausalLM.from_pretrained(str(a.folder), dtype=torch.float32).eval()
    base = model.get_output_embeddings().weight.detach().clone()
    kind, _ = read_rows(a.folder)
    new = torch.from_numpy(~np.isin(kind, (COPIED, SPECIAL)))[:, None].float()
    dview, tview = load_views(rec["drafter"]["given"], rec["target"]["given"])
    plan = plan_rows(dview, tview, drafter_rows=rec["drafter"]["rows"], target_rows=base.shape[0])
    own = load_drafter_model(rec["drafter"]["given"]).get_output_embeddings().weight.detach()
    ids = sorted(t for t in plan.pieces if plan.kind[t] == COMPOSED)
    first = own[torch.tensor([plan.pieces[t][0] for t in ids])]
    pieces = torch.tensor([len(plan.pieces[t]) for t in ids])

    seqs = [s for p in sorted(a.data.glob("shard-*.safetensors")) for s in load_shard(p)]
    train_seqs, held_seqs = split_heldout(seqs, 0.1, 0)  # heal's split (its defaults)
    train, held = positions_of(train_seqs), positions_of(held_seqs)
    cache = a.data / "features.pt"
    c = torch.load(cache) if cache.is_file() else None
    if c is not None and tuple(c["n"]) == (len(train), len(held)):
        train.hidden, held.hidden = c["tr"], c["he"]
    else:
        train.hidden, held.hidden = drafter_hidden(model, train_seqs), drafter_hidden(model, held_seqs)
        torch.save({"n": (len(train), len(held)), "tr": train.hidden, "he": held.hidden}, cache)
    print(f"{len(ids):,} composed rows; {len(train):,} training and {len(held):,} held-out positions", flush=True)
    evaluate(held, lambda h: h @ base.T, "zero-shot", t0)

    m = SharedRowMap(base, first, torch.tensor(ids), pieces)
    groups = [{"params": [m.A, m.B], "peak": a.map_lr}, {"params": [m.log_scale], "peak": 1e-2}]
    opt = torch.optim.AdamW([g | {"lr": g["peak"]} for g in groups], weight_decay=0.0)
    per = math.ceil(len(train) / a.batch)
    best = (evaluate(held, m.logits, "map step 0", t0)["mean_acceptance_length"], base)
    for step, total, idx in batches(len(train), a.batch, a.map_epochs):
        for g in opt.param_groups:
            g["lr"] = _lr(step, total, g["peak"])
        loss = soft_ce(m.logits(train.hidden[idx]), train.topk_ids[idx], train.topk_p[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if (step + 1) % per == 0 or step + 1 == total:
            with torch.no_grad():
                rows = m.rows()
            ev = evaluate(held, lambda h: h @ rows.T, f"map step {step + 1}", t0)
            if ev["mean_acceptance_length"] > best[0]:
                best = (ev["mean_acceptance_length"], rows)
    print(f"map scales per piece count (2, 3, 4, 5+): {[round(s, 3) for s in m.log_scale.exp().tolist()]}")

    for name, start in (("free rows from the map", best[1]), ("free rows from zero-shot", base)):
        w = start.clone().requires_grad_(True)
        opt = torch.optim.AdamW([w], lr=a.free_lr, weight_decay=0.0)
        for step, total, idx in batches(len(train), a.batch, a.free_epochs):
            for g in opt.param_groups:
                g["lr"] = _lr(step, total, a.free_lr)
            loss = candidate_soft_ce(train.hidden[idx], w, train.topk_ids[idx], train.topk_p[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            w.grad.mul_(new)
            opt.step()
            if (step + 1) % 9 == 0 or step + 1 == total:
                evaluate(held, lambda h: h @ w.detach().T, f"{name}, step {step + 1}", t0)


if __name__ == "__main__":
    main()
