"""`vocabbridge bench` against the real embedded server (tiny models on loopback ports): every
figure in the JSON, each /metrics delta attributed to its own request, the warm-up kept out of
the averages, the plots, and the ways configurations are started and fail."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from vocabbridge.bench import BenchSettings, Endpoint, bench_urls, parse_prompts, sections, write_outputs
from vocabbridge.bench.client import BenchClient
from vocabbridge.bench.counters import counter_delta
from vocabbridge.bench.results import ConfigResult, Figures, RequestResult
from vocabbridge.cli import main
from vocabbridge.engine import SamplingParams
from vocabbridge.engine.factory import EngineSpec, build_engine
from vocabbridge.errors import BenchError, ConfigError
from vocabbridge.launcher import LaunchSettings, bench_launched
from vocabbridge.report import to_json
from vocabbridge.server import serve_in_thread
from vocabbridge.spec import parse_drafters

SUITE = (
    '{"id": "hello", "category": "chat", "language": "en", "messages": [{"role": "user", "content": "Hello world! How are you?"}]}\n'
    '{"id": "code", "category": "code", "language": "en", "messages": [{"role": "user", "content": "def tokenize(text):"}]}\n'
)
MAX_TOKENS = 8
SETTINGS = BenchSettings(max_tokens=MAX_TOKENS, repeats=2, thinking="off", temperature=0, concurrency=(1, 3))


def _built(tiny, drafter: str):
    t = tiny["target"]
    loaded = {t.source: t, tiny["draft"].source: tiny["draft"]}
    name = {"self": t.source, "draft": tiny["draft"].source}.get(drafter, drafter)
    # the loaded fp32 models; drafters not int8: see below. A fixed draft length: the default would choose
    # it from timings (row_cost_ratio), and this module counts drafts exactly.
    kw = {"dtype": "float32", "drafter_dtype": "float32", "cost_aware": False}
    # fp32 drafters, so that the target drafting for itself proposes exactly its own greedy tokens.
    return build_engine(EngineSpec(target=t.source, drafter=name, num_speculative_tokens=3, **kw), loaded=loaded)


@pytest.fixture(scope="module")
def servers(tiny):
    """Three real servers: no drafting, the target drafting for itself (all accepted), a small drafter."""
    handles = {
        name: serve_in_thread(_built(tiny, d), max_num_seqs=4)
        for name, d in (("none", "none"), ("self", "self"), ("draft", "draft"))
    }
    yield handles
    for h in handles.values():
        h.stop()


@pytest.fixture(scope="module")
def run(servers):
    """One benchmark of the three, with scrapes of each server before and after it."""
    prompts = parse_prompts(SUITE)
    clients = {n: BenchClient(h.url) for n, h in servers.items()}
    before = {n: c.scrape() for n, c in clients.items()}
    res = bench_urls([Endpoint(n, h.url) for n, h in servers.items()], prompts, SETTINGS)
    after = {n: c.scrape() for n, c in clients.items()}
    for c in clients.values():
        c.close()
    return res, {n: counter_delta(before[n], after[n]) for n in servers}


def test_json_carries_every_figure(run):
    res, _ = run
    j = json.loads(to_json(res))
    assert [c["endpoint"]["name"] for c in j["configs"]] == ["none", "self", "draft"] and j["baseline"] == "none"
    for c in j["configs"]:
        assert c["metrics_available"] and c["error"] is None
        assert len(c["requests"]) == 2 * 2  # repeats × prompts × one thinking mode
        for r in c["requests"]:
            assert r["ok"] and r["output_tokens"] == MAX_TOKENS and r["completion"]["tokens_from"] == "usage"
            assert r["ttft"] > 0 and r["total_time"] >= r["ttft"] and r["decode_tokens_per_second"] > 0
            assert r["metrics"]["requests"] == 1 and r["target_forwards"] is not None
        o = c["overall"]
        for key in ("decode_tokens_per_second", "ttft", "total_time", "speedup", "forwards_per_token", "target_forwards"):
            assert o[key] is not None, key
        assert {p["prompt_id"] for p in c["by_prompt"]} == {"hello", "code"}
        assert all(p["figures"]["speedup"] is not None and p["figures"]["requests"] == 2 for p in c["by_prompt"])
        assert [w["concurrency"] for w in c["concurrency"]] == [1, 3]
        waves = [[r["prompt_id"] for r in w["requests"]] for w in c["concurrency"]]
        assert waves[0] == waves[1] and len(waves[0]) == 4  # every level runs the same set: 2 prompts × ceil(3 / 2)
        for w in c["concurrency"]:
            assert w["aggregate_tokens_per_second"] > 0 and w["per_request_decode_tokens_per_second"] > 0
            assert w["failed"] == 0
        assert c["warmup"]["phase"] == "warmup" and c["warmup"]["ok"]
    none, self_, draft = j["configs"]
    assert none["overall"]["speedup"] == 1.0
    assert none["overall"]["acceptance_rate"] is None and none["overall"]["forwards_per_token"] == 1.0
    assert self_["overall"]["acceptance_rate"] == 1.0  # the target drafting for itself, greedy
    assert self_["overall"]["mean_acceptance_length"] > 2 and self_["overall"]["forwards_per_token"] < 0.5
    assert self_["overall"]["per_position_acceptance"][0] == 1.0
    assert 0 <= draft["overall"]["acceptance_rate"] <= 1 and len(draft["overall"]["per_position_acceptance"]) == 3
    # greedy: every drafter gives the baseline's very answers (lossless), and the table says so
    assert [c["same_answers"] for c in j["configs"]] == [[4, 4], [4, 4], [4, 4]]
    overall = next(s for s in sections(res) if s.title == "By configuration")
    assert [row[-1] for row in overall.rows] == ["4 of 4"] * 3


def test_each_request_gets_exactly_its_own_counter_deltas(run, tiny):
    """Per request, the server's counters moved by what the engine alone does for that prompt."""
    from vocabbridge.chat import chat_prompt_ids

    res, _ = run
    prompts = {p.id: p for p in parse_prompts(SUITE)}
    for name in ("self", "draft"):
        oracle = _built(tiny, name).engine  # same models, a fresh engine: no shared state with the server's
        for r in res.config(name).requests:
            ids = chat_prompt_ids(tiny["target"].view, [dict(m) for m in prompts[r.prompt_id].messages], enable_thinking=False)
            s = oracle.generate(ids, SamplingParams(max_new_tokens=MAX_TOKENS, temperature=0)).stats
            m = r.metrics
            assert (m.drafts, m.draft_tokens, m.accepted) == (s.drafts, s.draft_tokens, s.accepted), (name, r.prompt_id)
            assert m.accepted_per_pos == s.accepted_per_pos + [0] * (3 - len(s.accepted_per_pos))
            assert m.generation_tokens == r.output_tokens == s.generated and m.prompt_tokens == len(ids)
            assert r.target_forwards == s.generated - s.accepted


def test_per_request_and_wave_deltas_add_up_to_the_whole_run(run):
    res, totals = run
    for c in res.configs:
        parts = [c.warmup.metrics] + [r.metrics for r in c.requests] + [w.metrics for w in c.concurrency]
        total = parts[0]
        for p in parts[1:]:
            total = total + p
        t = totals[c.name]
        assert (total.drafts, total.draft_tokens, total.accepted, total.generation_tokens, total.requests) == (
            t.drafts,
            t.draft_tokens,
            t.accepted,
            t.generation_tokens,
            t.requests,
        )
        assert total.accepted_per_pos == t.accepted_per_pos
        assert t.requests == 1 + 4 + 4 + 4  # warm-up, measured, and the same 4-request set at concurrency 1 and 3


def test_warmup_is_reported_but_not_averaged(run):
    res, _ = run
    for c in res.configs:
        assert c.warmup not in c.requests and all(r.phase == "measure" for r in c.requests)
        assert c.overall.requests == len(c.requests) == 4
        assert c.overall.total_time == pytest.approx(sum(r.total_time for r in c.requests) / 4)


def _request(total_time: float, phase: str = "measure") -> RequestResult:
    from vocabbridge.bench.client import Completion
    from vocabbridge.bench.counters import SpecDelta

    comp = Completion(text="x", output_tokens=11, ttft=0.5, total_time=total_time, last_token_time=total_time)
    return RequestResult(
        "c",
        phase,
        "p",
        "chat",
        None,
        0,
        1,
        comp,
        SpecDelta(
            drafts=4, draft_tokens=8, accepted=6, accepted_per_pos=[4, 2], generation_tokens=11, requests=1, spec_counters=True
        ),
    )


def test_a_slow_warmup_does_not_move_the_averages():
    c = ConfigResult(Endpoint("c", "http://x"), warmup=_request(100.0, "warmup"), requests=[_request(1.5), _request(2.5)])
    c.summarize()
    assert c.overall.total_time == 2.0 and c.overall.requests == 2
    assert c.overall.decode_tokens_per_second == pytest.approx((10 / 1.0 + 10 / 2.0) / 2)
    assert c.warmup_extra_time == pytest.approx(98.0)
    assert c.overall.acceptance_rate == 0.75 and c.overall.mean_acceptance_length == 2.5
    assert c.overall.per_position_acceptance == [1.0, 0.5] and c.overall.forwards_per_token == pytest.approx(5 / 11)
    assert Figures.of([]).decode_tokens_per_second is None


def test_plots_and_reports_are_written(run, tmp_path):
    import matplotlib.image

    res, _ = run
    written = write_outputs(res, tmp_path / "out", command="vocabbridge bench --url ...")
    for key in ("tokens_per_second", "acceptance_by_position", "throughput_concurrency"):
        png = written[key]
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        img = matplotlib.image.imread(png)
        assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 300
    md = written["markdown"].read_text(encoding="utf-8")
    assert (
        "### By configuration" in md and "![tokens_per_second](tokens_per_second.png)" in md and "vocabbridge bench --url" in md
    )
    assert json.loads(written["json"].read_text(encoding="utf-8"))["baseline"] == "none"


@pytest.mark.parametrize("page", ["missing", "html"])
def test_a_server_without_metrics_is_measured_and_says_what_it_could_not(tiny, page):
    from fastapi.responses import HTMLResponse

    with serve_in_thread(_built(tiny, "draft")) as h:
        h.app.router.routes[:] = [r for r in h.app.router.routes if getattr(r, "path", "") != "/metrics"]
        if page == "html":  # some servers answer every path with their web page
            h.app.add_api_route("/metrics", lambda: HTMLResponse("<html><body>hello</body></html>"))
        res = bench_urls(
            [Endpoint("plain", h.url)],
            parse_prompts(SUITE),
            BenchSettings(max_tokens=4, repeats=1, temperature=0, concurrency=(), warmup=False),
        )
    c = res.config("plain")
    assert not c.metrics_available and c.overall.decode_tokens_per_second > 0
    assert c.overall.acceptance_rate is None and c.overall.forwards_per_token is None
    why = "no Prometheus /metrics" if page == "missing" else "/metrics: the /metrics page is not Prometheus text"
    assert any(why in u for u in c.unmeasured), c.unmeasured
    assert res.baseline is None and any("speedup not measured" in n for n in res.notes)


def test_cli_against_running_servers(servers, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(SUITE, encoding="utf-8")
    args = [
        "bench",
        "--url",
        servers["none"].url,
        "--name",
        "none",
        "--url",
        servers["self"].url + "/v1",
        "--name",
        "self",
        "--prompts",
        str(f),
        "--categories",
        "code",
        "--max-tokens",
        "4",
        "--repeats",
        "1",
        "--concurrency",
        "2",
        "--temperature",
        "0",
        "--thinking",
        "both",
        "--out",
        str(tmp_path / "out"),
        "--json",
    ]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    j = json.loads(r.stdout)
    assert [c["endpoint"]["name"] for c in j["configs"]] == ["none", "self"]
    assert [(x["prompt_id"], x["thinking"]) for x in j["configs"][1]["by_prompt"]] == [("code", True), ("code", False)]
    assert j["settings"]["temperature"] == 0 and j["settings"]["concurrency"] == [2]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "acceptance_by_position.png",
        "report.md",
        "results.json",
        "throughput_concurrency.png",
        "tokens_per_second.png",
    ]


def test_cli_starts_configurations_in_process_and_reports_one_that_fails(tiny, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(SUITE, encoding="utf-8")
    target = tiny["target"].source
    args = [
        "bench",
        "--target",
        target,
        "--drafters",
        f"none,ngram,{tmp_path / 'no-such-model'}",
        "--backend",
        "embedded",
        "--dtype",
        "float32",
        "--prompts",
        str(f),
        "--max-tokens",
        "4",
        "--repeats",
        "1",
        "--concurrency",
        "none",
        "--no-warmup",
        "--temperature",
        "0",
    ]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 1
    last = r.output.strip().splitlines()[-1]
    assert last.startswith("Error: 1 of 3 configurations could not be benchmarked; no-such-model:"), last
    assert "By configuration" in r.output and "ngram" in r.output


def test_subprocess_launch_serves_benches_and_stops(tiny):
    ls = LaunchSettings(
        EngineSpec(target=tiny["target"].source, dtype="float32"), backend="embedded", launch="subprocess", startup_timeout=120
    )
    res = bench_launched(
        parse_drafters("ngram"),
        ls,
        parse_prompts(SUITE)[:1],
        BenchSettings(max_tokens=4, repeats=1, temperature=0, concurrency=(), warmup=False),
    )
    c = res.config("ngram")
    assert c.error is None and c.endpoint.launch["launch"] == "subprocess" and c.overall.requests == 1
    assert c.endpoint.launch["command"][:5] == ["serve", "--target", tiny["target"].source, "--drafter", "ngram"]
    assert c.overall.spec is not None and c.overall.spec.spec_counters
    with pytest.raises(Exception):  # stopped: nothing listens there any more
        BenchClient(c.endpoint.url, timeout=2).model()


def test_subprocess_that_cannot_start_says_why_in_one_line(tmp_path, monkeypatch):
    """`vocabbridge serve` refusing the configuration (here a missing model; --drafter suffix in vLLM
    without arctic-inference alike) is reported as its one-line error, not as the tail of its log."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the server log it keeps
    ls = LaunchSettings(
        EngineSpec(target=str(tmp_path / "missing-model")), backend="embedded", launch="subprocess", startup_timeout=120
    )
    res = bench_launched(parse_drafters("none"), ls, parse_prompts(SUITE), BenchSettings(max_tokens=4, repeats=1))
    err = res.config("none").error
    assert (
        err
        == f"none: {tmp_path / 'missing-model'}: no such file or folder; give a model folder, a .gguf file, a preset or a hub id (org/name)."
    )
    log = next(tmp_path.glob("vocabbridge-bench-*/serve.log"))
    assert log.read_text().splitlines()[-1] == "Error: " + err[len("none: ") :]


def test_serve_command_passes_every_engine_option_as_serve_spells_it():
    import dataclasses

    from vocabbridge.cli.serve_cmd import serve_cmd
    from vocabbridge.launcher import NOT_SERVE_OPTIONS, serve_command

    from .test_spec import CHANGED as changed  # a non-default value for every field, kept in one place

    fields = {f.name for f in dataclasses.fields(EngineSpec)} - set(NOT_SERVE_OPTIONS)
    assert fields <= set(changed), f"a new EngineSpec field to pass to serve: {fields - set(changed)}"
    spec = EngineSpec(target="t", drafter="d", **{k: v for k, v in changed.items() if k in fields})
    argv = serve_command(spec, backend="embedded", port=9, max_num_seqs=2)[3:]
    known = {o for p in serve_cmd.params for o in [*p.opts, *getattr(p, "secondary_opts", [])]}
    flags = [a for a in argv[1:] if a.startswith("-")]
    assert len(flags) == len(fields) + 2 + 4 and set(flags) <= known, set(flags) - known
    assert argv[argv.index("-k") + 1] == "3" and "--adaptive-k" in argv and "--ngram-first" in argv


def test_drafter_lists_and_settings_are_checked():
    assert [d.name for d in parse_drafters("none,smollm2-135m:bridged,smollm2-135m:text")] == [
        "none",
        "smollm2-135m:bridged",
        "smollm2-135m:text",
    ]
    with pytest.raises(ConfigError, match="more than once"):
        parse_drafters("ngram,ngram")
    with pytest.raises(ConfigError, match="a mode applies to model drafters only"):
        parse_drafters("ngram:text")
    with pytest.raises(ConfigError, match="empty item"):
        parse_drafters("none,,ngram")
    with pytest.raises(BenchError, match="--thinking must be one of"):
        BenchSettings(thinking="maybe")
    r = CliRunner().invoke(main, ["bench", "--url", "http://127.0.0.1:9", "--concurrency", "1,x"])
    assert r.exit_code == 2 and "comma-separated positive integers" in r.output
    r = CliRunner().invoke(main, ["bench", "--url", "http://127.0.0.1:9", "--drafters", "none"])
    assert r.exit_code == 1 and "either --url" in r.output


def test_an_unreachable_url_fails_before_anything_runs(servers):
    r = CliRunner().invoke(main, ["bench", "--url", servers["none"].url, "--url", "http://127.0.0.1:9", "--max-tokens", "2"])
    assert r.exit_code == 1
    assert r.output.startswith("Error: http://127.0.0.1:9 is not reachable") and "is the server running" in r.output


def test_report_names_the_ngram_first_hybrid():
    from types import SimpleNamespace

    from vocabbridge.bench.outputs import _launch

    la = {"drafter": "smollm2-135m", "mode": "bridged", "ngram_first": True, "num_speculative_tokens": 6}
    assert _launch(SimpleNamespace(endpoint=SimpleNamespace(launch=la, url="u"))) == (
        "drafter smollm2-135m, mode bridged, n-gram first, k=6"
    )
