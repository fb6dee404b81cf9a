"""Threads sized to the free cores (engine/threads.py): the /proc arithmetic on a fake /proc, the
governor's decisions on a fake meter and clock, the probe that decides whether a target's threads
may change, the engine's output while they change at every forward, and a real busy neighbour."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from vocabbridge.engine import SamplingParams, SpecEngine
from vocabbridge.engine import threads as th
from vocabbridge.engine.drafters import NgramDrafter
from vocabbridge.engine.invariant import INVARIANT_ROWS, make_invariant
from vocabbridge.engine.threads import CoreMeter, Knob, ThreadGovernor, free_cores, govern_threads, probe_thread_counts
from vocabbridge.errors import ConfigError

from .test_invariant import _lm, _tiny

# ==== a fake /proc ==============================================================================


class FakeProc:
    """/proc/stat and /proc/self/stat from counters the test moves: ``run(seconds, others=…, ours=…)``
    advances 100 jiffies a second per CPU, ``others`` and ``ours`` cores of them busy (spread evenly)."""

    def __init__(self, ncpu: int = 2, allowed: set[int] | None = None):
        self.ncpu = ncpu
        self.allowed = allowed if allowed is not None else set(range(ncpu))
        self.busy = [0.0] * ncpu
        self.idle = [0.0] * ncpu
        self.ours = 0.0

    def run(self, seconds: float, *, others: float = 0.0, ours: float = 0.0, elsewhere: float = 0.0) -> None:
        """``elsewhere``: busy cores on the CPUs outside the affinity (they must not count)."""
        inside = sorted(self.allowed)
        outside = [c for c in range(self.ncpu) if c not in self.allowed]
        for cpus, load in ((inside, others + ours), (outside, elsewhere)):
            for c in cpus:
                b = 100 * seconds * load / len(cpus)
                self.busy[c] += b
                self.idle[c] += 100 * seconds - b
        self.ours += 100 * seconds * ours

    def stat(self) -> str:
        lines = [f"cpu  {int(sum(self.busy))} 0 0 {int(sum(self.idle))} 0 0 0 0 0 0"]
        for c in range(self.ncpu):  # busy split over user, system and steal, idle over idle and iowait
            b, i = int(self.busy[c]), int(self.idle[c])
            lines.append(f"cpu{c} {b // 2} 0 {b // 4} {i - i // 10} {i // 10} 0 0 {b - b // 2 - b // 4} 0 0")
        return "\n".join(lines + ["intr 1 2 3", "ctxt 99"]) + "\n"

    def self_stat(self) -> str:
        o = int(self.ours)
        return f"4242 (python -m x) R 1 1 1 0 -1 0 0 0 0 0 {o - o // 3} {o // 3} 0 0 20 0 5 0"

    def cpus(self) -> set[int]:
        return set(self.allowed)


def test_the_meter_counts_others_busy_cores_not_ours():
    proc = FakeProc()
    meter = CoreMeter(proc)
    proc.run(2.0, others=1.0, ours=1.0)
    assert meter.sample() == pytest.approx(1.0, abs=0.02)
    proc.run(1.0, ours=2.0)  # our own two busy threads are no neighbour
    assert meter.sample() == pytest.approx(0.0, abs=0.02)
    proc.run(1.5, others=0.5)
    assert meter.sample() == pytest.approx(0.5, abs=0.02)
    assert meter.sample() is None  # no time passed


def test_the_meter_reads_only_the_cpus_this_process_may_use():
    proc = FakeProc(ncpu=4, allowed={1, 2})
    meter = CoreMeter(proc)
    assert meter.allowed == 2
    proc.run(1.0, others=1.0, elsewhere=2.0)
    assert meter.sample() == pytest.approx(1.0, abs=0.02)


@pytest.mark.parametrize(
    "allowed, others, current, want",
    [
        (2, 0.0, 2, 2),
        (2, 0.49, 2, 2),
        (2, 0.5, 2, 1),  # a neighbour at half a core takes a thread
        (2, 0.67, 2, 1),  # `yes` beside our two spinning threads gets 2/3 of a core
        (2, 0.4, 1, 1),  # between the thresholds: the count stays
        (2, 0.24, 1, 2),  # the neighbour is gone
        (2, 2.0, 2, 1),  # never fewer than one
        (8, 3.2, 8, 5),
        (8, 2.6, 5, 5),
        (8, 2.2, 5, 6),
    ],
)
def test_free_cores_with_hysteresis(allowed, others, current, want):
    assert free_cores(allowed, others, current) == want


# ==== the governor ==============================================================================


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _governor(proc: FakeProc, knobs, interval=1.5):
    clock = Clock()
    gov = ThreadGovernor(knobs, 2, interval=interval, meter=CoreMeter(proc), clock=clock)
    return gov, clock


def test_the_governor_follows_a_neighbour_and_looks_at_most_once_an_interval():
    proc, seen, fixed = FakeProc(), [], []
    gov, clock = _governor(proc, [Knob("a", seen.append), Knob("b", fixed.append, adapt=False, why="differs")])
    proc.run(0.2, ours=1.0)
    gov.start(window=0)
    assert (gov.threads, seen) == (2, [2])  # at load: a quiet machine, all cores
    reads = []
    meter_sample = gov.meter.sample
    gov.meter.sample = lambda: reads.append(1) or meter_sample()
    proc.run(1.0, others=1.0, ours=1.0)  # a neighbour arrives
    clock.t = 1.0
    gov.tick()
    assert reads == [] and gov.threads == 2  # too soon to look again: no /proc read
    proc.run(0.5, others=1.0, ours=1.0)
    clock.t = 1.5
    gov.tick()
    assert (len(reads), gov.threads, seen) == (1, 1, [2, 1])
    for t in (2.0, 3.0, 4.5, 6.0):  # the neighbour stays: nothing changes
        proc.run(1.0, others=1.0, ours=1.0)
        clock.t = t
        gov.tick()
    assert seen == [2, 1]
    proc.run(2.0, ours=1.0)  # it leaves
    clock.t = 8.0
    gov.tick()
    assert (gov.threads, seen, fixed) == (2, [2, 1, 2], [])  # the fixed knob was never touched
    assert [n for _, n in gov.changes] == [2, 1, 2]
    assert "fixed: b (differs)" in gov.describe()


def test_govern_threads_says_when_nothing_adapts(monkeypatch):
    monkeypatch.setenv("VOCABBRIDGE_THREADS", "fixed")
    assert govern_threads(object()) == (None, ["threads fixed as loaded (VOCABBRIDGE_THREADS=fixed)"])
    monkeypatch.setenv("VOCABBRIDGE_THREADS", "auto")
    assert govern_threads(object(), allowed=1) == (None, ["threads fixed as loaded (one core allowed)"])
    monkeypatch.setenv("VOCABBRIDGE_THREADS", "3")
    with pytest.raises(ConfigError, match="use auto"):
        govern_threads(object())


def test_an_fp32_target_keeps_torch_threads_fixed(monkeypatch):
    monkeypatch.delenv("VOCABBRIDGE_THREADS", raising=False)
    before = torch.get_num_threads()
    gov, notes = govern_threads(_lm(_tiny("qwen2"), rows=None), allowed=2)
    assert gov is None and "not a batch-invariant target" in notes[0]
    assert torch.get_num_threads() == before


# ==== the probe: may a target's threads change? ====================================================


@pytest.fixture(autouse=True)
def _torch_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_the_int8_target_computes_the_same_bits_at_every_thread_count():
    model = _tiny("qwen2")
    make_invariant(model)
    lm = _lm(model, rows=INVARIANT_ROWS, min_rows=1)
    assert probe_thread_counts(lm, torch.set_num_threads, [1, 2], most=INVARIANT_ROWS)


class Shifty:
    """A target whose logits move with the thread count it was given (what the probe must catch)."""

    max_context, vocab_size, rows, min_rows = 4096, 50, 5, 1

    def __init__(self):
        self.n = 1
        self.model = torch.nn.Linear(1, 1)
        self.source = "shifty"
        self.dtype = torch.float32

    def set(self, n: int) -> None:
        self.n = n

    def session(self):
        lm = self

        class S:
            ids = []

            def extend(self, tokens, keep=1):
                self.ids = self.ids + tokens
                return torch.full((keep, lm.vocab_size), float(len(self.ids) + (lm.n > 1) * 1e-3 * (len(tokens) == 1)))

            def truncate(self, n):
                self.ids = self.ids[:n]

        return S()


def test_the_probe_catches_a_thread_dependent_target_and_its_knob_stays_fixed(tmp_path, monkeypatch):
    monkeypatch.setenv("VOCABBRIDGE_CACHE", str(tmp_path))
    lm = Shifty()
    assert not probe_thread_counts(lm, lm.set, [1, 2], most=5)
    monkeypatch.setattr(th, "_probe_key", lambda *a: ["shifty"])
    knob = th._knob("shifty target", lm.set, lm, [1, 2], loaded=2)
    assert not knob.adapt and "differ between 1/2 threads" in knob.why
    assert lm.n == 2  # left at the count it was loaded with
    assert th._knob("drafter", lm.set, None, [1, 2], loaded=2).adapt  # a drafter's numerics do not matter


def test_speculative_output_stays_plain_while_threads_change_at_every_forward():
    """The engine ticks the governor before every target forward; here it flips torch's threads
    between 1 and 2 at each one, and the ngram drafter's answer is still the plain one."""
    model = _tiny("llama")
    make_invariant(model)

    class View:
        roles = {}

    lm = _lm(model, rows=INVARIANT_ROWS, min_rows=1)
    lm.view = View()

    class Flip:
        ticks = 0

        def tick(self):
            self.ticks += 1
            torch.set_num_threads(1 + self.ticks % 2)

    prompt = [5, 6, 7, 8, 5, 6, 7, 9] * 20  # repeats: n-gram drafts get accepted
    params = SamplingParams(max_new_tokens=60, ignore_eos=True)
    torch.set_num_threads(2)
    plain = [t for step in SpecEngine(lm, None).stream(prompt, params) for t in step.tokens]
    flip = Flip()
    engine = SpecEngine(lm, NgramDrafter(prompt_lookup_min=2, prompt_lookup_max=3), num_speculative_tokens=4, threads=flip)
    spec = [t for step in engine.stream(prompt, params) for t in step.tokens]
    assert spec == plain
    assert flip.ticks > 5


# ==== a real neighbour ==========================================================================


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs Linux's /proc")
def test_a_busy_neighbour_takes_a_thread():
    """A spinning process pinned to one of our CPUs: the meter counts it (at least the CPU time it
    got) and the governor sets one thread fewer than the cores we may use (fewer still if other
    people's work also keeps cores busy), here on torch's real thread count."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip(f"needs two CPUs to leave one free; this process may use {len(cpus)}")
    spin = f"import os; os.sched_setaffinity(0, {{{cpus[0]}}}); print(flush=True)\nwhile True: pass"
    neighbour = subprocess.Popen([sys.executable, "-c", spin], stdout=subprocess.PIPE)
    try:
        neighbour.stdout.readline()  # pinned and spinning
        torch.set_num_threads(len(cpus))
        gov = ThreadGovernor([Knob("torch", torch.set_num_threads)], len(cpus), interval=0.0)
        gov.meter = CoreMeter()
        cpu0 = _cpu_seconds(neighbour.pid)
        t0 = time.monotonic()
        time.sleep(2.0)
        gov.tick()
        its_share = (_cpu_seconds(neighbour.pid) - cpu0) / (time.monotonic() - t0)  # under a load of 15 on 2 cores: ~0.15
        assert gov.others >= 0.8 * its_share - 0.1, (gov.others, its_share)
        assert gov.threads <= len(cpus) - 1 and torch.get_num_threads() == gov.threads
    finally:
        neighbour.kill()
        neighbour.wait()


def test_a_model_with_its_own_torch_thread_count_computes_on_it_and_gives_the_count_back():
    """CausalLM.torch_threads (the q4 target: 1, so torch's spinning OpenMP thread leaves the
    kernel's worker its core): torch runs that many threads inside the model's forwards only."""
    if torch.get_num_threads() < 2:
        pytest.skip("needs two torch threads to tell the counts apart")
    model = _tiny("qwen2")
    lm = _lm(model, rows=None, min_rows=None)
    lm.torch_threads = 1
    seen = []
    model.model.layers[0].register_forward_hook(lambda *a: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    s = lm.session()
    s.extend([5, 6, 7])
    s.extend([8])
    assert seen == [1, 1] and torch.get_num_threads() == before
    lm.torch_threads = None
    s.extend([9])
    assert seen[-1] == before
