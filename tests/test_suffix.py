"""Suffix decoding (--drafter suffix): the incremental suffix tree against a brute-force reference,
worked drafts, the shared cache of earlier requests' outputs, and lossless decoding in the engine
(greedy identity for every drafter is in test_engine.py, the real checkpoint in test_real_models.py)."""

import importlib.util
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vocabbridge.engine import SamplingParams, SpecEngine
from vocabbridge.engine.drafters.suffix import Draft, SuffixDrafter, SuffixTree, find_suffix_draft
from vocabbridge.errors import ConfigError
from vocabbridge.spec import DRAFTERS, EngineSpec
from vocabbridge.vllm.config import speculative_config as vllm_speculative_config

GREEDY = SamplingParams()


def _propose(session, context, k=8):
    return session.propose(context, k, GREEDY, None).tokens


def _run(drafter, prompt, output, k=8):
    """One request through a drafter as the engine drives it: a proposal after every committed
    token, then finish; the proposals are returned."""
    s = drafter.session(prompt)
    proposals = [_propose(s, prompt + output[: i + 1], k) for i in range(len(output))]
    s.finish(prompt + output)
    return proposals


# ==== the rule, on worked cases =================================================================


def test_the_best_scoring_match_wins_not_the_longest():
    # "1 2" (2 tokens matched) was followed by 5, 6 and 4, once each: [5, 8] scores 1/3 + 1/3.
    # "2" alone was followed by 3 in 8 of its 11 occurrences: [3] scores 8/11, more.
    seq = [1, 2, 5, 8, 1, 2, 6, 8, 1, 2, 4, 8] + [7, 2, 3] * 8
    assert find_suffix_draft([seq], [0, 1, 2], k=8) == Draft([3], 8 / 11)
    # Without the third "1 2", [5, 8] scores 1/2 + 1/2 and wins.
    assert find_suffix_draft([seq[:8] + seq[12:]], [0, 1, 2], k=8) == Draft([5, 8], 1.0)


def test_a_frequent_continuation_beats_a_recent_one():
    # "5" was followed by 6 twice, then by 7 once: 6 (2 of its 4 occurrences, the last has no successor).
    assert find_suffix_draft([[5, 6, 5, 6, 5, 7, 5]], [9, 5], k=4) == Draft([6], 0.5)


def test_equal_counts_go_to_the_first_seen_once_and_to_the_last_to_reach_a_higher_count():
    # Once each: 7 came first.
    assert find_suffix_draft([[5, 7, 5, 6, 5]], [9, 5], k=4).tokens == [7]
    # Twice each: 6 got its second occurrence last.
    assert find_suffix_draft([[5, 7, 5, 6, 5, 7, 5, 6, 5]], [9, 5], k=4).tokens == [6]


@pytest.mark.parametrize("factor, want", [(0.5, [3]), (1.0, [3, 4]), (2.0, [3, 4, 5, 6])])
def test_the_spec_factor_caps_the_draft_by_the_match_length(factor, want):
    # "1 2" matches (2 tokens): at most factor × 2 tokens follow it.
    assert find_suffix_draft([[1, 2, 3, 4, 5, 6, 1, 2]], [0, 1, 2], k=8, max_spec_factor=factor).tokens == want


@pytest.mark.parametrize("min_prob, want", [(0.6, [3]), (0.4, [3, 4, 1, 2]), (0.0, [3, 4, 1, 2, 3, 5, 1, 2])])
def test_the_draft_stops_where_its_probability_falls_below_min_prob(min_prob, want):
    # After "1 2": 3 (3 of 4), then 4 (2 of 3: 0.5 in all), … then 3 again (1 of 2: 0.25 in all).
    seq = [1, 2, 3, 4, 1, 2, 3, 5, 1, 2, 3, 4, 1, 2]
    assert find_suffix_draft([seq], [0, 1, 2], k=8, max_spec_factor=10, min_prob=min_prob).tokens == want


def test_the_depth_bounds_match_plus_draft():
    # max_depth 4: the 1-token match "2" may draft 3 tokens, the 2-token match "1 2" only 2; 3 × 0.5 wins.
    assert find_suffix_draft([[1, 2, 3, 4, 5, 6, 1, 2]], [0, 1, 2], k=8, max_depth=4, max_spec_factor=10) == Draft([3, 4, 5], 1.5)


def test_k_caps_the_draft_and_nothing_matched_is_no_draft():
    assert find_suffix_draft([[1, 2, 3, 4, 5, 6, 1, 2]], [0, 1, 2], k=1, max_spec_factor=10).tokens == [3]
    assert find_suffix_draft([[1, 2, 3]], [7, 8], k=4) == Draft([], 0.0)
    assert find_suffix_draft([], [1, 2], k=4) == Draft([], 0.0)


# ==== the incremental tree against the brute force ==============================================

EXAMPLES = settings(max_examples=150, deadline=None)


@EXAMPLES
@given(
    st.lists(st.lists(st.integers(0, 3), max_size=14), min_size=1, max_size=3),
    st.lists(st.integers(0, 3), max_size=8),
    st.integers(2, 7),
    st.integers(1, 6),
    st.sampled_from([0.5, 1.0, 3.0]),
    st.sampled_from([0.0, 0.1, 0.3, 0.6]),
)
def test_the_tree_agrees_with_brute_force_as_sequences_grow(sequences, other, depth, k, factor, min_prob):
    tree = SuffixTree(depth)
    for s, seq in enumerate(sequences):
        tree.start(s)
        for i, token in enumerate(seq):
            tree.append(s, token)
            seen = [*sequences[:s], seq[: i + 1]]
            for context in (seq[: i + 1], other + seq[: i + 1]):
                want = find_suffix_draft(seen, context, k, max_depth=depth, max_spec_factor=factor, min_prob=min_prob)
                assert tree.draft(tree.match(context[-depth:]), k, factor, min_prob) == want, (seen, context)
            # A sequence's own end is read off its open suffixes, without a walk: the same matches.
            assert tree.ends(s) == tree.match(seq[max(0, i + 1 - depth) : i + 1])


def _substrings(sequences, depth):
    return {tuple(seq[i : i + n]) for seq in sequences for n in range(1, depth + 1) for i in range(len(seq) - n + 1)}


def _count(sequences, pattern):
    n = len(pattern)
    return sum(tuple(seq[i : i + n]) == pattern for seq in sequences for i in range(len(seq) - n + 1))


@EXAMPLES
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(-1, 2)), max_size=60), st.integers(2, 6))
def test_counts_hold_through_interleaved_appends_and_removals(ops, depth):
    """Sequences grow token by token in any order and are removed whole (token -1); every substring's
    count stays the brute-force count, and each node's proposed kid is one of its most frequent."""
    tree, live = SuffixTree(depth), {}
    for seq_id, token in ops:
        if token < 0:
            if seq_id in live:
                tree.remove(seq_id)
                del live[seq_id]
        else:
            tree.append(seq_id, token)
            live.setdefault(seq_id, []).append(token)
        for pattern in _substrings(live.values(), depth) | {(0, 1), (3, 3, 3)}:
            assert tree.count_of(pattern) == _count(live.values(), pattern), (live, pattern)
    for n, kids in enumerate(tree.kids):
        if kids and n not in tree._free:
            assert tree.count[tree.best[n]] == max(tree.count[c] for c in kids.values())
    for seq_id in list(live):
        tree.remove(seq_id)
    assert len(tree.kids) - len(tree._free) == 1 and not tree.kids[0]  # every node freed but the root


def test_tree_settings_are_checked():
    with pytest.raises(ConfigError, match="max_depth ≥ 2"):
        SuffixTree(1)
    with pytest.raises(ConfigError, match="min_prob"):
        SuffixDrafter(min_prob=1.5)


# ==== the drafter: its own tokens and the outputs of earlier requests ===========================


def test_a_request_drafts_from_its_own_prompt():
    d = SuffixDrafter(max_cached_requests=0)
    prompt = [10, 11, 12, 13, 14, 15, 1, 2]
    # After "… 1 2 10 11" the prompt's "10 11" continues "12 13" (a 2-token match drafts 2 tokens).
    assert _run(d, prompt, [10, 11])[-1] == [12, 13]


def test_a_second_request_drafts_from_the_first_ones_output():
    output = [20, 21, 22, 23, 24, 25, 26, 27]
    # The second prompt never saw 20 … 27; with the first output cached, "20 21" continues "22 23".
    # The running request holds a place in the cache too (as in Arctic Inference): 1 keeps only its own.
    for cached, want in ((2, [22, 23]), (1, []), (0, [])):
        d = SuffixDrafter(max_cached_requests=cached)
        _run(d, [1, 2, 3], output)
        assert _run(d, [4, 5, 6], [20, 21])[-1] == want, cached


def test_the_cache_forgets_the_oldest_requests_first():
    d = SuffixDrafter(max_cached_requests=2)
    _run(d, [1], [30, 31, 32, 33])
    _run(d, [1], [40, 41, 42, 43])
    assert d.describe()["cached_requests"] == 2
    s = d.session([1])  # the third request takes the first one's place
    assert _propose(s, [1, 30, 31]) == [] and _propose(s, [1, 30, 31, 40, 41]) == [42, 43]
    assert list(d.shared.seqs) == [1, 2]


def test_requests_running_together_draft_from_each_others_output():
    d = SuffixDrafter()
    a, b = d.session([1]), d.session([2])
    _propose(a, [1, 50, 51, 52, 53])  # committed by a, not finished
    assert _propose(b, [2, 50, 51]) == [52, 53]


def test_k_caps_the_session_draft():
    d = SuffixDrafter(max_spec_factor=10)
    _run(d, [1], list(range(60, 80)))
    assert [len(_run(d, [2], [60, 61, 62], k=k)[-1]) for k in (1, 3, 8)] == [1, 3, 8]


def test_a_long_prompt_is_indexed_in_chunks_while_warming():
    d = SuffixDrafter(max_cached_requests=0)
    prompt = list(range(100, 130)) * 2
    s = d.session(prompt)
    assert sum(1 for _ in s.warm(prompt + [100], 16)) == 3  # 61 tokens: indexed 16, 32, 48, then the rest on proposing
    assert _propose(s, prompt + [100], k=4) == [101, 102, 103, 104]  # the prompt's first half, matched by 23 tokens


# ==== the engine ================================================================================


def test_the_engine_hands_each_finished_request_to_the_next(tiny):
    t = tiny["target"]
    prompt = t.view.encode("Hello world! It's a beautiful day, isn't it?")
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    plain = SpecEngine(t).generate(prompt, params).tokens
    for cached in (1000, 0):
        engine = SpecEngine(t, SuffixDrafter(max_cached_requests=cached), num_speculative_tokens=4)
        first, second = engine.generate(prompt, params), engine.generate(prompt, params)
        assert first.tokens == second.tokens == plain
        if cached:  # the second run drafts the first one's output, and the target agrees
            assert second.stats.accepted > first.stats.accepted + 10
            assert second.stats.target_forwards < first.stats.target_forwards
        else:
            assert (second.stats.accepted, second.stats.drafts) == (first.stats.accepted, first.stats.drafts)


def test_a_closed_or_one_token_request_still_leaves_its_output(tiny):
    t = tiny["target"]
    d = SuffixDrafter()
    engine = SpecEngine(t, d, num_speculative_tokens=2)
    prompt = t.view.encode("def tokenize(text):")
    steps = engine.stream(prompt, SamplingParams(max_new_tokens=40, ignore_eos=True))
    emitted = [tok for _, step in zip(range(3), steps) for tok in step.tokens]
    steps.close()  # as the server does when a client goes away or a stop string ends the text
    assert d.shared.seqs[0] == emitted and len(emitted) >= 3
    one = engine.generate(prompt, SamplingParams(max_new_tokens=1, ignore_eos=True)).tokens
    assert d.shared.seqs[1] == one


# ==== configuration and vLLM ====================================================================


def test_the_spec_builds_the_drafter_and_vllms_suffix_config():
    spec = EngineSpec(target="t", drafter="suffix", num_speculative_tokens=6, suffix_max_depth=16, suffix_min_prob=0.2)
    d = DRAFTERS["suffix"].engine_class().from_spec(spec, None, None)
    assert d.describe() == {
        "name": "suffix",
        "max_depth": 16,
        "max_spec_factor": 1.0,
        "min_prob": 0.2,
        "max_cached_requests": 1000,
        "cached_requests": 0,
    }
    notes: list[str] = []
    assert vllm_speculative_config(spec, notes=notes) == {
        "method": "suffix",
        "num_speculative_tokens": 6,
        "suffix_decoding_max_tree_depth": 16,
        "suffix_decoding_max_cached_requests": 1000,
        "suffix_decoding_max_spec_factor": 1.0,
        "suffix_decoding_min_token_prob": 0.2,
    }
    assert any("arctic-inference" in n for n in notes) == (importlib.util.find_spec("arctic_inference") is None)


def test_vllm_takes_the_config_and_needs_arctic_inference_for_it():
    config = pytest.importorskip("vllm.config")
    cfg = vllm_speculative_config(EngineSpec(target="t", drafter="suffix", num_speculative_tokens=5))
    if importlib.util.find_spec("arctic_inference") is None:
        with pytest.raises(ImportError, match="Arctic Inference is required"):  # every key known, then this
            config.SpeculativeConfig(**cfg)
    else:
        sc = config.SpeculativeConfig(**cfg)
        assert (sc.method, sc.num_speculative_tokens, sc.suffix_decoding_max_tree_depth) == ("suffix", 5, 24)


def test_a_step_is_incremental_not_a_rebuild_of_the_context():
    """Each step indexes only the tokens committed since the last one (the trees' clocks count the
    tokens appended), so a step's cost does not grow with the context; speed lives in benchmarks."""
    rng = random.Random(0)
    phrases = [[rng.randrange(500) for _ in range(rng.randint(3, 15))] for _ in range(40)]
    context = [t for _ in range(300) for t in rng.choice(phrases)][:2100]
    drafter = SuffixDrafter(max_cached_requests=2)
    s = drafter.session(context[:100])
    _propose(s, context[:2000])
    own, shared = s.own._clock, drafter.shared._clock
    assert own == 2000 and shared == 1900  # the prompt is not in the shared tree: outputs only
    for end in range(2001, 2101):
        _propose(s, context[:end])
        assert (s.own._clock - own, drafter.shared._clock - shared) == (end - 2000, end - 2000)
