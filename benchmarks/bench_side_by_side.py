"""Three engines on the same hardware, the same prompts and the same GGUF checkpoints: our embedded
engine, vLLM (its CPU build here) and llama.cpp (llama-cpp-python's OpenAI server), each with the
drafters it has, measured by `vocabbridge bench` (the same client, protocol and /metrics reading).

    VOCABBRIDGE_MODELS=/work/models python benchmarks/bench_side_by_side.py \\
        --out benchmarks/results/2026-11-30-vllm-vs-embedded --llama-python /work/llama-venv/bin/python

Configurations (k = 4 everywhere; --min-confidence applies to vocabbridge's model drafters):
- embedded: none, ngram, suffix decoding, the 0.5B same-family drafter, SmolLM2-135M as tli (vLLM's heterogeneous
  path reproduced), bridged, text, and n-gram first + text;
- vLLM: none, ngram, the 0.5B drafter, SmolLM2-135M through its own heterogeneous path (tli), the
  same with our map (the plugin), and our text and bridged proposers;
- llama.cpp: plain and prompt-lookup decoding (llama.cpp refuses a drafter of another vocabulary).

Every engine decodes greedily; each configuration's answers are compared with its own engine's
plain answers (identical text = the drafter changed nothing). The run writes results.json, report.md
and the bench PNGs, plus side_by_side.md (the summary table) and run.log, to --out.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vocabbridge.bench import BenchSettings, Endpoint, bench_endpoint, load_prompts, select_prompts, write_outputs  # noqa: E402
from vocabbridge.bench.protocol import finish  # noqa: E402
from vocabbridge.launcher import DrafterChoice, LaunchSettings, bench_launched, free_port, stop_process  # noqa: E402
from vocabbridge.presets import resolve_model  # noqa: E402
from vocabbridge.report import fmt_float, fmt_pct  # noqa: E402
from vocabbridge.spec import EngineSpec  # noqa: E402

MAP = ROOT / "maps" / "smollm2_to_qwen2.5.json"
DTYPE_TAGS = {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}  # in configuration names: emb-bf16:none, emb-int8:ngram


def log(msg: str, out) -> None:
    line = f"[{time.strftime('%H:%M:%S')}] {msg}"
    print(line, flush=True)
    out.write(line + "\n")
    out.flush()


class LogProgress:
    def __init__(self, out):
        self.out = out
        self.config = ""

    def config_started(self, name, total):
        self.config = name
        log(f"{name}: {total} requests", self.out)

    def request_started(self, label):
        pass

    def request_done(self, r):
        c = r.completion
        what = f"{r.output_tokens} tok, TTFT {c.ttft or 0:.2f} s, {c.total_time:.1f} s" if r.ok else f"FAILED {c.error}"
        log(f"  {self.config} {r.phase} {r.prompt_id} (c={r.concurrency}): {what}", self.out)

    def config_done(self, result):
        o = result.overall
        log(f"{self.config}: {fmt_float(o.decode_tokens_per_second)} tok/s, acceptance {fmt_pct(o.acceptance_rate)}", self.out)

    def message(self, text):
        log(text, self.out)


@contextlib.contextmanager
def llama_server(python: str, gguf: str, *, threads: int, ctx: int, lookup: int | None, out):
    port = free_port()
    argv = [
        python,
        "-m",
        "llama_cpp.server",
        "--model",
        gguf,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_threads",
        str(threads),
        "--n_threads_batch",
        str(threads),
        "--n_ctx",
        str(ctx),
        "--model_alias",
        "llama",
        "--interrupt_requests",
        "False",  # queue concurrent requests (by default a new request cuts the running one off)
    ]
    if lookup:
        argv += ["--draft_model", "prompt-lookup-decoding", "--draft_model_num_pred_tokens", str(lookup)]
    logf = open(out.name + f".llama-{port}.log", "w")
    proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
    import httpx

    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited with {proc.returncode}; see {logf.name}")
            time.sleep(0.5)
        yield url, argv
    finally:
        stop_process(proc)
        logf.close()


def own_plain(c, engine_none):
    """The plain run of ``c``'s engine variant (a +cost variant's is its variant's own)."""
    return engine_none.get(c.name.split(":", 1)[0].removesuffix("+cost"))


def identical(configs, engine_none) -> dict[str, str]:
    """Per configuration: how many measured answers are the same text as its engine's plain ones."""
    out = {}
    for c in configs:
        base = own_plain(c, engine_none)
        if base is None or c.error:
            continue
        ref = {(r.prompt_id, r.repeat): r.completion.text for r in base.requests if r.ok}
        pairs = [(r.completion.text, ref.get((r.prompt_id, r.repeat))) for r in c.requests if r.ok]
        same = sum(a == b for a, b in pairs if b is not None)
        out[c.name] = f"{same}/{len(pairs)}"
    return out


def summary(configs, engine_none, ident, levels) -> str:
    rows = [
        "| engine:configuration | decode tok/s | × its plain | × llama.cpp plain | acceptance | per position | mean acc. length "
        "| target fwds / token | TTFT s | same answers as its plain |" + "".join(f" agg. tok/s c={c} |" for c in levels),
        "| " + " | ".join(["---"] * (10 + len(levels))) + " |",
    ]
    llama = next((c for c in configs if c.name == "llama:plain" and not c.error), None)
    for c in configs:
        if c.error:
            rows.append(f"| {c.name} | failed: {c.error.splitlines()[0][:80]} |" + " |" * (8 + len(levels)))
            continue
        o = c.overall
        base = own_plain(c, engine_none)
        own = o.decode_tokens_per_second / base.overall.decode_tokens_per_second if base and o.decode_tokens_per_second else None
        vs = o.decode_tokens_per_second / llama.overall.decode_tokens_per_second if llama and o.decode_tokens_per_second else None
        pos = " / ".join(f"{100 * p:.0f}" for p in o.per_position_acceptance) or "—"
        conc = {w.concurrency: w.aggregate_tokens_per_second for w in c.concurrency}
        rows.append(
            f"| {c.name} | {fmt_float(o.decode_tokens_per_second)} | {fmt_float(own)} | {fmt_float(vs)} | {fmt_pct(o.acceptance_rate)} "
            f"| {pos} | {fmt_float(o.mean_acceptance_length)} | {fmt_float(o.forwards_per_token)} | {fmt_float(o.ttft)} "
            f"| {ident.get(c.name, '—')} |" + "".join(f" {fmt_float(conc.get(lv))} |" for lv in levels)
        )
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b", help="the same-family drafter")
    ap.add_argument("--small", default="smollm2-135m", help="the drafter with another vocabulary")
    ap.add_argument("--engines", default="embedded,vllm,llama")
    ap.add_argument("--categories", default="korean_chat,english_chat,code_review,code_generation")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("-k", type=int, default=4)
    ap.add_argument("--min-confidence", type=float, default=0.3)
    ap.add_argument("--vllm-args", default="--max-model-len 8192", help="extra `vllm serve` arguments (one string)")
    ap.add_argument("--vllm-dtype", default="auto", help="vLLM's dtype (auto: bf16 on its CPU build)")
    ap.add_argument(
        "--emb",
        "--emb-dtype",
        dest="emb",
        default="auto",
        help="the embedded engine's variants, comma-separated: a target dtype (auto = fp32 on a CPU; int8 = the "
        "batch-invariant int8 target), llama.cpp (the engine on llama.cpp's kernels) or q4 (on our own 4-bit kernel, "
        "--kernels q4); a +cost suffix (llama.cpp+cost) "
        "runs that variant with the cost-aware draft length",
    )
    ap.add_argument("--llama-python", help="a Python with llama-cpp-python[server] (its own venv)")
    ap.add_argument("--llama-threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--llama-lookup", type=int, default=10, help="prompt-lookup tokens (llama-cpp-python's default)")
    ap.add_argument("--only", help="comma-separated configuration names to run (for a partial rerun)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    out = open(args.out / "run.log", "a", encoding="utf-8")
    levels = tuple(int(x) for x in args.concurrency.split(",") if x)
    prompts = select_prompts(load_prompts(), categories=args.categories.split(","))
    engines = args.engines.split(",")
    settings = BenchSettings(max_tokens=args.max_tokens, repeats=1, temperature=0, concurrency=levels)
    only = set(args.only.split(",")) if args.only else None
    progress = LogProgress(out)
    base = EngineSpec(target=args.target, num_speculative_tokens=args.k, min_confidence=args.min_confidence)
    s, d = args.small, args.draft
    plan = []
    variants = [(v.removesuffix("+cost"), v.endswith("+cost")) for v in args.emb.split(",")]  # "X+cost": cost-aware
    tags = [("emb" if x == "auto" else f"emb-{DTYPE_TAGS.get(x, x)}") + ("+cost" if cost else "") for x, cost in variants]
    e = tags[0]
    vl = "vllm" if args.vllm_dtype == "auto" else f"vllm-{DTYPE_TAGS.get(args.vllm_dtype, args.vllm_dtype)}"
    for (x, cost), e in zip(variants if "embedded" in engines else [], tags):
        vspec = base.replace(kernels=x) if x in ("llama.cpp", "q4") else base.replace(dtype=x)
        vspec = vspec.replace(cost_aware=cost)
        emb = LaunchSettings(vspec, backend="embedded", launch="inprocess")
        plan.append(
            (
                emb,
                [
                    DrafterChoice(f"{e}:none", "none"),
                    DrafterChoice(f"{e}:ngram", "ngram"),
                    DrafterChoice(f"{e}:suffix", "suffix"),
                    DrafterChoice(f"{e}:{d}", d),
                    DrafterChoice(f"{e}:{s}:tli", s, "tli"),
                    DrafterChoice(f"{e}:{s}:bridged", s, "bridged"),
                    DrafterChoice(f"{e}:{s}:text", s, "text"),
                    DrafterChoice(f"{e}:{s}:ngram+text", s, "text", True),
                ],
            )
        )
    if "vllm" in engines:
        vspec = base.replace(dtype=args.vllm_dtype)
        extra = ("--", *shlex.split(args.vllm_args)) if args.vllm_args else ()
        v = LaunchSettings(vspec, backend="vllm", launch="subprocess", startup_timeout=1800, serve_args=extra)
        vm = LaunchSettings(
            vspec.replace(map_path=str(MAP)), backend="vllm", launch="subprocess", startup_timeout=1800, serve_args=extra
        )
        plan.append(
            (
                v,
                [
                    DrafterChoice(f"{vl}:none", "none"),
                    DrafterChoice(f"{vl}:ngram", "ngram"),
                    DrafterChoice(f"{vl}:{d}", d),
                    DrafterChoice(f"{vl}:{s}:tli", s, "tli"),
                    DrafterChoice(f"{vl}:{s}:text", s, "text"),
                ],
            )
        )
        plan.append((vm, [DrafterChoice(f"{vl}:{s}:tli+map", s, "tli"), DrafterChoice(f"{vl}:{s}:bridged", s, "bridged")]))
    baseline = next((f"{x}:none" for x in (*tags, vl) if args.only is None or f"{x}:none" in args.only), None)
    if "llama" in engines and args.llama_python:  # before the other engines' minutes, not after them
        check = subprocess.run([args.llama_python, "-c", "import llama_cpp.server.app"], capture_output=True, text=True)
        if check.returncode:
            sys.exit(
                f"--llama-python {args.llama_python} cannot start llama.cpp's server ({check.stderr.strip().splitlines()[-1]}); "
                "install it there: pip install 'llama-cpp-python[server]'"
            )
    configs = []
    log(
        f"side by side: target {args.target} ({resolve_model(args.target)}), {len(prompts)} prompts, {args.max_tokens} tokens, "
        f"concurrency {levels}, k={args.k}",
        out,
    )
    for ls, choices in plan:
        choices = [c for c in choices if only is None or c.name in only]
        if choices:
            res = bench_launched(choices, ls, prompts, settings, progress=progress)
            configs += res.configs
    if "llama" in engines and args.llama_python:
        gguf = resolve_model(args.target)
        for name, lookup in (("llama:plain", None), ("llama:prompt-lookup", args.llama_lookup)):
            if only is not None and name not in only:
                continue
            with llama_server(args.llama_python, gguf, threads=args.llama_threads, ctx=8192, lookup=lookup, out=out) as (
                url,
                argv,
            ):
                launch = {"engine": "llama.cpp", "command": argv[1:], "drafter": "prompt-lookup" if lookup else "none"}
                configs.append(bench_endpoint(Endpoint(name, url, launch), prompts, settings, progress=progress))
    previous = args.out / "results.json"
    if only is not None and previous.is_file():  # a partial rerun replaces only its configurations
        kept = [c["endpoint"]["name"] for c in json.loads(previous.read_text())["configs"]]
        log(f"partial rerun of {sorted(only)}; earlier results.json had {kept} (merge by hand if wanted)", out)
    result = finish(
        configs,
        prompts,
        dataclasses.replace(settings, baseline=baseline if any(c.name == baseline for c in configs) else None),
        notes=[
            f"engines: {', '.join(tags)} = vocabbridge's engine (target {args.emb}: auto is fp32, int8 the batch-invariant int8 "
            f"target, llama.cpp its llama.cpp kernels, q4 our 4-bit kernel; int8 drafters on torch), {vl} = vLLM's CPU build "
            f"(dtype {args.vllm_dtype}; serve args {args.vllm_args!r}), llama = llama-cpp-python's server on the GGUF file itself",
        ],
    )
    command = "VOCABBRIDGE_MODELS=... python benchmarks/bench_side_by_side.py " + shlex.join(sys.argv[1:])
    write_outputs(result, args.out, command=command)
    engine_none = {c.name.split(":")[0]: c for c in configs if c.name.split(":", 1)[1] in ("none", "plain") and not c.error}
    ident = identical(configs, engine_none)
    table = summary(configs, engine_none, ident, levels)
    (args.out / "side_by_side.md").write_text(f"# Side by side\n\n`{command}`\n\n{table}\n", encoding="utf-8")
    log("\n" + table, out)


if __name__ == "__main__":
    main()
