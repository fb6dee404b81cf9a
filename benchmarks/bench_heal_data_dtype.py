"""What a CPU heal's minutes buy, by dtype: the target writing the data (``--heal-data-dtype``: int8,
the CPU default, against bfloat16, which AMX runs natively) and one whole-model step of the drafter
(float32 against bf16 autocast).

- data: the real target (a preset or GGUF) greedily continues the first ``--batch`` built-in
  training prompts for ``--new-tokens`` tokens through train-head's data path
  (``training.data.generate_batch``: top-k soft labels at each position), once per dtype;
- step: a transplanted drafter folder (``vocabbridge transplant ... -o drafters/NAME``) runs forward
  and backward over 8 sequences of 240 random tokens (about one step of the heal's 1,024 generated
  positions) and an AdamW step, ``--steps`` times per precision; the first is left out.

    python benchmarks/bench_heal_data_dtype.py --target qwen2.5-coder-1.5b --drafter drafters/smollm2-qwen-mean [--json out.json]

Prints tokens/s per data dtype and seconds per step, each with its ratio to the CPU default.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from vocabbridge.engine.invariant import quantize_rows
from vocabbridge.engine.model import load_causal_lm
from vocabbridge.presets import resolve_model
from vocabbridge.training.data import generate_batch, render_prompts, training_prompts
from vocabbridge.vllm.install import cpu_flags


def flags_shown() -> str:
    """The vector units that decide these costs, of those /proc/cpuinfo lists."""
    have = cpu_flags()
    return " ".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in have) or "unknown"


def data_rate(target: str, dtype: str, batch: int, new_tokens: int) -> dict:
    lm = load_causal_lm(resolve_model(target), dtype="float32" if dtype == "int8" else dtype, device="cpu", pack=False)
    lm.model.requires_grad_(False)
    if dtype == "int8":
        quantize_rows(lm.model)
    prompts = [ids for _, ids in render_prompts(lm.view, training_prompts(None))[:batch]]
    roles = lm.view.roles
    stops = {roles[r] for r in ("eos", "end_of_turn") if r in roles}
    with torch.inference_mode():
        t = time.perf_counter()
        seqs = generate_batch(lm.model, prompts, max_new_tokens=new_tokens, stop_ids=stops, top_k=20, pad_id=0)
        seconds = time.perf_counter() - t
    tokens = sum(len(s.tokens) - s.gen_start for s in seqs)
    return {"dtype": dtype, "tokens": tokens, "seconds": round(seconds, 2), "tokens_per_s": round(tokens / seconds, 2)}


def step_cost(drafter: str, autocast: bool, steps: int) -> dict:
    model = AutoModelForCausalLM.from_pretrained(drafter, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(100, 50_000, (1, 240), generator=torch.Generator().manual_seed(0))
    ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if autocast else contextlib.nullcontext
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        for _ in range(8):
            with ctx():
                logits = model(input_ids=ids).logits
            torch.log_softmax(logits.float(), -1)[..., :20].mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t)
    kept = times[1:] or times
    return {"precision": "bf16 autocast" if autocast else "float32", "seconds_per_step": round(sum(kept) / len(kept), 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--drafter", required=True, help="a transplanted drafter folder")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.manual_seed(0)
    data = [data_rate(args.target, d, args.batch, args.new_tokens) for d in ("int8", "bfloat16")]
    steps = [step_cost(args.drafter, a, args.steps) for a in (False, True)]
    print(f"CPU: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, flags: {flags_shown()}")
    print("| data dtype | tokens | seconds | tok/s | × int8 |\n| --- | --- | --- | --- | --- |")
    for d in data:
        print(
            f"| {d['dtype']} | {d['tokens']} | {d['seconds']} | {d['tokens_per_s']} | {d['tokens_per_s'] / data[0]['tokens_per_s']:.2f} |"
        )
    print("| whole-model step | s / step | × float32 |\n| --- | --- | --- |")
    for s in steps:
        print(f"| {s['precision']} | {s['seconds_per_step']} | {steps[0]['seconds_per_step'] / s['seconds_per_step']:.2f} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        out = {"cpu_flags": flags_shown(), "threads": torch.get_num_threads(), "data": data, "whole_step": steps} | vars(args)
        args.json.write_text(json.dumps(out, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
