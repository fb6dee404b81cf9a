"""What every command shares: the group with --debug and error display, option decorators,
and output helpers. Commands parse, call one library function, and render."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path

import click

from ..errors import VocabBridgeError


class Group(click.Group):
    """Shows VocabBridgeError as one line (exit 1); ``--debug`` / VOCABBRIDGE_DEBUG=1 re-raise it."""

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
        from click.shell_completion import CompletionItem

        return [CompletionItem(incomplete, type="file")]


TOKENIZER = TokenizerSource()


def pattern_option(fn):
    return click.option(
        "--pattern",
        metavar="REGEX|NAME",
        help="Split regex for tiktoken rank files (a regex, or cl100k, o200k, gpt2, llama3).",
    )(fn)


def format_options(fn):
    """--format table|markdown|json and its --json shorthand, merged into ``fmt``."""

    @click.option("--format", "fmt", type=click.Choice(["table", "markdown", "json"]), default="table", show_default=True,
                  help="table for people, markdown for pages, json for machines.")  # fmt: skip
    @click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
    @functools.wraps(fn)
    def wrapper(*args, fmt, as_json, **kwargs):
        return fn(*args, fmt="json" if as_json else fmt, **kwargs)

    return wrapper


def emit(text: str, output: Path | None) -> None:
    """Write ``text`` to ``output`` (atomically) or stdout."""
    if output is None:
        click.echo(text)
        return
    from ..util import atomic_write_text

    atomic_write_text(output, text)
    click.echo(f"wrote {output}", err=True)


def status(message: str):
    """A spinner on stderr while something slow runs (silent when stderr is not a terminal)."""
    from rich.console import Console

    console = Console(stderr=True)
    if not sys.stderr.isatty():
        import contextlib

        return contextlib.nullcontext()
    return console.status(message)
