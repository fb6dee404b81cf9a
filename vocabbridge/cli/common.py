"""What every command shares: the lazy group with --debug and error display, the options derived
from :class:`~vocabbridge.spec.EngineSpec`, checked output paths, and output helpers.
Commands parse, call one library function, and render."""

from __future__ import annotations

import functools
import importlib
import os
import sys
import tempfile
from pathlib import Path

import click
from click.shell_completion import CompletionItem
from rich.console import Console

from ..errors import VocabBridgeError
from ..spec import DRAFTERS, METHOD_NAMES, MODEL_MODES, EngineSpec, Option, options
from ..util import atomic_write_text, heartbeat


class Group(click.Group):
    """Commands imported when used (``vocabbridge diff`` never imports torch), and
    VocabBridgeError shown as one line (exit 1); ``--debug`` / VOCABBRIDGE_DEBUG=1 re-raise it."""

    def __init__(self, *args, lazy: dict[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy = lazy or {}  # name → "module:attr"

    def list_commands(self, ctx):
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx, name):
        if name in self.lazy and name not in self.commands:
            module, _, attr = self.lazy[name].partition(":")
            self.add_command(getattr(importlib.import_module(module), attr), name)
        return super().get_command(ctx, name)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except VocabBridgeError as e:
            if ctx.params.get("debug") or os.environ.get("VOCABBRIDGE_DEBUG"):
                raise
            raise click.ClickException(str(e)) from None


class TokenizerSource(click.ParamType):
    """A tokenizer.json, an HF folder, a .gguf file, a tiktoken rank file, or a hub id."""

    name = "TOKENIZER"

    def shell_complete(self, ctx, param, incomplete):

        return [CompletionItem(incomplete, type="file")]


TOKENIZER = TokenizerSource()


# ==== output paths, checked before the work =====================================================


def writable_path(path: Path, *, folder: bool = False) -> str | None:
    """Why ``path`` cannot be written (None when it can): tried for real, by creating the folder it
    goes in and a temporary file there, so a bad ``-o`` fails at once and not after minutes of work."""
    target = path if folder else path.parent
    if not folder and path.is_dir():
        return f"{path} is a folder; give a file name"
    if folder and path.exists() and not path.is_dir():
        return f"{path} is a file, not a folder"
    probe = target
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        return f"{probe} is a file, not a folder"
    try:
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target, prefix=".vocabbridge-write-check-"):
            pass
    except OSError as e:
        return f"cannot write in {target}: {e.strerror or e}"
    return None


class OutputPath(click.Path):
    """A file (or folder) this command will write, checked when the command line is parsed."""

    def __init__(self, *, folder: bool = False):
        super().__init__(dir_okay=folder, file_okay=not folder, path_type=Path)
        self.folder = folder

    def convert(self, value, param, ctx):
        path = Path(value).expanduser()
        why = writable_path(path, folder=self.folder)
        if why:
            self.fail(f"{why}; choose another path.", param, ctx)
        return path


OUTPUT_FILE = OutputPath()
OUTPUT_DIR = OutputPath(folder=True)


def emit(text: str, output: Path | None) -> None:
    """Write ``text`` to ``output`` (atomically) or stdout."""
    if output is None:
        click.echo(text)
        return
    atomic_write_text(output, text)
    click.echo(f"wrote {output}", err=True)


def status(message: str):
    """A spinner on stderr while something slow runs; off a terminal (logs, pipes, CI), where a
    spinner does not draw, a plain line every ``VOCABBRIDGE_PROGRESS_SECONDS`` (30 s) instead."""
    if not sys.stderr.isatty():
        prog = click.get_current_context(silent=True)
        name = f"vocabbridge {prog.info_name}" if prog is not None else "vocabbridge"
        return heartbeat(lambda s: f"{name}: {message.rstrip('…')}… (still working, {s:.0f} s)")
    return Console(stderr=True).status(message)


# ==== options ===================================================================================


# ==== options several commands take, declared once =============================================

BACKENDS = ("auto", "embedded", "vllm")
# the target writing self-distillation data: train-head --data-dtype, transplant --heal-data-dtype
DATA_DTYPES = ("auto", "int8", "float32", "bfloat16")


def backend_option(help: str = "auto: vLLM when it is installed and a CUDA GPU is present, else the embedded engine."):
    return click.option("--backend", type=click.Choice(BACKENDS), default="auto", show_default=True, help=help)


def max_num_seqs_option(help: str):
    return click.option("--max-num-seqs", type=click.IntRange(1), default=None, help=help)


def api_key_option(help: str):
    return click.option("--api-key", envvar="VOCABBRIDGE_API_KEY", show_envvar=True, help=help)


def json_option(help: str = "Print the result as JSON."):
    return click.option("--json", "as_json", is_flag=True, help=help)


def pattern_option(fn):
    return click.option(
        "--pattern",
        metavar="REGEX|NAME",
        help="Split regex for tiktoken rank files (a regex, or cl100k, o200k, gpt2, llama3).",
    )(fn)


def format_options(fn):
    """--format table|markdown|json and its --json shorthand, merged into ``fmt``."""

    @click.option(
        "--format",
        "fmt",
        type=click.Choice(["table", "markdown", "json"]),
        default="table",
        show_default=True,
        help="table for people, markdown for pages, json for machines.",
    )
    @json_option("Same as --format json.")
    @functools.wraps(fn)
    def wrapper(*args, fmt, as_json, **kwargs):
        return fn(*args, fmt="json" if as_json else fmt, **kwargs)

    return wrapper


def _click_option(name: str, o: Option, default, help_text: str, *, required: bool = False):
    decls = [f"{o.flag}/{o.off_flag}"] if o.kind == "bool" else [o.flag]
    if o.short:
        decls.insert(0, o.short)
    kw = {"help": help_text, "metavar": o.metavar}
    if required:
        kw["required"] = True
    else:
        kw |= {"default": default, "show_default": default is not None}
    if o.kind == "int":
        kw["type"] = click.IntRange(None if o.lo is None else int(o.lo), None if o.hi is None else int(o.hi))
    elif o.kind == "float":
        kw["type"] = click.FloatRange(o.lo, o.hi, max_open=o.hi_open)
    elif o.kind == "choice":
        kw["type"] = click.Choice(o.choices)
    elif o.kind == "path":
        kw["type"] = click.Path(dir_okay=False)
    return click.option(*decls, name, **kw)


def drafter_methods(*, engine: bool) -> list[str]:
    """The methods ``--drafter`` takes besides a model: those the embedded engine has (``engine``), or all."""
    return [m for m in METHOD_NAMES if not engine or DRAFTERS[m].engine is not None]


def drafter_help(*, engine: bool) -> str:
    """``--drafter``'s help, from the registry (every method, the model modes, the grammar)."""
    return (
        f"What drafts: {', '.join(drafter_methods(engine=engine))}, or a drafter model (a preset, a folder, a .gguf file "
        "or a hub id); mtp:HEAD_FOLDER drafts with a head trained by train-head, self:L with the target's own first L "
        f"layers; MODEL:MODE picks how a model meets the target ({', '.join(MODEL_MODES)}, as --mode), MODEL:ngram+MODE "
        "and ngram+mtp:HEAD put prompt lookup first."
    )


def spec_options(*, exclude: tuple[str, ...] = (), engine: bool = True, drafter_required: bool = False):
    """Every :class:`EngineSpec` field as a click option (flag, help, type and default come from
    the field), merged into one ``spec`` argument. ``exclude``: fields the command sets itself
    (bench's ``--drafters`` list). ``engine``: the command runs only the embedded engine, so
    ``--drafter`` lists only the methods it has and the help says nothing of vLLM; ``engine=False``
    (serve, bench: they have ``--backend vllm``) adds what an option does there (``Option.vllm_help``)."""
    fields = [(name, o, default) for name, o, default in options() if name not in exclude]

    def spec_from(params: dict) -> EngineSpec:
        return EngineSpec(**{name: params[name] for name, _, _ in fields})

    def decorate(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            spec = spec_from(kwargs)
            for name, _, _ in fields:
                del kwargs[name]
            return fn(*args, spec=spec, **kwargs)

        wrapper.spec_from = spec_from  # the spec a parsed command line makes (tests)

        for name, o, default in reversed(fields):
            help_text = o.help + (f" {o.vllm_help}" if not engine and o.vllm_help else "")
            if name == "drafter":
                help_text = drafter_help(engine=engine)
            wrapper = _click_option(name, o, default, help_text, required=name == "drafter" and drafter_required)(wrapper)
        return wrapper

    return decorate
