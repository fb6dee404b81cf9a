"""Reports for people and machines: a report is a list of :class:`Section` (title, columns, rows,
notes); the same sections render as rich tables or Markdown. JSON comes from the dataclasses.

>>> s = Section("Sizes", ["", "A", "B"], [["ids", "10", "12"]])
>>> print(to_markdown([s]))
### Sizes
<BLANKLINE>
|  | A | B |
| --- | --- | --- |
| ids | 10 | 12 |
<BLANKLINE>
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text


@dataclass
class Section:
    title: str
    columns: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)


def fmt_int(n: int | None) -> str:
    return "—" if n is None else f"{n:,}"


def fmt_pct(x: float | None, digits: int = 1) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.{digits}f} %"


def fmt_float(x: float | None, digits: int = 2) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _md_cell(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", "↵")


def to_markdown(sections: list[Section], *, title: str | None = None) -> str:
    out = [f"## {title}", ""] if title else []
    for s in sections:
        out += [f"### {s.title}", ""]
        if s.columns:
            out.append("| " + " | ".join(_md_cell(c) for c in s.columns) + " |")
            out.append("| " + " | ".join("---" for _ in s.columns) + " |")
            out += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in s.rows]
            out.append("")
        for n in s.notes:
            out += [n, ""]
    return "\n".join(out)


def print_sections(sections: list[Section], *, console=None, title: str | None = None) -> None:

    console = console or Console()
    if title:
        console.rule(Text(title, style="bold"))
    for s in sections:
        if s.columns and s.rows:
            t = Table(title=s.title, title_justify="left", title_style="bold", show_lines=False, expand=False)
            for i, c in enumerate(s.columns):
                t.add_column(c, overflow="fold", justify="right" if i and _numeric_column(s, i) else "left")
            for row in s.rows:
                t.add_row(*[Text(str(c)) for c in row])
            console.print(t)
        else:
            console.print(Text(s.title, style="bold"))
        for n in s.notes:
            console.print(Text(n), style="dim")
        console.print()


def _numeric_column(s: Section, i: int) -> bool:
    cells = [r[i] for r in s.rows if i < len(r) and r[i] not in ("", "—")]
    return bool(cells) and all(
        c.replace(",", "").replace(".", "").replace(" %", "").replace("×", "").lstrip("-").isdigit() for c in cells
    )


def to_jsonable(obj: Any) -> Any:
    """Dataclasses (with their public properties), bytes as latin-1-safe hex, tuples as lists."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out = {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj) if not f.name.startswith("_")}
        for name, attr in vars(type(obj)).items():
            if isinstance(attr, property) and not name.startswith("_"):
                out[name] = to_jsonable(getattr(obj, name))
        return out
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, bytes):
        return obj.hex()
    if isinstance(obj, float) and (math.isnan(obj) or math.isinf(obj)):
        return None
    return obj


def to_json(obj: Any) -> str:
    return json.dumps(to_jsonable(obj), ensure_ascii=False, indent=2)
