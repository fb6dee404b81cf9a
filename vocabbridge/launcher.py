"""Start each configuration in turn, benchmark it, stop it.

Two ways to start one:

- **in-process** (the default for the embedded backend): :func:`vocabbridge.server.serve_in_thread`
  on a loopback port, models kept loaded across configurations, so the target loads once (on a CPU
  that is most of a minute per configuration saved for a 1.5B model);
- **subprocess**: ``vocabbridge serve ... --host 127.0.0.1 --port P`` on a free port, ``/health``
  polled until it answers 200, stopped with SIGINT (then killed). This is the way for vLLM.

It sits above the bench (a pure HTTP client) and beside the CLI: it builds engines and servers, the
bench only measures them. Configurations are :class:`~vocabbridge.spec.DrafterChoice` items, parsed
by :func:`vocabbridge.spec.parse_drafters` (the one ``--drafter`` grammar).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx

from .bench.protocol import BenchSettings, Progress, bench_endpoint, finish
from .bench.results import BenchResult, ConfigResult, Endpoint
from .errors import BenchError, LaunchError, VocabBridgeError
from .prompts import Prompt
from .spec import DrafterChoice, EngineSpec, cli_args
from .util import process_table
from .vllm.backend import choose_backend

T = TypeVar("T")

HOST = "127.0.0.1"
NOT_SERVE_OPTIONS = ("target", "drafter")  # given first, before the options that differ from their defaults
LAUNCHES = ("auto", "inprocess", "subprocess")


@dataclass(frozen=True)
class LaunchSettings:
    """How configurations are started: ``base`` carries the target and engine options (-k, dtype...)."""

    base: EngineSpec
    backend: str = "auto"  # auto | embedded | vllm, as `vocabbridge serve --backend`
    launch: str = "auto"  # auto | inprocess | subprocess
    startup_timeout: float = 1200.0  # seconds to wait for /health (a first GGUF load converts the weights)
    max_num_seqs: int | None = None
    serve_args: tuple[str, ...] = field(default_factory=tuple)  # extra `vocabbridge serve` arguments (subprocess)

    def __post_init__(self):
        if self.launch not in LAUNCHES:
            raise BenchError(f"--launch must be one of {', '.join(LAUNCHES)}, got {self.launch!r}.")
        if self.serve_args and "--" in self.serve_args and self.backend == "embedded":
            raise BenchError("--vllm-args are for configurations started with --backend vllm; the embedded engine takes none.")
        if self.launch == "inprocess" and self.backend == "vllm":
            raise BenchError("--launch inprocess runs the embedded engine; with --backend vllm use --launch subprocess.")

    def spec_for(self, d: DrafterChoice) -> EngineSpec:
        return dataclasses.replace(self.base, drafter=d.drafter, mode=d.mode, ngram_first=d.ngram_first or self.base.ngram_first)


def resolve_launch(ls: LaunchSettings) -> tuple[str, str]:
    """(inprocess | subprocess, why)."""
    if ls.launch != "auto":
        return ls.launch, "asked for"
    if ls.backend == "vllm":
        return "subprocess", "the vLLM backend runs as its own server"
    if ls.backend == "auto" and choose_backend("auto")[0] == "vllm":
        return "subprocess", "backend auto picks vLLM here (vLLM installed, CUDA GPU present)"
    return "inprocess", "embedded backend: one process, models loaded once and reused by every configuration"


def free_port(host: str = HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def serve_command(
    spec: EngineSpec, *, backend: str, port: int, host: str = HOST, max_num_seqs: int | None = None, extra: tuple[str, ...] = ()
) -> list[str]:
    """The ``vocabbridge serve`` command for one configuration (engine options that differ from the defaults).

    >>> serve_command(EngineSpec(target="t", drafter="d", mode="text", num_speculative_tokens=3), backend="embedded", port=9)[3:]
    ['serve', '--target', 't', '--drafter', 'd', '--mode', 'text', '-k', '3', '--backend', 'embedded', '--host', '127.0.0.1', '--port', '9']
    """
    argv = [
        sys.executable,
        "-m",
        "vocabbridge",
        "serve",
        *cli_args(spec),
        "--backend",
        backend,
        "--host",
        host,
        "--port",
        str(port),
    ]
    if max_num_seqs:
        argv += ["--max-num-seqs", str(max_num_seqs)]
    return argv + list(extra)


def _tail(path: Path, n: int = 20) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return "(no output)"
    return "\n".join(lines[-n:]) or "(no output)"


def _refusal(log: Path) -> str | None:
    """The one-line error `vocabbridge serve` ended with (``Error: ...``), when that is how it ended."""
    lines = _tail(log, 5).splitlines()
    last = lines[-1] if lines else ""
    return last[len("Error: ") :] if last.startswith("Error: ") else None


def _healthy(url: str) -> bool:

    try:
        return httpx.get(url + "/health", timeout=5.0).status_code == 200
    except httpx.HTTPError:
        return False


def _call(fn: Callable[[], T]) -> T:
    return fn()


@contextlib.contextmanager
def subprocess_server(
    spec: EngineSpec, ls: LaunchSettings, *, name: str
) -> Iterator[tuple[Endpoint, Callable[[Callable[[], T]], T]]]:
    """``vocabbridge serve`` for ``spec`` on a free loopback port, until the block ends (yields the
    endpoint and how to run the benchmark: here, as it is)."""
    port = free_port()
    argv = serve_command(spec, backend=ls.backend, port=port, max_num_seqs=ls.max_num_seqs, extra=ls.serve_args)
    url = f"http://{HOST}:{port}"
    log_dir = Path(tempfile.mkdtemp(prefix="vocabbridge-bench-"))
    log = log_dir / "serve.log"
    t0 = time.perf_counter()
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = t0 + ls.startup_timeout
        while not _healthy(url):
            if proc.poll() is not None:
                refused = _refusal(log)
                if refused:  # serve refused the configuration (a missing dependency, a bad option): that, alone
                    raise LaunchError(f"{name}: {refused}")
                raise LaunchError(
                    f"{name}: `vocabbridge serve` exited with status {proc.returncode} before it was ready; "
                    f"its last lines ({log}):\n{_tail(log)}"
                )
            if time.perf_counter() > deadline:
                raise LaunchError(
                    f"{name}: {url}/health did not answer 200 within {ls.startup_timeout:.0f} s "
                    f"(--startup-timeout to wait longer); its last lines ({log}):\n{_tail(log)}"
                )
            time.sleep(0.5)
        launch = {
            "target": spec.target_name,
            "drafter": spec.drafter,
            "mode": spec.mode,
            "ngram_first": spec.ngram_first,
            "num_speculative_tokens": spec.num_speculative_tokens,
            "backend": ls.backend,
            "launch": "subprocess",
            "command": argv[3:],
            "startup_seconds": round(time.perf_counter() - t0, 2),
        }
        yield Endpoint(name, url, launch), _call
    except BaseException:
        stop_process(proc)
        raise  # the log stays for the error message to point at
    stop_process(proc)
    shutil.rmtree(log_dir, ignore_errors=True)


def stop_process(proc: subprocess.Popen, *, grace: float = 30.0) -> int:
    """SIGINT (a clean stop, as Ctrl-C: `vocabbridge serve` stops what it started, vLLM included, in
    seconds), then SIGKILL after ``grace`` seconds; the exit status. What it started and outlives it
    (vLLM runs in a process group of its own) is killed, group by group: nothing is left running."""
    started = _descendants(proc.pid)
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            started |= _descendants(proc.pid)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
    alive = _processes()
    for pid, group, start in started:
        if alive.get(pid, (None, None, None))[1:] == (group, start) and group != os.getpgid(0):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, signal.SIGKILL)  # the very process (same start time) still runs: its group goes
    return proc.returncode


def _processes() -> dict[int, tuple[int, int, int]]:
    """pid → (parent, process group, start time) of every process (from /proc; empty elsewhere)."""
    return {pid: (parent, group, start) for pid, (_, parent, group, start) in (process_table() or {}).items()}


def _descendants(pid: int) -> set[tuple[int, int, int]]:
    """(pid, process group, start time) of every process under ``pid``."""
    table = _processes()
    out, todo = set(), [pid]
    while todo:
        p = todo.pop()
        for child, (parent, group, start) in table.items():
            if parent == p:
                out.add((child, group, start))
                todo.append(child)
    return out


@contextlib.contextmanager
def inprocess_server(
    spec: EngineSpec, ls: LaunchSettings, *, name: str, loaded: dict
) -> Iterator[tuple[Endpoint, Callable[[Callable[[], T]], T]]]:
    """The engine built in this process (models reused from ``loaded``), served on a loopback port.
    Yields the endpoint and how to run the benchmark: in a helper thread while this thread runs
    the engine (torch's CPU kernels are faster on the main thread, see EngineWorker)."""
    # Imported here, not at the top: the bench is a client for any server and must not need torch
    # (`import vocabbridge.bench` stays torch-free; tests/test_spec.py checks it).
    from .engine.factory import build_engine
    from .server import serve_in_thread

    t0 = time.perf_counter()
    built = build_engine(spec, loaded=loaded)
    load_s = time.perf_counter() - t0
    kw = {"max_num_seqs": ls.max_num_seqs} if ls.max_num_seqs else {}
    with serve_in_thread(built, host=HOST, port=0, engine_thread=False, **kw) as handle:
        launch = {
            "target": spec.target_name,
            "drafter": spec.drafter,
            "mode": spec.mode,
            "ngram_first": spec.ngram_first,
            "running": built.mode,
            "num_speculative_tokens": spec.num_speculative_tokens,
            "backend": "embedded",
            "launch": "inprocess",
            "engine": built.describe(),
            "load_seconds": round(load_s, 2),
        }
        yield Endpoint(name, handle.url, launch), handle.run_with_engine_here


def bench_launched(
    drafters: list[DrafterChoice],
    ls: LaunchSettings,
    prompts: list[Prompt],
    settings: BenchSettings,
    *,
    progress: Progress | None = None,
    loaded: dict | None = None,
) -> BenchResult:
    """Start, benchmark and stop each configuration in turn; one that cannot start is reported, not fatal."""
    progress = progress or Progress()
    names = [d.name for d in drafters]
    if settings.baseline and settings.baseline not in names:
        raise BenchError(f"--baseline {settings.baseline} is not one of the configurations: {', '.join(names)}.")
    targets = {ls.spec_for(d).target_name for d in drafters}  # a drafter without a target fails here, before any start
    if len(targets) > 1:
        raise BenchError(f"the drafters pair with different targets ({', '.join(sorted(targets))}); pass --target.")
    how, why = resolve_launch(ls)
    loaded = loaded if loaded is not None else {}
    configs: list[ConfigResult] = []
    for d in drafters:
        spec = ls.spec_for(d)
        progress.message(f"{d.name}: starting ({'loading models' if how == 'inprocess' else 'vocabbridge serve'})…")
        if how == "inprocess":
            server = inprocess_server(spec, ls, name=d.name, loaded=loaded)
        else:
            server = subprocess_server(spec, ls, name=d.name)
        try:
            with server as (endpoint, run):
                configs.append(run(lambda: bench_endpoint(endpoint, prompts, settings, progress=progress)))
        except VocabBridgeError as e:
            failed = ConfigResult(
                Endpoint(d.name, "", {"target": spec.target_name, "drafter": d.drafter, "mode": d.mode}), error=str(e)
            )
            configs.append(failed)
            progress.message(f"{d.name}: failed: {e}")
    where = "in this process" if how == "inprocess" else "as `vocabbridge serve` subprocesses"
    env_note = f"configurations started {where} ({why})"
    result = finish(configs, prompts, settings, notes=[env_note])
    result.environment["launch"] = how
    result.environment["models_dir"] = os.environ.get("VOCABBRIDGE_MODELS")
    return result
