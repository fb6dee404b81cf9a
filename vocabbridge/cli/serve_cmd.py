"""``vocabbridge serve``: the embedded server or vLLM, started, watched and stopped cleanly."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import click

from ..engine.factory import build_engine, preflight
from ..errors import ConfigError
from ..presets import resolve_model
from ..server.runner import bind, serve_in_thread
from ..util import sigterm_interrupts
from ..vllm.backend import check, choose_backend, echo_stderr, run_vllm, vllm_command
from ..vllm.install import inspect_vllm
from .common import api_key_option, backend_option, max_num_seqs_option, spec_options, status

MAX_QUEUED_TOKENS = 32768  # serve's default: a few long prompts or dozens of short ones wait; more get a 429


def _say(message: str) -> None:
    click.echo(f"vocabbridge serve: {message}", err=True)


@click.command("serve", context_settings={"show_default": True})
@spec_options(engine=False)
@backend_option()
@click.option("--host", default="127.0.0.1", help="Address to bind (loopback by default).")
@click.option("--port", default=8000, type=click.IntRange(0, 65535), help="0 picks a free port.")
@api_key_option("Require 'Authorization: Bearer KEY' on /v1/* (health and metrics stay open).")
@max_num_seqs_option("Requests generating at once; the rest wait in FIFO order. [embedded default: 8; vLLM: its own]")
@click.option(
    "--max-queued-tokens",
    type=click.IntRange(0),
    default=None,
    help="Embedded: refuse (HTTP 429 with Retry-After) a request whose prompt would take the prompt tokens waiting "
    "for a slot (not running) past this; a request that finds none waiting is always taken; 0 = no limit. "
    f"[default: {MAX_QUEUED_TOKENS}]",
)
@click.option("--served-model-name", help="The model name clients send. [default: the target as given]")
@click.option("--tensor-parallel-size", type=click.IntRange(1), default=None, help="GPUs to split the target over (vLLM only).")
@click.option("--dry-run", is_flag=True, help="Print what would run (the exact vllm command) and exit.")
@click.argument("vllm_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- VLLM_ARGS...]")
def serve_cmd(
    spec,
    backend,
    host,
    port,
    api_key,
    max_num_seqs,
    max_queued_tokens,
    served_model_name,
    tensor_parallel_size,
    dry_run,
    vllm_args,
):
    """Serve the target with a drafter over an OpenAI-compatible HTTP API with vLLM's /metrics.

    Embedded: our engine (CPU or one GPU), one engine thread round-robining requests.
    vLLM: runs `vllm serve TARGET --speculative-config ...` (arguments after -- go to vLLM as they are).

    \b
    Examples:
      VOCABBRIDGE_MODELS=~/models vocabbridge serve --target qwen2.5-coder-1.5b --drafter ngram
      vocabbridge serve --drafter exaone-1.2b --backend vllm --tensor-parallel-size 2 -- --max-model-len 32768
      vocabbridge serve --drafter smollm2-135m --mode bridged --api-key secret --port 8080
    """
    chosen, why = choose_backend(backend)
    if chosen == "vllm" and max_queued_tokens is not None:
        raise ConfigError("--max-queued-tokens bounds the embedded server's queue; vLLM has no such limit (leave it out).")
    if chosen == "vllm":
        cmd = vllm_command(
            spec,
            host=host,
            port=port,
            served_model_name=served_model_name,
            api_key=api_key,
            max_num_seqs=max_num_seqs,
            tensor_parallel_size=tensor_parallel_size,
            extra_args=vllm_args,
        )
        if not dry_run:
            check(cmd)  # a refusal comes first and alone, not after the notes
        for note in cmd.notes:
            _say(note)
        if dry_run:
            click.echo(cmd.shell())
            return
        info = inspect_vllm()
        if info.problems:
            raise ConfigError(" ".join(info.problems))
        _say(f"backend vllm ({why}): {cmd.shell()}")
        sys.exit(_run_vllm(cmd, host, port))
    if vllm_args:
        raise ConfigError(f"arguments after -- are for vLLM ({' '.join(vllm_args)}); the embedded backend takes none.")
    if tensor_parallel_size not in (None, 1):
        raise ConfigError("--tensor-parallel-size needs --backend vllm (the embedded engine runs on one device).")
    queued = MAX_QUEUED_TOKENS if max_queued_tokens is None else max_queued_tokens or None
    _serve_embedded(spec, why, host, port, api_key, max_num_seqs or 8, queued, served_model_name, dry_run)


def _run_vllm(cmd, host, port) -> int:
    def ready():
        click.echo(f"vocabbridge serve: ready on http://{host}:{port} — model {cmd.model_name}, vLLM backend; Ctrl-C stops")
        sys.stdout.flush()

    return run_vllm(cmd, host=host, port=port, on_ready=ready, say=_say, echo=echo_stderr)


def _serve_embedded(spec, why, host, port, api_key, max_num_seqs, max_queued_tokens, served_model_name, dry_run) -> None:
    target = resolve_model(spec.target_name)
    drafter = spec.drafter if not spec.uses_model else f"{spec.drafter} ({resolve_model(spec.drafter)})"
    _say(f"backend embedded ({why})")
    if dry_run:
        preflight(spec)
        click.echo(
            f"embedded: target {spec.target_name} ({target}), drafter {drafter}, k={spec.num_speculative_tokens}, "
            f"on http://{host}:{port}, up to {max_num_seqs} concurrent requests, "
            f"{max_queued_tokens or 'unlimited'} queued prompt tokens"
        )
        return
    if host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        _say(f"warning: listening on {host} without --api-key; anyone who can reach it can use it")
    sock = bind(host, port)  # fail now, not after loading the models
    _say(f"loading target {spec.target_name} ({target}) and drafter {drafter}…")
    t0 = time.perf_counter()
    try:
        with sigterm_interrupts(), status("loading models…"):
            built = build_engine(spec)
    except KeyboardInterrupt:
        sock.close()
        _say("interrupted while loading the models; stopped")
        return
    except BaseException:
        sock.close()
        raise
    _say(f"loaded in {time.perf_counter() - t0:.1f} s: {built.ready_line()}" + "".join(f"; {n}" for n in built.notes))
    # The engine runs on this (the main) thread, HTTP in a thread of its own: torch's CPU kernels
    # run faster on the main thread (see EngineWorker).
    handle = serve_in_thread(
        built,
        host,
        sock=sock,
        served_model_name=served_model_name,
        api_key=api_key,
        max_num_seqs=max_num_seqs,
        max_queued_tokens=max_queued_tokens,
        engine_thread=False,
    )
    stop = threading.Event()
    stopper = threading.Thread(target=handle.stop, name="vocabbridge-stop", daemon=True)
    http_died = threading.Event()

    def on_signal(signum, frame):
        if stop.is_set():  # a second Ctrl-C: leave at once, whatever is running
            os._exit(128 + signum)
        stop.set()
        _say("stopping: open requests end with an error, the engine finishes its current step (Ctrl-C again to quit at once)…")
        stopper.start()  # ends the engine loop below after its current step

    def watch_http():
        while not stop.wait(0.5):
            if not handle.thread.is_alive():
                http_died.set()
                handle.worker.stop()
                return

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    k = f", k={built.engine.k}" if built.mode != "none" else ""
    click.echo(
        f"vocabbridge serve: ready on {handle.url} — model {handle.model_name}, drafter {built.drafter_label}{k}, "
        f"embedded engine, up to {max_num_seqs} concurrent requests; Ctrl-C stops"
    )
    sys.stdout.flush()
    threading.Thread(target=watch_http, name="vocabbridge-watch", daemon=True).start()
    try:
        handle.run_engine()
        if http_died.is_set():
            raise click.ClickException("the HTTP server stopped unexpectedly; run with --debug for the log.")
        stopper.join()
    finally:
        stop.set()
        for s, h in previous.items():
            signal.signal(s, h)
    _say("stopped")
