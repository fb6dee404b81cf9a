"""The coverage of a transplant, before any weights: how many target rows are copied, special,
composed (and from how many drafter pieces), or empty; by script; the specials paired by role.
Sections for a table or Markdown, a dict for JSON. Several targets make one table.

>>> print(to_markdown(coverage_sections([(plan, target_view)])))  # doctest: +SKIP
"""

from __future__ import annotations

from ..report import Section, fmt_int, fmt_pct
from ..tokenizer.scripts import SCRIPT_LABELS
from ..tokenizer.view import TokenizerView
from .plan import KINDS, RowPlan


def coverage_json(plan: RowPlan, target: TokenizerView) -> dict:
    return {
        "drafter": plan.drafter.__dict__,
        "target": plan.target.__dict__,
        "rows": plan.counts,
        "share": {k: round(v / plan.target.rows, 4) for k, v in plan.counts.items()},
        "pieces": plan.piece_lengths,
        "mean_pieces": round(plan.mean_pieces, 3),
        "lossy": plan.lossy,
        "special_pairs": {r: list(p) for r, p in plan.special_pairs.items()},
        "composed_specials": plan.composed_specials,
        "by_script": {s: c for s, c in plan.by_script(target).items() if c["copied"] or c["composed"]},
    }


def _name(source: str) -> str:
    return source.rstrip("/").rsplit("/", 1)[-1] or source


def coverage_sections(plans: list[tuple[RowPlan, TokenizerView]]) -> list[Section]:
    """One row per target: rows by kind (and share of the target's rows), pieces per composed token."""
    rows = []
    for plan, _ in plans:
        c, n = plan.counts, plan.target.rows
        lengths = plan.piece_lengths
        rows.append(
            [_name(plan.target.source), fmt_int(n)]
            + [f"{fmt_int(c[k])} ({fmt_pct(c[k] / n)})" for k in KINDS]
            + [f"{plan.mean_pieces:.2f}", " / ".join(fmt_int(lengths[x]) for x in ("1", "2", "3", "4+")), fmt_int(plan.lossy)]
        )
    drafter = plans[0][0].drafter if plans else None
    out = [
        Section(
            f"Transplant coverage: {_name(drafter.source) if drafter else ''} ({fmt_int(drafter.rows) if drafter else ''} rows) → target",
            ["target", "rows", *KINDS, "pieces per composed", "pieces 1 / 2 / 3 / 4+", "lossy"],
            rows,
            [
                "copied: the drafter's row for the same bytes; special: paired by role or content; composed: built "
                "from the drafter's spelling of the token (--init); empty: no bytes (padding rows), the mean row. "
                "lossy: composed tokens the drafter cannot spell byte for byte."
            ],
        )
    ]
    for plan, view in plans:
        scripts = [(s, c) for s, c in plan.by_script(view).items() if c["copied"] or c["composed"]]
        out.append(
            Section(
                f"By script: {_name(plan.target.source)} (base tokens)",
                ["script", "copied", "composed", "copied share"],
                [
                    [
                        SCRIPT_LABELS[s],
                        fmt_int(c["copied"]),
                        fmt_int(c["composed"]),
                        fmt_pct(c["copied"] / max(1, c["copied"] + c["composed"])),
                    ]
                    for s, c in scripts
                ],
                [
                    "specials paired by role: "
                    + (", ".join(f"{r} {t}←{d}" for r, (t, d) in plan.special_pairs.items()) or "none")
                    + f"; {plan.composed_specials} special tokens composed from their text"
                ],
            )
        )
    return out
