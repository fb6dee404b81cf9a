"""Self-speculation (``--drafter self:L``): the target's first L layers draft over the target's own KV
cache, which they leave exactly as they found it, so the output is the target's own for every L.
A tiny random four-layer Llama (no download), and the SmolLM2 GGUF for the real check."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from vocabbridge.chat import chat_prompt_ids
from vocabbridge.cli import main
from vocabbridge.engine import SamplingParams, SpecEngine, load_causal_lm
from vocabbridge.engine.drafters import SelfSpecDrafter
from vocabbridge.engine.factory import build_engine, preflight
from vocabbridge.engine.invariant import INVARIANT_ROWS
from vocabbridge.engine.offline import eval_drafter, greedy_continuations, sweep_self_spec
from vocabbridge.errors import ConfigError
from vocabbridge.heads.draft_head import decoder_of
from vocabbridge.spec import EngineSpec, cli_args
from vocabbridge.testing import tiny_model
from vocabbridge.vllm.config import speculative_config as vllm_speculative_config

from .test_engine import PROMPTS
from .test_real_models import PROMPTS as REAL_PROMPTS
from .test_real_models import SMOL, smol  # noqa: F401  (the fixture)

LAYERS = 4
GREEDY = SamplingParams(max_new_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def deep_dir(tok_dirs, tmp_path_factory):
    return tiny_model(tmp_path_factory.mktemp("deep") / "llama4", tok_dirs["base"], seed=7, layers=LAYERS)


@pytest.fixture(scope="module")
def deep(deep_dir):
    """A four-layer tiny target (fp32, linears packed as the engine loads them)."""
    return load_causal_lm(str(deep_dir), dtype="float32")


@pytest.fixture(scope="module")
def deep_int8(deep_dir):
    """The same target as the engine's batch-invariant int8 target (forwards padded to INVARIANT_ROWS)."""
    return load_causal_lm(str(deep_dir), dtype="int8", rows=INVARIANT_ROWS)


@torch.inference_mode()
def first_layers_by_hand(model, tokens: list[int], layers: int) -> torch.Tensor:
    """The reference: embeddings, decoder layers 0 … layers−1, final norm, lm_head, no cache. [n, V]"""
    base = decoder_of(model)
    x = torch.tensor([tokens])
    positions = torch.arange(len(tokens))[None]
    h = base.embed_tokens(x)
    rope = base.rotary_emb(h, positions)
    for layer in base.layers[:layers]:
        h = layer(h, attention_mask=None, position_embeddings=rope, position_ids=positions)
    return model.lm_head(base.norm(h))[0].float()


def cache_state(session) -> tuple[list[int], list[int], list[torch.Tensor]]:
    """A target session's ids, every layer's length and a copy of its keys and values."""
    layers = session.cache.layers
    return (
        list(session.ids),
        [x.get_seq_length() for x in layers],
        [t.clone() for x in layers for t in (x.keys, x.values)],
    )


def same_state(a, b) -> bool:
    return a[0] == b[0] and a[1] == b[1] and all(torch.equal(x, y) for x, y in zip(a[2], b[2]))


# ==== the early exit =============================================================================


@pytest.mark.parametrize("layers", [1, 2, 3])
def test_early_exit_logits_equal_the_first_layers_run_by_hand(deep, layers):
    tokens = deep.view.encode(PROMPTS[1])
    d = SelfSpecDrafter(deep, layers=layers)
    got = d.early.session().extend(tokens, keep=len(tokens))
    want = first_layers_by_hand(deep.model, tokens, layers)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    full = deep.session().extend(tokens, keep=len(tokens))
    assert (got - full).abs().max() > 0.1  # premise: the early exit is not the full model
    assert len(decoder_of(deep.model).layers) == LAYERS  # the target keeps its layers
    assert {id(p) for p in d.early.model.parameters()} <= {id(p) for p in deep.model.parameters()}  # no copied weight


@pytest.mark.parametrize("layers", [1, 3])
def test_proposing_over_the_target_cache_leaves_it_as_it_was(deep, layers):
    prompt = deep.view.encode(PROMPTS[0])
    target = deep.session()
    target.extend(prompt[:-1])  # as in the engine: the last committed token is fed by the verification
    before = cache_state(target)
    session = SelfSpecDrafter(deep, layers=layers).session(prompt)
    session.attach_target(target)
    greedy = session.propose(prompt, 4, SamplingParams(), None)
    assert same_state(cache_state(target), before)
    sampled = session.propose(prompt, 4, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    assert same_state(cache_state(target), before)
    # The proposals are the early exit's own: greedy tokens its argmax chain, sampled q its softmax.
    ref = first_layers_by_hand(deep.model, prompt + greedy.tokens[:-1], layers)
    n = len(prompt) - 1
    assert len(greedy.tokens) == 4 and greedy.probs is None
    assert greedy.tokens == ref[n:].argmax(-1).tolist()
    assert sampled.probs.shape == (len(sampled.tokens), deep.vocab_size)
    torch.testing.assert_close(sampled.probs[0], torch.softmax(ref[n], -1), rtol=0, atol=1e-5)


def test_without_a_target_cache_the_session_drafts_the_same_over_its_own(deep):
    """eval-drafter proposes with no target session: its own cache over the first L layers."""
    prompt = deep.view.encode(PROMPTS[2])
    d = SelfSpecDrafter(deep, layers=2)
    own = d.session(prompt)
    target = deep.session()
    shared = d.session(prompt)
    shared.attach_target(target)
    for i in range(len(prompt) - 6, len(prompt) + 1):
        target.sync(prompt[: i - 1])  # what the engine's target holds when it asks for a draft after prompt[:i]
        assert (
            own.propose(prompt[:i], 3, SamplingParams(), None).tokens
            == shared.propose(prompt[:i], 3, SamplingParams(), None).tokens
        )
    assert own.kv.cache is not target.cache and len(own.kv.cache.layers) == 2  # only the first L layers cached
    assert not shared.own.ids  # the attached session never filled a cache of its own


def test_min_confidence_stops_the_draft(deep):
    prompt = deep.view.encode(PROMPTS[1])
    target = deep.session()
    target.extend(prompt[:-1])
    lengths = []
    for gate in (0.0, 0.999999):
        s = SelfSpecDrafter(deep, layers=1, min_confidence=gate).session(prompt)
        s.attach_target(target)
        lengths.append(len(s.propose(prompt, 6, SamplingParams(), None).tokens))
    assert lengths[0] == 6 and lengths[1] < 6


# ==== the engine: lossless for every L =========================================================


@pytest.fixture(scope="module")
def plain(deep):
    return {p: SpecEngine(deep).generate(deep.view.encode(p), GREEDY).tokens for p in PROMPTS}


@pytest.mark.parametrize("layers", [1, 2, 3])
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_output_is_identical_to_plain_for_every_depth(deep, plain, layers, k):
    engine = SpecEngine(deep, SelfSpecDrafter(deep, layers=layers), num_speculative_tokens=k)
    drafted = accepted = 0
    for p in PROMPTS:
        r = engine.generate(deep.view.encode(p), GREEDY)
        assert r.tokens == plain[p], (layers, k, p)
        drafted += r.stats.draft_tokens
        accepted += r.stats.accepted
    assert drafted > 0 and accepted > 0


def test_greedy_output_is_identical_on_the_batch_invariant_int8_target(deep_int8):
    t = deep_int8
    assert t.rows == INVARIANT_ROWS
    engine = SpecEngine(t, SelfSpecDrafter(t, layers=2), num_speculative_tokens=4)
    for p in PROMPTS:
        ids = t.view.encode(p)
        assert engine.generate(ids, GREEDY).tokens == SpecEngine(t).generate(ids, GREEDY).tokens, p


def test_sampling_runs_and_a_seed_repeats_it(deep):
    engine = SpecEngine(deep, SelfSpecDrafter(deep, layers=3), num_speculative_tokens=3)
    params = SamplingParams(max_new_tokens=32, temperature=0.8, top_p=0.95, seed=3, ignore_eos=True)
    ids = deep.view.encode(PROMPTS[1])
    a, b = engine.generate(ids, params), engine.generate(ids, params)
    assert len(a.tokens) == 32 and a.tokens == b.tokens
    assert a.stats.draft_tokens > 0 and 0 <= a.stats.accepted <= a.stats.draft_tokens


# ==== configuration ===============================================================================


@pytest.mark.parametrize("layers", [0, LAYERS, LAYERS + 3])
def test_a_depth_outside_the_model_is_refused(deep, layers):
    with pytest.raises(ConfigError, match=f"L must be 1 … {LAYERS - 1}.*e.g. --drafter self:1"):
        SelfSpecDrafter(deep, layers=layers)


def test_self_L_parses_and_bad_spellings_say_how_to_fix_them():
    spec = EngineSpec(target="t", drafter="self:8")
    assert (spec.drafter_method, spec.self_layers, spec.uses_model, spec.drafter_path) == ("self", 8, False, None)
    assert EngineSpec(target="t", drafter="ngram").self_layers is None
    assert cli_args(spec)[:4] == ["--target", "t", "--drafter", "self:8"]
    for bad in ("self", "self:", "self:x", "self:0", "self:-2", "self:2.5"):
        with pytest.raises(ConfigError, match="write --drafter self:L"):
            EngineSpec(target="t", drafter=bad)
    with pytest.raises(ConfigError, match="embedded engine only.*no early-exit"):
        vllm_speculative_config(spec)


def test_the_llama_cpp_kernels_are_refused_before_loading(deep_dir):
    with pytest.raises(ConfigError, match="early exit.*use --kernels torch"):
        preflight(EngineSpec(target=str(deep_dir), drafter="self:2", kernels="llama.cpp"))


def test_the_factory_builds_it_without_a_drafter_model(deep_dir, deep):
    built = build_engine(EngineSpec(target=str(deep_dir), drafter="self:2", dtype="float32"), loaded={str(deep_dir): deep})
    assert built.mode == "self" and built.drafter_lm is None and built.target is deep
    assert built.describe()["drafter"] | {"kv_cache": ""} == {
        "name": "self",
        "layers": 2,
        "of_layers": LAYERS,
        "kv_cache": "",
        "min_confidence": 0.0,
    }


# ==== which L: the sweep =========================================================================


def test_the_sweep_scores_every_depth(deep):
    seqs = greedy_continuations(deep, [deep.view.encode(p) for p in PROMPTS[:2]], 16)
    points = sweep_self_spec(deep, seqs, [1, 3], k=3, rounds=1)
    assert [p.layers for p in points] == [1, 3]
    alone = eval_drafter(deep, SelfSpecDrafter(deep, layers=3), seqs, k=3)
    assert points[1].eval.accepted_per_pos == alone.accepted_per_pos and points[1].eval.positions == alone.positions > 20
    for p in points:
        assert p.eval.draft_tokens == 3 * p.eval.positions  # no stop token drafted: always k
        assert 0 <= p.acceptance_rate <= 1 and 1 <= p.mean_acceptance_length <= 4
        assert p.draft_cost > 0 and p.verify_cost > 0 and p.estimated_speedup > 0
    with pytest.raises(ConfigError, match="L must be 1 … 3"):
        sweep_self_spec(deep, seqs, [2, 4])


def test_eval_drafter_layers_sweeps_in_one_run(deep_dir, tmp_path):
    f = tmp_path / "t.txt"
    f.write_text(PROMPTS[1] * 2, encoding="utf-8")
    base = ["eval-drafter", "--target", str(deep_dir), "--dtype", "float32", "--text", str(f), "-k", "2"]
    r = CliRunner().invoke(main, [*base, "--drafter", "self:2", "--layers", "3,1", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert [p["layers"] for p in out["sweep"]] == [1, 2, 3] and out["k"] == 2
    assert {"acceptance_rate", "mean_acceptance_length", "draft_cost", "estimated_speedup"} <= set(out["sweep"][0])
    r = CliRunner().invoke(main, [*base, "--drafter", "self:2", "--layers", "1"])
    assert r.exit_code == 0 and "Self-speculation: which L" in r.output and "self:1" in r.output
    r = CliRunner().invoke(main, [*base, "--drafter", "ngram", "--layers", "1"])
    assert r.exit_code == 1 and "use it with --drafter self:L" in r.output
    r = CliRunner().invoke(main, [*base, "--drafter", "self:2", "--layers", "1,x"])
    assert r.exit_code == 2 and "layer counts separated by commas" in r.output


# ==== the real model =============================================================================


def test_self_speculation_is_lossless_on_the_real_model(smol):  # noqa: F811
    spec = EngineSpec(target=str(SMOL), drafter="self:28", num_speculative_tokens=3, cost_aware=False)
    built = build_engine(spec, loaded=smol)
    params = SamplingParams(max_new_tokens=24)
    ids = chat_prompt_ids(built.target.view, [{"role": "user", "content": REAL_PROMPTS[0]}])
    got = built.engine.generate(ids, params)
    assert got.tokens == SpecEngine(built.target).generate(ids, params).tokens
    assert got.stats.accepted > 0  # 28 of SmolLM2's 30 layers agree with all 30 now and then (fewer, untrained, rarely)
