"""`vocabbridge bench --prefill-think`: the variants and their checks, the planning-notes flag on
worked examples, speedups compared like with like, and a run against real servers on loopback
(tiny models) whose prompts the server really continued."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from vocabbridge.bench import THINK_BLOCKS, BenchResult, BenchSettings, Endpoint, parse_prompts, sections, starts_with_planning
from vocabbridge.bench.client import Completion
from vocabbridge.bench.planning import answer_text
from vocabbridge.bench.prefill import decode_escapes, prefill_text
from vocabbridge.bench.results import ConfigResult, RequestResult, apply_speedups
from vocabbridge.chat import chat_prompt_ids, render_chat
from vocabbridge.cli import main
from vocabbridge.errors import BenchError
from vocabbridge.server import serve_in_thread

from .test_bench import _built

SUITE = (
    '{"id": "hello", "category": "chat", "language": "en", "messages": [{"role": "user", "content": "Hello! How are you?"}]}\n'
    '{"id": "annyeong", "category": "chat", "language": "ko", "messages": [{"role": "user", "content": "안녕하세요! 잘 지내요?"}]}\n'
)

# ==== the variants ======================================================================


def test_prefill_values_resolve_per_prompt_language():
    assert prefill_text("match", "ko") == THINK_BLOCKS["ko"] and prefill_text("match", "ko-KR") == THINK_BLOCKS["ko"]
    assert prefill_text("match", "en") == prefill_text("match", "") == prefill_text("match", "de") == THINK_BLOCKS["en"]
    assert prefill_text("en", "ko") == THINK_BLOCKS["en"] and prefill_text("ko", "en") == THINK_BLOCKS["ko"]
    assert prefill_text(r"<think>\nDone.\n</think>\n\n", "ko") == "<think>\nDone.\n</think>\n\n"
    assert decode_escapes(r"a\\nb") == r"a\nb"  # an escaped backslash stays one
    for block in THINK_BLOCKS.values():  # short, closed, the answer starting after a blank line
        assert block.startswith("<think>\n") and block.endswith("\n</think>\n\n") and len(block) < 100


@pytest.mark.parametrize(
    "values, message",
    [
        (("en", "en"), "given twice"),
        (("",), "give match, en, ko or the text"),
        ((r"\n\n",), "give match, en, ko or the text"),
        (("plain",), "always run"),
        ("en", "a tuple of values"),
    ],
)
def test_prefill_settings_are_checked(values, message):
    with pytest.raises(BenchError, match=message):
        BenchSettings(prefill_think=values)


def test_prefill_variants_multiply_the_measured_requests_only():
    s = BenchSettings(repeats=2, thinking="both", concurrency=(1, 4), prefill_think=("match", "en"))
    assert s.variants == [None, "match", "en"]
    assert s.requests_per_config(5) == 1 + 2 * 5 * 2 * 3 + 5 * 2  # warm-up, measured, the plain sweep


def test_cli_refuses_a_repeated_prefill_value():
    r = CliRunner().invoke(main, ["bench", "--url", "http://127.0.0.1:9", "--prefill-think", "en", "--prefill-think", "en"])
    assert r.exit_code == 1 and "given twice" in r.output


# ==== the planning-notes flag ===========================================================


@pytest.mark.parametrize(
    "text",
    [
        "Okay, the user is asking how to split chores between three flatmates.",
        "Okay, so the user wants a day trip plan.",
        "Alright, let's tackle this code review.",
        "Let me think about the rate limiter first.",
        "I need to summarize the design document.",
        "I'll start by listing the bugs in the module.",
        "First, I need to understand what the module does.",
        "The user wants a token bucket with tests.",
        "We need to answer in Korean.",
        "Hmm, the question is asking for three options.",
        "  **Okay, the user's request is clear.**",
        "사용자가 부모님과 함께할 당일치기 나들이 코스를 묻고 있습니다.",
        "사용자는 서울 근교 여행지를 원한다.",
        "먼저 요청 내용을 정리해 보겠습니다.",
        "우선, 조건을 하나씩 살펴보겠습니다.",
        "알겠습니다. 사용자의 요청은 당일치기 코스 추천입니다.",
        "알겠습니다. 이 요청은 부모님을 모시고 가는 나들이에 관한 것입니다.",
        "Here is the plan.\n</think>\n\nHere is the plan.",
        "<think>\nThe user wants a direct answer.",
    ],
)
def test_planning_openers_are_flagged(text):
    assert starts_with_planning(text)


@pytest.mark.parametrize(
    "text",
    [
        "Here is a fair way to split the chores between the three of you:\n\n1. Rotate weekly.",
        "Okay, here is a rota that works around night shifts.",
        "First, preheat the oven to 200 °C.",
        "You could take them to Suwon Hwaseong: the fortress walk is flat and short.",
        "The user manual covers installation; this summary covers the design.",
        "```python\nimport threading\n```",
        "토요일 당일치기라면 수원 화성을 추천합니다. 성곽길이 완만해서 부모님과 걷기 좋습니다.",
        "먼저 아침 일찍 출발하시는 것이 좋겠습니다.",
        "알겠습니다! 요청하신 코스를 추천해 드릴게요.",
        "",
    ],
)
def test_answers_are_not_flagged(text):
    assert not starts_with_planning(text)


def test_the_answer_is_what_follows_the_models_own_think_block():
    assert answer_text("<think>\nOkay, the user…\n</think>\n\nParis.", thinking=True) == "\n\nParis."
    assert answer_text("Okay, the user asks…", thinking=True) is None  # still thinking when it stopped
    assert answer_text("Paris.", "Okay, the user asks…", thinking=True) == "Paris."  # a reasoning parser split it off
    assert answer_text("Okay, the user asks…", thinking=False) == "Okay, the user asks…"
    assert answer_text("Okay, the user asks…", thinking=None) == "Okay, the user asks…"  # the model did not think
    # A reasoning parser never saw </think> (it was prefilled), so it filed the answer as reasoning.
    assert answer_text("", "Let me answer.", thinking=False, prefilled=True) == "Let me answer."
    assert answer_text("x</think>y", thinking=None, prefilled=True) == "x</think>y"  # a leftover tag stays in


# ==== figures and speedups, like with like ==============================================


def _req(config: str, prompt: str, variant: str | None, tps: float, text: str = "Paris.") -> RequestResult:
    # 11 tokens, 10 of them after the first one, in 10 / tps seconds
    comp = Completion(text=text, output_tokens=11, ttft=0.1, total_time=0.1 + 10 / tps, last_token_time=0.1 + 10 / tps)
    return RequestResult(config, "measure", prompt, "chat", False, 0, 1, comp, None, variant)


def _config(name: str, requests: list[RequestResult]) -> ConfigResult:
    c = ConfigResult(Endpoint(name, "http://x"), requests=requests)
    c.summarize()
    return c


def test_a_variant_is_compared_with_the_baselines_same_variant():
    base = _config("none", [_req("none", "p", None, 10.0), _req("none", "p", "en", 20.0)])
    mtp = _config(
        "mtp",
        [_req("mtp", "p", None, 20.0), _req("mtp", "p", "en", 40.0, "Okay, the user wants Paris."), _req("mtp", "p", "en", 40.0)],
    )
    apply_speedups([base, mtp], "none")
    assert mtp.overall.requests == 1 and mtp.overall.speedup == pytest.approx(2.0)  # plain requests only
    variants = {v.prefill: v.figures for v in mtp.by_prefill}
    assert [v.prefill for v in mtp.by_prefill] == [None, "en"]
    assert variants["en"].speedup == pytest.approx(2.0)  # 40 / 20, not 40 / 10
    assert {p.prefill: p.figures.speedup for p in mtp.by_prompt} == pytest.approx({None: 2.0, "en": 2.0})
    assert (variants["en"].planning_answers, variants["en"].answers) == (1, 2)
    assert mtp.plain_figures(False) is variants[None]
    res = BenchResult(settings={"prefill_think": ["en"]}, prompts=[], configs=[base, mtp], baseline="none")
    table = next(s for s in sections(res) if s.title == "Prefill")
    assert [(r[2], r[5], r[6], r[-1]) for r in table.rows if r[0] == "mtp"] == [
        ("plain", "—", "×2.00", "0 of 1"),
        ("en", "×2.00", "×2.00", "1 of 2"),  # vs this configuration's plain, vs the baseline's en
    ]


# ==== a real run ========================================================================


@pytest.fixture(scope="module")
def servers(tiny):
    handles = {name: serve_in_thread(_built(tiny, d), max_num_seqs=2) for name, d in (("none", "none"), ("self", "self"))}
    yield handles
    for h in handles.values():
        h.stop()


@pytest.fixture(scope="module")
def cli_run(servers, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prefill")
    (tmp / "p.jsonl").write_text(SUITE, encoding="utf-8")
    args = ["bench", "--url", servers["none"].url, "--name", "none", "--url", servers["self"].url, "--name", "self"]
    args += ["--prompts", str(tmp / "p.jsonl"), "--max-tokens", "6", "--repeats", "1", "--concurrency", "2"]
    args += ["--temperature", "0", "--thinking", "off", "--prefill-think", "en", "--prefill-think", "match"]
    r = CliRunner().invoke(main, [*args, "--out", str(tmp / "out")])
    assert r.exit_code == 0, r.output
    return r.stdout, json.loads((tmp / "out" / "results.json").read_text(encoding="utf-8")), tmp / "out"


def test_every_prompt_runs_plain_and_with_each_prefill(cli_run, tiny):
    """The server continued the prefilled assistant turn: its prompt is the chat rendered up to
    the end of the think block (token counts from the stream's usage)."""
    _, j, _ = cli_run
    view = tiny["target"].view
    prompts = {p.id: p for p in parse_prompts(SUITE)}
    assert j["settings"]["prefill_think"] == ["en", "match"]
    for c in j["configs"]:
        got = {(r["prompt_id"], r["prefill"]): r for r in c["requests"]}
        assert len(c["requests"]) == len(got) == 2 * 3
        for (pid, variant), r in got.items():
            messages = [dict(m) for m in prompts[pid].messages]
            want = None if variant is None else THINK_BLOCKS["ko" if (variant, pid) == ("match", "annyeong") else "en"]
            assert r["prefill_text"] == want and r["ok"] and r["output_tokens"] == 6
            if want is None:
                n = len(chat_prompt_ids(view, messages, enable_thinking=False))
            else:
                continued = render_chat(
                    view,
                    [*messages, {"role": "assistant", "content": want}],
                    add_generation_prompt=False,
                    enable_thinking=False,
                    continue_final_message=True,
                )
                assert continued.endswith(want)
                n = len(view.encode(continued))
            assert r["completion"]["prompt_tokens"] == n, (pid, variant)
            assert r["starts_with_planning"] in (True, False)
        assert all(r["prefill"] is None for w in c["concurrency"] for r in w["requests"])  # the sweep stays plain
        assert c["overall"]["requests"] == 2 and c["warmup"]["prefill"] is None
        assert [(v["thinking"], v["prefill"]) for v in c["by_prefill"]] == [(False, None), (False, "en"), (False, "match")]
        for v in c["by_prefill"]:
            f = v["figures"]
            assert f["requests"] == 2 and f["answers"] == 2 and f["decode_tokens_per_second"] > 0
    none, self_ = j["configs"]
    assert all(v["figures"]["acceptance_rate"] == 1.0 for v in self_["by_prefill"])  # the target drafting for itself
    assert all(v["figures"]["per_position_acceptance"][0] == 1.0 for v in self_["by_prefill"])


def test_speedups_pair_each_variant_with_the_baselines_same_variant(cli_run):
    _, j, _ = cli_run
    none, self_ = j["configs"]
    base = {v["prefill"]: v["figures"] for v in none["by_prefill"]}
    for v in self_["by_prefill"]:
        f = v["figures"]
        assert f["speedup"] == pytest.approx(f["decode_tokens_per_second"] / base[v["prefill"]]["decode_tokens_per_second"])
    base_prompts = {(p["prompt_id"], p["prefill"]): p["figures"] for p in none["by_prompt"]}
    assert len(self_["by_prompt"]) == 6
    for p in self_["by_prompt"]:
        b = base_prompts[p["prompt_id"], p["prefill"]]
        assert p["figures"]["speedup"] == pytest.approx(p["figures"]["decode_tokens_per_second"] / b["decode_tokens_per_second"])


def test_report_and_terminal_put_each_variant_beside_plain(cli_run):
    out, j, folder = cli_run
    md = (folder / "report.md").read_text(encoding="utf-8")
    assert "### Prefill" in md and "prefill think en, match" in md
    rows = [
        line
        for line in md.split("### Prefill")[1].split("###")[0].splitlines()
        if line.startswith("| none") or line.startswith("| self")
    ]
    assert [row.split(" | ")[:3] for row in rows] == [
        [f"| {c}", "off", v] for c in ("none", "self") for v in ("plain", "en", "match")
    ]
    planning = {
        (c["endpoint"]["name"], v["prefill"]): v["figures"]["planning_answers"] for c in j["configs"] for v in c["by_prefill"]
    }
    for row in rows:
        name, _, variant = (x.strip("| ") for x in row.split(" | ")[:3])
        assert row.rstrip(" |").endswith(f"{planning[name, None if variant == 'plain' else variant]} of 2")
    assert "| prefill |" in md.split("### By prompt")[1].split("###")[0]  # the by-prompt table names the variant too
    assert "Prefill" in out and "planning-note answers" in out and "match" in out
    assert md.index("### By prompt") < md.index("### Prefill") < md.index("### Acceptance by draft position")
