"""``vocabbridge build-map`` and ``vocabbridge coverage``: parse, call the mapping library, render."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import click

from ..errors import MapFileError, VocabBridgeError
from ..mapping import default_texts, load_map, save_map
from ..mapping.map_report import analyze_map, analyze_pair
from ..report import print_sections, to_markdown
from ..spec import EngineSpec, cli_args
from ..tokenizer import load_tokenizer, same_vocabulary
from ..util import read_text_file
from ..vllm.config import speculative_config
from .common import OUTPUT_FILE, TOKENIZER, format_options, pattern_option, status

TEXT_OPTION = click.option(
    "--text",
    "texts",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="A UTF-8 text file for corpus coverage (repeatable). Default: the small Korean/English chat, prose and code set shipped with vocabbridge.",
)


def _read_texts(paths) -> dict[str, str]:
    return {str(p): read_text_file(p) for p in paths} if paths else default_texts()


def _render(sections, fmt: str, title: str) -> None:
    if fmt == "markdown":
        click.echo(to_markdown(sections, title=title))
    else:
        print_sections(sections, title=title)


@click.command("build-map")
@click.argument("drafter", type=TOKENIZER)
@click.argument("target", type=TOKENIZER)
@click.option(
    "-o",
    "--output",
    type=OUTPUT_FILE,
    help="Write the map file here (e.g. maps/NAME.json). Without it, only the coverage is shown.",
)
@click.option(
    "--mode",
    type=click.Choice(["bytes", "vllm"]),
    default="bytes",
    show_default=True,
    help="bytes: pair by raw bytes, specials by role; vllm: vLLM's use_heterogeneous_vocab string map, exactly.",
)
@TEXT_OPTION
@click.option(
    "-k",
    "--num-speculative-tokens",
    default=EngineSpec.num_speculative_tokens,
    show_default=True,
    type=click.IntRange(1),
    help="Draft tokens per step, for the printed vLLM hand-off (the same default as serve's -k).",
)
@click.option(
    "--drafter-vocab-size",
    type=click.IntRange(1),
    help="The drafter model's vocabulary size (embedding rows), when the tokenizer source does not say.",
)
@click.option(
    "--target-vocab-size",
    type=click.IntRange(1),
    help="The target model's vocabulary size (embedding rows), when the tokenizer source does not say.",
)
@pattern_option
@format_options
def build_map_cmd(
    drafter, target, output, mode, texts, num_speculative_tokens, drafter_vocab_size, target_vocab_size, pattern, fmt
):
    """Build the DRAFTER → TARGET token map, show its coverage, and print vLLM's hand-off.

    Coverage is shown for the map built and for vLLM's own string map (what vLLM will get), over
    the vocabulary and over real text (--text, or the shipped texts).

    \b
    Examples:
      vocabbridge build-map ../shared/tokenizers/smollm2 ../shared/tokenizers/qwen3 -o my-maps/smollm2_to_qwen3.json
      vocabbridge build-map LGAI-EXAONE/EXAONE-4.0-1.2B LGAI-EXAONE/EXAONE-4.5-33B -o maps/4.0_to_4.5.json --text chat.txt
      vocabbridge build-map A B --mode vllm --json
    """
    text_map = _read_texts(texts)
    with status("loading tokenizers…"):
        dv = load_tokenizer(drafter, pattern=pattern)
        tv = load_tokenizer(target, pattern=pattern)
    with status(f"building the {mode} map and its coverage…" + (" (and the input bridge)" if output else "")):
        report = analyze_pair(
            dv,
            tv,
            mode=mode,
            texts=text_map,
            drafter_vocab_size=drafter_vocab_size,
            target_vocab_size=target_vocab_size,
            check_bridge=output is not None,
        )
    if output is not None:
        with status(f"writing {output}…"):
            save_map(report.map, output, coverage=report.coverage)
        report.path = str(output)
    spec = EngineSpec(target=tv.source, drafter=dv.source, num_speculative_tokens=num_speculative_tokens, map_path=report.path)
    report.vllm_config = speculative_config(spec, same_vocabulary=same_vocabulary(dv, tv), model_for=str)
    report.serve_line = shlex.join(["vocabbridge", "serve", "--backend", "vllm", *cli_args(spec)])
    if fmt == "json":
        click.echo(json.dumps(report.to_dict(), ensure_ascii=False, indent=2))
        return
    _render(report.sections(written=True), fmt, f"vocabbridge build-map: {drafter} → {target}")


@click.command("coverage")
@click.argument("map_path", metavar="MAP", type=click.Path(dir_okay=False, path_type=Path))
@TEXT_OPTION
@click.option(
    "--compare-modes", is_flag=True, help="Also build the other mode's map for the same pair and show both side by side."
)
@click.option("--drafter", "drafter_src", type=TOKENIZER, help="The drafter tokenizer, when it moved since the map was built.")
@click.option("--target", "target_src", type=TOKENIZER, help="The target tokenizer, when it moved since the map was built.")
@pattern_option
@format_options
def coverage_cmd(map_path, texts, compare_modes, drafter_src, target_src, pattern, fmt):
    """Coverage of a map file over the vocabulary and over real text.

    The tokenizers are reloaded from the sources recorded in the map (or --drafter / --target)
    and must have the fingerprints the map was built for.

    \b
    Examples:
      vocabbridge coverage maps/smollm2_to_qwen3.json
      vocabbridge coverage maps/4.0_to_4.5.json --text chat.txt --compare-modes
    """
    tm = load_map(map_path)
    text_map = _read_texts(texts)
    views = []
    with status("loading tokenizers…"):
        for role, given, side in (("drafter", drafter_src, tm.drafter), ("target", target_src, tm.target)):
            try:
                views.append(load_tokenizer(given or side.source, pattern=pattern))
            except VocabBridgeError as e:
                if given:
                    raise
                raise MapFileError(
                    f"{map_path}: cannot load the {role} tokenizer recorded in the map ({side.source}): {e} "
                    f"Pass --{role} with where it is now."
                ) from e
    with status("coverage…"):
        report = analyze_map(tm, *views, texts=text_map, compare_modes=compare_modes, path=str(map_path))
    if fmt == "json":
        click.echo(json.dumps(report.to_dict(), ensure_ascii=False, indent=2))
        return
    _render(report.sections(), fmt, f"vocabbridge coverage: {map_path}")
