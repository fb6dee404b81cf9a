"""Sweep the ridge strength of the least-squares start on the cached 1.5B data; held-out greedy acceptance."""
import copy, dataclasses, json, random, sys, time
from pathlib import Path
import torch
from vocabbridge.engine import load_causal_lm
from vocabbridge.presets import resolve_model
from vocabbridge.heads.data import load_shard, draft_vocabulary
from vocabbridge.heads.model import new_head, target_parts, norm_scale
from vocabbridge.heads.train import split_heldout, Recipe
from vocabbridge.heads import chain as C

torch.manual_seed(0)
work = Path("/work/main/heads/qwen2.5-coder-1.5b/train/data")
seqs = [s for p in sorted(work.glob("shard-*.safetensors")) for s in load_shard(p)]
r = Recipe()
train, held = split_heldout(seqs, r.heldout, r.seed)
print("train", sum(s.positions for s in train), "held", sum(s.positions for s in held), flush=True)
lm = load_causal_lm(resolve_model("qwen2.5-coder-1.5b"), dtype="float32", pack=False)
lm.model.requires_grad_(False)
parts = target_parts(lm.model)
vocab = parts.embed.weight.shape[0]
roles = lm.view.roles
stops = {roles[x] for x in ("eos", "end_of_turn") if x in roles}
ids = draft_vocabulary(train, size=r.draft_vocab, vocab_size=vocab, always=stops)
t2d = torch.full((vocab,), -1, dtype=torch.long); t2d[ids] = torch.arange(len(ids))
ev = lambda h: C.evaluate(h, held, t2d, k=3, batch_tokens=512, device="cpu", autocast=lambda: torch.autocast("cpu", enabled=False))
results = []
max_pos = int(sys.argv[1]) if len(sys.argv) > 1 else 32768
for eh_r in [float(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "1e-3").split(",")]:
    head = new_head(parts, draft_ids=ids)
    t = time.time(); r2 = C.fit_projection(head, train, ridge=eh_r); print(f"eh ridge {eh_r}: R2 {r2:.3f} {time.time()-t:.0f}s", flush=True)
    module = C.residual_output(head, "mlp.down_proj")
    base = module.weight.detach().clone()
    w = norm_scale(head.norm).float()
    feats = []
    hook = module.register_forward_pre_hook(lambda m, a: feats.append(a[0]))
    normal = C._Normal(module.in_features, parts.hidden_size, "cpu")
    t = time.time()
    with torch.no_grad():
        for group in C.batches(train, batch_tokens=2048, rng=random.Random(0)):
            b = C.collate(group, t2d, 2048)
            feats.clear()
            out = head.layer_output(b.hidden, b.next_tokens, b.positions, mask=C.chain_mask(b.hidden.shape[1], 1))
            normal.add(feats[-1][b.valid], b.next_hidden[b.valid] / w - out[b.valid].float())
            if normal.count >= max_pos:
                break
    hook.remove()
    print(f"normal eqs over {normal.count} positions {time.time()-t:.0f}s", flush=True)
    for dr in [float(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "1e-3,1e-2,3e-2,1e-1,3e-1").split(",")]:
        t = time.time(); m, r2 = normal.solve(dr)
        with torch.no_grad():
            module.weight.copy_(base + m.T.float())
        e = ev(head)
        row = dict(eh_ridge=eh_r, down_ridge=dr, positions=normal.count, r2_train=r2, acc=[round(a, 4) for a in e["acceptance_per_position"]], mal=round(e["mean_acceptance_length"], 3), loss=round(e["loss"], 3))
        print(row, f"{time.time()-t:.0f}s", flush=True)
        results.append(row)
json.dump(results, open(f"/work/exp/ridge/results-{max_pos}.json", "w"), indent=1)
