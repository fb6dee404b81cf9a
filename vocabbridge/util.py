"""Small helpers shared by several modules."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from .errors import InputFileError


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# Read once at import: setting and restoring it at every write would, for that moment, give files
# that other threads create a umask of 0.
_UMASK = _read_umask()


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file + rename: never a half-written file.

    The file gets the permissions a plain ``open(path, "w")`` would give it (mkstemp's are 0600,
    which would hide a map or a report from a server running as another user).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def common_prefix_len(xs, ys) -> int:
    """Length of the common prefix of two sequences (C-speed slice compares, binary search).

    >>> common_prefix_len([1, 2, 3], [1, 2, 4, 5])
    2
    """
    n = min(len(xs), len(ys))
    if xs[:n] == ys[:n]:
        return n
    lo, hi = 0, n - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if xs[:mid] == ys[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def read_text_file(path: str | Path) -> str:
    """A UTF-8 text file's content; a missing or non-UTF-8 file is an error saying which."""
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise InputFileError(f"{p}: no such text file.") from e
    except IsADirectoryError as e:
        raise InputFileError(f"{p} is a folder; give a text file.") from e
    except UnicodeDecodeError as e:
        raise InputFileError(f"{p}: not UTF-8 text (byte {e.start}); pass UTF-8 files to --text.") from e


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")


def looks_like_hub_id(source: str) -> bool:
    """``org/name`` as the Hugging Face hub spells a repository (not a file name).

    >>> looks_like_hub_id("Qwen/Qwen2.5-Coder-1.5B-Instruct"), looks_like_hub_id("qwen2.5-coder-05b")
    (True, False)
    >>> looks_like_hub_id("models/q.gguf"), looks_like_hub_id("./x/y")
    (False, False)
    """
    return bool(_HUB_ID.match(source)) and not source.endswith((".json", ".gguf", ".tiktoken", ".model", ".txt"))


PROGRESS_ENV = "VOCABBRIDGE_PROGRESS_SECONDS"  # how often a long phase says it is still working, off a terminal


def progress_every() -> float:
    """Seconds between progress lines off a terminal (``VOCABBRIDGE_PROGRESS_SECONDS``, default 30)."""
    try:
        return max(0.05, float(os.environ.get(PROGRESS_ENV, "30")))
    except ValueError:
        return 30.0


@contextlib.contextmanager
def heartbeat(line: Callable[[float], str | None], *, stream=None, every: float | None = None) -> Iterator[None]:
    """While the block runs, off a terminal, print ``line(seconds so far)`` to stderr every
    :func:`progress_every` seconds (a line of None is skipped). rich's bars and spinners draw only
    on a terminal, so in a log, a pipe or CI a long phase printed nothing for many minutes.

    >>> with heartbeat(lambda s: f"working ({s:.0f} s)", stream=io.StringIO()):  # doctest: +SKIP
    ...     time.sleep(65)
    """
    stream = stream if stream is not None else sys.stderr
    if getattr(stream, "isatty", lambda: False)():
        yield
        return
    every = every or progress_every()
    stop, t0 = threading.Event(), time.monotonic()

    def beat():
        while not stop.wait(every):
            text = line(time.monotonic() - t0)
            if text:
                print(text, file=stream, flush=True)

    thread = threading.Thread(target=beat, name="vocabbridge-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(1)


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM interrupts like SIGINT (KeyboardInterrupt) while the block runs, so what the block
    started is stopped on the way out (a bare SIGTERM would end the process and leave it running)."""
    old = signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def process_table() -> dict[int, tuple[str, int, int, int]] | None:
    """pid → (state, parent, process group, start time) of every process, from ``/proc``; None where
    there is no ``/proc`` (not Linux)."""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        return None
    out = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                out[int(entry.name)] = (fields[0], int(fields[1]), int(fields[2]), int(fields[19]))
            except (OSError, IndexError, ValueError):
                continue
    return out
