"""Training at scale: the prompts the target writes itself (Magpie), the batched two-pass data path a
GPU runs (checked against the step-by-step path on the CPU), device-side batches, kinds of prompts."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from vocabbridge.engine import load_causal_lm
from vocabbridge.prompts import load_prompts
from vocabbridge.testing import tiny_model
from vocabbridge.training.chain import collate
from vocabbridge.training.data import generate_batch, generate_batch_fast, render_prompts, sequence_features
from vocabbridge.training.magpie import Filter, Keeper, fits_kind, language_of, synthesize_prompts, user_turn_prefix
from vocabbridge.training.train import prompt_kind

# ==== the filters ===================================================================================


def test_languages_and_kinds_are_told_apart():
    assert language_of("파이썬에서 리스트를 정렬하는 방법을 알려주세요.") == "ko"
    assert language_of("Explain how a hash map works.") == "en"
    assert language_of("Объясни, как работает хеш-таблица.") == "other"
    assert fits_kind("Write a Python function that merges two sorted lists.", "code")
    assert not fits_kind("What is the capital of France?", "code")
    assert fits_kind("자바스크립트에서 비동기 함수를 설명해 주세요.", "code")  # Korean code questions count as code


def test_the_keeper_drops_cut_short_wrong_language_repeats_and_bench_overlaps():
    bench = load_prompts()
    k = Keeper(Filter(), bench, specials=("<|im_start|>",))
    assert not k.keep("Implement a 2D vector in C++ with an array.\n<|im_start|><|im_start|>", "code", finished=True)
    assert not k.keep("How do I cook rice in a pot without it sticking", "en", finished=False)
    assert not k.keep("short", "en", finished=True)
    assert not k.keep("한국어로 된 질문입니다. 이것은 영어가 아닙니다.", "en", finished=True)
    assert k.keep("How do I cook rice in a pot without it sticking?", "en", finished=True)
    assert not k.keep("how do I cook rice in a pot without it sticking!!", "en", finished=True)  # the same, normalised
    words = bench[1].messages[-1]["content"].split()  # the English chat prompt of the suite
    assert not k.keep("Please help: " + " ".join(words[:12]), "en", finished=True)
    assert k.rejected == {
        "cut at the token limit": 1,
        "length": 1,
        "language or kind": 1,
        "duplicate": 1,
        "overlaps the bench suite": 1,
        "holds special tokens": 1,
    }


def test_a_prompt_kind_is_read_from_its_id():
    assert [prompt_kind(i) for i in ("magpie-code-000001", "magpie-ko-000002-think", "en-chat-012", "doc")] == [
        "code",
        "ko",
        "en-chat",
        "doc",
    ]


# ==== the two-pass data path ===========================================================================


@pytest.fixture(scope="module")
def tiny_lm(tok_dirs, tmp_path_factory):
    folder = tiny_model(tmp_path_factory.mktemp("scale") / "t", tok_dirs["base"], seed=3, layers=2)
    return load_causal_lm(str(folder), dtype="float32", pack=False)


def test_the_batched_two_pass_path_gives_the_step_by_step_paths_features(tiny_lm):
    """The GPU's path (one generate, one teacher-forced forward) against the CPU's (a forward per
    step): same tokens, same hidden states and layer streams, same top-k, position by position."""
    view = tiny_lm.view
    prompts = [view.encode(t) for t in ("def add(a, b):", "Hello there, how are", "x")]
    stops = {view.roles["eos"]} if "eos" in view.roles else set()
    kw = dict(max_new_tokens=12, stop_ids=stops, top_k=5, pad_id=0, aux_layers=(1, 2))
    slow = generate_batch(tiny_lm.model, prompts, **kw)
    fast = generate_batch_fast(tiny_lm.model, prompts, **kw)
    for a, b in zip(slow, fast):  # the step-by-step path keeps its features on the CPU, the batched one on the device
        assert a.tokens.tolist() == b.tokens.tolist() and a.gen_start == b.gen_start
        assert torch.allclose(a.hidden.float(), b.hidden.float().cpu(), atol=2e-3)
        assert torch.allclose(a.aux.float(), b.aux.float().cpu(), atol=2e-3)
        assert (a.topk_ids[:, 0] == b.topk_ids[:, 0].cpu()).float().mean() > 0.95
        assert torch.allclose(a.topk_p.float(), b.topk_p.float().cpu(), atol=2e-3)


def test_sequence_features_groups_by_tokens_and_keeps_each_sequence_apart(tiny_lm):
    seqs = [[5, 6, 7, 8, 9], [10, 11, 12], list(range(20, 60))]
    one = sequence_features(tiny_lm.model, seqs, [2, 1, 10], top_k=3, batch_tokens=1 << 20)
    many = sequence_features(tiny_lm.model, seqs, [2, 1, 10], top_k=3, batch_tokens=40)  # one sequence a forward
    for a, b, s in zip(one, many, seqs):
        assert a.positions == len(s) - 1 and a.tokens.tolist() == s
        assert torch.allclose(a.hidden.float(), b.hidden.float(), atol=2e-3)


def test_batches_are_built_where_the_data_lie(tiny_lm):
    seqs = sequence_features(tiny_lm.model, [[5, 6, 7, 8], [9, 10, 11]], [1, 1], top_k=3)
    b = collate(seqs, torch.arange(tiny_lm.vocab_size), 8)
    assert b.hidden.device == seqs[0].hidden.device and b.valid.sum() == 2 + 1  # a label needs the next position


def test_a_fifth_of_the_prompts_think_where_the_template_can(tiny_lm):
    class View:
        chat_template = "{% if enable_thinking %}T{% endif %}{{ messages[-1]['content'] }}"

        def encode(self, text):
            return [ord(c) for c in text]

    ps = [p for p in load_prompts()] * 2  # ten prompts
    out = render_prompts(View(), ps, thinking_share=0.2)
    assert sum(pid.endswith("+think") for pid, _ in out) == 2 and sum(pid.endswith("-think") for pid, _ in out) == 8


# ==== Magpie on a real model ===========================================================================


def test_the_user_turn_prefix_ends_where_a_user_message_starts():
    from vocabbridge.tokenizer import load_tokenizer

    from .conftest import shared_tokenizer

    view = load_tokenizer(shared_tokenizer("qwen3"))
    prefix = user_turn_prefix(view, "en")
    assert prefix.endswith("<|im_start|>user\n") and "<|im_start|>system\n" in prefix


@pytest.mark.slow
def test_smollm2_writes_prompts_that_pass_the_filters(tmp_path):
    """The real thing, small: SmolLM2-135M continues its own chat template into user messages."""
    models = Path(os.environ.get("VOCABBRIDGE_MODELS", "")).expanduser()
    gguf = models / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not gguf.is_file():
        if os.environ.get("VOCABBRIDGE_REQUIRE_REAL"):
            pytest.fail(f"{gguf} is missing (VOCABBRIDGE_REQUIRE_REAL is set)")
        pytest.skip("needs SmolLM2-135M in VOCABBRIDGE_MODELS (../shared/tools/fetch-models.sh)")
    lm = load_causal_lm(str(gguf), dtype="float32", pack=False)
    out = tmp_path / "written.jsonl"
    kept, stats = synthesize_prompts(lm.model, lm.view, 3, out=out, batch=12, max_tokens=64, seed=1, kinds=("en", "code"))
    assert 0 < len(kept) <= 3 and stats["candidates_this_run"] >= len(kept)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["id"] for x in lines][: len(kept)] == [p.id for p in kept]
    for p in kept:
        kind = p.id.split("-")[1]
        assert fits_kind(p.messages[-1]["content"], kind)
    again, _ = synthesize_prompts(lm.model, lm.view, len(kept), out=out, batch=12, max_tokens=64, seed=1, kinds=("en",))
    assert [p.id for p in again] == [p.id for p in kept]  # resumed from the file: nothing new generated
