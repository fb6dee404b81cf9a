"""train-head and the mtp drafter end to end on a real checkpoint (SmolLM2-135M-Instruct, the GGUF
file itself), on a tiny budget: what a user runs first, so a broken loader or a dtype mix-up on a
real model fails here. Skips without the file, as tests/test_real_models.py does."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vocabbridge.chat import chat_prompt_ids
from vocabbridge.engine import SamplingParams, SpecEngine
from vocabbridge.engine.factory import build_engine
from vocabbridge.spec import EngineSpec
from vocabbridge.training.train import Recipe, train_head

REPO = Path(__file__).resolve().parents[1]
SMOL = Path(os.environ.get("VOCABBRIDGE_MODELS", REPO.parent / "models")) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def smol_model():
    if not SMOL.is_file():
        why = f"needs {SMOL} (../shared/tools/fetch-models.sh DEST smollm2-135m, then VOCABBRIDGE_MODELS=DEST)"
        if os.environ.get("VOCABBRIDGE_REQUIRE_REAL"):
            pytest.fail(why)
        pytest.skip(why)


def test_a_head_trained_on_smollm2_drafts_losslessly(smol_model, tmp_path):
    recipe = Recipe(max_prompts=12, new_tokens=24, epochs=1, draft_vocab=4096)
    r = train_head(str(SMOL), tmp_path / "head", recipe, quiet=True, say=lambda m: None)
    assert r.tokens["generated"] > 100 and r.eval["positions"] > 0
    built = build_engine(
        EngineSpec(target=str(SMOL), drafter=f"mtp:{tmp_path / 'head'}", num_speculative_tokens=3, cost_aware=False)
    )
    assert built.mode == "mtp"
    ids = chat_prompt_ids(built.target.view, [{"role": "user", "content": "Write a Python function that reverses a string."}])
    params = SamplingParams(max_new_tokens=32)
    got = built.engine.generate(ids, params)
    assert got.tokens == SpecEngine(built.target).generate(ids, params).tokens
    assert got.stats.draft_tokens > 0
