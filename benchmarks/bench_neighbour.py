"""A busy neighbour (issue 26): plain decoding on a quiet machine and beside `yes > /dev/null`, our
engine on llama.cpp's kernels (threads following the free cores, engine/threads.py, and fixed at
every core as before) against llama.cpp itself (llama-cpp-python's high-level ``Llama``,
``n_threads=os.cpu_count()``, as a user runs it), in the same run, interleaved, with the same
prompt and token count; optionally our int8 target too.

    VOCABBRIDGE_MODELS=/work/models python benchmarks/bench_neighbour.py --target qwen2.5-coder-1.5b \\
        --out benchmarks/results/2026-12-03-busy-neighbour

Each measurement: a few warm-up tokens (the governor sees the neighbour there), then ``--tokens``
greedy tokens, eos ignored; tok/s is decoding after the first token. Before every round the load
of other people's processes is measured (cores busy while we run nothing), so a figure taken while
others worked says so. Reported: medians over ``--repeats`` rounds and the slowdown each system
takes from the neighbour (quiet tok/s ÷ busy tok/s; 2.0 = it lost half).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vocabbridge.engine import SamplingParams  # noqa: E402
from vocabbridge.engine.factory import build_engine  # noqa: E402
from vocabbridge.engine.invariant import cpu_name  # noqa: E402
from vocabbridge.engine.llama_cpp import system_info  # noqa: E402
from vocabbridge.engine.threads import CoreMeter  # noqa: E402
from vocabbridge.presets import resolve_model  # noqa: E402
from vocabbridge.spec import EngineSpec  # noqa: E402

PROMPT = "Write a Python function that parses an ISO 8601 date string and returns a datetime, with tests."
WARM = 4  # tokens decoded before timing


def vector_units() -> str:
    """``AVX2, no AVX-512`` or ``AVX-512``, from /proc/cpuinfo's flags."""
    with open("/proc/cpuinfo") as f:
        flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    return "AVX-512" if "avx512f" in flags else "AVX2, no AVX-512" if "avx2" in flags else "no AVX2"


def background_load(seconds: float = 2.0) -> float:
    """Cores other processes keep busy while this one sleeps."""
    meter = CoreMeter()
    time.sleep(seconds)
    return meter.sample() or 0.0


class Ours:
    """Our engine, plain decoding (no drafter); ``governed`` False: threads fixed at every core."""

    def __init__(self, name: str, built, governor, governed: bool):
        self.name, self.built, self.governor, self.governed = name, built, governor, governed
        self.ids = built.target.view.encode(PROMPT)

    def run(self, tokens: int) -> dict:
        engine, gov = self.built.engine, self.governor
        engine.threads = gov if self.governed else None
        if gov is not None:
            for knob in gov.knobs if not self.governed else []:
                knob.set(os.cpu_count())
            gov.threads, gov._next = 0, 0.0  # the governed run sets every knob at its first look
        engine.generate(self.ids, SamplingParams(max_new_tokens=WARM, ignore_eos=True))
        res = engine.generate(self.ids, SamplingParams(max_new_tokens=tokens, ignore_eos=True))
        s = res.stats
        threads = gov.threads if self.governed and gov is not None else os.cpu_count()
        return {"tok_s": (len(res.tokens) - 1) / (s.time_total - s.ttft), "threads": threads, "tokens": res.tokens}


class LlamaItself:
    """llama-cpp-python's high-level Llama, as a user runs it."""

    name = "llama.cpp itself"

    def __init__(self, path: str, ctx: int):
        from llama_cpp import Llama

        self.n_threads = os.cpu_count()
        self.llm = Llama(model_path=path, n_threads=self.n_threads, n_ctx=ctx, verbose=False)
        self.ids = self.llm.tokenize(PROMPT.encode())

    def _decode(self, n: int) -> tuple[list[int], float, float]:
        out, t_first = [], 0.0
        for tok in self.llm.generate(self.ids, temp=0.0, reset=True):
            out.append(tok)
            if len(out) == 1:
                t_first = time.perf_counter()
            if len(out) >= n:
                break
        return out, t_first, time.perf_counter()

    def run(self, tokens: int) -> dict:
        self._decode(WARM)
        out, t_first, t_end = self._decode(tokens)
        return {"tok_s": (len(out) - 1) / (t_end - t_first), "threads": self.n_threads, "tokens": out}


def neighbour() -> subprocess.Popen:
    return subprocess.Popen(["sh", "-c", "exec yes > /dev/null"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--int8", action="store_true", help="also our torch int8 target (governed and fixed)")
    ap.add_argument("--settle", type=float, default=2.0, help="seconds between starting the neighbour and measuring")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    command = "VOCABBRIDGE_MODELS=" + os.environ.get("VOCABBRIDGE_MODELS", "") + " python " + shlex.join(sys.argv)

    src = resolve_model(args.target)
    print(f"loading {args.target} ({src})", flush=True)
    llama_built = build_engine(EngineSpec(target=args.target, kernels="llama.cpp"))
    gov = llama_built.engine.threads
    systems = [
        Ours("ours, llama.cpp kernels, threads governed", llama_built, gov, True),
        Ours("ours, llama.cpp kernels, threads fixed", llama_built, gov, False),
        LlamaItself(str(src), 2048),
    ]
    notes = {"ours, llama.cpp kernels": llama_built.notes}
    if args.int8:
        int8_built = build_engine(EngineSpec(target=args.target, kernels="torch", dtype="int8"))
        gov8 = int8_built.engine.threads
        systems += [
            Ours("ours, int8 target, threads governed", int8_built, gov8, True),
            Ours("ours, int8 target, threads fixed", int8_built, gov8, False),
        ]
        notes["ours, int8 target"] = int8_built.notes
    runs = []
    for r in range(args.repeats):
        for busy in (False, True):
            load = background_load()
            with open("/proc/loadavg") as f:
                loadavg = f.read().split()[0]
            print(
                f"round {r + 1}, {'with yes' if busy else 'quiet'}: others' load {load:.2f} cores, loadavg {loadavg}", flush=True
            )
            proc = neighbour() if busy else None
            try:
                if proc:
                    time.sleep(args.settle)
                for system in systems:
                    res = system.run(args.tokens)
                    runs.append(
                        {"round": r, "busy": busy, "system": system.name, "others_before": load, "loadavg": loadavg, **res}
                    )
                    print(f"  {system.name}: {res['tok_s']:.2f} tok/s ({res['threads']} threads at the end)", flush=True)
            finally:
                if proc:
                    proc.kill()
                    proc.wait()
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "runs.json").write_text(json.dumps(runs, indent=1))
    report = render(runs, systems, args, command, notes)
    print(report)
    if args.out:
        (args.out / "report.md").write_text(report)


def render(runs, systems, args, command, notes) -> str:
    def med(name, busy):
        return statistics.median(x["tok_s"] for x in runs if x["system"] == name and x["busy"] == busy)

    same = {}
    for x in runs:  # every system's tokens, quiet and busy, must be the same answer
        same.setdefault(x["system"], set()).add(tuple(x["tokens"]))
    loads = [x["others_before"] for x in runs]
    lines = [
        "# A busy neighbour: plain decoding quiet and beside `yes > /dev/null`",
        "",
        "```",
        command,
        "```",
        "",
        f"- target: {args.target} ({Path(resolve_model(args.target)).name}), {args.tokens} greedy tokens after {WARM} warm-up "
        f"tokens, eos ignored, medians of {args.repeats} rounds; each round runs every system quiet, then every system "
        "beside one `yes > /dev/null`.",
        f"- CPU: {cpu_name()}, {os.cpu_count()} cores, {vector_units()}; llama.cpp: {system_info()}",
        f"- other people's processes kept {min(loads):.2f}-{max(loads):.2f} cores busy before the rounds "
        f"(median {statistics.median(loads):.2f}; measured from /proc/stat while this run slept; "
        f"{os.cpu_count()}.00 = every core): 'quiet' means no `yes`, not an idle machine.",
        "",
        "| system | quiet tok/s | with `yes` tok/s | slowdown | threads with `yes` | answers identical |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for s in systems:
        q, b = med(s.name, False), med(s.name, True)
        th = sorted({x["threads"] for x in runs if x["system"] == s.name and x["busy"]})
        lines.append(
            f"| {s.name} | {q:.2f} | {b:.2f} | {q / b:.1f}x | {'/'.join(map(str, th))} | {'yes' if len(same[s.name]) == 1 else 'NO'} |"
        )
    lines += ["", "Notes the engines printed at load:"]
    for name, ns in notes.items():
        lines += [f"- {name}: {'; '.join(ns)}"]
    lines += ["", "Every run (tok/s; others' cores before the round):", ""]
    for x in runs:
        lines.append(
            f"- round {x['round'] + 1} {'busy ' if x['busy'] else 'quiet'} {x['system']}: {x['tok_s']:.2f} ({x['threads']} threads; "
            f"others {x['others_before']:.2f} cores, loadavg {x['loadavg']})"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
