"""What should an unpaired target token be for a drafter that reads one token per target token
(vLLM's heterogeneous path)? Offline acceptance, on the target's own greedy continuations of the
bench suite's prompts, for:

- ``tli vllm-map unk``: vLLM's own string-match map, unpaired → the drafter's unk (what vLLM does);
- ``tli bytes-map unk``: our map (pairs by bytes and roles), unpaired → unk;
- ``tli bytes-map first``: our map, unpaired → the first token of its input-bridge spelling (the plugin's default);
- ``bridged`` and ``text``: our drafters that read the whole context (for reference).

    OUT=benchmarks/results/$(date +%F)-tli-fallback && mkdir -p $OUT
    VOCABBRIDGE_MODELS=/work/models python benchmarks/bench_tli_fallback.py --log $OUT/run.log

One target forward per sequence gives the target's greedy token at every position; each drafter
then proposes at every position as it would while decoding (vocabbridge.engine.offline).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vocabbridge.chat import chat_prompt_ids  # noqa: E402
from vocabbridge.engine.factory import build_engine  # noqa: E402
from vocabbridge.engine.offline import eval_drafter, greedy_continuations  # noqa: E402
from vocabbridge.mapping.tokenmap import UNPAIRED_ENV  # noqa: E402
from vocabbridge.prompts import load_prompts, select_prompts  # noqa: E402
from vocabbridge.spec import EngineSpec  # noqa: E402

MAP = ROOT / "maps" / "smollm2_to_qwen2.5.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--drafter", default="smollm2-135m")
    ap.add_argument("--categories", default="korean_chat,english_chat,code_review,code_generation")
    ap.add_argument("--tokens", type=int, default=64, help="greedy continuation tokens per prompt")
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--log", type=Path)
    args = ap.parse_args()
    out = open(args.log, "w", encoding="utf-8") if args.log else None

    def say(line: str) -> None:
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    loaded: dict = {}
    base = EngineSpec(target=args.target, drafter=args.drafter, num_speculative_tokens=args.k)
    plain = build_engine(base.replace(drafter="none"), loaded=loaded)
    view = plain.target.view
    prompts = select_prompts(load_prompts(), categories=args.categories.split(","))
    ids = [chat_prompt_ids(view, [dict(m) for m in p.messages]) for p in prompts]
    t0 = time.perf_counter()
    seqs = greedy_continuations(plain.target, ids, args.tokens)
    say(
        f"target {args.target}: greedy continuations of {len(ids)} prompts × {args.tokens} tokens in {time.perf_counter() - t0:.0f} s"
    )
    configs = [
        ("tli vllm-map unk", base.replace(mode="tli"), None),
        ("tli bytes-map unk", base.replace(mode="tli", map_path=str(MAP)), "unk"),
        ("tli bytes-map first", base.replace(mode="tli", map_path=str(MAP)), "first"),
        ("bridged", base.replace(mode="bridged", map_path=str(MAP)), None),
        ("text", base.replace(mode="text"), None),
    ]
    say(f"{'configuration':<22} {'per position (k=' + str(args.k) + ')':<34} exp. acc. length  per prompt (position 1)")
    for name, spec, unpaired in configs:
        if unpaired:
            os.environ[UNPAIRED_ENV] = unpaired
        built = build_engine(spec, loaded=loaded)
        per_prompt = []
        total = None
        for p, seq in zip(prompts, seqs):
            ev = eval_drafter(built.target, built.engine.drafter, [seq], k=args.k, name=name)
            per_prompt.append(f"{p.id} {100 * ev.acceptance_per_position[0]:.0f}")
            total = ev if total is None else total.merge(ev)
        pos = " / ".join(f"{100 * a:.1f}" for a in total.acceptance_per_position)
        say(f"{name:<22} {pos:<34} {total.expected_acceptance_length:>5.2f}             {', '.join(per_prompt)}")
        os.environ.pop(UNPAIRED_ENV, None)
    if out:
        out.close()


if __name__ == "__main__":
    main()
