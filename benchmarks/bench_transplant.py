"""Transplanted drafters beside the other ways a drafter with another vocabulary drafts, in one run:
our engine on the int8 target and on llama.cpp's kernels, and real vLLM (its CPU build) with the
transplanted drafter as a plain draft_model, measured by `vocabbridge bench`'s client (the same
protocol and /metrics reading as bench_side_by_side.py, whose tables this reuses).

    VOCABBRIDGE_MODELS=/work/models python benchmarks/bench_transplant.py \\
        --transplanted mean=drafters/smollm2-qwen-mean --transplanted healed=drafters/smollm2-qwen-healed \\
        --out benchmarks/results/2026-12-03-transplant

Configurations (k = 4 and a fixed draft length everywhere, --min-confidence for model drafters):
- emb-int8 (the batch-invariant int8 target on torch): none, ngram, the 0.5B same-family drafter,
  SmolLM2 as tli, bridged, text and ngram+text, and each transplanted drafter in draft mode (and
  ngram first + the last one given);
- emb-llama.cpp (our engine on llama.cpp's kernels, the GGUF files as they are): none, ngram, the
  0.5B, SmolLM2 ngram+text, each transplanted drafter's GGUF;
- vllm (CPU build): none, vLLM's ngram, SmolLM2 through vLLM's heterogeneous path (tli: with our
  map, which `serve --backend vllm` builds and hands to our plugin by default; vLLM's own
  string-match map is what `vllm serve` alone runs, 4.1 % accepted in
  benchmarks/results/2026-11-30-vllm-vs-embedded), each transplanted drafter as a plain
  draft_model, and n-gram first + each transplanted drafter as our DraftProposer in vLLM's worker.

Every answer is compared with its engine's own plain answers. tok/s are noisy on a shared 2-core
machine: compare ratios within one run, and repeat.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_side_by_side import LogProgress, identical, log, summary  # noqa: E402

from vocabbridge.bench import BenchSettings, load_prompts, select_prompts, write_outputs  # noqa: E402
from vocabbridge.bench.protocol import finish  # noqa: E402
from vocabbridge.launcher import DrafterChoice, LaunchSettings, bench_launched  # noqa: E402
from vocabbridge.presets import resolve_model  # noqa: E402
from vocabbridge.spec import EngineSpec  # noqa: E402


def _pair(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not Path(path).is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: give NAME=FOLDER (a transplanted drafter folder)")
    return name, path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b", help="the same-family drafter")
    ap.add_argument("--small", default="smollm2-135m", help="the drafter with another vocabulary (before its transplant)")
    ap.add_argument("--transplanted", type=_pair, action="append", default=[], metavar="NAME=FOLDER")
    ap.add_argument("--engines", default="int8,llama.cpp,vllm", help="of int8, q4 (our q4 target), llama.cpp, vllm")
    ap.add_argument(
        "--drafter-dtypes",
        default="auto",
        help="the model drafters' --drafter-dtype on our torch and q4 targets, comma-separated to compare them "
        "(int8,q4: each model drafter's name then ends in @int8 / @q4)",
    )
    ap.add_argument("--categories", default="korean_chat,english_chat,code_review,code_generation")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--min-confidence", type=float, default=0.3)
    ap.add_argument("--vllm-args", default="--max-model-len 8192", help="extra `vllm serve` arguments (one string)")
    ap.add_argument("--vllm-dtype", default="auto", help="vLLM's dtype (auto: bf16 on its CPU build)")
    ap.add_argument("--vllm-transplanted", help="comma-separated NAMEs served in vLLM (default: all)")
    ap.add_argument("--only", help="comma-separated configuration names to run (a partial rerun)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    out = open(args.out / "run.log", "a", encoding="utf-8")
    prompts = select_prompts(load_prompts(), categories=args.categories.split(","))
    settings = BenchSettings(max_tokens=args.max_tokens, repeats=1, temperature=0, concurrency=())
    only = set(args.only.split(",")) if args.only else None
    progress = LogProgress(out)
    base = EngineSpec(target=args.target, num_speculative_tokens=args.k, min_confidence=args.min_confidence, cost_aware=False)
    s, d, tp = args.small, args.draft, args.transplanted
    engines = args.engines.split(",")
    plan = []
    dtypes = args.drafter_dtypes.split(",")

    def at(name: str, dd: str) -> str:  # a model drafter's name, its dtype marked where several are compared
        return f"{name}@{dd}" if len(dtypes) > 1 else name

    for torch_engine, kernels in (("int8", "torch"), ("q4", "q4")):
        if torch_engine not in engines:
            continue
        e = f"emb-{torch_engine}"
        for i, dd in enumerate(dtypes):
            models = [
                DrafterChoice(at(f"{e}:{d}", dd), d),
                DrafterChoice(at(f"{e}:{s}:tli", dd), s, "tli"),
                DrafterChoice(at(f"{e}:{s}:bridged", dd), s, "bridged"),
                DrafterChoice(at(f"{e}:{s}:text", dd), s, "text"),
                DrafterChoice(at(f"{e}:{s}:ngram+text", dd), s, "text", True),
                *[DrafterChoice(at(f"{e}:transplant-{n}", dd), p, "draft") for n, p in tp],
            ]
            if tp:
                models.append(DrafterChoice(at(f"{e}:ngram+transplant-{tp[-1][0]}", dd), tp[-1][1], "draft", True))
            plain = [DrafterChoice(f"{e}:none", "none"), DrafterChoice(f"{e}:ngram", "ngram")] if i == 0 else []
            spec = base.replace(dtype="int8" if kernels == "torch" else "auto", kernels=kernels, drafter_dtype=dd)
            plan.append((LaunchSettings(spec, backend="embedded", launch="inprocess"), plain + models))
    if "llama.cpp" in engines:
        e = "emb-llama.cpp"
        with_gguf = [(n, p) for n, p in tp if any(Path(p).glob("*.gguf"))]
        choices = [
            DrafterChoice(f"{e}:none", "none"),
            DrafterChoice(f"{e}:ngram", "ngram"),
            DrafterChoice(f"{e}:{d}", d),
            DrafterChoice(f"{e}:{s}:ngram+text", s, "text", True),
            *[DrafterChoice(f"{e}:transplant-{n}", p, "draft") for n, p in with_gguf],
        ]
        if with_gguf:
            choices.append(DrafterChoice(f"{e}:ngram+transplant-{with_gguf[-1][0]}", with_gguf[-1][1], "draft", True))
        plan.append((LaunchSettings(base.replace(kernels="llama.cpp"), backend="embedded", launch="inprocess"), choices))
    if "vllm" in engines:
        vl = "vllm"
        extra = ("--", *shlex.split(args.vllm_args)) if args.vllm_args else ()
        keep = set(args.vllm_transplanted.split(",")) if args.vllm_transplanted else {n for n, _ in tp}

        def vllm_settings(min_confidence: float) -> LaunchSettings:
            spec = base.replace(dtype=args.vllm_dtype, min_confidence=min_confidence)
            return LaunchSettings(spec, backend="vllm", launch="subprocess", startup_timeout=1800, serve_args=extra)

        # vLLM's own methods with no confidence gate (a gate makes a same-vocabulary drafter our proposer)
        plan.append(
            (
                vllm_settings(0.0),
                [
                    DrafterChoice(f"{vl}:none", "none"),
                    DrafterChoice(f"{vl}:ngram", "ngram"),
                    DrafterChoice(f"{vl}:{s}:tli", s, "tli"),
                    *[DrafterChoice(f"{vl}:transplant-{n}", p, "draft") for n, p in tp if n in keep],
                ],
            )
        )
        # our DraftProposer in vLLM's worker: n-gram first, the gate, the row-int8 drafter
        plan.append(
            (
                vllm_settings(args.min_confidence),
                [DrafterChoice(f"{vl}:ngram+transplant-{n}", p, "draft", True) for n, p in tp if n in keep],
            )
        )
    configs = []
    log(
        f"transplant bench: target {args.target} ({resolve_model(args.target)}), {len(prompts)} prompts, {args.max_tokens} tokens, k={args.k}",
        out,
    )
    t0 = time.time()
    for ls, choices in plan:
        choices = [c for c in choices if only is None or c.name in only]
        if choices:
            configs += bench_launched(choices, ls, prompts, settings, progress=progress).configs
    baseline = next((c.name for c in configs if c.name.endswith(":none") and not c.error), None)
    result = finish(
        configs,
        prompts,
        dataclasses.replace(settings, baseline=baseline),
        notes=[
            "engines: emb-int8 = our engine on the batch-invariant int8 target (torch), emb-q4 = on our q4 target, "
            f"model drafters with --drafter-dtype {args.drafter_dtypes}; emb-llama.cpp = our engine on "
            "llama.cpp's kernels (the GGUF files as they are; a transplanted drafter as its GGUF), vllm = vLLM's CPU build "
            f"(dtype {args.vllm_dtype}; serve args {args.vllm_args!r}); transplant-NAME = a transplanted SmolLM2 folder in draft "
            "mode (vLLM: a plain draft_model, no use_heterogeneous_vocab)",
            "transplanted drafters: " + ", ".join(f"{n} = {p}" for n, p in tp),
        ],
    )
    command = "VOCABBRIDGE_MODELS=... python benchmarks/bench_transplant.py " + shlex.join(sys.argv[1:])
    write_outputs(result, args.out, command=command)
    engine_none = {c.name.split(":")[0]: c for c in configs if c.name.split(":", 1)[1] == "none" and not c.error}
    table = summary(configs, engine_none, identical(configs, engine_none), ())
    (args.out / "side_by_side.md").write_text(
        f"# Transplanted drafters, side by side\n\n`{command}`\n\n{table}\n", encoding="utf-8"
    )
    log(f"\n{table}\n({(time.time() - t0) / 60:.0f} min)", out)


if __name__ == "__main__":
    main()
