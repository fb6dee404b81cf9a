"""The heal's two model passes, one sequence at a time against padded micro-batches, on one machine:
the feature pass (the drafter's final hidden states over the data, computed once) and whole-model
steps (forward, soft cross-entropy on the target's top-k, backward, AdamW). On a GPU the padded
path also runs under bf16 autocast, as `heal` runs it there; one sequence at a time in float32 is
how `heal` ran before (issue 28's GPU heal: 113 s of features and 245 whole-model steps in 212 s
for 4,606 answers of Qwen2.5-Coder-1.5B on an H100).

The drafter is SmolLM2-135M's shape with the target's 151,936-row vocabulary (what a transplant
onto Qwen2.5-Coder gives), random weights: the cost does not depend on the values. The answers are
random tokens of the lengths heal's data have (a prompt, then up to 200 generated tokens).

    python benchmarks/bench_heal_batching.py [--device cuda] [--sequences 512] [--steps 20] [--json out.json]

Prints a table: seconds and sequences/s for each path and the ratio against one sequence at a time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import time
from pathlib import Path

import torch

import vocabbridge.transplant.heal as heal_mod
from vocabbridge.training.data import Sequence
from vocabbridge.transplant.heal import GPU_MICRO_TOKENS, HealRecipe, _Healing, drafter_hidden


def drafter(vocab: int, device: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=vocab,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).to(device).float()


def answers(n: int, vocab: int, top_k: int = 20) -> list[Sequence]:
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        prompt = int(torch.randint(20, 200, (1,), generator=g))
        gen = int(torch.randint(40, 201, (1,), generator=g))
        m = prompt + gen
        ids = torch.randint(0, vocab, (m - 1, top_k), generator=g, dtype=torch.int32)
        p = torch.rand(m - 1, top_k, generator=g).half()
        out.append(Sequence(torch.randint(0, vocab, (m,), generator=g), torch.zeros(m - 1, 1), ids, p, prompt))
    return out


@contextlib.contextmanager
def heal_before():
    """On a GPU, heal as it ran before padding: float32, no autocast (heal autocasts to bf16 there)."""
    real = heal_mod._autocast
    heal_mod._autocast = lambda device: contextlib.nullcontext()
    try:
        yield
    finally:
        heal_mod._autocast = real


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def features(model, seqs, device, micro) -> float:
    sync(device)
    t = time.perf_counter()
    drafter_hidden(model, seqs, max_tokens=micro)
    sync(device)
    return time.perf_counter() - t


def whole_steps(model, seqs, device, micro, steps, batch_positions=1024) -> tuple[float, int]:
    run = _Healing(model, None, None, None, HealRecipe(micro_tokens=micro or 0), Path("."), device=device, say=lambda s: None)
    model.train()
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-6)
    base = model.get_decoder()
    used, i = 0, 0
    sync(device)
    t = None
    for s in range(steps + 1):  # the first step warms up, untimed
        if s == 1:
            sync(device)
            t = time.perf_counter()
        batch, n = [], 0
        while n < batch_positions:
            q = seqs[i % len(seqs)]
            batch.append(q)
            n += len(q.tokens) - q.gen_start
            i += 1
        run._whole_step(base, opt, params, batch, n, micro)
        if s >= 1:
            used += len(batch)
    sync(device)
    model.eval()
    return time.perf_counter() - t, used


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sequences", type=int, default=512)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--micro", type=int, default=GPU_MICRO_TOKENS, help="tokens per padded forward")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    dev = args.device
    model = drafter(args.vocab, dev)
    seqs = answers(args.sequences, args.vocab)
    where = torch.cuda.get_device_name() if dev.startswith("cuda") else platform.processor() or platform.machine()
    print(f"device {dev} ({where}), torch {torch.__version__}; {len(seqs)} answers, {args.steps} whole-model steps each")
    rows = {}
    for name, micro in (("one sequence at a time", 0), (f"padded, {args.micro} tokens", args.micro)):
        with heal_before() if micro == 0 and dev.startswith("cuda") else contextlib.nullcontext():
            features(model, seqs[:8], dev, micro)  # warm-up
            f = features(model, seqs, dev, micro)
            w, used = whole_steps(model, seqs, dev, micro, args.steps)
        rows[name] = {"features_s": f, "features_seq_per_s": len(seqs) / f, "whole_s": w, "whole_seq_per_s": used / w}
    base = next(iter(rows.values()))
    print("| path | features s | answers/s | × | whole-model s | answers/s | × |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name, r in rows.items():
        fx, wx = r["features_seq_per_s"] / base["features_seq_per_s"], r["whole_seq_per_s"] / base["whole_seq_per_s"]
        print(
            f"| {name} | {r['features_s']:.2f} | {r['features_seq_per_s']:.0f} | ×{fx:.2f} | "
            f"{r['whole_s']:.2f} | {r['whole_seq_per_s']:.1f} | ×{wx:.2f} |"
        )
    if args.json:
        args.json.write_text(json.dumps({"device": dev, "where": where, "torch": torch.__version__, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
