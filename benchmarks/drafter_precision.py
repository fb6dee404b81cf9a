"""How a CPU drafter's dtype changes what it drafts and what a step costs, against the same
drafter in float32 (the reference, measured in the same run).

For each dtype (int8: row-int8 linears on the lean forward; int8-dynamic: quantize_dynamic's,
one activation scale a forward; q4: our 4-bit kernels) and each text, the drafter prefills the
first PREFILL tokens in one forward, then steps one token at a time; its top-1 choice at every
position is compared with the float32 drafter's. A drafter's numerics never change the engine's
output (the target verifies every token), only how much of its drafting the target accepts.

    python benchmarks/drafter_precision.py --drafter drafters/smollm2-qwen-healed-gpu2 [--dtypes int8,int8-dynamic,q4] [--json out.json]

Prints a table: top-1 agreement with float32 over the prefill's rows and over the one-row steps
after it, and the median one-row step in ms (x float32's).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vocabbridge.engine.factory import load_drafter_lm  # noqa: E402
from vocabbridge.engine.model import load_causal_lm  # noqa: E402

TEXTS = ("README.md", "docs/transplant.md", "vocabbridge/engine/lean.py", "CONTRIBUTING.md")


def measure(lm, texts: list[list[int]], reference: list[tuple[torch.Tensor, torch.Tensor]] | None, prefill: int, steps: int):
    """(prefill choices, step choices, step seconds) per text, and agreement with ``reference``."""
    out, agree_p, agree_s, n_p, n_s, times = [], 0, 0, 0, 0, []
    for i, ids in enumerate(texts):
        with torch.inference_mode():
            s = lm.session()
            pre = s.extend(ids[:prefill], keep=prefill).argmax(-1)
            step = []
            for t in ids[prefill : prefill + steps]:
                t0 = time.perf_counter()
                step.append(int(s.extend([t]).argmax()))
                times.append(time.perf_counter() - t0)
        step = torch.tensor(step)
        out.append((pre, step))
        if reference is not None:
            agree_p += int((pre == reference[i][0]).sum())
            agree_s += int((step == reference[i][1]).sum())
            n_p, n_s = n_p + len(pre), n_s + len(step)
    agreement = (agree_p / n_p, agree_s / n_s) if reference is not None else (1.0, 1.0)
    return out, agreement, statistics.median(times[len(texts) :])  # the first step of each text warms up


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drafter", required=True, help="a drafter folder, GGUF or preset")
    ap.add_argument("--dtypes", default="int8,int8-dynamic,q4")
    ap.add_argument("--prefill", type=int, default=240)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    ref_lm = load_causal_lm(args.drafter, dtype="float32", device="cpu")
    texts = [ref_lm.view.encode((ROOT / f).read_text(encoding="utf-8")) for f in TEXTS]
    texts = [ids for ids in texts if len(ids) >= args.prefill + args.steps]
    reference, _, ref_step = measure(ref_lm, texts, None, args.prefill, args.steps)
    rows = [{"dtype": "float32", "prefill_agreement": 1.0, "step_agreement": 1.0, "step_ms": 1000 * ref_step}]
    del ref_lm
    for dtype in args.dtypes.split(","):
        lm = load_drafter_lm(args.drafter, dtype, device="cpu")
        _, (a_p, a_s), step = measure(lm, texts, reference, args.prefill, args.steps)
        rows.append({"dtype": dtype, "prefill_agreement": a_p, "step_agreement": a_s, "step_ms": 1000 * step})
        del lm
    cpu = platform.processor() or platform.machine()
    print(
        f"drafter {args.drafter}; {len(texts)} texts, a {args.prefill}-token prefill then {args.steps} one-row steps each; "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {cpu}"
    )
    print(
        "| drafter dtype | top-1 = float32's, prefill rows | top-1 = float32's, one-row steps after it | one-row step ms | × float32 |"
    )
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['dtype']} | {r['prefill_agreement']:.1%} | {r['step_agreement']:.1%} | {r['step_ms']:.1f} | "
            f"×{rows[0]['step_ms'] / r['step_ms']:.2f} |"
        )
    if args.json:
        args.json.write_text(json.dumps({"drafter": args.drafter, "texts": len(texts), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
