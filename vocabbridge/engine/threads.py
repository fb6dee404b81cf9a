"""Threads sized to the cores other processes leave free, measured while the engine runs.

Why: llama.cpp's threads and torch's OpenMP threads spin while they wait for each other at the
end of every op. With one of two cores taken by another process, the thread that lost its core
holds the others up at every barrier: the 1.5B target then decoded 0.52 tok/s on llama.cpp's
kernels (llama.cpp itself 0.69) against ~10 on a quiet machine. With as many threads as free
cores a busy neighbour costs about its share.

How: :class:`CoreMeter` reads the busy jiffies of the CPUs this process may run on
(``os.sched_getaffinity``) from ``/proc/stat``, minus this process's own (``/proc/self/stat``
utime + stime), between two samples: what other processes kept busy, in cores.
:class:`ThreadGovernor` does it at most every ``interval`` seconds when the engine calls
:meth:`~ThreadGovernor.tick` (once per target forward: two small file reads every ~1.5 s) and
sets each :class:`Knob` (torch's intra-op threads, a llama.cpp model's contexts, the q4 kernel's
pool) to ``allowed − round(others)`` threads, at least one, with a little hysteresis
(:func:`free_cores`).

**Output stays token-identical.** A knob that a target's forwards run under may change in the
middle of a generation only if the target computes the same logits bit for bit at every thread
count. :func:`probe_thread_counts` measures it at load (the prompt, one-row steps past 256 KV
cells, 2- and k+1-row verifications, with 1 and with all allowed threads), cached like the other
load probes (:func:`.invariant.probe_cached`); where it finds a difference the knob stays at the
count the target was loaded with, and a note says why. Equal results at every count also carry the
load-time lone-row probe (measured at one count) over to the others: the forwards it compares are
the same bits. A drafter's numerics never change what is emitted, so a knob only drafters use
adapts freely. An fp32 or bf16 torch target is not batch-invariant to begin with (and SmolLM2's fp32
logits changed between 1 and 2 threads when measured), so torch's count stays fixed under one
without a probe. ``VOCABBRIDGE_THREADS=fixed`` turns adaptation off.

Measured on the 2-core AVX2 machine (probe at 300 cells, 1 vs 2 threads): the llama.cpp target
(bf16 KV cache, flash attention, no repacking) and the torch int8 target are the same bit for bit;
with llama.cpp's default f16 KV cache a lone row's attention is split across the threads past 256
cells and differs, which the two-row padding the lone-row probe then chooses avoids.

>>> gov = ThreadGovernor([Knob("torch", torch.set_num_threads)], allowed=2)  # doctest: +SKIP
>>> gov.start(); gov.tick(); gov.threads  # doctest: +SKIP
1
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .invariant import PROBE_CELLS, cpu_name, files_fingerprint, probe_cached

INTERVAL_S = 1.5  # how often tick() looks at /proc (at most)
START_WINDOW_S = 0.1  # the first measurement, at load (10 jiffies a CPU)


# ==== measuring ================================================================================


class ProcReader:
    """The real ``/proc`` and affinity (tests pass a fake with the same three methods)."""

    def stat(self) -> str:
        with open("/proc/stat", encoding="ascii") as f:
            return f.read()

    def self_stat(self) -> str:
        with open("/proc/self/stat", encoding="ascii", errors="replace") as f:
            return f.read()

    def cpus(self) -> set[int]:
        try:
            return set(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            return set(range(os.cpu_count() or 1))


def cpu_jiffies(stat: str, cpus: set[int]) -> tuple[int, int]:
    """(busy, total) jiffies of ``cpus`` from ``/proc/stat``'s ``cpuN`` lines. Busy: user, nice,
    system, irq, softirq and steal (another guest's time on a shared host is a neighbour too);
    total adds idle and iowait (guest time is already inside user and nice).

    >>> cpu_jiffies("cpu  9 0 9 9 0 0 0 0 0 0\\ncpu0 5 1 2 10 1 0 1 0 0 0\\ncpu1 4 0 0 90 0 0 0 0 0 0\\n", {0})
    (9, 20)
    """
    busy = total = 0
    for line in stat.splitlines():
        if not line.startswith("cpu") or line[3:4] == " ":
            continue
        name, *fields = line.split()
        if int(name[3:]) not in cpus:
            continue
        user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in (fields + ["0"] * 8)[:8])
        b = user + nice + system + irq + softirq + steal
        busy += b
        total += b + idle + iowait
    return busy, total


def own_jiffies(self_stat: str) -> int:
    """utime + stime of ``/proc/self/stat`` (all this process's threads), in jiffies; the command
    name in parentheses may hold spaces, so the fields are counted after its closing parenthesis.

    >>> own_jiffies("42 (a b) R 1 1 1 0 -1 0 0 0 0 0 7 3 0 0 20 0")
    10
    """
    fields = self_stat[self_stat.rindex(")") + 2 :].split()
    return int(fields[11]) + int(fields[12])  # fields 14 and 15 of proc(5), counted from the pid


class CoreMeter:
    """How many cores other processes kept busy since the previous :meth:`sample`, on the CPUs
    this process may use."""

    def __init__(self, reader: ProcReader | None = None):
        self.reader = reader or ProcReader()
        self.cpus = self.reader.cpus()
        self._last = self._read()
        self.since = time.monotonic()  # when the first sample was taken

    @property
    def allowed(self) -> int:
        return max(1, len(self.cpus))

    def _read(self) -> tuple[int, int, int]:
        busy, total = cpu_jiffies(self.reader.stat(), self.cpus)
        return busy, total, own_jiffies(self.reader.self_stat())

    def sample(self) -> float | None:
        """Others' busy cores since the last sample (None if no time has passed in between)."""
        now = self._read()
        (b0, t0, o0), (b1, t1, o1) = self._last, now
        self._last = now
        elapsed = (t1 - t0) / self.allowed  # jiffies per CPU
        if elapsed <= 0:
            return None
        return min(float(self.allowed), max(0.0, ((b1 - b0) - (o1 - o0)) / elapsed))


def free_cores(allowed: int, others: float, current: int) -> int:
    """Threads to run with: ``allowed`` less the cores others use, at least one. One thread goes as
    soon as others use half a core, and comes back once they use less than a quarter, so a
    neighbour near the threshold does not flip the count at every look.

    >>> [free_cores(2, x, 2) for x in (0.3, 0.6, 1.0, 3.0)], [free_cores(2, x, 1) for x in (0.4, 0.2)]
    ([2, 1, 1, 1], [1, 2])
    """
    most = allowed - math.floor(others + 0.5)  # the count others leave room for
    least = allowed - math.floor(others + 0.75)  # below it a thread is surely short of a core
    want = min(max(current, least), most)
    return max(1, min(allowed, want))


# ==== governing =================================================================================


@dataclass
class Knob:
    """One thread-count setting: ``set(n)`` applies it; ``adapt`` False keeps it as loaded (``why``)."""

    name: str
    set: Callable[[int], None]
    adapt: bool = True
    why: str = ""


@dataclass
class ThreadGovernor:
    """Sets every adaptable knob to the free core count at :meth:`start` and whenever it changes
    (looked at by :meth:`tick`, at most every ``interval`` seconds)."""

    knobs: list[Knob]
    allowed: int
    interval: float = INTERVAL_S
    meter: CoreMeter | None = None
    clock: Callable[[], float] = time.monotonic
    threads: int = 0  # the count set last (0: none yet)
    others: float = 0.0  # others' busy cores at the last look
    changes: deque = field(default_factory=lambda: deque(maxlen=64))  # (clock, threads) of the latest changes
    _next: float = 0.0

    def start(self, window: float = START_WINDOW_S) -> int:
        """Set the knobs (at load) from a measurement of at least ``window`` seconds since the
        meter was made (made earlier, before the load probes, it waits no more); returns the count."""
        self.meter = self.meter or CoreMeter()
        time.sleep(max(0.0, window - (time.monotonic() - getattr(self.meter, "since", 0.0))))
        self._look(self.clock())
        return self.threads

    def tick(self) -> None:
        """Called before every target forward: cheap unless ``interval`` has passed."""
        now = self.clock()
        if now >= self._next:
            self._look(now)

    def _look(self, now: float) -> None:
        self._next = now + self.interval
        others = self.meter.sample() if self.meter is not None else None
        if others is None:
            return
        self.others = others
        n = free_cores(self.allowed, others, self.threads or self.allowed)
        if n != self.threads:
            for knob in self.knobs:
                if knob.adapt:
                    knob.set(n)
            self.threads = n
            self.changes.append((now, n))

    def describe(self) -> str:
        moving = [k.name for k in self.knobs if k.adapt]
        fixed = [f"{k.name} ({k.why})" for k in self.knobs if not k.adapt]
        said = f"threads follow the free cores (1..{self.allowed}, /proc/stat every {self.interval:g} s)"
        said += f" for {', '.join(moving)}" if moving else ": none adapts"
        return said + (f"; fixed: {'; '.join(fixed)}" if fixed else "")


# ==== is it safe? ===============================================================================


def probe_thread_counts(
    lm, set_threads: Callable[[int], None], counts: list[int], *, most: int, cells: int = PROBE_CELLS
) -> bool:
    """Whether ``lm`` computes the same logits bit for bit with each of ``counts`` threads (set by
    ``set_threads``): a ``cells``-token prompt (past llama.cpp's 256-cell split), ``most`` one-token
    steps as plain decoding runs them, then verifications of 2 and ``most`` rows over the same tokens.
    A context too short for it is probed with a shorter prompt (the model never reaches more)."""
    cells = min(cells, lm.max_context - most - 1)
    if cells < 1:
        return False
    prompt = [(97 * i + 13) % lm.vocab_size for i in range(cells)]
    step = [(11 + 31 * i) % lm.vocab_size for i in range(most)]

    def run(n: int) -> list[torch.Tensor]:
        set_threads(n)
        s = lm.session()
        out = [s.extend(prompt)]
        out += [s.extend([t]) for t in step]
        for rows in sorted({2, most}):
            s.truncate(cells)
            out.append(s.extend(step[:rows], keep=rows))
        return out

    first = run(counts[0])
    return all(all(torch.equal(a, b) for a, b in zip(first, run(n))) for n in counts[1:])


def _q4():
    try:
        from . import q4
    except ImportError:
        return None
    return q4 if q4.available() else None


def _uses_q4(lm) -> bool:
    q4 = _q4()
    model = getattr(lm, "model", None)
    return q4 is not None and model is not None and any(isinstance(m, q4.Q4Linear) for m in model.modules())


def _probe_key(lm, counts: list[int], most: int) -> list[str]:
    """What decides :func:`probe_thread_counts`' answer: the model, the kernels and their settings."""
    from .llama_cpp import LlamaCppLM, probe_key

    head = ["threads", ",".join(map(str, counts)), f"most {most} cells {PROBE_CELLS}", cpu_name()]
    if isinstance(lm, LlamaCppLM):
        return head + probe_key(lm) + [f"min_rows {lm.min_rows}"]
    kinds = sorted({type(m).__name__ for m in lm.model.modules()})  # int8 rows, packed fp32, q4 …
    key = head + ["torch", files_fingerprint(lm.source), torch.__version__, str(lm.dtype), f"rows {lm.rows} {lm.min_rows}"]
    if _uses_q4(lm):
        q4 = _q4()
        key += ["q4", q4.FORMAT, q4.vector_unit()]
    return key + kinds


def thread_counts(allowed: int) -> list[int]:
    """The counts the probe compares: one, all, and one between on a larger machine.

    >>> thread_counts(2), thread_counts(16)
    ([1, 2], [1, 8, 16])
    """
    return sorted({1, (allowed + 1) // 2, allowed})


def govern_threads(target, drafter_lm=None, *, allowed: int | None = None) -> tuple[ThreadGovernor | None, list[str]]:
    """The governor for an engine over ``target`` (and a drafter model), started, and a note that says
    which kernels adapt and why the others do not; None where nothing may adapt (one core, or
    ``VOCABBRIDGE_THREADS=fixed``)."""
    from ..errors import ConfigError
    from .llama_cpp import LlamaCppLM

    mode = os.environ.get("VOCABBRIDGE_THREADS", "auto").strip().lower()
    if mode not in ("auto", "fixed"):
        raise ConfigError(f"VOCABBRIDGE_THREADS={mode!r}: use auto (threads follow the free cores) or fixed (as loaded).")
    meter = CoreMeter()  # measuring from here, through the probes
    allowed = allowed or meter.allowed
    if mode == "fixed" or allowed < 2:
        return None, [f"threads fixed as loaded ({'VOCABBRIDGE_THREADS=fixed' if mode == 'fixed' else 'one core allowed'})"]
    counts = thread_counts(allowed)
    on_gpu = str(getattr(target, "device", "cpu")) != "cpu"  # CPU threads do not compute a GPU target's logits
    torch_target = not isinstance(target, LlamaCppLM) and not on_gpu
    q4 = _q4() if torch_target and _uses_q4(target) else None

    def set_torch(n: int) -> None:  # torch also runs the sampling and any torch drafter
        torch.set_num_threads(n)

    if q4 is not None:  # torch's own ops stay on one thread (see load_q4_lm); the kernel's pool has the cores
        knobs = [_knob("q4 target", q4.set_threads, target, counts, q4.require().threads())]
    else:
        torch_name = "torch target" if torch_target else "torch (CPU side: drafter, sampling)"
        knobs = [_knob(torch_name, set_torch, target if torch_target else None, counts, torch.get_num_threads())]
    for lm in (target, drafter_lm):
        if isinstance(lm, LlamaCppLM):
            role = "target" if lm is target else "drafter"
            knobs.append(_knob(f"llama.cpp {role}", lm.set_threads, lm if lm is target else None, counts, lm.threads))
    gov = ThreadGovernor(knobs, allowed, meter=meter)
    if not any(k.adapt for k in knobs):
        return None, [gov.describe()]
    gov.start()
    return gov, [gov.describe()]


def _knob(name: str, setter: Callable[[int], None], target, counts: list[int], loaded: int) -> Knob:
    """A knob; one that sets a target's threads adapts only where the probe finds that target's
    logits the same at every count (else it stays at ``loaded``, the count it was loaded with)."""
    if target is None:
        return Knob(name, setter)  # a drafter's numerics never change the output
    from .llama_cpp import MAX_ROWS, LlamaCppLM

    if not isinstance(target, LlamaCppLM) and not target.rows:
        return Knob(
            name,
            setter,
            False,
            f"not a batch-invariant target, whose logits may change with the thread count, kept at {loaded}",
        )
    most = getattr(target, "rows", None) or MAX_ROWS
    try:
        same = probe_cached(_probe_key(target, counts, most), lambda: probe_thread_counts(target, setter, counts, most=most))
    finally:
        setter(loaded)
    if same:
        return Knob(name, setter)
    return Knob(
        name, setter, False, f"its logits differ between {'/'.join(map(str, counts))} threads (measured), kept at {loaded}"
    )
