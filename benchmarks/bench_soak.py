"""Soak and fairness of the embedded server with a real model.

Two parts, one run:

1. **Fairness** (``--ttft``): time to first token of a short request on an idle server, then while a
   long prompt (``--long-tokens``, 20,000 by default) is being prefilled; the peer is the same
   server with chunking off (``--prefill-chunk`` larger than the prompt), where the short request
   waits for the whole prefill. Target: short TTFT under load ≤ 2 × idle TTFT + one chunk's time.
2. **Soak** (``--minutes``): ``--clients`` client threads for the given minutes, each sending a mix of
   short chats, long prompts (``--soak-long-tokens``, 10,000) and requests whose client disconnects
   mid-stream. Checked: every request not disconnected succeeds (nothing failed or lost), the
   server's counters stay consistent (accepted ≤ draft tokens, per-position sums = accepted,
   request_success = answered + aborted), and the process's resident memory stays flat.

    OUT=benchmarks/results/$(date +%F)-soak && mkdir -p $OUT
    VOCABBRIDGE_MODELS=/work/models python benchmarks/bench_soak.py --log $OUT/run.log --json $OUT/results.json

Defaults: target Qwen2.5-Coder-0.5B-Instruct (32k context, so a 20k-token prompt fits), n-gram
drafter (k = 4), greedy, the server in this process on loopback (real uvicorn, real HTTP).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vocabbridge.bench.counters import parse_counters  # noqa: E402
from vocabbridge.engine.factory import build_engine  # noqa: E402
from vocabbridge.prompts import load_prompts  # noqa: E402
from vocabbridge.server import serve_in_thread  # noqa: E402
from vocabbridge.spec import EngineSpec  # noqa: E402

MODELS = Path(os.environ.get("VOCABBRIDGE_MODELS", "/work/models"))
SHORT = [
    "Write a Python function that merges two sorted lists.",
    "오늘 저녁 메뉴로 간단한 한식 요리를 추천해 주세요.",
    "What does the Python `with` statement do? Answer briefly.",
    "Write a bash one-liner that finds the 5 largest files in a folder.",
]


def log(msg: str, out) -> None:
    line = f"[{time.strftime('%H:%M:%S')}] {msg}"
    print(line, flush=True)
    if out:
        out.write(line + "\n")
        out.flush()


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def long_text(view, tokens: int) -> str:
    """A document of about ``tokens`` tokens: the suite's design document, repeated as needed."""
    doc = next(p for p in load_prompts() if p.id == "doc-summary").messages[0]["content"]
    ids: list[int] = []
    while len(ids) < tokens:
        ids += view.encode(doc)
    return view.decode_bytes(ids[:tokens]).decode("utf-8", errors="ignore")


def stream_chat(c: httpx.Client, content: str, max_tokens: int, *, disconnect_after: int | None = None) -> dict:
    """One streamed chat; ``disconnect_after``: close the connection after that many chunks."""
    body = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    out = {"ttft": None, "chunks": 0, "finish": None, "tokens": None, "error": None}
    try:
        with c.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                out["error"] = f"HTTP {r.status_code}: {r.read()[:200]!r}"
                return out
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                obj = json.loads(line[6:])
                if "error" in obj:
                    out["error"] = obj["error"]["message"]
                    break
                for ch in obj.get("choices", []):
                    if ch.get("delta", {}).get("content") and out["ttft"] is None:
                        out["ttft"] = time.perf_counter() - t0
                    out["finish"] = ch.get("finish_reason") or out["finish"]
                if obj.get("usage"):
                    out["tokens"] = obj["usage"]["completion_tokens"]
                out["chunks"] += 1
                if disconnect_after is not None and out["chunks"] >= disconnect_after:
                    break  # leaving the with-block closes the connection mid-stream
    except httpx.HTTPError as e:
        out["error"] = f"{type(e).__name__}: {e}"
    out["total"] = time.perf_counter() - t0
    return out


def fairness(url: str, view, long_tokens: int, out) -> dict:
    """Short-request TTFT idle, and while a long prompt prefills (three probes spread over it)."""
    res: dict = {}
    with httpx.Client(base_url=url, timeout=3600) as c:
        idle = [stream_chat(c, SHORT[i % 4], 4)["ttft"] for i in range(3)]
        res["idle_ttft"] = statistics.median(idle)
        log(f"  idle short-request TTFT: {', '.join(f'{t:.2f}' for t in idle)} s (median {res['idle_ttft']:.2f})", out)
        text = long_text(view, long_tokens)
        holder: dict = {}
        t_long = time.perf_counter()
        th = threading.Thread(target=lambda: holder.update(stream_chat(httpx.Client(base_url=url, timeout=7200), text, 4)))
        th.start()
        probes = []
        time.sleep(3.0)
        while th.is_alive() and len(probes) < 3:
            r = stream_chat(c, SHORT[len(probes) % 4], 4)
            probes.append(r["ttft"])
            log(
                f"  short-request TTFT during the long prefill: {r['ttft']:.2f} s (t = {time.perf_counter() - t_long:.0f} s)", out
            )
            time.sleep(5.0)
        th.join()
        res["long_ttft"] = holder.get("ttft")
        res["busy_ttft"] = probes
        log(f"  long request ({long_tokens:,} prompt tokens): TTFT {res['long_ttft']:.1f} s", out)
    return res


def soak(url: str, view, minutes: float, clients: int, soak_long: int, out, seed: int = 0) -> dict:
    deadline = time.perf_counter() + minutes * 60
    long_doc = long_text(view, soak_long)
    results: list[dict] = []
    lock = threading.Lock()
    mem: list[tuple[float, float]] = []

    def client(i: int):
        r = random.Random(seed * 100 + i)
        with httpx.Client(base_url=url, timeout=3600) as c:
            while time.perf_counter() < deadline:
                kind = r.choices(["short", "long", "disconnect"], weights=[6, 1, 2])[0]
                if kind == "short":
                    res = stream_chat(c, r.choice(SHORT), r.randint(8, 32))
                elif kind == "long":
                    res = stream_chat(c, long_doc, 8)
                else:
                    res = stream_chat(c, r.choice(SHORT), 64, disconnect_after=r.randint(1, 4))
                res["kind"] = kind
                with lock:
                    results.append(res)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        mem.append((time.perf_counter() - t0, rss_mib()))
        with lock:
            n = len(results)
        log(f"  soak t={mem[-1][0]:5.0f} s: {n} requests done, RSS {mem[-1][1]:,.0f} MiB", out)
        for t in threads:
            t.join(timeout=30)
    return {"results": results, "memory": mem, "seconds": time.perf_counter() - t0}


def check_counters(url: str) -> dict:
    page = httpx.get(url + "/metrics", timeout=30).text
    c = parse_counters(page)
    per_pos = sum(c.accepted_per_pos.values()) if c.accepted_per_pos else 0
    success = {}
    for line in page.splitlines():
        if line.startswith("vllm:request_success_total{"):
            reason = line.split('finished_reason="')[1].split('"')[0]
            success[reason] = float(line.rsplit(" ", 1)[1])
    v = c.values
    return {
        "drafts": v.get("drafts") or 0,
        "draft_tokens": v.get("draft_tokens") or 0,
        "accepted": v.get("accepted") or 0,
        "per_pos_sum": per_pos,
        "success": success,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=str(MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
    ap.add_argument("--drafter", default="ngram")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--long-tokens", type=int, default=20_000, help="fairness: the long prompt")
    ap.add_argument("--soak-long-tokens", type=int, default=10_000, help="soak: the long prompts")
    ap.add_argument("--prefill-chunk", type=int, default=256)
    ap.add_argument("--skip-ttft", action="store_true")
    ap.add_argument("--skip-soak", action="store_true")
    ap.add_argument("--log", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    out = open(args.log, "w", encoding="utf-8") if args.log else None
    log(f"bench_soak: target {args.target}, drafter {args.drafter}, prefill chunk {args.prefill_chunk}", out)
    report: dict = {"args": {k: str(v) for k, v in vars(args).items()}}
    loaded: dict = {}
    spec = EngineSpec(target=args.target, drafter=args.drafter, prefill_chunk=args.prefill_chunk)
    built = build_engine(spec, loaded=loaded)
    view = built.target.view
    if not args.skip_ttft:
        for label, chunk in (("chunked", args.prefill_chunk), ("unchunked peer", 10**9)):
            b = build_engine(spec.replace(prefill_chunk=chunk), loaded=loaded)
            log(f"fairness, {label} (prefill chunk {chunk if chunk < 10**9 else 'off'}):", out)
            with serve_in_thread(b, max_num_seqs=8) as srv:
                r = fairness(srv.url, view, args.long_tokens, out)
            r["prefill_chunk"] = chunk
            report[f"fairness_{label.split()[0]}"] = r
        ch = report["fairness_chunked"]
        chunk_s = ch["long_ttft"] / max(1, -(-args.long_tokens // args.prefill_chunk))  # mean time of one chunk
        bound = 2 * ch["idle_ttft"] + chunk_s
        worst = max(t for t in ch["busy_ttft"] if t is not None) if ch["busy_ttft"] else float("nan")
        report["fairness_verdict"] = {
            "mean_chunk_s": chunk_s,
            "bound_s": bound,
            "worst_busy_ttft_s": worst,
            "met": worst <= bound,
        }
        log(
            f"fairness: worst short TTFT during a {args.long_tokens:,}-token prefill {worst:.2f} s; bound 2 × idle "
            f"{ch['idle_ttft']:.2f} + one chunk {chunk_s:.2f} = {bound:.2f} s: {'met' if worst <= bound else 'NOT met'}; "
            f"unchunked peer: {', '.join(f'{t:.1f}' for t in report['fairness_unchunked']['busy_ttft'])} s",
            out,
        )
    if not args.skip_soak:
        log(f"soak: {args.clients} clients for {args.minutes:g} minutes", out)
        with serve_in_thread(built, max_num_seqs=8) as srv:
            s = soak(srv.url, view, args.minutes, args.clients, args.soak_long_tokens, out)
            counters = check_counters(srv.url)
        res = s["results"]
        by = {k: [r for r in res if r["kind"] == k] for k in ("short", "long", "disconnect")}
        failed = [r for r in res if r["kind"] != "disconnect" and (r["error"] or not r["finish"])]
        answered = len([r for r in res if r["kind"] != "disconnect" and not r["error"]])
        mem = [m for _, m in s["memory"]]
        warm = mem[len(mem) // 4 :] or mem
        consistent = (
            counters["accepted"] <= counters["draft_tokens"]
            and counters["per_pos_sum"] == counters["accepted"]
            and sum(v for k, v in counters["success"].items() if k in ("stop", "length")) == answered
        )
        report["soak"] = {
            "requests": {k: len(v) for k, v in by.items()},
            "failed_or_lost": len(failed),
            "failures": [r["error"] for r in failed][:10],
            "counters": counters,
            "counters_consistent": consistent,
            "rss_mib": {"first": mem[0], "after_warmup_min": min(warm), "after_warmup_max": max(warm), "last": mem[-1]},
            "seconds": s["seconds"],
        }
        log(
            f"soak: {len(res)} requests ({', '.join(f'{k} {len(v)}' for k, v in by.items())}); failed or lost among the "
            f"not-disconnected: {len(failed)}; counters consistent: {consistent} ({counters}); RSS MiB first "
            f"{mem[0]:,.0f}, after warm-up {min(warm):,.0f}–{max(warm):,.0f}, last {mem[-1]:,.0f}",
            out,
        )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
    if out:
        out.close()


if __name__ == "__main__":
    main()
