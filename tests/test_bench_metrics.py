"""The /metrics arithmetic on recorded pages: vLLM's (two engines, ``_created`` series, counters
that appear between scrapes) and ours, plus the edge cases (restarts, missing counters)."""

from __future__ import annotations

import pytest

from vocabbridge.bench.counters import SpecDelta, counter_delta, parse_counters
from vocabbridge.errors import MetricsError

M = 'model_name="LGAI-EXAONE/EXAONE-4.5-33B"'

# vLLM 0.11-style page after start-up: speculative config with 3 tokens, data parallel 2 (engine 0 and 1),
# prometheus_client's *_created series present, the per-position counters of engine 1 not created yet.
VLLM_BEFORE = f"""\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",{M}}} 0.0
vllm:num_requests_running{{engine="1",{M}}} 0.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{engine="0",{M}}} 1200.0
vllm:prompt_tokens_total{{engine="1",{M}}} 800.0
# HELP vllm:prompt_tokens_created Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_created gauge
vllm:prompt_tokens_created{{engine="0",{M}}} 1.7330e+09
vllm:prompt_tokens_created{{engine="1",{M}}} 1.7330e+09
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{engine="0",{M}}} 400.0
vllm:generation_tokens_total{{engine="1",{M}}} 400.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{{engine="0",finished_reason="stop",{M}}} 1.0
vllm:request_success_total{{engine="0",finished_reason="length",{M}}} 1.0
vllm:request_success_total{{engine="1",finished_reason="length",{M}}} 1.0
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{engine="0",{M}}} 200.0
vllm:spec_decode_num_drafts_total{{engine="1",{M}}} 100.0
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{{engine="0",{M}}} 600.0
vllm:spec_decode_num_draft_tokens_total{{engine="1",{M}}} 300.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{{engine="0",{M}}} 330.0
vllm:spec_decode_num_accepted_tokens_total{{engine="1",{M}}} 150.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",{M},position="0"}} 150.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",{M},position="1"}} 110.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",{M},position="2"}} 70.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="1",{M},position="0"}} 80.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="1",{M},position="1"}} 70.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_created Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_created gauge
vllm:spec_decode_num_accepted_tokens_per_pos_created{{engine="0",{M},position="0"}} 1.7330e+09
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.5",{M}}} 1.0
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",{M}}} 2.0
vllm:time_to_first_token_seconds_count{{engine="0",{M}}} 2.0
vllm:time_to_first_token_seconds_sum{{engine="0",{M}}} 1.25
"""

# One request later (it ran on engine 0): 100 tokens, 40 drafts of 3, 75 accepted; a new
# finished_reason series and engine 1's position="2" series appeared since the first scrape.
VLLM_AFTER = (
    VLLM_BEFORE.replace(
        f'vllm:prompt_tokens_total{{engine="0",{M}}} 1200.0', f'vllm:prompt_tokens_total{{engine="0",{M}}} 1537.0'
    )
    .replace(f'vllm:generation_tokens_total{{engine="0",{M}}} 400.0', f'vllm:generation_tokens_total{{engine="0",{M}}} 500.0')
    .replace(
        f'vllm:request_success_total{{engine="0",finished_reason="length",{M}}} 1.0',
        f'vllm:request_success_total{{engine="0",finished_reason="length",{M}}} 2.0\n'
        f'vllm:request_success_total{{engine="1",finished_reason="abort",{M}}} 0.0',
    )
    .replace(
        f'vllm:spec_decode_num_drafts_total{{engine="0",{M}}} 200.0', f'vllm:spec_decode_num_drafts_total{{engine="0",{M}}} 240.0'
    )
    .replace(
        f'vllm:spec_decode_num_draft_tokens_total{{engine="0",{M}}} 600.0',
        f'vllm:spec_decode_num_draft_tokens_total{{engine="0",{M}}} 720.0',
    )
    .replace(
        f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",{M}}} 330.0',
        f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",{M}}} 405.0',
    )
    .replace(f'{M},position="0"}} 150.0', f'{M},position="0"}} 185.0')
    .replace(f'{M},position="1"}} 110.0', f'{M},position="1"}} 135.0')
    .replace(
        f'{M},position="2"}} 70.0',
        f'{M},position="2"}} 85.0\nvllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="1",{M},position="2"}} 0.0',
    )
)

# Our server (vocabbridge serve): no *_created series, one engine; adaptive k drafted a 5th
# position for the first time during the request, so position="4" exists only after it.
OURS_BEFORE = """\
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="qwen2.5-coder-1.5b"} 0.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="qwen2.5-coder-1.5b"} 0.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="qwen2.5-coder-1.5b"} 0.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="qwen2.5-coder-1.5b"} 0.0
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="qwen2.5-coder-1.5b"} 0.0
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="qwen2.5-coder-1.5b"} 0.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="qwen2.5-coder-1.5b"} 0.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="qwen2.5-coder-1.5b",position="0"} 0.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="qwen2.5-coder-1.5b",position="1"} 0.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="qwen2.5-coder-1.5b",position="2"} 0.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="qwen2.5-coder-1.5b",position="3"} 0.0
"""

OURS_AFTER = """\
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="qwen2.5-coder-1.5b"} 114.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="qwen2.5-coder-1.5b"} 64.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="qwen2.5-coder-1.5b"} 0.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="qwen2.5-coder-1.5b"} 1.0
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="qwen2.5-coder-1.5b"} 20.0
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="qwen2.5-coder-1.5b"} 81.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="qwen2.5-coder-1.5b"} 43.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="qwen2.5-coder-1.5b",position="0"} 17.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="qwen2.5-coder-1.5b",position="1"} 12.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="qwen2.5-coder-1.5b",position="2"} 8.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="qwen2.5-coder-1.5b",position="3"} 5.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="qwen2.5-coder-1.5b",position="4"} 1.0
"""

# A vLLM server started without a speculative config: no spec-decode counters at all.
VLLM_NO_SPEC = """\
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 400.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 1.0
"""


def test_vllm_counters_sum_over_engines_and_skip_created_series():
    c = parse_counters(VLLM_BEFORE)
    assert c.values["drafts"] == 300 and c.values["draft_tokens"] == 900 and c.values["accepted"] == 480
    assert c.values["prompt_tokens"] == 2000  # the *_created gauges (1.7e9) are not counted
    assert c.values["requests"] == 3  # finished reasons summed
    assert c.accepted_per_pos == {0: 230, 1: 180, 2: 70}
    assert c.vllm_metrics and c.has_spec_counters


def test_vllm_delta_is_the_one_request_including_series_that_appeared_between_scrapes():
    d = counter_delta(parse_counters(VLLM_BEFORE), parse_counters(VLLM_AFTER))
    assert (d.drafts, d.draft_tokens, d.accepted) == (40, 120, 75)
    assert d.accepted_per_pos == [35, 25, 15]  # engine 1's new position="2" series counts from 0
    assert (d.prompt_tokens, d.generation_tokens, d.requests) == (337, 100, 1)
    assert d.acceptance_rate == pytest.approx(75 / 120)
    assert d.mean_acceptance_length == pytest.approx(1 + 75 / 40)
    assert d.per_position_acceptance == pytest.approx([35 / 40, 25 / 40, 15 / 40])
    assert sum(d.accepted_per_pos) == d.accepted and not d.notes


def test_our_delta_counts_a_position_first_seen_in_the_second_scrape():
    d = counter_delta(parse_counters(OURS_BEFORE), parse_counters(OURS_AFTER))
    assert (d.drafts, d.draft_tokens, d.accepted, d.generation_tokens, d.prompt_tokens, d.requests) == (20, 81, 43, 64, 114, 1)
    assert d.accepted_per_pos == [17, 12, 8, 5, 1]
    assert d.mean_acceptance_length == pytest.approx(1 + 43 / 20)


def test_a_counter_missing_from_the_first_scrape_counts_from_zero():
    """A server scraped before its first request may not have created a series yet."""
    before = parse_counters("# TYPE vllm:generation_tokens counter\nvllm:generation_tokens_total 5\n")
    d = counter_delta(before, parse_counters(OURS_AFTER))
    assert (d.drafts, d.draft_tokens, d.accepted, d.generation_tokens) == (20, 81, 43, 59)
    assert d.accepted_per_pos == [17, 12, 8, 5, 1]


def test_no_spec_counters_on_a_vllm_page_means_no_drafting():
    d = counter_delta(parse_counters(VLLM_NO_SPEC), parse_counters(VLLM_NO_SPEC.replace("400.0", "464.0")))
    assert (d.drafts, d.draft_tokens, d.accepted, d.generation_tokens) == (0, 0, 0, 64)
    assert not d.spec_counters
    assert d.acceptance_rate is None and d.mean_acceptance_length is None and d.per_position_acceptance == []


def test_a_page_without_vllm_metrics_leaves_acceptance_unknown():
    page = "# TYPE http_requests counter\nhttp_requests_total 3\n"
    d = counter_delta(parse_counters(page), parse_counters(page))
    assert d.accepted is None and d.draft_tokens is None and d.acceptance_rate is None


def test_a_counter_that_went_down_is_unknown_and_said_so():
    d = counter_delta(parse_counters(OURS_AFTER), parse_counters(OURS_BEFORE))  # the server restarted
    assert d.accepted is None and d.drafts is None
    assert any("went down" in n for n in d.notes)


def test_deltas_add_up():
    a = SpecDelta(
        drafts=2, draft_tokens=6, accepted=3, accepted_per_pos=[2, 1], generation_tokens=8, requests=1, spec_counters=True
    )
    b = SpecDelta(
        drafts=1, draft_tokens=3, accepted=3, accepted_per_pos=[1, 1, 1], generation_tokens=5, requests=1, spec_counters=True
    )
    s = a + b
    assert (s.drafts, s.draft_tokens, s.accepted, s.accepted_per_pos, s.generation_tokens, s.requests) == (
        3,
        9,
        6,
        [3, 2, 1],
        13,
        2,
    )
    assert (a + SpecDelta()).accepted is None  # unknown stays unknown


def test_a_page_that_is_not_prometheus_text_is_a_clear_error():
    with pytest.raises(MetricsError, match="not Prometheus text"):
        parse_counters("<html><body>Not found</body></html>\n")


def test_our_server_metrics_render_reads_back():
    """What vocabbridge serve renders is what bench parses (no _created series, vLLM names)."""
    from vocabbridge.server.prometheus import ServerMetrics

    m = ServerMetrics("tiny", speculative=True, num_spec_tokens=3)
    before = parse_counters(m.render().decode())
    with m.lock:
        m.spec_step(2, 6, 4, [2, 1, 1])
        m.generation_tokens.inc(7)
        m.success["length"].inc()
    d = counter_delta(before, parse_counters(m.render().decode()))
    assert (d.drafts, d.draft_tokens, d.accepted, d.accepted_per_pos, d.generation_tokens, d.requests) == (
        2,
        6,
        4,
        [2, 1, 1],
        7,
        1,
    )
