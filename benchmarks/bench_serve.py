"""Benchmark: what serving concurrent clients costs. The embedded server (real uvicorn on
loopback, in this process) answers the same requests at 1, 4 and 8 concurrent clients; the peer is
the same requests one after another through the engine alone (no HTTP, no scheduling).

    python benchmarks/bench_serve.py                                   # defaults below
    python benchmarks/bench_serve.py --target /path/model.gguf --drafter none --max-tokens 64 --concurrency 1 2 4 8

Defaults: target /work/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf (or $VOCABBRIDGE_MODELS), drafter ngram
(k=4), 8 distinct chat prompts, 32 output tokens each (ignore_eos, so every request makes exactly 32),
greedy, CPU. Every level sends all 8 requests, streamed, with at most C in flight.

Per level: wall time, aggregate output tokens/s, its ratio to the sequential peer, per-request
latency (mean / max), time to first token (mean / max) seen by the client, mean acceptance length
from /metrics, and whether every answer is token-identical to the peer's (greedy decoding is
deterministic, so interleaving requests must not change a single token).

The server round-robins engine steps across active requests (no batching), so the expected cost of
concurrency is per-request latency growing with the number of clients while the aggregate tokens/s
stays near sequential; the ratio measures the overhead (HTTP, SSE, the engine thread hand-off).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODELS = Path(os.environ.get("VOCABBRIDGE_MODELS", "/work/models"))
DEFAULT_TARGET = str(MODELS / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")

PROMPTS = [
    "Write a Python function that merges two sorted lists.",
    "Explain what a KV cache is in transformer inference, in two sentences.",
    "Write a binary search in Python with type hints.",
    "오늘 저녁 메뉴로 간단한 한식 요리를 추천해 주세요.",
    "Refactor: def f(x):\n    if x == 0:\n        return None\n    else:\n        return x + 1",
    "Write a SQL query that counts orders per customer.",
    "What does the Python `with` statement do? Answer briefly.",
    "Write a bash one-liner that finds the 5 largest files in a folder.",
]


def run_level(url: str, model: str, requests: list[dict], concurrency: int) -> dict:
    """Send every request, at most ``concurrency`` at once; time each one as its client sees it."""
    import httpx

    pending = list(enumerate(requests))
    lock = threading.Lock()
    results: dict[int, dict] = {}

    def client():
        with httpx.Client(base_url=url, timeout=600) as c:
            while True:
                with lock:
                    if not pending:
                        return
                    i, body = pending.pop(0)
                t0 = time.perf_counter()
                ttft, ids = None, []
                with c.stream("POST", "/v1/chat/completions", json=body | {"model": model}) as r:
                    r.raise_for_status()
                    for line in r.iter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        choice = json.loads(line[6:])["choices"][0]
                        if choice.get("token_ids"):
                            ttft = ttft or time.perf_counter() - t0
                            ids += choice["token_ids"]
                results[i] = {"latency": time.perf_counter() - t0, "ttft": ttft, "tokens": ids}

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t0
    return {"wall": wall, "results": [results[i] for i in range(len(requests))]}


def scrape(url: str) -> dict[str, float]:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text):
        for s in fam.samples:
            if "position" not in s.labels and "finished_reason" not in s.labels:
                out[s.name] = s.value
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=DEFAULT_TARGET)
    ap.add_argument("--drafter", default="ngram")
    ap.add_argument("-k", "--num-speculative-tokens", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    ap.add_argument("--json", type=Path, help="Also write the figures as JSON here.")
    args = ap.parse_args()
    if not Path(args.target).exists() and "/" in args.target and args.target.startswith(("/", ".")):
        print(f"missing {args.target}: run ../shared/tools/fetch-models.sh or pass --target", file=sys.stderr)
        return 2
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import warnings

    warnings.filterwarnings("ignore")
    from vocabbridge.chat import chat_prompt_ids
    from vocabbridge.engine import SamplingParams, SpecStats
    from vocabbridge.engine.factory import EngineSpec, build_engine
    from vocabbridge.server import serve_in_thread

    t0 = time.perf_counter()
    built = build_engine(EngineSpec(target=args.target, drafter=args.drafter, num_speculative_tokens=args.num_speculative_tokens))
    print(f"loaded {Path(args.target).name} + {built.mode} drafter in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    n = max(args.concurrency)
    prompts = (PROMPTS * (n // len(PROMPTS) + 1))[:n]
    params = SamplingParams(max_new_tokens=args.max_tokens, ignore_eos=True)
    messages = [[{"role": "user", "content": p}] for p in prompts]
    ids = [chat_prompt_ids(built.target.view, m) for m in messages]
    # The peer: the same requests one after another through the engine alone. It runs in its own
    # thread, as the server's engine does: on a CPU shared with other processes, torch's OpenMP
    # pool of the main thread was measured 2-5x slower than a fresh thread's (an idle 16-core
    # machine shows no difference), and the comparison must not credit the server with that.
    seq: list[dict] = []

    def peer():
        built.engine.generate(ids[0], SamplingParams(max_new_tokens=4))  # warm-up (oneDNN, tokenizer backend)
        t0 = time.perf_counter()
        for p in ids:
            t1 = time.perf_counter()
            r = built.engine.generate(p, params)
            seq.append({"latency": time.perf_counter() - t1, "ttft": r.stats.ttft, "tokens": r.tokens, "stats": r.stats})
        seq.append({"wall": time.perf_counter() - t0})

    th = threading.Thread(target=peer)
    th.start()
    th.join()
    seq_wall = seq.pop()["wall"]
    stats = SpecStats()
    for s in seq:
        stats = stats.merge(s["stats"])
    rows = [
        {
            "level": "sequential, engine alone (peer)",
            "concurrency": 1,
            "wall": seq_wall,
            "results": seq,
            "mean_acceptance_length": stats.mean_acceptance_length,
            "identical": True,
        }
    ]

    bodies = [
        {
            "messages": m,
            "max_tokens": args.max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "return_token_ids": True,
        }
        for m in messages
    ]
    with serve_in_thread(built, max_num_seqs=n) as srv:
        for c in args.concurrency:
            before = scrape(srv.url)
            level = run_level(srv.url, srv.model_name, bodies, c)
            after = scrape(srv.url)
            d = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            drafts = d.get("vllm:spec_decode_num_drafts_total", 0)
            mal = 1 + d["vllm:spec_decode_num_accepted_tokens_total"] / drafts if drafts else float("nan")
            same = all(r["tokens"] == s["tokens"] for r, s in zip(level["results"], seq))
            rows.append(
                {
                    "level": f"server, {c} concurrent client{'s' if c > 1 else ''}",
                    "concurrency": c,
                    **level,
                    "mean_acceptance_length": mal,
                    "identical": same,
                }
            )

    total = sum(len(r["tokens"]) for r in seq)
    print(
        f"\n{Path(args.target).name}, drafter {built.mode} (k={built.engine.k}), {n} requests × {args.max_tokens} tokens, "
        f"greedy, {os.cpu_count()} CPU cores (shared: figures are approximate)\n"
    )
    head = f"{'':34} {'wall s':>7} {'tok/s':>7} {'× seq':>6} {'lat mean':>9} {'lat max':>8} {'ttft mean':>9} {'ttft max':>8} {'MAL':>5}  same tokens"
    print(head)
    out = []
    for r in rows:
        lat = [x["latency"] for x in r["results"]]
        ttft = [x["ttft"] for x in r["results"]]
        tps = total / r["wall"]
        ratio = seq_wall / r["wall"]
        print(
            f"{r['level']:34} {r['wall']:7.1f} {tps:7.2f} {ratio:6.2f} {statistics.mean(lat):9.2f} {max(lat):8.2f} "
            f"{statistics.mean(ttft):9.2f} {max(ttft):8.2f} {r['mean_acceptance_length']:5.2f}  {'yes' if r['identical'] else 'NO'}"
        )
        out.append(
            {
                "level": r["level"],
                "concurrency": r["concurrency"],
                "wall_s": r["wall"],
                "tokens_per_s": tps,
                "ratio_to_sequential": ratio,
                "latency_mean_s": statistics.mean(lat),
                "latency_max_s": max(lat),
                "ttft_mean_s": statistics.mean(ttft),
                "ttft_max_s": max(ttft),
                "mean_acceptance_length": r["mean_acceptance_length"],
                "identical_to_sequential": r["identical"],
            }
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "target": args.target,
                    "drafter": built.mode,
                    "k": built.engine.k,
                    "requests": n,
                    "max_tokens": args.max_tokens,
                    "levels": out,
                },
                indent=2,
            )
        )
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
