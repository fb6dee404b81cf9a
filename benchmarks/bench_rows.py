"""The cost of one target forward as a function of its rows (1…8), per backend: what a (k+1)-token
verification costs next to a one-token step, the number speculative decoding lives on.

    VOCABBRIDGE_MODELS=/work/models python benchmarks/bench_rows.py --target qwen2.5-coder-1.5b \\
        --out benchmarks/results/2026-12-01-exact-cpu/rows.md

Backends (the same GGUF checkpoint): torch fp32 (the engine's default on a CPU, linears pre-packed
for oneDNN), torch int8 as fbgemm's dynamic quantization has it (one activation scale per batch:
not batch-invariant), our batch-invariant int8 (engine/invariant.py; its forwards are padded to
INVARIANT_ROWS rows, so the cost below is for the rows as given and the engine pays the padded
count), llama.cpp as it ships (weight repacking on) and llama.cpp as the engine's target runs it
(repacking off, flash attention on a bf16 KV cache; a plain step is one row where the load probe
finds that a lone row computes as a batch row, else padded to two), and q4, our own 4-bit kernel
(engine/q4.py, csrc/q4/q4.c: the GGUF's Q4_K tensors as they are, each weight block decoded once for
all rows; the rest of the forward as the int8 invariant target's); ``q4:UNIT`` runs it on one vector
unit (``q4:avx512vnni``, ``q4:amx``: the same bits, other speeds). The last column: filling the
--context cache (the median of 3 prefills after a warm one). Each cell: the median of --repeats forwards over a
--context-token cache; the ratio is against the same backend's one-row forward.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vocabbridge.presets import resolve_model  # noqa: E402

ROWS = (1, 2, 3, 4, 5, 6, 7, 8)


def measure(lm, context: int, repeats: int, prefills: int = 3) -> dict:
    """Median seconds of a forward by its rows, and ``"prefill"``: of filling the --context cache."""
    fills = []
    for _ in range(prefills + 1):  # the first one warms up
        s = lm.session()
        t0 = time.perf_counter()
        s.extend(list(range(1000, 1000 + context)))
        fills.append(time.perf_counter() - t0)
    out = {"prefill": statistics.median(fills[1:])}
    for r in ROWS:
        times = []
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            s.extend(list(range(2000, 2000 + r)), keep=r)
            times.append(time.perf_counter() - t0)
            s.truncate(context)
        out[r] = statistics.median(times[1:])
    return out


def vector_units() -> str:
    """What the kernels may use: llama.cpp's build flags where it is installed, else the CPU's."""
    try:
        from llama_cpp import llama_print_system_info

        return "llama.cpp built with: " + llama_print_system_info().decode().strip()
    except ImportError:
        flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").is_file() else []
        return "CPU flags: " + " ".join(sorted({f for f in flags if f.startswith(("avx", "amx"))}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--context", type=int, default=300, help="tokens in the cache before the measured forward")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--backends", default="fp32,int8-naive,int8-invariant,llama.cpp,llama.cpp-invariant,q4")
    ap.add_argument("--threads", type=int, help="threads for every backend (default: each backend's own; llama.cpp: all cores)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    known = ("fp32", "int8-naive", "int8-invariant", "llama.cpp", "llama.cpp-invariant", "q4")
    unknown = [b for b in args.backends.split(",") if b not in known and not b.startswith("q4:")]
    if unknown:
        ap.error(f"unknown backend {', '.join(unknown)}; the backends: {', '.join(known)}")
    src = resolve_model(args.target)
    rows = {}
    for name in args.backends.split(","):
        print(f"{name}: loading {src}…", file=sys.stderr, flush=True)
        if name.startswith("llama.cpp"):
            from vocabbridge.engine.llama_cpp import load_llama_cpp_lm

            lm = load_llama_cpp_lm(src, invariant=name.endswith("invariant"), threads=args.threads)
        elif name == "q4" or name.startswith("q4:"):  # q4:UNIT: on that vector unit (avx512vnni, amx, …)
            from vocabbridge.engine.q4 import load_q4_lm, require

            lm = load_q4_lm(src, threads=args.threads)
            if ":" in name:
                require().set_isa(name.split(":", 1)[1])
            lm.rows = None  # the rows as given (the engine verifies up to INVARIANT_ROWS a forward)
        else:
            from vocabbridge.engine.model import load_causal_lm

            dtype = {"fp32": "float32", "int8-naive": "int8", "int8-invariant": "int8"}[name]
            lm = load_causal_lm(src, dtype=dtype, rows=1 if name == "int8-invariant" else None)
            lm.rows = None  # the invariant kernels, the rows as given (the engine pads to INVARIANT_ROWS)
        rows[name] = measure(lm, args.context, args.repeats)
        print(f"{name}: " + ", ".join(f"{r}: {1000 * t:.1f} ms" for r, t in rows[name].items()), file=sys.stderr, flush=True)
        del lm
        if name.startswith("q4:"):
            from vocabbridge.engine.q4 import require

            require().set_isa(require().supported()[-1])
    head = "| backend | " + " | ".join(f"{r} row{'s' if r > 1 else ''}" for r in ROWS)
    head += f" | 5 rows ÷ 1 row | prefill of {args.context} tokens |"
    lines = [head, "|" + " --- |" * (len(ROWS) + 3)]
    for name, t in rows.items():
        cells = " | ".join(f"{1000 * t[r]:.0f} ms (×{t[r] / t[1]:.2f})" for r in ROWS)
        lines.append(f"| {name} | {cells} | **{t[5] / t[1]:.2f}** | {t['prefill']:.2f} s |")
    table = "\n".join(lines)
    cmd = "VOCABBRIDGE_MODELS=... python benchmarks/bench_rows.py " + " ".join(sys.argv[1:])
    cpu = f"{os.cpu_count()} cores ({args.threads or 'default'} threads); {vector_units()}"
    text = f"# One forward's cost by rows: {args.target}, {args.context}-token cache\n\n`{cmd}`\n\n{cpu}\n\n{table}\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
