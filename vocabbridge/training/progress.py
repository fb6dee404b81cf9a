"""Progress for long phases: a rich bar on a terminal; elsewhere (logs, CI) plain lines, at most one
every ``VOCABBRIDGE_PROGRESS_SECONDS`` (30 s) besides the first update and the last (a heal's
thousands of steps wrote a line each), and one in that time without an update too (a batch of
generation can take minutes).

>>> with Progress(3, "steps", stream=io.StringIO()) as p:  # doctest: +SKIP
...     p.update(1, loss=2.5)
"""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress

from ..util import heartbeat, progress_every


class Progress:
    """``update(n, **info)`` advances by n and shows ``info`` (floats to 4 digits)."""

    def __init__(self, total: int, desc: str, *, unit: str = "", stream=None, quiet: bool = False):
        self.total, self.desc, self.unit, self.done = total, desc, unit, 0
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet
        self.t0 = self.said = self.updated = time.perf_counter()
        self.bar = None
        self._beat = None
        if not quiet and getattr(self.stream, "isatty", lambda: False)():
            self.bar = RichProgress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                TextColumn("{task.fields[info]}"),
                console=Console(file=self.stream),
                transient=False,
            )
            self.bar.start()
            self.task = self.bar.add_task(desc, total=total, info="")
        elif not quiet:
            self._beat = heartbeat(self._still, stream=self.stream)
            self._beat.__enter__()

    def _still(self, elapsed: float) -> str | None:
        if time.perf_counter() - max(self.said, self.updated) < progress_every():
            return None  # a line or an update came lately: the update's line will say it
        self.said = time.perf_counter()
        return f"{self.desc}: {self.done}/{self.total}{self.unit}  {elapsed:.0f} s  (working)"

    def update(self, n: int = 1, **info) -> None:
        self.done += n
        text = "  ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in info.items())
        if self.bar is not None:
            self.bar.update(self.task, advance=n, info=text)
        elif not self.quiet:
            now = self.updated = time.perf_counter()
            if self.done < self.total and self.done > n and now - self.said < progress_every():
                return  # off a terminal: a line every progress_every() seconds, the first and the last
            self.said = now
            elapsed = now - self.t0
            print(
                f"{self.desc}: {self.done}/{self.total}{self.unit}  {elapsed:.0f} s  {text}".rstrip(),
                file=self.stream,
                flush=True,
            )

    def close(self) -> None:
        if self._beat is not None:
            self._beat.__exit__(None, None, None)
            self._beat = None
        if self.bar is not None:
            self.bar.stop()
            self.bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
