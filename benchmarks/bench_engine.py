"""Benchmark the embedded engine on real GGUF models against transformers' own generate().

    ../shared/tools/fetch-models.sh /path/to/models          # once: assemble the GGUF files
    VOCABBRIDGE_MODELS=/path/to/models python benchmarks/bench_engine.py [--max-new-tokens 128] [--json out.json]

Target Qwen2.5-Coder-1.5B-Instruct, CPU, greedy, five prompts (Korean chat, English chat, code
review, summary of a long input, code generation) × 128 new tokens. Our modes: plain, ngram,
draft (Qwen2.5-Coder-0.5B), bridged and text (SmolLM2-135M), and the n-gram-first hybrids of the
last two. The peers, timed in the same process: transformers generate() plain,
prompt_lookup_num_tokens, assistant_model=0.5B, and assistant_model=SmolLM2 with
tokenizer=/assistant_tokenizer= (universal assisted generation), twice:

- "stock" (×peer): the models as transformers loads them by default (fp32, dense nn.Linear,
  fp32 assistants) — what a transformers user runs, and what the issue's targets are against;
- "same" (×same): generate() on *our* loaded models (pre-packed fp32 target, int8 drafters), so
  the ratio isolates the decoding loop and the drafting policy from the weight handling.

Per mode: decode tokens/s (time after the first token), ratio to our plain, ratio to its
transformers peer, acceptance rate, accepted tokens per target forward, target forwards per 128
tokens, the ideal speedup given the measured acceptance and the measured forward costs, the
efficiency (measured / ideal), and whether every output is token-identical to plain.

Ideal speedup of a mode = (tokens per target forward) × c(target, 1 token) /
(mean c(target, verify forward of n+1 tokens) + drafter forwards per step × c(drafter, 1 token)),
with every c measured here by timing bare model forwards, so the efficiency is what the engine
loses to everything that is not a model forward (Python, re-tokenization, KV bookkeeping).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vocabbridge.chat import chat_prompt_ids  # noqa: E402
from vocabbridge.engine import (  # noqa: E402
    BridgedDrafter,
    DraftModelDrafter,
    NgramDrafter,
    SamplingParams,
    SpecEngine,
    TextDrafter,
    load_causal_lm,
)
from vocabbridge.engine.drafters import NgramFirstDrafter  # noqa: E402
from vocabbridge.engine.factory import load_drafter_lm  # noqa: E402
from vocabbridge.mapping import build_token_map  # noqa: E402
from vocabbridge.presets import resolve_model  # noqa: E402

TEXTS = ROOT / "vocabbridge" / "data" / "texts"


def prompts() -> dict[str, str]:
    return {
        "korean_chat": "요즘 잠이 잘 안 와요. 저녁에 할 수 있는 간단한 습관 몇 가지를 추천해 주시고, 각각 왜 도움이 되는지 설명해 주세요.",
        "english_chat": "I'm planning a weekend trip to the mountains with two friends. What should we pack, and how should we plan the days?",
        "code_review": "Please review this Python module. Point out bugs, risky error handling and style problems, "
        "and suggest concrete fixes.\n\n```python\n" + (TEXTS / "code.txt").read_text(encoding="utf-8") + "\n```",
        "summary": "Summarize the following story in one paragraph, then list its three main themes.\n\n"
        + (TEXTS / "english_prose.txt").read_text(encoding="utf-8"),
        "code_generation": "Write a Python class implementing an LRU cache with get and put in O(1), "
        "using a dict and a doubly linked list, with type hints and a short usage example.",
    }


@dataclass
class Run:
    mode: str
    per_prompt: dict[str, dict] = field(default_factory=dict)

    def total(self, key: str) -> float:
        return sum(r[key] for r in self.per_prompt.values())


def timed_forward(lm, n: int, ctx: int = 300, repeats: int = 5) -> float:
    """Median seconds of a bare n-token forward on top of a ctx-token cache."""
    s = lm.session()
    s.extend(list(range(1000, 1000 + ctx)))
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        s.extend(list(range(2000, 2000 + n)), keep=n)
        ts.append(time.perf_counter() - t)
        s.truncate(ctx)
    return statistics.median(ts)


def ours(engine: SpecEngine, run: Run, name: str, prompt: list[int], params: SamplingParams) -> None:
    r = engine.generate(prompt, params)
    s = r.stats
    run.per_prompt[name] = {
        "tokens": r.tokens,
        "generated": s.generated,
        "decode_time": s.time_total - s.ttft,
        "ttft": s.ttft,
        "drafts": s.drafts,
        "draft_tokens": s.draft_tokens,
        "accepted": s.accepted,
        "target_forwards": s.target_forwards,
        "drafter_forwards": s.drafter_forwards,
        "time_draft": s.time_draft,
        "time_verify": s.time_verify,
        "verify_sizes": s.verify_sizes,
    }
    acc = s.acceptance_rate if s.draft_tokens else float("nan")
    print(
        f"  {run.mode:13s} {name:16s} {s.generated:4d} tok  {(s.generated - 1) / max(s.time_total - s.ttft, 1e-9):6.2f} tok/s  acc {acc:.2f}",
        flush=True,
    )


class _FirstToken:
    """A transformers streamer that only notes when the first generated token arrives."""

    def __init__(self):
        self.calls, self.first = 0, None

    def put(self, value):
        self.calls += 1
        if self.calls == 2 and self.first is None:  # call 1 is the prompt
            self.first = time.perf_counter()

    def end(self):
        pass


def hf_tokenizer(view):
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=view.backend)
    for role in ("eos", "bos", "pad", "unk"):
        if role in view.roles:
            setattr(tok, f"{role}_token", (view.tokens[view.roles[role]] or b"").decode())
    return tok


def stock_models(srcs: dict[str, str]):
    """The three models as a transformers user loads them: from_pretrained with its defaults
    (fp32, dense nn.Linear). The weights are read from vocabbridge's dequantized copy of the GGUF
    files (identical tensors; it skips transformers' 40 s GGUF dequantization)."""
    from transformers import AutoModelForCausalLM

    from vocabbridge.engine.model import _converted_cache_dir

    out = []
    for name in ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2-135m"):
        folder = _converted_cache_dir(Path(srcs[name]), torch.float32)
        out.append(AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval())
    return out


def peer(target, model, run: Run, name: str, prompt: list[int], max_new: int, **kw) -> None:
    eos = [target.view.roles[r] for r in ("eos", "end_of_turn") if r in target.view.roles]
    streamer = _FirstToken()
    x = torch.tensor([prompt])
    t0 = time.perf_counter()
    out = model.generate(
        x,
        attention_mask=torch.ones_like(x),
        max_new_tokens=max_new,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=eos[0],
        streamer=streamer,
        **kw,
    )
    t1 = time.perf_counter()
    gen = out[0, len(prompt) :].tolist()
    first = streamer.first or t0
    run.per_prompt[name] = {"tokens": gen, "generated": len(gen), "decode_time": t1 - first, "ttft": first - t0}
    print(f"  {run.mode:13s} {name:16s} {len(gen):4d} tok  {(len(gen) - 1) / max(t1 - first, 1e-9):6.2f} tok/s", flush=True)


def ttft_experiment(target, drafter_lm, drafter, tokens: int = 2000) -> dict:
    """Time to first token on a ~``tokens``-token prompt, without and with a drafter, and what
    the drafter's prefill costs when it computes logits for the last position only (ours) vs
    for every prompt position (what a naive prefill does)."""
    text = "\n\n".join(
        (TEXTS / f).read_text(encoding="utf-8")
        for f in ("code.txt", "english_prose.txt", "english_chat.txt", "korean_prose.txt", "korean_chat.txt")
    )
    ids = target.view.encode(text)[:tokens]
    one = SamplingParams(max_new_tokens=2)
    out = {"prompt_tokens": len(ids)}
    r = SpecEngine(target).generate(ids, one)
    out["ttft_plain"] = r.stats.ttft
    r = SpecEngine(target, drafter, num_speculative_tokens=4).generate(ids, one)
    out["ttft_with_drafter"] = r.stats.ttft
    out["second_token_with_drafter"] = r.stats.time_total - r.stats.ttft  # includes the drafter's lazy prefill
    dids = drafter_lm.view.encode(text)[:tokens]
    for keep, key in ((1, "drafter_prefill_last_logits"), (len(dids), "drafter_prefill_all_logits")):
        t = time.perf_counter()
        drafter_lm.session().extend(dids, keep=keep)
        out[key] = time.perf_counter() - t
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--dtype", default="auto", help="target dtype (auto: fp32 on CPU)")
    ap.add_argument("--drafter-dtype", default="int8", help="drafter dtype (int8: dynamic quantization)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--k-ngram", type=int, default=4)
    ap.add_argument("--k-draft", type=int, default=6)
    ap.add_argument("--k-smol", type=int, default=6)
    ap.add_argument("--conf-draft", type=float, default=0.3, help="min_confidence of the 0.5B drafter")
    ap.add_argument("--conf-smol", type=float, default=0.4, help="min_confidence of the SmolLM2 drafters")
    ap.add_argument("--no-hybrids", action="store_true", help="skip the ngram+bridged / ngram+text rows")
    ap.add_argument("--only", default="", help="comma-separated subset of modes (plain is always run)")
    ap.add_argument("--no-peers", action="store_true", help="skip the transformers peers")
    ap.add_argument("--prompts", default="", help="comma-separated subset of prompt names")
    ap.add_argument("--json", type=Path, help="write every figure here")
    ap.add_argument("--ttft", action="store_true", help="also measure time to first token on a ~2,000-token prompt")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    srcs = {n: resolve_model(n) for n in ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "smollm2-135m")}
    for n, s in srcs.items():
        if not Path(s).is_file():
            print(
                f"{n}: {s} not found locally; run ../shared/tools/fetch-models.sh DIR and set VOCABBRIDGE_MODELS=DIR",
                file=sys.stderr,
            )
            return 2
    t = time.perf_counter()
    target = load_causal_lm(srcs["qwen2.5-coder-1.5b"], dtype=args.dtype)
    d05 = load_drafter_lm(srcs["qwen2.5-coder-0.5b"], args.drafter_dtype, device="cpu")
    smol = load_drafter_lm(srcs["smollm2-135m"], args.drafter_dtype, device="cpu")
    print(f"models loaded in {time.perf_counter() - t:.1f} s (dtype {target.dtype}, {args.threads} threads)", flush=True)
    V = target.vocab_size
    ps = prompts()
    if args.prompts:
        ps = {k: v for k, v in ps.items() if k in args.prompts.split(",")}
    ids = {k: chat_prompt_ids(target.view, [{"role": "user", "content": v}]) for k, v in ps.items()}
    print("prompt tokens:", {k: len(v) for k, v in ids.items()}, flush=True)
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    tm = build_token_map(smol.view, target.view, mode="bytes", drafter_vocab_size=smol.vocab_size, target_vocab_size=V)
    cs = args.conf_smol
    modes = {
        "ngram": (NgramDrafter(prompt_lookup_min=1, prompt_lookup_max=4), args.k_ngram, None),
        "draft": (
            DraftModelDrafter(d05, target_vocab_size=V, target_view=target.view, min_confidence=args.conf_draft),
            args.k_draft,
            d05,
        ),
        "bridged": (BridgedDrafter(smol, tm, target_vocab_size=V, min_confidence=cs), args.k_smol, smol),
        "text": (TextDrafter(smol, target.view, target_vocab_size=V, min_confidence=cs), args.k_smol, smol),
    }
    if not args.no_hybrids:  # prompt lookup first, SmolLM2 when it finds nothing
        modes["ngram+bridged"] = (
            NgramFirstDrafter(BridgedDrafter(smol, tm, target_vocab_size=V, min_confidence=cs)),
            args.k_smol,
            smol,
        )
        modes["ngram+text"] = (
            NgramFirstDrafter(TextDrafter(smol, target.view, target_vocab_size=V, min_confidence=cs)),
            args.k_smol,
            smol,
        )
    if args.only:
        modes = {k: v for k, v in modes.items() if k in args.only.split(",")}

    # Bare forward costs, for the ideal speedups.
    cost = {"target_1": timed_forward(target, 1)}
    for n in range(2, max(args.k_ngram, args.k_draft, args.k_smol) + 2):
        cost[f"target_{n}"] = timed_forward(target, n)
    cost["target_1"] = timed_forward(target, 1)  # again, now that the process is warm
    cost["draft_1"] = timed_forward(d05, 1)
    cost["smol_1"] = timed_forward(smol, 1)
    print("forward costs (s):", {k: round(v, 4) for k, v in cost.items()}, flush=True)

    engines = {"plain": SpecEngine(target)}
    engines.update({name: SpecEngine(target, d, num_speculative_tokens=k) for name, (d, k, _) in modes.items()})

    # Two sets of peers. "stock": transformers as its users run it — the same weights loaded by
    # from_pretrained with its defaults (fp32, dense nn.Linear, fp32 drafters); the targets
    # are against these. "same": transformers' generate() on *our* loaded models (packed target,
    # int8 drafters), which isolates the decoding loop and the drafting policy from the weights.
    peer_sets: dict[str, dict[str, tuple]] = {}
    if not args.no_peers:
        st_t, st_d, st_s = stock_models(srcs)
        tok_t, tok_s = hf_tokenizer(target.view), hf_tokenizer(smol.view)
        for label, (tm_, dm_, sm_) in {"stock": (st_t, st_d, st_s), "same": (target.model, d05.model, smol.model)}.items():
            peer_sets[label] = {
                "plain": (tm_, {}),
                "ngram": (tm_, {"prompt_lookup_num_tokens": args.k_ngram}),
                "draft": (tm_, {"assistant_model": dm_}),
                "uag": (tm_, {"assistant_model": sm_, "tokenizer": tok_t, "assistant_tokenizer": tok_s}),
            }
    peer_of = {
        "plain": "plain",
        "ngram": "ngram",
        "draft": "draft",
        "bridged": "uag",
        "text": "uag",
        "ngram+bridged": "uag",
        "ngram+text": "uag",
    }
    runs = {name: Run(name) for name in engines}
    hf = {(label, key): Run(f"hf-{label}-{key}") for label, ps_ in peer_sets.items() for key in ps_}
    # Every mode runs on a prompt before the next prompt, each followed by its peers: the VM's speed
    # drifts, and interleaving spreads the drift instead of charging it to whichever ran last.
    for pname, prompt in ids.items():
        done: set[str] = set()
        for name, engine in engines.items():
            ours(engine, runs[name], pname, prompt, params)
            key = peer_of.get(name)
            if key in done or key is None:
                continue
            done.add(key)
            for label, ps_ in peer_sets.items():
                model, kw = ps_[key]
                peer(target, model, hf[(label, key)], pname, prompt, args.max_new_tokens, **kw)
    peers = {(label, m): hf[(label, peer_of[m])] for label in peer_sets for m in engines if (label, peer_of[m]) in hf}

    ttft = None
    if args.ttft:
        ttft = ttft_experiment(
            target, d05, modes["draft"][0] if "draft" in modes else DraftModelDrafter(d05, target_vocab_size=V)
        )
        print("TTFT on a long prompt:", {k: round(v, 3) for k, v in ttft.items()}, flush=True)

    plain = runs["plain"]
    plain_tps = (plain.total("generated") - len(ids)) / plain.total("decode_time")
    rows = []
    for name, run in runs.items():
        gen, dt = run.total("generated"), run.total("decode_time")
        tps = (gen - len(ids)) / dt
        fwd = run.total("target_forwards") - len(ids)  # decode forwards (prefill excluded)
        acc = run.total("accepted") / run.total("draft_tokens") if run.total("draft_tokens") else float("nan")
        tpf = (gen - len(ids)) / fwd
        same = all(run.per_prompt[p]["tokens"] == plain.per_prompt[p]["tokens"] for p in ids)
        if name == "plain":
            ideal = 1.0
        else:
            # What the decode would cost if only bare forwards took time: each verify forward at its
            # measured size, plus the drafter's one-token forwards.
            drafter, k, dlm = modes[name]
            sizes: dict[int, int] = {}
            for r in run.per_prompt.values():
                for m, c in r["verify_sizes"].items():
                    sizes[int(m)] = sizes.get(int(m), 0) + c
            c_draft = 0.0 if dlm is None else (cost["draft_1"] if dlm is d05 else cost["smol_1"])
            model_time = sum(c * cost[f"target_{m}"] for m, c in sizes.items()) + run.total("drafter_forwards") * c_draft
            ideal = (gen - len(ids)) * cost["target_1"] / model_time
        measured = tps / plain_tps

        def peer_tps(label):
            p = peers.get((label, name))
            return (p.total("generated") - len(ids)) / p.total("decode_time") if p else float("nan")

        p = peers.get(("stock", name))
        rows.append(
            {
                "mode": name,
                "tokens_per_s": tps,
                "vs_plain": measured,
                "vs_peer": tps / peer_tps("stock"),
                "peer_tokens_per_s": peer_tps("stock"),
                "vs_same_weights_peer": tps / peer_tps("same"),
                "same_weights_peer_tokens_per_s": peer_tps("same"),
                "acceptance_rate": acc,
                "tokens_per_target_forward": tpf,
                "target_forwards_per_128": 128 * fwd / (gen - len(ids)),
                "ideal_speedup": ideal,
                "efficiency": measured / ideal,
                "identical_to_plain": same,
                "stock_peer_identical_to_plain": (
                    all(p.per_prompt[q]["tokens"] == plain.per_prompt[q]["tokens"] for q in ids) if p else None
                ),
            }
        )

    hdr = (
        f"{'mode':13s} {'tok/s':>6s} {'×plain':>7s} {'×peer':>7s} {'peer':>6s} {'×same':>6s} {'same':>6s} {'accept':>7s} "
        f"{'tok/fwd':>7s} {'fwd/128':>7s} {'ideal':>6s} {'effic':>6s}  identical"
    )
    print("\n" + hdr)
    for r in rows:
        print(
            f"{r['mode']:13s} {r['tokens_per_s']:6.2f} {r['vs_plain']:7.2f} {r['vs_peer']:7.2f} {r['peer_tokens_per_s']:6.2f} "
            f"{r['vs_same_weights_peer']:6.2f} {r['same_weights_peer_tokens_per_s']:6.2f} "
            f"{r['acceptance_rate']:7.2f} {r['tokens_per_target_forward']:7.2f} {r['target_forwards_per_128']:7.1f} "
            f"{r['ideal_speedup']:6.2f} {100 * r['efficiency']:5.0f}%  {'yes' if r['identical_to_plain'] else 'NO'}"
        )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "rows": rows,
                    "costs": cost,
                    "ttft": ttft,
                    "prompt_tokens": {k: len(v) for k, v in ids.items()},
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "per_prompt": {n: r.per_prompt for n, r in runs.items()},
                    "peers": {f"{k[0]}/{k[1]}": r.per_prompt for k, r in hf.items()},
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
