"""The static-cache target (engine/static.py): the same numbers as transformers, every row computed
alike whatever the rows beside it, speculative output identical to plain, and the CUDA graphs
replaying what the eager path computes. On a machine with a GPU these run there (bf16, graphs), on
a CPU in float32 without graphs."""

from __future__ import annotations

import gc

import pytest
import torch

from vocabbridge.engine import SamplingParams, SpecEngine, load_causal_lm
from vocabbridge.engine.drafters import DraftModelDrafter, NgramDrafter
from vocabbridge.engine.static import StaticLM, static_lm, supported
from vocabbridge.testing import tiny_model

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
DTYPE = "bfloat16" if GPU else "float32"
PROMPTS = ["Hello world, give them the results.", "def tokenize(text):\n    return", "안녕하세요. 오늘 날씨가"]


@pytest.fixture(scope="module")
def models(tok_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("static")
    t = tiny_model(root / "t", tok_dirs["base"], seed=0, layers=3)
    d = tiny_model(root / "d", tok_dirs["base"], seed=1, layers=1)
    load = lambda p: load_causal_lm(str(p), dtype=DTYPE, device=DEVICE, pack=False)  # noqa: E731
    return {
        "hf": load(t),
        "target": static_lm(load(t), rows=8, invariant=True),
        "draft": static_lm(load(d), rows=8, invariant=False),
    }


def test_the_tiny_llama_runs_on_the_static_path(models):
    assert supported(models["hf"]) is None
    assert isinstance(models["target"], StaticLM) and models["target"].graphs == GPU


def test_the_static_forward_computes_what_transformers_computes(models):
    hf, st = models["hf"], models["target"]
    ids = hf.view.encode(PROMPTS[0])
    a, b = hf.session(), st.session()
    tol = 5e-2 if GPU else 1e-4
    assert torch.allclose(a.extend(ids, keep=3), b.extend(ids, keep=3), atol=tol)
    for tok in (5, 17, 301):  # decode steps
        assert torch.allclose(a.extend([tok]), b.extend([tok]), atol=tol)
    la, ha = a.extend([7, 8, 9], keep=3, hidden=True)
    lb, hb = b.extend([7, 8, 9], keep=3, hidden=True)
    assert torch.allclose(la, lb, atol=tol) and torch.allclose(ha, hb, atol=tol)
    _, sa = a.extend([11, 12], keep=2, hidden=(1, 3))
    _, sb = b.extend([11, 12], keep=2, hidden=(1, 3))
    assert sb.shape == (2, 2 * hf.model.config.hidden_size) and torch.allclose(sa, sb, atol=tol)


def test_a_rows_logits_do_not_depend_on_the_rows_beside_it(models):
    """Bit for bit: each position of a verification equals the same position fed alone."""
    st = models["target"]
    prompt = st.view.encode(PROMPTS[1])
    step = [11, 12, 13, 14, 15, 16, 17]
    one = st.session()
    one.extend(prompt)
    alone = torch.cat([one.extend([t]) for t in step])
    for n in range(2, len(step) + 1):
        s = st.session()
        s.extend(prompt)
        assert torch.equal(s.extend(step[:n], keep=n), alone[:n]), n
    s = st.session()
    s.extend(prompt)
    s.extend(step[:3], keep=3)
    s.truncate(len(prompt) + 1)  # a rejection: the rest comes again, one by one
    assert torch.equal(torch.cat([s.extend([t]) for t in step[1:4]]), alone[1:4])


@pytest.mark.parametrize("k", [1, 3, 7, 12])
def test_speculative_output_equals_plain_on_the_static_target(models, k):
    st, draft = models["target"], models["draft"]
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    for p in PROMPTS:
        ids = st.view.encode(p * 2)
        want = SpecEngine(st).generate(ids, params).tokens
        for drafter in (DraftModelDrafter(draft, target_vocab_size=st.vocab_size), NgramDrafter()):
            got = SpecEngine(st, drafter, num_speculative_tokens=k).generate(ids, params)
            assert got.tokens == want, (p, k, drafter.name)


def test_a_dropped_sessions_slot_serves_the_next_one(models):
    st = models["target"]
    ids = st.view.encode(PROMPTS[2])
    params = SamplingParams(max_new_tokens=16, ignore_eos=True)
    want = SpecEngine(st).generate(ids, params).tokens
    junk = st.session()
    junk.extend(st.view.encode(PROMPTS[0] * 3))
    del junk
    gc.collect()
    assert st._pool  # the slot came back
    assert SpecEngine(st).generate(ids, params).tokens == want


def test_a_context_past_the_cache_is_refused(models):
    from vocabbridge.errors import RequestError

    st = models["target"]
    s = st.session()
    with pytest.raises(RequestError, match="exceeds"):
        s.extend([5] * (st.max_context + 1))


@pytest.mark.skipif(not GPU, reason="CUDA graphs need a GPU")
def test_the_graphs_replay_what_the_eager_path_computes(models):
    st = models["target"]
    eager = StaticLM.wrap(models["hf"], rows=8, invariant=True, graphs=False)
    ids = st.view.encode(PROMPTS[0])
    a, b = st.session(), eager.session()
    a.extend(ids)
    b.extend(ids)
    for toks in ([5], [6, 7, 8], [9]):
        assert torch.equal(a.extend(toks, keep=len(toks)), b.extend(toks, keep=len(toks)))


def test_attending_over_more_cache_keys_changes_no_row(models):
    """Forwards attend over the first 1024, 2048 … keys (as few as their rows need); a row's result
    must not depend on it, or a verification crossing a boundary would differ from plain decoding.
    Here with boundaries every 16 keys, and prompts that put rows on both sides of them."""
    st = StaticLM.wrap(models["hf"], rows=8, invariant=True, least_keys=16)
    for cut in (10, 13, 29, 62):
        prompt = list(range(5, 5 + cut))
        step = [11, 12, 13, 14, 15, 16, 17]
        one = st.session()
        one.extend(prompt)
        alone = torch.cat([one.extend([t]) for t in step])
        for n in (3, 7):
            s = st.session()
            s.extend(prompt)
            assert torch.equal(s.extend(step[:n], keep=n), alone[:n]), (cut, n)
