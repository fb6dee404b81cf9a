"""Which target features predict the target's next hidden state best? A linear probe for choosing an
EAGLE-3 head's layers (vocabbridge/heads/eagle3.py: default_aux_layers).

    VOCABBRIDGE_MODELS=/work/models python benchmarks/eagle3_feature_probe.py generate 6   # 96 training prompts × 96 greedy tokens, int8 target
    VOCABBRIDGE_MODELS=/work/models python benchmarks/eagle3_feature_probe.py fit          # ridge fits, held-out greedy agreement

``generate`` stores, for every position, the final hidden state h and the residual streams entering
layers 2, 7, 14, 20, 25, 27 and 28 (28: the final norm's input). ``fit`` regresses h_{t+1} (divided
by the final norm's scale, as the heads' least-squares start does) on [rms(embed(x_{t+1})), rms(features)]
for each feature set, over the prompts not held out, and counts how often the lm_head on the
prediction gives the target's greedy token x_{t+2}, at the held-out prompts' generated positions.
Run of 2026-12-02 (2-core AVX2 machine): benchmarks/results/2026-12-02-eagle3-head/feature-probe/results.md.
"""

import random
import sys
import time
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import DynamicCache

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vocabbridge.engine.convert import converted_folder  # noqa: E402
from vocabbridge.engine.invariant import quantize_rows  # noqa: E402
from vocabbridge.engine.model import load_causal_lm  # noqa: E402
from vocabbridge.heads.draft_head import decoder_of  # noqa: E402
from vocabbridge.presets import resolve_model  # noqa: E402
from vocabbridge.training.data import DataPlan, render_prompts, training_prompts  # noqa: E402

DATA = Path("/tmp/eagle3-probe-data.pt")
NEW = 96
SAVE = [2, 7, 14, 20, 25, 27, 28]
SETS = {
    "A mtp: e,h": ["h"],
    "B e,a14,a25,a28": ["a14", "a25", "a28"],
    "C eagle3 default e,a2,a14,a25": ["a2", "a14", "a25"],
    "D e,a20,a28": ["a20", "a28"],
    "E e,a27,a28": ["a27", "a28"],
    "F e,a7,a20,a28": ["a7", "a20", "a28"],
}


def rms(x):
    return x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()


@torch.inference_mode()
def generate(batches: int) -> None:
    torch.manual_seed(0)
    lm = load_causal_lm(resolve_model("qwen2.5-coder-1.5b"), dtype="float32", device="cpu", pack=False)
    lm.model.requires_grad_(False)
    quantize_rows(lm.model)
    base = decoder_of(lm.model)
    n_layers = len(base.layers)
    plan = DataPlan.make(render_prompts(lm.view, training_prompts()), batch_size=16, seed=0)
    cap = {}

    def pre_hook(i):
        def f(m, args, kwargs):
            cap[i] = (args[0] if args else kwargs["hidden_states"]).detach()

        return f

    hooks = [base.layers[i].register_forward_pre_hook(pre_hook(i), with_kwargs=True) for i in range(n_layers)]
    hooks.append(base.norm.register_forward_pre_hook(pre_hook(n_layers), with_kwargs=True))
    seqs, t0 = [], time.time()
    for bi, batch in enumerate(plan.batches[:batches]):
        prompts = [ids for _, ids in batch]
        b, t = len(prompts), max(len(p) for p in prompts)
        ids = torch.zeros((b, t), dtype=torch.long)
        mask = torch.zeros((b, t), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, t - len(p) :] = torch.tensor(p)
            mask[i, t - len(p) :] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        h = base(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, past_key_values=cache).last_hidden_state
        rows = [{"h": [h[i, t - len(p) :]], **{f"a{j}": [cap[j][i, t - len(p) :]] for j in SAVE}} for i, p in enumerate(prompts)]
        nxt = lm.model.lm_head(h[:, -1]).argmax(-1)
        toks = [p + [int(nxt[i])] for i, p in enumerate(prompts)]
        last = pos[:, -1]
        for _ in range(NEW - 1):
            mask = torch.cat([mask, torch.ones((b, 1), dtype=mask.dtype)], 1)
            last = last + 1
            h = base(
                input_ids=nxt[:, None], attention_mask=mask, position_ids=last[:, None], use_cache=True, past_key_values=cache
            ).last_hidden_state
            for i in range(b):
                rows[i]["h"].append(h[i, -1:])
                for j in SAVE:
                    rows[i][f"a{j}"].append(cap[j][i, -1:])
            nxt = lm.model.lm_head(h[:, -1]).argmax(-1)
            for i in range(b):
                toks[i].append(int(nxt[i]))
        for i, p in enumerate(prompts):
            r = {k: torch.cat(v).half() for k, v in rows[i].items()}
            r.update(tokens=torch.tensor(toks[i]), gen_start=len(p), pid=batch[i][0])
            seqs.append(r)
        print(f"batch {bi + 1}/{batches} {time.time() - t0:.0f}s", flush=True)
    for hk in hooks:
        hk.remove()
    torch.save({"seqs": seqs}, DATA)
    print("saved", sum(len(s["tokens"]) for s in seqs), "tokens")


def fit() -> None:
    seqs = torch.load(DATA, weights_only=False)["seqs"]
    weights = {}
    for f in sorted(converted_folder(Path(resolve_model("qwen2.5-coder-1.5b"))).glob("*.safetensors")):
        with safe_open(str(f), "pt") as sf:
            for k in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"):
                if k in sf.keys():
                    weights[k] = sf.get_tensor(k).float()
    emb, w = weights["model.embed_tokens.weight"], weights["model.norm.weight"]
    head = weights.get("lm_head.weight", emb)
    pids = sorted({s["pid"] for s in seqs})
    random.Random(0).shuffle(pids)
    held = set(pids[: max(1, len(pids) // 6)])

    def feats(s, keys):
        toks = s["tokens"]
        m = len(toks) - 2
        x = torch.cat([rms(emb[toks[1 : m + 1]])] + [rms(s[k][:m].float()) for k in keys], -1)
        y = s["h"][1 : m + 1].float() / w
        gen = torch.arange(m) + 2 >= s["gen_start"]
        return x, y, gen, toks[2 : m + 2]

    for name, keys in SETS.items():
        t0 = time.time()
        xtx = xty = None
        cnt = 0
        for s in seqs:
            if s["pid"] in held:
                continue
            x, y, _, _ = feats(s, keys)
            xtx = x.T @ x if xtx is None else xtx + x.T @ x
            xty = x.T @ y if xty is None else xty + x.T @ y
            cnt += len(x)
        xtx, xty = xtx.double(), xty.double()
        xh, lh = [], []
        for s in seqs:
            if s["pid"] in held:
                x, _, gen, lab = feats(s, keys)
                xh.append(x[gen])
                lh.append(lab[gen])
        xh, lh = torch.cat(xh), torch.cat(lh)
        out = []
        for ridge in (1e-3, 1e-2, 1e-1):
            lam = ridge * float(xtx.diagonal().mean())
            m = torch.linalg.solve(xtx + lam * torch.eye(xtx.shape[0], dtype=xtx.dtype), xty).float()
            pred = ((xh @ m) * w) @ head.T
            out.append(f"ridge {ridge:g}: {float((pred.argmax(-1) == lh).float().mean()):.3f}")
        print(f"{name:32s} train pos {cnt}, held-out gen pos {len(lh)}: " + "  ".join(out) + f"  ({time.time() - t0:.0f}s)")


if __name__ == "__main__":
    generate(int(sys.argv[2])) if sys.argv[1] == "generate" else fit()
