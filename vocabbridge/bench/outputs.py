"""A benchmark's results for people: rich tables / Markdown (through :mod:`vocabbridge.report`
sections), JSON for machines, and PNG plots. A run with ``--prefill-think`` variants gets a
"Prefill" section after "By prompt": each variant beside the plain requests.

>>> from vocabbridge.bench.results import BenchResult
>>> [s.title for s in sections(BenchResult(settings={}, prompts=[], configs=[]))]
['Configurations', 'By configuration', 'By prompt', 'Acceptance by draft position', 'Concurrency', 'Warm-up (excluded from the averages)']
"""

from __future__ import annotations

from pathlib import Path

from ..report import Section, fmt_float, fmt_pct, to_json, to_markdown
from ..util import atomic_write_text
from .plots import write_plots
from .prefill import variant_label
from .results import BenchResult, ConfigResult, Figures


def _x(v: float | None) -> str:
    return "—" if v is None else f"×{v:.2f}"


def _s(v: float | None) -> str:
    return "—" if v is None else f"{v:.2f} s"


def _thinking(t: bool | None) -> str:
    return {None: "model default", True: "on", False: "off"}[t]


def _planning(f: Figures) -> str:
    """Answers starting with planning notes, "n of N" (N: the answers that could be judged)."""
    return f"{f.planning_answers} of {f.answers}" if f.answers else "—"


def _positions(acc: list[float]) -> str:
    return " / ".join(f"{100 * a:.0f}" for a in acc) + " %" if acc else "—"


def _launch(c: ConfigResult) -> str:
    la = c.endpoint.launch
    if not la:
        return c.endpoint.url
    parts = [f"drafter {la.get('drafter', '?')}"]
    if la.get("mode") not in (None, "auto", "none", "ngram"):
        parts.append(f"mode {la['mode']}")
    if la.get("ngram_first"):
        parts.append("n-gram first")
    if la.get("num_speculative_tokens") and la.get("drafter") != "none":
        parts.append(f"k={la['num_speculative_tokens']}")
    return ", ".join(parts)


def sections(res: BenchResult) -> list[Section]:
    ok = [c for c in res.configs if c.error is None]
    cfg = Section(
        "Configurations",
        ["configuration", "server", "model", "/metrics", "notes"],
        [
            [c.name, _launch(c), c.model or "—", "yes" if c.metrics_available else "no", c.error or "; ".join(c.unmeasured) or ""]
            for c in res.configs
        ],
    )
    overall = Section(
        "By configuration",
        [
            "configuration",
            "requests",
            "decode tok/s",
            "speedup",
            "TTFT",
            "total time",
            "acceptance",
            "mean acc. length",
            "target forwards / token",
            "planning-note answers",
            "same answer as baseline",
        ],
        [
            [
                c.name,
                str(c.overall.requests) + (f" ({c.overall.failed} failed)" if c.overall.failed else ""),
                fmt_float(c.overall.decode_tokens_per_second),
                _x(c.overall.speedup),
                _s(c.overall.ttft),
                _s(c.overall.total_time),
                fmt_pct(c.overall.acceptance_rate),
                fmt_float(c.overall.mean_acceptance_length),
                fmt_float(c.overall.forwards_per_token),
                _planning(c.overall),
                f"{c.same_answers[0]} of {c.same_answers[1]}" if c.same_answers else "—",
            ]
            for c in ok
        ],
        [
            f"speedup: decode tokens/s against '{res.baseline}' (no drafting)." if res.baseline else "speedup: no baseline.",
            "target forwards / token = (generated − accepted) / generated: 1.00 without drafting.",
            "planning-note answers: answers that start with planning or meta talk ('Okay, the user…', '사용자가…') "
            "or hold a think tag, of those that could be judged.",
            "same answer as baseline (greedy runs): measured answers, prefilled ones included, that are the very text of "
            "the baseline's answer to the same prompt and repeat; a lossless drafter gives N of N.",
        ],
    )
    if any(v.prefill is not None for c in ok for v in c.by_prefill):
        overall.notes.append("plain requests (nothing prefilled); the --prefill-think variants are in 'Prefill'.")
    variants = any(p.prefill is not None for c in ok for p in c.by_prompt)
    by_prompt = Section(
        "By prompt",
        [
            "configuration",
            "prompt",
            "thinking",
            *(["prefill"] if variants else []),
            "n",
            "decode tok/s",
            "speedup",
            "TTFT",
            "acceptance",
            "mean acc. length",
            "target forwards / generated",
        ],
        [
            [
                c.name,
                p.prompt_id,
                _thinking(p.thinking),
                *([variant_label(p.prefill)] if variants else []),
                str(p.figures.requests),
                fmt_float(p.figures.decode_tokens_per_second),
                _x(p.figures.speedup),
                _s(p.figures.ttft),
                fmt_pct(p.figures.acceptance_rate),
                fmt_float(p.figures.mean_acceptance_length),
                f"{fmt_float(p.figures.target_forwards, 1)} / {fmt_float(p.figures.output_tokens, 1)}",
            ]
            for c in ok
            for p in c.by_prompt
        ],
    )
    prefill = _prefill_section(res) if variants else None
    k = max((len(c.overall.per_position_acceptance) for c in ok), default=0)
    pos = Section(
        "Acceptance by draft position",
        ["configuration"] + [f"pos {i + 1}" for i in range(k)],
        [
            [c.name]
            + [fmt_pct(a) for a in c.overall.per_position_acceptance]
            + ["—"] * (k - len(c.overall.per_position_acceptance))
            for c in ok
            if c.overall.per_position_acceptance
        ],
        ["share of drafts whose i-th token was accepted (accepted_per_pos[i] / drafts)."],
    )
    conc = Section(
        "Concurrency",
        [
            "configuration",
            "concurrent",
            "aggregate tok/s",
            "per-request decode tok/s",
            "per-request tok/s (queueing incl.)",
            "TTFT",
            "wall time",
            "acceptance",
        ],
        [
            [
                c.name,
                str(w.concurrency) + (f" ({w.failed} failed)" if w.failed else ""),
                fmt_float(w.aggregate_tokens_per_second),
                fmt_float(w.per_request_decode_tokens_per_second),
                fmt_float(w.per_request_tokens_per_second),
                _s(w.ttft),
                _s(w.wall_time),
                fmt_pct(w.acceptance_rate),
            ]
            for c in ok
            for w in c.concurrency
        ],
        ["aggregate = all output tokens of the wave / its wall time; acceptance over the whole wave."],
    )
    warm = Section(
        "Warm-up (excluded from the averages)",
        ["configuration", "prompt", "TTFT", "total time", "decode tok/s", "extra time vs. later mean"],
        [
            [
                c.name,
                c.warmup.prompt_id,
                _s(c.warmup.ttft),
                _s(c.warmup.total_time),
                fmt_float(c.warmup.decode_tokens_per_second),
                _s(c.warmup_extra_time),
            ]
            for c in ok
            if c.warmup is not None and c.warmup.ok
        ],
    )
    out = [cfg, overall, by_prompt, *([prefill] if prefill else []), pos, conc, warm]
    for s in out:
        if not s.rows:
            s.notes.insert(0, "nothing measured.")
    overall.notes += res.notes
    return out


def _prefill_section(res: BenchResult) -> Section:
    """Per configuration and thinking mode: the plain requests, then each prefill variant beside them."""
    rows = []
    for c in (c for c in res.configs if c.error is None):
        for v in c.by_prefill:
            f, plain = v.figures, c.plain_figures(v.thinking)
            vs_plain = (
                f.decode_tokens_per_second / plain.decode_tokens_per_second
                if v.prefill is not None and plain and plain.decode_tokens_per_second and f.decode_tokens_per_second
                else None
            )
            rows.append(
                [
                    c.name,
                    _thinking(v.thinking),
                    variant_label(v.prefill),
                    str(f.requests) + (f" ({f.failed} failed)" if f.failed else ""),
                    fmt_float(f.decode_tokens_per_second),
                    _x(vs_plain),
                    _x(f.speedup),
                    fmt_pct(f.acceptance_rate),
                    fmt_float(f.mean_acceptance_length),
                    _positions(f.per_position_acceptance),
                    _planning(f),
                ]
            )
    return Section(
        "Prefill",
        [
            "configuration",
            "thinking",
            "prefill",
            "n",
            "decode tok/s",
            "vs plain",
            "speedup",
            "acceptance",
            "mean acc. length",
            "acceptance by position",
            "planning-note answers",
        ],
        rows,
        [
            "prefill: the assistant turn sent started with a closed think block (continue_final_message); "
            "match = the built-in block in the prompt's language, en / ko = that block for every prompt, "
            "other values = that text; plain = nothing prefilled.",
            "vs plain: decode tokens/s against the same configuration's plain requests; "
            "speedup: against the baseline's requests with the same prefill.",
            "planning-note answers: answers that start with planning or meta talk, or hold a think tag, of those judged.",
        ],
    )


def settings_line(res: BenchResult) -> str:
    s = res.settings
    temp = "model default" if s.get("temperature") is None else s.get("temperature")
    return (
        f"max tokens {s.get('max_tokens')}, repeats {s.get('repeats')}, thinking {s.get('thinking')}, temperature {temp}, "
        f"concurrency {','.join(str(c) for c in s.get('concurrency', ()))}, "
        + (f"prefill think {', '.join(s['prefill_think'])}, " if s.get("prefill_think") else "")
        + f"prompts {', '.join(p['id'] for p in res.prompts)}"
    )


def markdown_report(res: BenchResult, *, plots: dict[str, str] | None = None, command: str | None = None) -> str:
    env = res.environment
    head = ["# vocabbridge bench", ""]
    if command:
        head += ["```bash", command, "```", ""]
    head += [
        f"- settings: {settings_line(res)}",
        f"- machine: {env.get('platform', '?')}, {env.get('cpu_count', '?')} CPUs, Python {env.get('python', '?')}; "
        f"{env.get('time', '')}",
        "",
    ]
    body = to_markdown(sections(res))
    figs = [""] + [f"![{name}]({file})" for name, file in (plots or {}).items()]
    return "\n".join(head) + body + "\n".join(figs) + "\n"


def write_outputs(res: BenchResult, out_dir: str | Path, *, command: str | None = None) -> dict[str, Path]:
    """results.json, report.md and the PNG plots in ``out_dir``; returns what was written."""

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plots = write_plots(res, out)
    atomic_write_text(out / "results.json", to_json(res) + "\n")
    atomic_write_text(out / "report.md", markdown_report(res, plots={k: p.name for k, p in plots.items()}, command=command))
    return {"json": out / "results.json", "markdown": out / "report.md", **plots}
