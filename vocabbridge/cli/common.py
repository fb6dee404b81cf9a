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


def engine_options(fn):
    """--target/--drafter/--mode/--map/-k... merged into one ``spec`` (an EngineSpec)."""

    @click.option("--target", metavar="MODEL", help="Target: a preset (vocabbridge presets), a model folder, a .gguf file or a hub id. "
                  "Defaults to the drafter preset's target.")  # fmt: skip
    @click.option("--drafter", default="none", show_default=True, metavar="DRAFTER",
                  help="none | ngram | mtp | a drafter model (preset, folder, .gguf, hub id).")  # fmt: skip
    @click.option("--mode", type=click.Choice(["auto", "draft", "bridged", "text"]), default="auto", show_default=True,
                  help="How a model drafter meets the target: draft (same vocabulary), bridged (token map), "
                       "text (re-tokenized drafted text). auto: draft when the vocabularies match, else text.")  # fmt: skip
    @click.option("--map", "map_path", type=click.Path(dir_okay=False), help="Token map for --mode bridged (built and cached when absent).")
    @click.option("-k", "--num-speculative-tokens", default=4, show_default=True, type=click.IntRange(1, 64))
    @click.option("--prompt-lookup-min", default=1, show_default=True, type=click.IntRange(1))
    @click.option("--prompt-lookup-max", default=4, show_default=True, type=click.IntRange(1))
    @click.option("--adaptive-k/--fixed-k", default=False, show_default=True, help="Grow k after full acceptance, shrink after a miss.")
    @click.option("--min-confidence", default=0.0, show_default=True, type=click.FloatRange(0, 1, max_open=True),
                  help="Model drafters: stop drafting when the product of the drafter's top probabilities (its own "
                       "estimate that the draft survives) falls below this; 0 = always draft k.")  # fmt: skip
    @click.option("--ngram-first/--no-ngram-first", default=False, show_default=True,
                  help="Model drafters: propose a prompt-lookup match when there is one, the model otherwise.")  # fmt: skip
    @click.option("--dtype", default="auto", show_default=True, help="Target dtype: auto (fp32 on CPU, bf16 on CUDA), float32, bfloat16, float16.")
    @click.option("--drafter-dtype", default="auto", show_default=True,
                  help="Drafter dtype: auto (int8 weights on CPU, else the target's), int8, float32, bfloat16.")  # fmt: skip
    @click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda, cuda:1 ...")
    @functools.wraps(fn)
    def wrapper(*args, target, drafter, mode, map_path, num_speculative_tokens, prompt_lookup_min, prompt_lookup_max,
                adaptive_k, min_confidence, ngram_first, dtype, drafter_dtype, device, **kwargs):  # fmt: skip
        from ..engine.factory import EngineSpec

        spec = EngineSpec(
            target=target, drafter=drafter, mode=mode, map_path=map_path, num_speculative_tokens=num_speculative_tokens,
            prompt_lookup_min=prompt_lookup_min, prompt_lookup_max=prompt_lookup_max, adaptive_k=adaptive_k,
            min_confidence=min_confidence, ngram_first=ngram_first, dtype=dtype, drafter_dtype=drafter_dtype, device=device,
        )  # fmt: skip
        return fn(*args, spec=spec, **kwargs)

    return wrapper
