"""Where a GPU decode step's time goes, and an MTP head in the loop prompt by prompt (diagnostics
for the H200 run): the static step alone at two cache sizes, transformers' eager step, the engine's
plain decoding on a short prompt, and the head's in-loop acceptance per bench prompt.

    python3 tools/device/diag.py TARGET HEAD
"""

from __future__ import annotations

import sys
import time

import torch

from vocabbridge.chat import chat_prompt_ids
from vocabbridge.engine import SamplingParams, load_causal_lm
from vocabbridge.engine.factory import build_engine
from vocabbridge.engine.static import StaticLM
from vocabbridge.presets import resolve_model
from vocabbridge.prompts import load_prompts
from vocabbridge.spec import EngineSpec


def timed(fn, n=50):
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1000


target, head = sys.argv[1], sys.argv[2]
lm = load_causal_lm(resolve_model(target), dtype="bfloat16", device="cuda", pack=False)
ids = lm.view.encode("def quicksort(xs):\n    ")
for max_len in (1024, 16384):
    st = StaticLM.wrap(lm, rows=8, invariant=True, max_len=max_len)
    s = st.session()
    s.extend(ids)
    n = len(s.ids)

    def step(s=s, n=n):
        s.extend([11])
        s.truncate(n)

    print(f"static step, cache {max_len}: {timed(step):.2f} ms")
    eager = StaticLM.wrap(lm, rows=8, invariant=True, max_len=max_len, graphs=False)
    e = eager.session()
    e.extend(ids)

    def estep(e=e, n=n):
        e.extend([11])
        e.truncate(n)

    print(f"static eager step, cache {max_len}: {timed(estep, 10):.2f} ms")
kv = lm.session()
kv.extend(ids)
m = len(kv.ids)


def hf():
    kv.extend([11])
    kv.truncate(m)


print(f"transformers eager step: {timed(hf, 10):.2f} ms")
built = build_engine(EngineSpec(target=target, drafter="none", device="cuda"))
p = SamplingParams(max_new_tokens=128, ignore_eos=True)
built.engine.generate(ids, SamplingParams(max_new_tokens=8))
torch.cuda.synchronize()
t = time.perf_counter()
r = built.engine.generate(ids, p)
torch.cuda.synchronize()
print(f"engine plain, short prompt: {len(r.tokens) / (time.perf_counter() - t):.1f} tok/s")
mtp = build_engine(EngineSpec(target=target, drafter=f"mtp:{head}", device="cuda", num_speculative_tokens=3))
for pr in load_prompts():
    x = chat_prompt_ids(mtp.target.view, list(pr.messages))
    g = mtp.engine.generate(x, SamplingParams(max_new_tokens=128))
    s = g.stats
    pos = [a / max(1, s.drafts) for a in s.accepted_per_pos]
    print(f"{pr.id} ({len(x)} prompt tokens): per position {', '.join(f'{a:.2f}' for a in pos)}; drafts {s.drafts}")
