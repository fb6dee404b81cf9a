"""Token maps on real tokenizers from ../shared/tokenizers (skipped with the reason when absent),
and the committed maps in maps/ checked against a fresh build."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from vocabbridge import load_tokenizer
from vocabbridge.mapping import build_token_map, compute_coverage, load_map
from vocabbridge.mapping.bridge import _single_bytes

from .conftest import shared_tokenizer

REPO = Path(__file__).resolve().parents[1]
MODELS = Path(os.environ.get("VOCABBRIDGE_MODELS", REPO.parent / "models"))

pytestmark = pytest.mark.shared


@pytest.fixture(scope="module")
def real():
    return {n: load_tokenizer(shared_tokenizer(n)) for n in ("smollm2", "qwen3", "exaone-3.5")}


def test_smollm2_to_qwen3(real):
    d, t = real["smollm2"], real["qwen3"]
    bm, vm = build_token_map(d, t), build_token_map(d, t, mode="vllm")
    assert vm.pairs == 39_237  # checked against vLLM's VocabMapping on transformers' tokenizers
    assert bm.pairs == vm.pairs  # two byte-level vocabularies: strings and bytes agree here
    assert bm.target_to_draft[t.roles["end_of_turn"]] == d.roles["end_of_turn"]  # <|im_end|> both sides
    assert bm.target_to_draft[t.roles["start_of_turn"]] == d.roles["start_of_turn"]


def test_exaone_to_qwen3_bytes_mode_pairs_what_strings_miss(real):
    d, t = real["exaone-3.5"], real["qwen3"]
    bm, vm = build_token_map(d, t), build_token_map(d, t, mode="vllm")
    assert bm.target_to_draft[151645] == 361  # <|im_end|> ↔ [|endofturn|], by role
    assert vm.target_to_draft[151645] == -1
    # EXAONE keeps indentation runs as added tokens spelled with real spaces ("    "), Qwen as
    # byte-level "ĠĠĠĠ": the same bytes, different strings.
    four = t.id_of(b"    ")
    assert bm.target_to_draft[four] == d.ids_by_bytes[b"    "][0] and vm.target_to_draft[four] == -1
    assert vm.pairs == 51_524 and bm.pairs == vm.pairs + 37


@pytest.mark.parametrize("drafter,target", [("exaone-3.5", "qwen3"), ("smollm2", "qwen3")])
def test_bridge_spells_every_target_token_the_drafter_can_spell(real, drafter, target):
    d, t = real[drafter], real[target]
    tm = build_token_map(d, t)
    singles = _single_bytes(d)
    inexact = [x for x, ids in tm.input_bridge.items() if d.decode_bytes(ids) != t.tokens[x]]
    # Only tokens holding a byte the drafter has no token for (SmolLM2 lacks 21 of the 256 bytes,
    # e.g. 0xC0, 0xF5-0xFF, which never occur in UTF-8) stay inexact.
    assert all(any(b not in singles for b in t.tokens[x]) for x in inexact)
    assert len(inexact) <= 256 - len(singles)


def test_corpus_coverage_on_the_shipped_texts(real):
    from vocabbridge.mapping import default_texts

    d, t = real["exaone-3.5"], real["qwen3"]
    tm = build_token_map(d, t)
    cov = compute_coverage(tm, d, t, texts=default_texts())
    ko = next(x for x in cov.texts if x.file == "korean_chat.txt")
    en = next(x for x in cov.texts if x.file == "english_prose.txt")
    assert ko.partnered_share > 0.5 and en.partnered_share > 0.9


def test_committed_smollm2_to_qwen3_map_is_current(real):
    path = REPO / "maps" / "smollm2_to_qwen3.json"
    tm = load_map(path, drafter=real["smollm2"], target=real["qwen3"])
    fresh = build_token_map(real["smollm2"], real["qwen3"])
    assert np.array_equal(tm.target_to_draft, fresh.target_to_draft) and np.array_equal(tm.draft_to_target, fresh.draft_to_target)
    assert tm.input_bridge == fresh.input_bridge


def test_committed_smollm2_to_qwen25_map_is_current():
    names = ("SmolLM2-135M-Instruct.Q4_1.gguf", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    if not all((MODELS / n).is_file() for n in names):
        pytest.skip(f"needs the GGUF models in {MODELS} (../shared/tools/fetch-models.sh; set VOCABBRIDGE_MODELS)")
    d, t = (load_tokenizer(MODELS / n) for n in names)
    tm = load_map(REPO / "maps" / "smollm2_to_qwen2.5.json", drafter=d, target=t)
    fresh = build_token_map(d, t)
    assert tm.mode == "bytes" and tm.target.model_vocab_size == 151_936
    assert np.array_equal(tm.target_to_draft, fresh.target_to_draft) and tm.input_bridge == fresh.input_bridge
