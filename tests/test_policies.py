"""The draft-length policies: the cost-aware length follows measured row costs and acceptance, and
the engine stays lossless under it. Tiny random-weight models, no downloads."""

import pytest

from vocabbridge.engine import NgramDrafter, SamplingParams, SpecEngine
from vocabbridge.engine import engine as engine_module
from vocabbridge.engine.drafters import NgramFirstDrafter
from vocabbridge.engine.policies import EXPLORE, REMEASURE, Acceptance, CostAware, RowCosts, row_cost_ratio

from .test_engine import PROMPTS, drafters, plain  # noqa: F401 (plain: the plain greedy outputs, a fixture)


def _costs(first: float, per_row: float, rows=(1, 5)) -> RowCosts:
    c = RowCosts()
    for r in rows:
        c.observe(r, first + per_row * (r - 1))
    return c


def test_row_costs_interpolate_and_extrapolate_what_was_not_measured():
    c = RowCosts()
    assert c.seconds(3) is None
    c.observe(2, 0.2)
    assert c.seconds(1) == c.seconds(9) == 0.2  # one point: flat until a second is measured
    c.observe(4, 0.4)
    assert c.seconds(3) == pytest.approx(0.3) and c.seconds(6) == pytest.approx(0.6) and c.seconds(1) == pytest.approx(0.1)
    c.observe(4, 0.6)  # an exponential average, not the last figure
    assert 0.4 < c.seconds(4) < 0.6
    assert c.age(4) == 0 and c.age(2) == 2 and c.age(7) > 10**6


def test_acceptance_is_conditional_per_position_and_fades_toward_the_prior():
    a = Acceptance(4, prior=0.5, weight=1.0, memory=0.9)
    for _ in range(30):
        a.observe(4, 2)  # two accepted, the third rejected, the fourth never reached
    assert a.rate(0) > 0.9 and a.rate(1) > 0.9 and a.rate(2) < 0.1 and a.rate(3) == pytest.approx(a.rate(2))
    b = Acceptance(4, prior=0.5, weight=1.0, memory=0.9)
    for _ in range(30):
        b.observe(1, 1)  # only ever drafted one token, always kept
    assert b.rate(1) == b.rate(3) == b.rate(0) > 0.9  # the positions never tried are expected to do as well
    assert a.expected_tokens(0) == 1.0 and 2.8 < a.expected_tokens(2) < 3.0
    low = a.rate(2)
    for _ in range(30):
        a.forget()
    assert low < a.rate(2) and 0.5 < a.rate(0) < 0.7  # sitting out, the record fades back toward the prior


@pytest.mark.parametrize(
    "per_row, accepted, want",
    [
        (0.005, [4], 4),  # cheap rows (int8, fp32 weights), a drafter that is always right: the whole draft
        (0.005, [1], 1),  # cheap rows, only the first token ever kept: that one pays, the rest never do
        (0.005, [1, 0], 1),  # cheap rows, the first token kept half the time: still pays
        (0.070, [1, 0], 0),  # dear rows (Q4_K on 2 AVX2 cores): it does not; a plain step
        (0.070, [1], 1),  # dear rows, a first token that is always kept: pays for its row
        (0.070, [4], 4),  # dear rows, a drafter that is always right: the whole draft pays
    ],
)
def test_the_cost_aware_length_weighs_expected_tokens_against_measured_seconds(per_row, accepted, want):
    policy = CostAware(_costs(0.100, per_row), 8, True, Acceptance(8, prior=0.6, weight=1.0, memory=0.9))
    for i in range(40):
        policy.acceptance.observe(4, accepted[i % len(accepted)])
    assert policy.length(4) == want
    assert CostAware(_costs(0.100, per_row), positions=8, enabled=False).length(4) == 4  # off: always the cap


def test_the_cost_aware_length_measures_before_it_decides():
    costs = RowCosts()
    policy = CostAware(costs, positions=4, enabled=True)
    assert policy.length(4) == 4  # nothing measured: draft, to measure a verification
    policy.observe_step(4, 0, 0.3, 0.0)
    assert policy.length(4) == 0  # a plain step next, to measure the baseline
    policy.observe_step(0, 0, 0.1, 0.0)
    assert policy.length(4) in range(5)
    for _ in range(REMEASURE + 1):
        costs.observe(5, 0.3)
    assert policy.length(4) == 0  # the baseline is old: measured again


def test_free_and_model_proposals_are_scored_apart_and_a_model_that_sat_out_is_tried_again():
    policy = CostAware(_costs(0.100, 0.050), positions=4, enabled=True)
    for _ in range(12):  # 24 forwards: the plain step's cost is still fresh (REMEASURE)
        policy.observe_step(4, 4, 0.31, 0.0, free=True)  # lookup: always right
        policy.observe_step(4, 0, 0.31, 0.04)  # the model: always wrong, 10 ms a token
    assert policy.length(4, free=True) == 4 and policy.length(4) == 0
    for _ in range(EXPLORE):
        policy.observe_step(0, 0, 0.1, 0.0)
    assert policy.length(4) == 4  # sat out long enough: one full draft, to see whether it does better now
    policy.observe_step(4, 0, 0.31, 0.04)
    assert policy.length(4) == 0
    policy.observe_step(4, 0, 0.31, 4.0)  # a model so slow (~0.3 s a token) that no draft of it could pay
    for _ in range(EXPLORE):
        policy.observe_step(0, 0, 0.1, 0.0)
    assert policy.length(4) == 0  # not explored again


def test_a_shadow_draft_is_scored_against_what_the_target_emitted():
    policy = CostAware(_costs(0.1, 0.07), positions=4, enabled=True)
    policy.observe_shadow(3, [7, 8, 9])
    policy.score_shadow([0, 1, 2, 7])  # not settled yet: one token matched so far
    assert policy.shadow is not None and policy.free.tries == [0.0] * 4
    policy.score_shadow([0, 1, 2, 7, 8, 5])  # settled: two matched, the third missed
    assert policy.shadow is None and policy.free.hits[:3] == [1.0, 1.0, 0.0] and policy.free.tries[:3] == [1.0] * 3


# ==== in the engine ==============================================================================


@pytest.mark.parametrize("name", ["ngram", "ngram-map", "suffix", "draft", "self", "text-spm", "ngram+draft"])
def test_greedy_output_stays_identical_to_plain_with_the_cost_aware_length(tiny, plain, name):
    t = tiny["target"]
    ds = drafters(tiny)
    drafter = NgramFirstDrafter(ds["draft"]) if name == "ngram+draft" else ds[name]
    engine = SpecEngine(t, drafter, num_speculative_tokens=4, cost_aware=True)
    for p in PROMPTS:
        r = engine.generate(t.view.encode(p), SamplingParams(max_new_tokens=48, ignore_eos=True))
        assert r.tokens == plain[p], (name, p)
        assert len(r.stats.verify_sizes) >= 1


FIRST, PER_ROW = 0.020, 0.010  # dear rows: 5 cost 3x one, as llama.cpp's Q4_K kernels on 2 AVX2 cores


class _Clock:
    """A virtual ``time`` for the engine: it moves only when the dear target runs a forward, so the
    policy sees exactly the modelled costs, whatever else the machine is doing (CI runs tests side
    by side; wall-clock sleeps there made the measured costs, and the policy's choices, noisy)."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class _DearRows:
    """The tiny target with dear rows: a forward costs ``FIRST`` seconds plus ``PER_ROW`` for every
    further row, on the virtual clock."""

    def __init__(self, lm, clock: _Clock, per_row: float = PER_ROW):
        self.lm, self.clock, self.per_row = lm, clock, per_row

    def __getattr__(self, name):
        return getattr(self.lm, name)

    def session(self):
        return _DearSession(self.lm.session(), self.clock, self.per_row)


class _DearSession:
    def __init__(self, s, clock: _Clock, per_row: float):
        self.s, self.clock, self.per_row = s, clock, per_row

    def __len__(self):
        return len(self.s)

    def __getattr__(self, name):
        return getattr(self.s, name)

    def extend(self, tokens, **kw):
        self.clock.now += FIRST + self.per_row * (len(tokens) - 1)
        return self.s.extend(tokens, **kw)


def _modelled_seconds(stats) -> float:
    """The decode steps' cost on the dear-row target, from the rows each forward fed."""
    return sum(n * (FIRST + PER_ROW * (rows - 1)) for rows, n in stats.verify_sizes.items())


@pytest.mark.parametrize(
    "text, drafts_pay",
    [
        ("안녕하세요. Hello world, give them the results.", True),  # the random target loops: n-gram drafts are right
        (PROMPTS[0], False),  # n-gram drafts right about half the time: on dear rows full drafts lose
        (PROMPTS[2], False),
    ],
)
def test_on_dear_rows_the_cost_aware_engine_drafts_where_drafts_pay(tiny, text, drafts_pay, monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(engine_module, "time", clock)
    t = _DearRows(tiny["target"], clock)
    params = SamplingParams(max_new_tokens=64, ignore_eos=True)
    prompt = t.view.encode(text)
    ngram = lambda: NgramDrafter(prompt_lookup_min=1, prompt_lookup_max=3)  # noqa: E731
    plain = SpecEngine(t).generate(prompt, params)
    fixed = SpecEngine(t, ngram(), num_speculative_tokens=4).generate(prompt, params)
    aware = SpecEngine(t, ngram(), num_speculative_tokens=4, cost_aware=True).generate(prompt, params)
    assert aware.tokens == fixed.tokens == plain.tokens
    cost = {name: _modelled_seconds(r.stats) for name, r in [("plain", plain), ("fixed", fixed), ("aware", aware)]}
    if drafts_pay:  # premise: drafting in full beats plain decoding here
        assert cost["fixed"] < 0.9 * cost["plain"], cost
    assert cost["aware"] <= 1.08 * min(cost["plain"], cost["fixed"]), cost  # about the better of the two, never worse


@pytest.mark.parametrize("name", ["suffix", "ngram+draft"])
def test_whatever_lengths_the_policy_picks_the_output_is_plain(tiny, plain, name, monkeypatch):
    """Lengths drawn at random (0 … cap) for every proposal, free or not: still plain greedy."""
    import random

    t = tiny["target"]
    rng = random.Random(0)
    monkeypatch.setattr(CostAware, "length", lambda self, cap, free=False: rng.randint(0, max(cap, 0)))
    ds = drafters(tiny)
    for _ in range(2):
        drafter = NgramFirstDrafter(ds["draft"]) if name == "ngram+draft" else ds[name]
        engine = SpecEngine(t, drafter, num_speculative_tokens=4, cost_aware=True)
        for p in PROMPTS:
            assert engine.generate(t.view.encode(p), SamplingParams(max_new_tokens=48, ignore_eos=True)).tokens == plain[p]


# ==== the default length policy follows what rows cost ==============================================


def test_the_length_policy_follows_the_measured_cost_of_rows(tiny, monkeypatch):
    from vocabbridge.engine import policies
    from vocabbridge.engine.factory import draft_length_policy
    from vocabbridge.spec import EngineSpec

    clock = _Clock()
    monkeypatch.setattr(policies, "time", clock)
    t = tiny["target"]
    dear_rows, cheap_rows = _DearRows(t, clock), _DearRows(t, clock, per_row=0.001)
    spec = EngineSpec(target=t.source, drafter="ngram", num_speculative_tokens=4)
    assert row_cost_ratio(dear_rows, 5) == pytest.approx(3.0)  # 20 ms + 10 ms a further row: 60 / 20 ms
    dear, why = draft_length_policy(spec, dear_rows)
    assert dear and why.startswith("cost-aware (5 rows measured 3.00x") and "dear" in why
    cheap, why = draft_length_policy(spec, cheap_rows)  # 24 / 20 ms: the int8 target's kind of rows
    assert not cheap and why.startswith("fixed k=4 (5 rows measured 1.20x") and "cheap" in why
    assert draft_length_policy(spec.replace(cost_aware=False), dear_rows) == (False, "fixed k=4 (asked for)")
    assert draft_length_policy(spec.replace(cost_aware=True), t) == (True, "cost-aware (asked for)")
    assert draft_length_policy(spec.replace(drafter="none"), dear_rows) == (False, "")
