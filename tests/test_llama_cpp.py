"""The engine on llama.cpp's kernels (``--kernels llama.cpp``, engine/llama_cpp.py), on real GGUF files.

Needs ``llama-cpp-python`` (``pip install 'vocabbridge[llama]'``); without it the tests skip, saying
so, unless ``VOCABBRIDGE_REQUIRE_LLAMA=1`` (as in CI), where that is a failure.
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from vocabbridge.engine import SamplingParams, SpecEngine, llama_cpp
from vocabbridge.engine.factory import build_engine
from vocabbridge.engine.invariant import probe_lone_rows
from vocabbridge.engine.llama_cpp import MAX_ROWS, load_llama_cpp_lm, system_info
from vocabbridge.engine.threads import probe_thread_counts
from vocabbridge.errors import ConfigError, ModelLoadError, RequestError
from vocabbridge.spec import EngineSpec

from .test_invariant import QWEN05, worst_difference
from .test_real_models import PROMPTS, SMOL, need_model, smol  # noqa: F401  (the fixture)

if importlib.util.find_spec("llama_cpp") is None:
    why = "needs llama-cpp-python: pip install 'vocabbridge[llama]'"
    if os.environ.get("VOCABBRIDGE_REQUIRE_LLAMA"):
        raise RuntimeError(why + " (VOCABBRIDGE_REQUIRE_LLAMA is set)")
    pytest.skip(why, allow_module_level=True)


@pytest.fixture(scope="module")
def gguf():
    """Qwen2.5-Coder-0.5B Q4_K_M: its K-quant matmuls are the ones that change with the batch
    (SmolLM2's Q4_1 ones happen not to)."""
    need_model(QWEN05)
    return {False: load_llama_cpp_lm(str(QWEN05), invariant=False), True: load_llama_cpp_lm(str(QWEN05), invariant=True)}


def _worst(lm, prompt_len: int, k: int) -> float:
    return worst_difference(lm, prompt_len, k, steps=14, vocab=40000)


def test_the_naive_path_differs_from_plain_rows(gguf):
    assert max(_worst(gguf[False], 60, k) for k in (1, 3, 4)) > 1e-4, system_info()


@pytest.mark.parametrize("prompt_len", [5, 250, 260])
def test_invariant_verification_equals_plain_rows_bit_for_bit(gguf, prompt_len):
    """k = 1…8 (k + 1 > MAX_ROWS verifies in pieces), KV lengths across llama.cpp's 256-cell padding."""
    for k in range(1, 9):
        assert _worst(gguf[True], prompt_len, k) == 0.0, (k, system_info())
    assert MAX_ROWS >= 5  # k = 4 verifies in one forward


def _lone_row_matches_a_batch_row(lm, cells: int) -> bool:
    """Three one-token forwards vs one three-row forward over the same tokens, after ``cells`` tokens."""
    s = lm.session()
    s.extend(list(range(100, 100 + cells)))
    rows = torch.cat([s.extend([t]) for t in (7, 8, 9)])
    s.truncate(cells)
    return torch.equal(rows, s.extend([7, 8, 9], keep=3))


@pytest.mark.parametrize("kv_type", [1, llama_cpp.KV_BF16])  # f16 (llama.cpp's default), bf16 (ours)
def test_the_load_probe_predicts_whether_a_lone_row_computes_as_a_batch_row(gguf, kv_type, monkeypatch):
    """The probe (at 300 cells) decides whether a plain step runs one row or two; it must agree with a
    direct check at another KV length. On the machines measured, the f16 cache's lone row splits its
    attention past 256 cells (the probe says no) and the bf16 cache's does not."""
    monkeypatch.setattr(llama_cpp, "KV_BF16", kv_type)
    lm = load_llama_cpp_lm(str(QWEN05), invariant=True)
    lm.min_rows = 1  # unpadded, to see what one row alone computes
    probed = probe_lone_rows(lm, most=llama_cpp.MAX_ROWS)
    assert probed == _lone_row_matches_a_batch_row(lm, 420), system_info()
    assert gguf[True].min_rows in (1, 2)


def test_sessions_roll_back_and_reuse_contexts(gguf):
    lm = gguf[True]
    s = lm.session()
    first = s.extend([1, 2, 3, 4], keep=2)
    assert first.shape == (2, lm.vocab_size) and s.ids == [1, 2, 3, 4]
    s.truncate(2)
    assert s.ids == [1, 2]
    again = s.extend([3, 4], keep=2)
    assert torch.equal(again, first)
    assert torch.equal(s.sync([1, 2, 3, 4], keep=1), first[-1:])  # nothing new: the last token is fed again
    del s
    assert lm._pool  # the context went back, cleared, for the next request
    with pytest.raises(RequestError, match="exceeds"):
        lm.session().extend([1] * (lm.max_context + 1))


def test_a_non_gguf_source_and_mtp_are_refused(smol, tmp_path):  # noqa: F811
    with pytest.raises(ModelLoadError, match="GGUF"):
        load_llama_cpp_lm(str(tmp_path))
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 64)
    with pytest.raises(ModelLoadError, match="corrupt"):
        load_llama_cpp_lm(str(bad))
    with pytest.raises(ConfigError, match="hidden states"):
        build_engine(EngineSpec(target=str(SMOL), drafter="mtp", kernels="llama.cpp"))


@pytest.mark.parametrize("drafter, mode", [("ngram", "auto"), ("self", "draft"), ("qwen", "text"), ("qwen", "bridged")])
def test_every_drafter_is_token_identical_on_llama_cpp(smol, drafter, mode):  # noqa: F811
    if drafter == "qwen":
        need_model(QWEN05)
    name = {"self": str(SMOL), "qwen": str(QWEN05)}.get(drafter, drafter)
    built = build_engine(EngineSpec(target=str(SMOL), drafter=name, mode=mode, kernels="llama.cpp"), loaded=smol)
    assert built.target.invariant and built.target.dtype == "gguf"
    plain = SpecEngine(built.target)
    params = SamplingParams(max_new_tokens=32)
    for p in PROMPTS:
        ids = built.target.view.encode(p)
        assert built.engine.generate(ids, params).tokens == plain.generate(ids, params).tokens, (drafter, mode, p)


def test_set_threads_reaches_every_context_and_the_target_computes_alike_at_1_and_2_threads(gguf):
    """What lets the thread governor (engine/threads.py) resize a llama.cpp target mid-generation:
    ``set_threads`` reaches the pooled contexts, the ones in use and new ones, and with the bf16 KV
    cache the probe's forwards (a 300-cell prompt, one-row steps, 2- and 7-row verifications) are
    the same bits with one thread and two."""
    lm = gguf[True]
    L = llama_cpp._llama()
    busy, pooled = lm.session(), lm.session()
    del pooled
    before = lm.threads
    try:
        lm.set_threads(1)
        fresh = lm.session()
        assert {L.llama_n_threads(c) for c in lm._contexts} == {1} and len(lm._contexts) >= 2
        assert L.llama_n_threads(busy.ctx) == L.llama_n_threads(fresh.ctx) == 1
        del busy, fresh
        assert probe_thread_counts(lm, lm.set_threads, [1, 2], most=MAX_ROWS), system_info()
    finally:
        lm.set_threads(before)


def test_speculation_on_llama_cpp_stays_plain_while_threads_change_at_every_forward(smol):  # noqa: F811
    built = build_engine(EngineSpec(target=str(SMOL), drafter="ngram", kernels="llama.cpp"), loaded=smol)
    lm = built.target

    class Flip:  # the governor's hook, changing the count before every target forward
        ticks = 0

        def tick(self):
            self.ticks += 1
            lm.set_threads(1 + self.ticks % 2)

    built.engine.threads = Flip()
    params = SamplingParams(max_new_tokens=32)
    before = lm.threads
    try:
        for p in PROMPTS:
            ids = lm.view.encode(p) * 3  # repeated: the n-gram drafts get accepted
            lm.set_threads(2)
            assert built.engine.generate(ids, params).tokens == SpecEngine(lm).generate(ids, params).tokens, p
        assert built.engine.threads.ticks > 10
    finally:
        lm.set_threads(before)
