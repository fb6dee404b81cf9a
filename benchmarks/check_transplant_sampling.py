"""Sampling through a transplanted drafter keeps the target's distribution, on the real models.

Two checks, as tests/test_engine.py checks the other drafters on tiny ones:

1. rejection sampling, position by position: along the target's greedy answer to a prompt, the
   target's distribution p (temperature T) and the drafter's q at the same context; a draft token
   drawn from q goes through ``verify`` N times; the emitted first token's empirical law must be as
   close to p as N draws straight from p are (total variation within 1.5× theirs + 0.01);
2. end to end: the same prompt, two sampled tokens, M seeds with plain decoding and M with the
   drafter; the two empirical laws of the pairs must agree (total variation below 0.15, as the
   tiny-model test).

    VOCABBRIDGE_MODELS=/work/models python benchmarks/check_transplant_sampling.py drafters/smollm2-qwen-healed \\
        --out benchmarks/results/2026-12-03-transplant/sampling.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vocabbridge.chat import chat_prompt_ids  # noqa: E402
from vocabbridge.engine import DraftModelDrafter, SamplingParams, SpecEngine, load_causal_lm  # noqa: E402
from vocabbridge.engine.invariant import INVARIANT_ROWS  # noqa: E402
from vocabbridge.engine.sampling import logits_to_probs  # noqa: E402
from vocabbridge.engine.verify import verify  # noqa: E402
from vocabbridge.presets import resolve_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("drafter", help="a transplanted drafter folder")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--prompt", default="Write a Python function that returns the n-th Fibonacci number.")
    ap.add_argument("--positions", type=int, default=8)
    ap.add_argument("--draws", type=int, default=20000)
    ap.add_argument("--seeds", type=int, default=300)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    t0 = time.time()
    target = load_causal_lm(resolve_model(args.target), dtype="int8", rows=INVARIANT_ROWS)
    drafter = load_causal_lm(args.drafter, dtype="float32")
    ids = chat_prompt_ids(target.view, [{"role": "user", "content": args.prompt}])
    params = SamplingParams(temperature=args.temperature)
    g = torch.Generator().manual_seed(0)

    # 1. verify, position by position, along the target's greedy answer
    greedy = SpecEngine(target).generate(ids, SamplingParams(max_new_tokens=args.positions)).tokens
    seq = ids + greedy
    t_logits = target.session().extend(seq, keep=args.positions + 1)  # [positions+1, V]
    d_logits = drafter.session().extend(seq, keep=args.positions + 1)
    rows = []
    for i in range(args.positions):
        p = logits_to_probs(t_logits[i : i + 1], params)[0]
        q = logits_to_probs(d_logits[i : i + 1], params)[0]
        counts = torch.zeros_like(p)
        pair = torch.stack([t_logits[i], t_logits[i]])
        for _ in range(args.draws):
            x = int(torch.multinomial(q, 1, generator=g))
            acc, nxt = verify(pair, [x], q[None], params, g)
            counts[x if acc == 1 else nxt] += 1
        tv = 0.5 * float((counts / args.draws - p).abs().sum())
        direct = torch.bincount(torch.multinomial(p, args.draws, replacement=True, generator=g), minlength=len(p)).float()
        noise = 0.5 * float((direct / args.draws - p).abs().sum())  # what as many draws straight from p give
        overlap = float(torch.minimum(p, q).sum())  # the expected acceptance of one sampled draft token
        ok = tv <= 1.5 * noise + 0.01
        rows.append(
            {
                "position": i,
                "tv": round(tv, 4),
                "tv_of_direct_draws": round(noise, 4),
                "passes": ok,
                "p_q_overlap": round(overlap, 3),
                "top_p": round(float(p.max()), 3),
            }
        )
        print(f"position {i}: TV {tv:.4f} (direct draws from p: {noise:.4f}; p·q overlap {overlap:.2f})", flush=True)

    # 2. end to end: two sampled tokens, plain against speculative
    drafting = SpecEngine(
        target, DraftModelDrafter(drafter, target_vocab_size=target.vocab_size, target_view=target.view), num_speculative_tokens=2
    )
    plain = SpecEngine(target)
    two = lambda seed: SamplingParams(max_new_tokens=2, temperature=args.temperature, seed=seed, ignore_eos=True)  # noqa: E731
    a = Counter(tuple(plain.generate(ids, two(s)).tokens) for s in range(args.seeds))
    b = Counter()
    accepted = drafted = 0
    for s in range(args.seeds):
        r = drafting.generate(ids, two(100_000 + s))
        b[tuple(r.tokens)] += 1
        accepted, drafted = accepted + r.stats.accepted, drafted + r.stats.draft_tokens
    keys = set(a) | set(b)
    tv2 = 0.5 * sum(abs(a[k] - b[k]) for k in keys) / args.seeds
    print(f"end to end: {len(keys)} distinct pairs, TV {tv2:.3f}; drafter acceptance {accepted}/{drafted}", flush=True)
    result = {
        "drafter": args.drafter,
        "target": args.target,
        "temperature": args.temperature,
        "prompt": args.prompt,
        "verify": {
            "draws": args.draws,
            "positions": rows,
            "max_tv": max(r["tv"] for r in rows),
            "passes": all(r["passes"] for r in rows),
        },
        "end_to_end": {
            "seeds": args.seeds,
            "distinct_pairs": len(keys),
            "tv": round(tv2, 4),
            "passes": tv2 < 0.15 and len(keys) > 3,
            "accepted": accepted,
            "draft_tokens": drafted,
            "plain_top": [[list(k), v] for k, v in a.most_common(5)],
            "drafter_top": [[list(k), v] for k, v in b.most_common(5)],
        },
        "seconds": round(time.time() - t0),
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("verify", "end_to_end")}, indent=1)[:2000])


if __name__ == "__main__":
    main()
