"""The engine is lossless: greedy output equals plain greedy for every drafter; sampling follows
the target's distribution. Tiny random-weight models built from a config, no downloads."""

import pytest
import torch

from vocabbridge.engine import DraftModelDrafter, NgramDrafter, SamplingParams, SpecEngine, TextDrafter
from vocabbridge.engine.drafters import NgramMapDrafter, SuffixDrafter
from vocabbridge.engine.drafters.base import Drafter, DraftSession, Proposal
from vocabbridge.engine.verify import verify
from vocabbridge.errors import RequestError

PROMPTS = [
    "안녕하세요. 오늘 날씨가 정말 좋네요! 내일 회의는 오후 3시에 시작합니다.",
    "Hello world! It's a beautiful day, isn't it? I'll give them the results.",
    "def tokenize(text):\n    return [t for t in text.split() if t]\n",
]


def drafters(tiny):
    t = tiny["target"]
    v = t.vocab_size
    return {
        "ngram": NgramDrafter(prompt_lookup_min=1, prompt_lookup_max=3),
        "ngram-map": NgramMapDrafter(n=2, m=4, min_hits=1),
        "suffix": SuffixDrafter(max_spec_factor=2.0, min_prob=0.0),
        "draft": DraftModelDrafter(tiny["draft"], target_vocab_size=v, target_view=t.view),
        "self": DraftModelDrafter(t, target_vocab_size=v),
        "text-spm": TextDrafter(tiny["spm"], t.view, target_vocab_size=v),
        "text-extended": TextDrafter(tiny["extended"], t.view, target_vocab_size=v),
    }


@pytest.fixture(scope="module")
def plain(tiny):
    t = tiny["target"]
    params = SamplingParams(max_new_tokens=48, ignore_eos=True)
    return {p: SpecEngine(t).generate(t.view.encode(p), params).tokens for p in PROMPTS}


@pytest.mark.parametrize("name", ["ngram", "ngram-map", "suffix", "draft", "self", "text-spm", "text-extended"])
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_output_is_identical_to_plain_greedy(tiny, plain, name, k):
    t = tiny["target"]
    engine = SpecEngine(t, drafters(tiny)[name], num_speculative_tokens=k)
    for p in PROMPTS:
        r = engine.generate(t.view.encode(p), SamplingParams(max_new_tokens=48, ignore_eos=True))
        assert r.tokens == plain[p], (name, p)


def test_adaptive_k_stays_lossless(tiny, plain):
    t = tiny["target"]
    engine = SpecEngine(t, drafters(tiny)["self"], num_speculative_tokens=2, adaptive_k=True, k_max=8)
    p = PROMPTS[1]
    r = engine.generate(t.view.encode(p), SamplingParams(max_new_tokens=48, ignore_eos=True))
    assert r.tokens == plain[p]
    assert r.stats.draft_tokens > 2 * r.stats.drafts  # k grew past its start


def test_a_drafter_identical_to_the_target_accepts_everything(tiny):
    t = tiny["target"]
    r = SpecEngine(t, drafters(tiny)["self"], num_speculative_tokens=4).generate(
        t.view.encode(PROMPTS[0]), SamplingParams(max_new_tokens=41, ignore_eos=True)
    )
    s = r.stats
    assert s.acceptance_rate == 1.0 and s.accepted == s.draft_tokens
    assert s.accepted_per_pos == [s.drafts] * 4
    # 1 token from the prefill, then 5 per verification forward.
    assert s.target_forwards == 1 + 8 and s.mean_acceptance_length == 5.0


def test_ngram_accepts_on_repetitive_output(tiny):
    t = tiny["target"]
    # Premise: on this prompt the random target falls into a short loop, as small models do.
    prompt = t.view.encode("안녕하세요. Hello world, give them the results.")
    params = SamplingParams(max_new_tokens=64, ignore_eos=True)
    out = SpecEngine(t).generate(prompt, params).tokens
    assert out[1:13] == out[5:17] and out[40:60] == out[44:64], "premise: the plain output repeats with period 4"
    r = SpecEngine(t, NgramDrafter(), num_speculative_tokens=4).generate(prompt, params)
    assert r.tokens == out
    assert r.stats.acceptance_rate > 0.5 and r.stats.target_forwards < 40


def test_stats_are_consistent(tiny):
    t = tiny["target"]
    r = SpecEngine(t, drafters(tiny)["draft"], num_speculative_tokens=3).generate(
        t.view.encode(PROMPTS[2]), SamplingParams(max_new_tokens=30, ignore_eos=True)
    )
    s = r.stats
    assert s.accepted <= s.draft_tokens and sum(s.accepted_per_pos) == s.accepted
    assert s.generated == 30 == len(r.tokens)
    assert s.target_forwards == s.generated - s.accepted  # every forward yields accepted + 1 tokens
    assert s.drafter_forwards > 0 and s.time_total >= s.time_draft + s.time_verify


def test_long_generation_with_many_rejections_leaves_no_stale_kv(tiny):
    t = tiny["target"]
    params = SamplingParams(max_new_tokens=300, ignore_eos=True)
    prompt = t.view.encode(PROMPTS[0])
    want = SpecEngine(t).generate(prompt, params).tokens
    for name in ("draft", "text-spm"):
        r = SpecEngine(t, drafters(tiny)[name], num_speculative_tokens=5).generate(prompt, params)
        assert r.tokens == want, name
        assert r.stats.draft_tokens - r.stats.accepted > 50  # many rollbacks happened


def test_kv_session_truncate_then_extend_matches_a_fresh_pass(tiny):
    t = tiny["target"]
    ids = t.view.encode(PROMPTS[1])
    s = t.session()
    s.extend(ids[:5])
    s.extend(ids[5:12])
    s.truncate(7)
    got = s.extend(ids[7:10], keep=3)
    fresh = t.session().extend(ids[:10], keep=3)
    assert torch.allclose(got, fresh, atol=1e-4)
    assert s.ids == ids[:10]


def test_stop_token_ends_generation(tiny):
    t = tiny["target"]
    prompt = t.view.encode(PROMPTS[1])
    full = SpecEngine(t).generate(prompt, SamplingParams(max_new_tokens=20, ignore_eos=True)).tokens
    stop = full[5]
    r = SpecEngine(t, drafters(tiny)["self"]).generate(prompt, SamplingParams(max_new_tokens=20, stop_token_ids=(stop,)))
    assert r.tokens == full[: full.index(stop) + 1] and r.finish_reason == "stop"


def test_prompt_longer_than_the_context_is_refused(tiny):
    t = tiny["target"]
    with pytest.raises(RequestError, match="exceeds the target's context"):
        SpecEngine(t).generate([5] * (t.max_context - 3), SamplingParams(max_new_tokens=10))


def test_bad_sampling_parameters_are_refused():
    with pytest.raises(RequestError, match="max_new_tokens"):
        SamplingParams(max_new_tokens=0)
    with pytest.raises(RequestError, match="top_p"):
        SamplingParams(top_p=0)


# ==== sampling: rejection sampling keeps the target's distribution ===========================


def _tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


@pytest.mark.parametrize("deterministic", [False, True])
def test_verify_first_token_follows_the_target_distribution(deterministic):
    g = torch.Generator().manual_seed(0)
    V = 6
    p_logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, 0.3])
    q = torch.softmax(torch.tensor([0.0, 2.0, 1.0, 0.5, 0.0, -2.0]), -1)
    params = SamplingParams(temperature=1.0)
    p = torch.softmax(p_logits, -1)
    counts = torch.zeros(V)
    n = 20000
    for _ in range(n):
        if deterministic:
            x, probs = 1, None  # always propose token 1 (one-hot q)
        else:
            x, probs = int(torch.multinomial(q, 1, generator=g)), q[None]
        acc, nxt = verify(torch.stack([p_logits, p_logits]), [x], probs, params, g)
        counts[x if acc == 1 else nxt] += 1
    assert _tv(counts / n, p) < 0.02


def test_sampled_generations_follow_the_target_distribution(tiny):
    """Two-token continuations: distribution with a different drafter ≈ plain sampling."""
    t = tiny["target"]
    prompt = t.view.encode("Hello")
    params = lambda seed: SamplingParams(max_new_tokens=2, temperature=1.5, top_k=4, seed=seed, ignore_eos=True)  # noqa: E731
    plain_eng = SpecEngine(t)
    spec_eng = SpecEngine(t, drafters(tiny)["draft"], num_speculative_tokens=2)
    from collections import Counter

    n = 400
    a = Counter(tuple(plain_eng.generate(prompt, params(s)).tokens) for s in range(n))
    b = Counter(tuple(spec_eng.generate(prompt, params(10_000 + s)).tokens) for s in range(n))
    keys = set(a) | set(b)
    tv = 0.5 * sum(abs(a[k] - b[k]) for k in keys) / n
    assert len(keys) > 3  # a real distribution, not a point mass
    assert tv < 0.15, (tv, a.most_common(5), b.most_common(5))


class _Wrong(DraftSession):
    """Runs a "model" (``cost`` forwards per draft) and proposes a token the target never picks next."""

    def __init__(self, plain_tokens, prompt_len, cost):
        self.plain, self.n0, self.cost = plain_tokens, prompt_len, cost

    def propose(self, context, k, params, generator):
        self.forwards += self.cost
        i = len(context) - self.n0  # index of the next output token
        wrong = [(self.plain[i] + 1) % 50] if i < len(self.plain) else []
        return Proposal(wrong)


class _WrongDrafter(Drafter):
    name = "wrong"

    def __init__(self, plain_tokens, prompt_len, cost=2):
        self.plain, self.n0, self.cost = plain_tokens, prompt_len, cost

    def session(self, prompt):
        return _Wrong(self.plain, self.n0, self.cost)


@pytest.mark.parametrize("backoff", [True, False])
def test_a_drafter_that_keeps_missing_backs_off_and_output_is_unchanged(tiny, plain, backoff):
    t = tiny["target"]
    p = PROMPTS[1]
    ids = t.view.encode(p)
    engine = SpecEngine(t, _WrongDrafter(plain[p], len(ids)), num_speculative_tokens=1, backoff=backoff)
    r = engine.generate(ids, SamplingParams(max_new_tokens=48, ignore_eos=True))
    assert r.tokens == plain[p] and r.stats.accepted == 0
    steps = 46  # decode steps with room for a draft: not the prefill's token, not the last one
    if backoff:
        # misses 1-3, skip 1, miss, skip 2, miss, skip 4, miss, skip 8, miss, skip 16, miss, skip 16 (capped) …
        assert r.stats.skipped_drafts > 30 and r.stats.drafter_forwards // 2 + r.stats.skipped_drafts in (steps, steps + 1)
        assert r.stats.drafter_forwards // 2 <= 12
    else:
        assert r.stats.skipped_drafts == 0 and r.stats.drafter_forwards // 2 == steps


def test_cheap_misses_do_not_back_off(tiny, plain):
    """A draft the confidence gate stopped after one forward costs little: no back-off for it."""
    t = tiny["target"]
    p = PROMPTS[1]
    ids = t.view.encode(p)
    r = SpecEngine(t, _WrongDrafter(plain[p], len(ids), cost=1), num_speculative_tokens=1).generate(
        ids, SamplingParams(max_new_tokens=48, ignore_eos=True)
    )
    assert r.tokens == plain[p] and r.stats.skipped_drafts == 0


def test_free_proposals_never_back_off(tiny):
    t = tiny["target"]
    ids = t.view.encode(PROMPTS[2])
    r = SpecEngine(t, NgramDrafter(prompt_lookup_min=1, prompt_lookup_max=3), num_speculative_tokens=3).generate(
        ids, SamplingParams(max_new_tokens=48, ignore_eos=True)
    )
    assert r.stats.skipped_drafts == 0
