"""``vocabbridge build-map`` and ``vocabbridge coverage``: parse, call the mapping library, render."""

from __future__ import annotations

import json
from pathlib import Path

import click

from .common import TOKENIZER, format_options, pattern_option, status

TEXT_OPTION = click.option(
    "--text", "texts", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
    help="A UTF-8 text file for corpus coverage (repeatable). Default: the small Korean/English chat, prose and code set shipped with vocabbridge.",
)  # fmt: skip


def _read_texts(paths) -> dict[str, str]:
    from ..diff.core import read_text_file
    from ..mapping import default_texts

    return {str(p): read_text_file(p) for p in paths} if paths else default_texts()


def _render(sections, fmt: str, title: str) -> None:
    from ..report import print_sections, to_markdown

    if fmt == "markdown":
        click.echo(to_markdown(sections, title=title))
    else:
        print_sections(sections, title=title)


@click.command("build-map")
@click.argument("drafter", type=TOKENIZER)
@click.argument("target", type=TOKENIZER)
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the map file here (e.g. maps/NAME.json). Without it, only the coverage is shown.")  # fmt: skip
@click.option("--mode", type=click.Choice(["bytes", "vllm"]), default="bytes", show_default=True,
              help="bytes: pair by raw bytes, specials by role; vllm: vLLM's use_heterogeneous_vocab string map, exactly.")  # fmt: skip
@TEXT_OPTION
@click.option("--num-speculative-tokens", default=3, show_default=True, type=click.IntRange(1),
              help="Draft tokens per step, for the printed vLLM --speculative-config.")  # fmt: skip
@click.option("--drafter-vocab-size", type=click.IntRange(1), help="The drafter model's vocabulary size (embedding rows), when the tokenizer source does not say.")
@click.option("--target-vocab-size", type=click.IntRange(1), help="The target model's vocabulary size (embedding rows), when the tokenizer source does not say.")
@pattern_option
@format_options
def build_map_cmd(drafter, target, output, mode, texts, num_speculative_tokens, drafter_vocab_size, target_vocab_size, pattern, fmt):
    """Build the DRAFTER → TARGET token map, show its coverage, and print vLLM's hand-off.

    Coverage is shown for the map built and for vLLM's own string map (what vLLM will get), over
    the vocabulary and over real text (--text, or the shipped texts).

    \b
    Examples:
      vocabbridge build-map ../shared/tokenizers/smollm2 ../shared/tokenizers/qwen3 -o maps/smollm2_to_qwen3.json
      vocabbridge build-map LGAI-EXAONE/EXAONE-4.0-1.2B LGAI-EXAONE/EXAONE-4.5-33B -o maps/4.0_to_4.5.json --text chat.txt
      vocabbridge build-map A B --mode vllm --json
    """
    from ..mapping import build_token_map, compute_coverage, save_map
    from ..mapping.render import coverage_dict, coverage_sections, map_section, speculative_config, serve_command, vllm_section
    from ..report import to_jsonable
    from ..tokenizer import load_tokenizer

    text_map = _read_texts(texts)
    with status("loading tokenizers…"):
        dv = load_tokenizer(drafter, pattern=pattern)
        tv = load_tokenizer(target, pattern=pattern)
    with status(f"building the {mode} map…"):
        sizes = {"drafter_vocab_size": drafter_vocab_size, "target_vocab_size": target_vocab_size}
        tm = build_token_map(dv, tv, mode=mode, **sizes)
        vm = tm if mode == "vllm" else build_token_map(dv, tv, mode="vllm", **sizes)
    with status("coverage over the vocabulary and the texts…" + (" (and the input bridge)" if output else "")):
        cov = compute_coverage(tm, dv, tv, texts=text_map, vllm_map=vm, check_bridge=output is not None)
        covs = [cov] if mode == "vllm" else [cov, compute_coverage(vm, dv, tv, texts=text_map)]
    if output is not None:
        with status(f"writing {output}…"):
            save_map(tm.with_coverage(cov), output)
    config = speculative_config(drafter, num_speculative_tokens)
    if fmt == "json":
        click.echo(json.dumps({
            "map": None if output is None else str(output),
            "mode": mode,
            "drafter": to_jsonable(tm.drafter),
            "target": to_jsonable(tm.target),
            "stats": to_jsonable(tm.stats),
            "coverage": {c.mode: coverage_dict(c) for c in covs},
            "vllm": {"speculative_config": config, "serve_command": serve_command(target, config), "coverage_mode": "vllm"},
        }, ensure_ascii=False, indent=2))  # fmt: skip
        return
    vcov = covs[-1]
    sections = [map_section(tm, None if output is None else str(output)), *coverage_sections(covs),
                vllm_section(vcov, config, target, own=cov)]  # fmt: skip
    _render(sections, fmt, f"vocabbridge build-map: {drafter} → {target}")


@click.command("coverage")
@click.argument("map_path", metavar="MAP", type=click.Path(dir_okay=False, path_type=Path))
@TEXT_OPTION
@click.option("--compare-modes", is_flag=True, help="Also build the other mode's map for the same pair and show both side by side.")
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
    from ..errors import MapFileError, VocabBridgeError
    from ..mapping import build_token_map, compute_coverage, load_map
    from ..mapping.render import coverage_dict, coverage_sections, map_section
    from ..report import to_jsonable
    from ..tokenizer import load_tokenizer

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
    dv, tv = views
    tm.check(dv, tv, path=str(map_path))
    with status("coverage…"):
        other = None
        if compare_modes:
            other = build_token_map(dv, tv, mode="vllm" if tm.mode == "bytes" else "bytes",
                                    drafter_vocab_size=tm.drafter.model_vocab_size, target_vocab_size=tm.target.model_vocab_size)  # fmt: skip
        vm = other if other is not None and other.mode == "vllm" else None
        covs = [compute_coverage(tm, dv, tv, texts=text_map, vllm_map=vm)]
        if other is not None:
            covs.append(compute_coverage(other, dv, tv, texts=text_map, vllm_map=tm if tm.mode == "vllm" else None))
        covs.sort(key=lambda c: c.mode)  # bytes, then vllm
    if fmt == "json":
        click.echo(json.dumps({
            "map": str(map_path), "mode": tm.mode, "drafter": to_jsonable(tm.drafter), "target": to_jsonable(tm.target),
            "coverage": {c.mode: coverage_dict(c) for c in covs},
        }, ensure_ascii=False, indent=2))  # fmt: skip
        return
    _render([map_section(tm, None), *coverage_sections(covs)], fmt, f"vocabbridge coverage: {map_path}")
