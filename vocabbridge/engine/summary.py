"""SpecStats and offline evaluations as report sections (rich tables / Markdown)."""

from __future__ import annotations

from ..report import Section, fmt_float, fmt_int, fmt_pct
from .offline import OfflineEval, SelfSpecPoint
from .stats import SpecStats


def stats_section(s: SpecStats, title: str = "Speculative decoding") -> Section:
    rows = [
        ["prompt tokens", fmt_int(s.prompt_tokens)],
        ["generated tokens", fmt_int(s.generated)],
        ["drafts / draft tokens / accepted", f"{s.drafts:,} / {s.draft_tokens:,} / {s.accepted:,}"],
        ["acceptance rate", fmt_pct(s.acceptance_rate)],
        ["mean acceptance length", fmt_float(s.mean_acceptance_length)],
        ["accepted per position", ", ".join(str(x) for x in s.accepted_per_pos) or "—"],
        ["target forwards (prefill counted once)", fmt_int(s.target_forwards)],
        ["tokens per target forward", fmt_float(s.tokens_per_target_forward)],
        ["drafter forwards", fmt_int(s.drafter_forwards)],
        ["steps without drafting (back-off)", fmt_int(s.skipped_drafts)],
        ["time to first token", f"{s.ttft:.2f} s"],
        ["time: draft / verify / other", f"{s.time_draft:.2f} / {s.time_verify:.2f} / {s.time_other:.2f} s"],
        ["tokens/s (decode)", fmt_float(s.decode_tokens_per_second)],
    ]
    return Section(title, ["", "value"], rows)


def offline_section(ev: OfflineEval, source: str) -> Section:
    rows = [[f"position {j + 1}", fmt_pct(a)] for j, a in enumerate(ev.acceptance_per_position)]
    rows += [
        ["mean target probability of the first proposal", fmt_float(ev.mean_target_prob, 3)],
        ["expected acceptance length (1 + Σ positions)", fmt_float(ev.expected_acceptance_length)],
        ["positions scored / with a proposal", f"{fmt_int(ev.positions)} / {fmt_int(ev.proposed)}"],
        ["seconds", fmt_float(ev.seconds)],
    ]
    return Section(f"Offline acceptance: {ev.name} drafter", ["", "value"], rows, [f"scored along {source}"])


def self_sweep_section(points: list[SelfSpecPoint], source: str, k: int) -> Section:
    """One row per early-exit depth L of a ``--drafter self:L`` sweep."""
    rows = [
        [
            f"self:{p.layers}",
            fmt_pct(p.acceptance_rate),
            fmt_float(p.mean_acceptance_length),
            fmt_float(p.draft_cost),
            f"×{fmt_float(p.estimated_speedup)}",
        ]
        for p in points
    ]
    v = points[0].verify_cost if points else float("nan")
    notes = [
        f"scored along {source}; k = {k}",
        "draft cost: one L-layer draft forward / one full target forward (one token each, the fastest of 5 rounds)",
        f"est. speedup: mean acceptance length / ({fmt_float(v)} for a {k + 1}-token verification + draft tokens × draft cost), "
        "in one-token target forwards; measure the real one with generate --compare-plain",
    ]
    columns = ["drafter", "acceptance rate", "mean acceptance length", "draft cost", "est. speedup"]
    return Section("Self-speculation: which L", columns, rows, notes)
