"""Speculative decoding from Python, checked against plain greedy decoding.

    VOCABBRIDGE_MODELS=/path/to/models python examples/speculative_generate.py

Target Qwen2.5-Coder-1.5B-Instruct and the SmolLM2-135M drafter (another vocabulary, drafting
text), from the local GGUF files (../shared/tools/fetch-models.sh assembles them).
"""

from __future__ import annotations

from vocabbridge.chat import chat_prompt_ids
from vocabbridge.engine import SamplingParams, SpecEngine
from vocabbridge.engine.factory import EngineSpec, build_engine

built = build_engine(
    EngineSpec(
        target="qwen2.5-coder-1.5b",
        drafter="smollm2-135m",
        mode="text",
        num_speculative_tokens=6,
        min_confidence=0.4,
        ngram_first=True,
    )
)
ids = chat_prompt_ids(built.target.view, [{"role": "user", "content": "Write a Python function that reverses a linked list."}])
params = SamplingParams(max_new_tokens=96)

spec = built.engine.generate(ids, params)
plain = SpecEngine(built.target).generate(ids, params)
s = spec.stats
print(spec.text)
print(f"\nidentical to plain greedy: {spec.tokens == plain.tokens}")
print(
    f"acceptance {s.acceptance_rate:.2f}, mean acceptance length {s.mean_acceptance_length:.2f}, "
    f"{s.tokens_per_target_forward:.2f} tokens per target forward"
)
print(f"decode {s.decode_tokens_per_second:.2f} tok/s vs plain {plain.stats.decode_tokens_per_second:.2f} tok/s")
