import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vocabbridge.engine.drafters.ngram import NgramIndex, NgramMap, find_ngram_proposal
from vocabbridge.errors import ConfigError


def test_ngram_prefers_longest_match():
    # "2 3" occurred followed by 9; "3" alone most recently followed by 7: the 2-gram wins.
    assert find_ngram_proposal([2, 3, 9, 3, 7, 1, 2, 3], k=1, min_n=1, max_n=2) == [9]


def test_ngram_uses_most_recent_occurrence():
    assert find_ngram_proposal([1, 5, 1, 6, 1], k=1, min_n=1, max_n=1) == [6]


def test_no_match_for_4gram_but_match_for_3gram():
    assert find_ngram_proposal([9, 1, 2, 3, 4, 8, 1, 2, 3], k=2, min_n=3, max_n=4) == [4, 8]


def test_min_n_is_respected():
    assert find_ngram_proposal([1, 2, 3, 1], k=2, min_n=2, max_n=3) == []


def test_proposal_may_run_into_the_suffix_itself():
    # Overlapping occurrence: "1 1" ... the proposal continues from inside the current suffix.
    assert find_ngram_proposal([1, 1, 1], k=3, min_n=1, max_n=2) == [1]


def test_no_match_gives_an_empty_list():
    assert find_ngram_proposal([1, 2, 3], k=4) == []
    assert find_ngram_proposal([], k=4) == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 4), max_size=40), st.integers(1, 3), st.integers(0, 2), st.integers(1, 5))
def test_incremental_index_agrees_with_the_pure_function(tokens, min_n, extra, k):
    max_n = min_n + extra
    index = NgramIndex(min_n, max_n)
    for end in range(len(tokens) + 1):
        prefix = tokens[:end]
        assert index.propose(prefix, k) == find_ngram_proposal(prefix, k, min_n, max_n)


# ==== the n-gram map ============================================================================


def _reference_map_proposal(tokens, k, n, m, min_hits):
    """The n-gram map by brute force: count every complete (key, value) occurrence before the end."""
    key = tuple(tokens[len(tokens) - n :]) if len(tokens) >= n else None
    counts: dict = {}
    for i in range(len(tokens) - n - m + 1):
        if tuple(tokens[i : i + n]) == key:
            value = tuple(tokens[i + n : i + n + m])
            hits, _ = counts.get(value, (0, i))
            counts[value] = (hits + 1, i)
    if not counts:
        return []
    value, (hits, _) = max(counts.items(), key=lambda kv: kv[1])
    return list(value[:k]) if hits >= min_hits else []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=40), st.integers(1, 3), st.integers(1, 4), st.integers(1, 3), st.integers(1, 5))
def test_ngram_map_agrees_with_brute_force_as_the_context_grows(tokens, n, m, min_hits, k):
    ngram_map = NgramMap(n, m, min_hits)
    for end in range(len(tokens) + 1):
        prefix = tokens[:end]
        assert ngram_map.propose(prefix, k) == _reference_map_proposal(prefix, k, n, m, min_hits), prefix


def test_ngram_map_prefers_the_frequent_continuation_over_the_recent_one():
    tokens = [7, 8, 1, 2] + [7, 8, 1, 2] + [7, 8, 5, 6] + [7, 8]
    assert NgramMap(2, 2, 1).propose(tokens, 4) == [1, 2]  # twice against once
    assert find_ngram_proposal(tokens, 2, 1, 2) == [5, 6]  # prompt lookup: the last occurrence


def test_ngram_map_settings_are_checked():
    with pytest.raises(ConfigError, match="min-hits"):
        NgramMap(0, 2, 1)
