from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

from ..diff import diff_tokenizers
from ..diff.render import diff_json, sections
from ..report import print_sections, to_markdown
from ..tokenizer import load_tokenizer
from ..util import read_text_file
from .common import OUTPUT_FILE, TOKENIZER, emit, format_options, pattern_option, status


@click.command("diff")
@click.argument("a", type=TOKENIZER)
@click.argument("b", type=TOKENIZER)
@click.option(
    "--text",
    "texts",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="A UTF-8 text file: tokens per character and round-trip for each tokenizer. Repeatable.",
)
@click.option("--examples", default=8, show_default=True, type=click.IntRange(0), help="Examples per list.")
@pattern_option
@format_options
@click.option("-o", "--output", type=OUTPUT_FILE, help="Write the report here.")
def diff_cmd(a, b, texts, examples, pattern, fmt, output):
    """Show exactly how tokenizer A differs from tokenizer B.

    Vocabulary by raw bytes (identical id prefix, moved, only-in), merges, normalizer and
    pre-tokenizer (regexes and behaviour on sample texts), special tokens by role, multi-word
    tokens, and a per-script breakdown.

    \b
    Examples:
      vocabbridge diff ../shared/tokenizers/cl100k ../shared/tokenizers/llama-3
      vocabbridge diff LGAI-EXAONE/EXAONE-4.0-1.2B LGAI-EXAONE/EXAONE-4.5-33B --text chat.txt
      vocabbridge diff A B --format markdown -o diff.md
    """

    with status("loading tokenizers…"):
        va = load_tokenizer(a, pattern=pattern)
        vb = load_tokenizer(b, pattern=pattern)
        d = diff_tokenizers(va, vb, texts={str(t): read_text_file(t) for t in texts}, examples=examples)
    if fmt == "json":
        emit(diff_json(d), output)
    elif fmt == "markdown":
        emit(to_markdown(sections(d), title=f"vocabbridge diff: {a} → {b}"), output)
    elif output is not None:
        with output.open("w", encoding="utf-8") as f:
            print_sections(sections(d), console=Console(file=f, width=160), title=f"{a}  →  {b}")
        click.echo(f"wrote {output}", err=True)
    else:
        print_sections(sections(d), title=f"{a}  →  {b}")
