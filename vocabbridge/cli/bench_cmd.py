"""``vocabbridge bench``: parse, run the library's protocol, render (tables, JSON, Markdown, PNGs)."""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from ..bench import BenchSettings, Endpoint, bench_urls, load_prompts, select_prompts, write_outputs
from ..bench.client import base_url
from ..bench.outputs import sections
from ..errors import BenchError
from ..launcher import LaunchSettings, bench_launched
from ..report import print_sections, to_json
from ..spec import MODEL_MODES, parse_drafters
from ..util import heartbeat, progress_every, sigterm_interrupts
from .common import (
    OUTPUT_DIR,
    api_key_option,
    backend_option,
    drafter_methods,
    json_option,
    max_num_seqs_option,
    spec_options,
)


def _int_list(ctx, param, value: str) -> tuple[int, ...]:
    if value.strip().lower() in ("", "none", "0"):
        return ()
    try:
        out = tuple(int(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r}: give comma-separated positive integers, e.g. 1,4,8 (or none).") from None
    if any(v < 1 for v in out):
        raise click.BadParameter(f"{value!r}: concurrency levels must be at least 1.")
    return out


def _names(value: str | None) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


class _Progress:
    """Progress bars on a terminal; otherwise (logs, CI) one line per request, and a line every
    ``VOCABBRIDGE_PROGRESS_SECONDS`` (30 s) without one (a server starting, a long request)."""

    def __init__(self):
        self.console = Console(stderr=True)
        self.tty = sys.stderr.isatty()
        self.bars = None
        self.task = None
        self.done = self.total = 0
        self.config = ""
        self.doing = "starting"
        self.said = time.monotonic()
        self._beat = None

    def __enter__(self):
        if self.tty:
            self.bars = Progress(
                SpinnerColumn(),
                TextColumn("{task.fields[config]:<22}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.description}"),
                console=self.console,
            )
            self.bars.start()
        else:
            self._beat = heartbeat(self._still)
            self._beat.__enter__()
        return self

    def __exit__(self, *exc):
        if self._beat is not None:
            self._beat.__exit__(*exc)
        if self.bars is not None:
            self.bars.stop()

    def _print(self, text: str, **kw) -> None:
        self.said = time.monotonic()
        self.console.print(text, highlight=False, markup=False, **kw)

    def _still(self, elapsed: float) -> str | None:
        quiet = time.monotonic() - self.said
        if quiet < progress_every():
            return None
        self.said = time.monotonic()
        where = f"[{self.config} {self.done}/{self.total}] " if self.config else ""
        return f"{where}still {self.doing} ({quiet:.0f} s since the last line, {elapsed:.0f} s in all)"

    def config_started(self, name, total):
        self.config, self.done, self.total = name, 0, total
        if self.bars is not None:
            self.task = self.bars.add_task("", total=total, config=name)

    def request_started(self, label):
        self.doing = f"running {label.split(': ', 1)[-1]}"
        if self.bars is not None and self.task is not None:
            self.bars.update(self.task, description=label.split(": ", 1)[-1])

    def request_done(self, r):
        self.done += 1
        if self.bars is not None and self.task is not None:
            self.bars.advance(self.task)
            return
        c = r.completion
        what = f"{r.output_tokens} tokens, TTFT {c.ttft or 0:.2f} s, {c.total_time:.1f} s" if r.ok else f"failed: {c.error}"
        prefill = "" if r.prefill is None else f" (prefill {r.prefill})"
        self._print(f"[{self.config} {self.done}/{self.total}] {r.phase} {r.prompt_id}{prefill}: {what}")

    def config_done(self, result):
        if self.bars is not None and self.task is not None:
            self.bars.update(self.task, description="done")

    def message(self, text):
        self.config, self.doing = "", text.rstrip("…. ")  # e.g. "ngram: starting (vocabbridge serve)"
        self._print(text, style="dim")


def _command_line() -> str | None:
    prog = Path(sys.argv[0]).name if sys.argv else ""
    if prog not in ("vocabbridge", "__main__.py"):
        return None
    env = f"VOCABBRIDGE_MODELS={shlex.quote(os.environ['VOCABBRIDGE_MODELS'])} " if os.environ.get("VOCABBRIDGE_MODELS") else ""
    return env + "vocabbridge " + shlex.join(sys.argv[1:])


@click.command("bench")
@spec_options(exclude=("drafter", "mode"), engine=False)
@click.option(
    "--url", "urls", multiple=True, metavar="URL", help="A running OpenAI-compatible server (ours or vLLM); repeatable."
)
@click.option("--name", "names", multiple=True, help="A name for each --url, in order. [default: host:port]")
@click.option(
    "--drafters",
    metavar="LIST",
    help="Configurations to start in turn, comma-separated, each as --drafter takes it: "
    f"{', '.join(drafter_methods(engine=False))}, [ngram+]mtp:HEAD_FOLDER, self:L, or MODEL[:[ngram+]MODE] "
    f"(MODE: {', '.join(MODEL_MODES)}); e.g. none,ngram,smollm2-135m:text.",
)
@backend_option("As `vocabbridge serve --backend`.")
@click.option(
    "--launch",
    type=click.Choice(["auto", "inprocess", "subprocess"]),
    default="auto",
    show_default=True,
    help="auto: in this process for the embedded backend (models load once for all configurations), "
    "`vocabbridge serve` subprocesses for vLLM.",
)
@max_num_seqs_option("Requests a started server generates at once.")
@click.option(
    "--vllm-args",
    metavar="ARGS",
    default="",
    help="Arguments for `vllm serve` in started vLLM configurations, as one string, e.g. '-O0 --max-model-len 4096'.",
)
@click.option(
    "--startup-timeout", default=1200.0, show_default=True, type=click.FloatRange(1), help="Seconds to wait for a started server."
)
@click.option(
    "--prompts",
    "prompts_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="A JSONL prompt suite of your own. [default: the built-in five-category suite]",
)
@click.option("--categories", metavar="LIST", help="Only these categories (comma-separated), e.g. korean_chat,code_generation.")
@click.option("--prompt-ids", metavar="LIST", help="Only these prompt ids (comma-separated).")
@click.option(
    "--thinking",
    type=click.Choice(["model", "on", "off", "both"]),
    default="model",
    show_default=True,
    help="chat_template_kwargs.enable_thinking: model sends nothing (the template's default).",
)
@click.option(
    "--prefill-think",
    "prefill_think",
    multiple=True,
    metavar="TEXT",
    help="Also run every prompt with the answer started by a closed think block (continue_final_message), "
    "beside the plain requests; repeatable. match: the built-in block in the prompt's language; en, ko: "
    "that block for every prompt; anything else: that text (\\n escapes).",
)
@click.option("--max-tokens", default=400, show_default=True, type=click.IntRange(1), help="Output tokens per request.")
@click.option("--repeats", default=2, show_default=True, type=click.IntRange(1), help="Times each prompt is measured.")
@click.option("--temperature", type=click.FloatRange(0), help="0 = greedy. [default: left out: the server's / model's own]")
@click.option("--concurrency", default="1,4,8", show_default=True, callback=_int_list, help="Concurrency levels (or none).")
@click.option("--warmup/--no-warmup", default=True, show_default=True, help="One request per configuration, reported apart.")
@click.option("--baseline", help="The no-drafting configuration speedups are against. [default: the one named none]")
@api_key_option("Bearer token for --url servers.")
@click.option(
    "--request-timeout", default=1800.0, show_default=True, type=click.FloatRange(1), help="Seconds one request may take."
)
@click.option("--out", "out_dir", type=OUTPUT_DIR, help="Write results.json, report.md and the PNG plots here.")
@json_option("Print everything as JSON (tables are not printed).")
def bench_cmd(
    spec,
    urls,
    names,
    drafters,
    backend,
    launch,
    max_num_seqs,
    vllm_args,
    startup_timeout,
    prompts_file,
    categories,
    prompt_ids,
    thinking,
    prefill_think,
    max_tokens,
    repeats,
    temperature,
    concurrency,
    warmup,
    baseline,
    api_key,
    request_timeout,
    out_dir,
    as_json,
):
    """Compare drafting configurations on the same server hardware, the way the EXAONE study did.

    Per configuration: a warm-up request (reported apart, not averaged), then repeats × prompts ×
    thinking modes (× --prefill-think variants) one at a time with /metrics read before and after
    each (acceptance, per-position acceptance, mean acceptance length, target forwards), then the
    concurrency sweep. Speedups are against the configuration named `none`.

    \b
    Examples:
      vocabbridge bench --url http://127.0.0.1:8000 --name ngram --url http://127.0.0.1:8001 --name none
      vocabbridge bench --url http://127.0.0.1:8000 --name mtp --thinking off --prefill-think match --prefill-think en
      VOCABBRIDGE_MODELS=/work/models vocabbridge bench --target qwen2.5-coder-1.5b \\
          --drafters none,ngram,qwen2.5-coder-0.5b,smollm2-135m:bridged,smollm2-135m:text \\
          --max-tokens 64 --repeats 1 --concurrency 1,4 --temperature 0 --out benchmarks/results/run
    """
    if bool(urls) == bool(drafters):
        raise BenchError("give either --url (running servers) or --drafters (configurations to start), not both or neither.")
    if names and len(names) != len(urls):
        raise BenchError(f"{len(names)} --name for {len(urls)} --url; give one --name per --url, or none.")
    prompts = select_prompts(load_prompts(prompts_file), categories=_names(categories), ids=_names(prompt_ids))
    settings = BenchSettings(
        max_tokens=max_tokens,
        repeats=repeats,
        thinking=thinking,
        temperature=temperature,
        concurrency=concurrency,
        warmup=warmup,
        baseline=baseline,
        request_timeout=request_timeout,
        prefill_think=prefill_think,
    )
    try:
        with sigterm_interrupts(), _Progress() as progress:
            if urls:
                endpoints = [Endpoint(n, u) for n, u in zip(names or [base_url(u).split("://", 1)[1] for u in urls], urls)]
                result = bench_urls(endpoints, prompts, settings, api_key=api_key, progress=progress)
            else:
                extra = ("--", *shlex.split(vllm_args)) if vllm_args else ()
                ls = LaunchSettings(
                    spec,
                    backend=backend,
                    launch=launch,
                    startup_timeout=startup_timeout,
                    max_num_seqs=max_num_seqs,
                    serve_args=extra,
                )
                result = bench_launched(parse_drafters(drafters), ls, prompts, settings, progress=progress)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the server being started or measured is stopped on the way out
        click.echo("vocabbridge bench: interrupted; stopped, with every server it had started", err=True)
        sys.exit(130)
    if out_dir is not None:
        written = write_outputs(result, out_dir, command=_command_line())
        click.echo(f"wrote {', '.join(str(p) for p in written.values())}", err=True)
    if as_json:
        click.echo(to_json(result))
    else:
        # Wide tables in logs and pipes, where rich would otherwise wrap them at 80 columns.
        console = Console() if sys.stdout.isatty() else Console(width=180)
        print_sections(sections(result), console=console, title="vocabbridge bench")
    failed = [c for c in result.configs if c.error]
    if failed:
        raise BenchError(
            f"{len(failed)} of {len(result.configs)} configurations could not be benchmarked; "
            f"{failed[0].name}: {failed[0].error.splitlines()[0]}"
        )
