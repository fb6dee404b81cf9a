"""``vocabbridge generate`` and ``vocabbridge eval-drafter``: parse, run the engine, render."""

from __future__ import annotations

import codecs
import sys
from pathlib import Path

import click

from ..chat import chat_prompt_ids
from ..engine import SamplingParams, SpecEngine
from ..engine.drafters import SelfSpecDrafter
from ..engine.engine import shown_tokens
from ..engine.factory import build_engine
from ..engine.offline import eval_drafter, eval_sequences, sweep_self_spec
from ..engine.summary import offline_section, self_sweep_section, stats_section
from ..errors import ConfigError
from ..report import print_sections, to_json
from .common import json_option, spec_options, status


def _prompt_ids(view, prompt: str, raw: bool, thinking: bool | None) -> list[int]:
    if raw:
        return view.encode(prompt)
    kw = {} if thinking is None else {"enable_thinking": thinking}
    return chat_prompt_ids(view, [{"role": "user", "content": prompt}], **kw)


class _Printer:
    """Prints each step's text as it comes (an incremental UTF-8 decoder holds split characters back),
    without the stop token that ends it."""

    def __init__(self, view):
        self.view = view
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, step) -> None:
        sys.stdout.write(self.decoder.decode(self.view.decode_bytes(shown_tokens(step.tokens, step.finish_reason))))
        sys.stdout.flush()

    def close(self) -> None:
        sys.stdout.write(self.decoder.decode(b"", final=True) + "\n")


@click.command("generate")
@spec_options()
@click.option("-p", "--prompt", help="The prompt (a user message unless --raw).")
@click.option("--prompt-file", type=click.Path(exists=True, dir_okay=False, path_type=Path), help="Read the prompt from a file.")
@click.option("--raw", is_flag=True, help="Send the prompt as is, without the chat template.")
@click.option("--thinking/--no-thinking", default=None, help="enable_thinking for chat templates that know it.")
@click.option("--max-tokens", default=128, show_default=True, type=click.IntRange(1), help="Tokens to generate at most.")
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(0), help="0 = greedy.")
@click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(0, 1, min_open=True), help="Nucleus sampling.")
@click.option("--top-k", default=0, show_default=True, type=click.IntRange(0), help="Sample among the k likeliest; 0 = off.")
@click.option("--seed", type=int, help="Random seed for sampling (the same seed gives the same text).")
@click.option("--compare-plain", is_flag=True, help="Also decode without drafting and check the outputs are identical.")
@json_option("Print text and stats as JSON.")
def generate_cmd(spec, prompt, prompt_file, raw, thinking, max_tokens, temperature, top_p, top_k, seed, compare_plain, as_json):
    """Generate once with a drafter and print the text and the drafting statistics.

    \b
    Examples:
      vocabbridge generate --target qwen2.5-coder-1.5b --drafter ngram -p "Write a binary search in Python."
      vocabbridge generate --drafter smollm2-135m --mode text -p "안녕하세요!" --compare-plain
    """
    if (prompt is None) == (prompt_file is None):
        raise ConfigError("give exactly one of --prompt and --prompt-file.")
    text = prompt if prompt is not None else prompt_file.read_text(encoding="utf-8")
    with status("loading models…"):
        built = build_engine(spec)
    click.echo(f"vocabbridge generate: {built.ready_line()}", err=True)
    ids = _prompt_ids(built.target.view, text, raw, thinking)
    params = SamplingParams(max_new_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    printer = None if as_json else _Printer(built.target.view)
    result = built.engine.generate(ids, params, on_step=printer)
    if printer is not None:
        printer.close()
    out = {
        "config": built.describe(),
        "text": result.text,
        "tokens": result.tokens,
        "finish_reason": result.finish_reason,
        "stats": result.stats,
    }
    if compare_plain:
        plain = SpecEngine(built.target).generate(ids, params)
        out["plain"] = {
            "identical": plain.tokens == result.tokens,
            "stats": plain.stats,
            "speedup": plain.stats.time_total / result.stats.time_total,
        }
    if as_json:
        click.echo(to_json(out))
        return
    sections = [stats_section(result.stats, f"Speculative decoding ({built.mode})")]
    if compare_plain:
        p = out["plain"]
        sections.append(stats_section(p["stats"], "Plain decoding"))
        sections[-1].notes.append(f"identical to plain: {'yes' if p['identical'] else 'NO'}; speedup ×{p['speedup']:.2f}")
    print_sections(sections)


def _layer_list(ctx, param, value: str | None) -> tuple[int, ...]:
    if not value:
        return ()
    try:
        return tuple(int(x) for x in value.split(",") if x.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r}: give layer counts separated by commas, e.g. 4,8,14.") from None


@click.command("eval-drafter")
@spec_options(drafter_required=True)
@click.option(
    "--text",
    "texts",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Score along this text (repeatable). Without --text, the target's own greedy continuations are used.",
)
@click.option("-p", "--prompt", "prompts", multiple=True, help="A chat prompt whose greedy continuation is scored (repeatable).")
@click.option(
    "--continuation-tokens",
    default=64,
    show_default=True,
    type=click.IntRange(1),
    help="Tokens of the target's greedy continuation scored per prompt.",
)
@click.option("--max-positions", default=512, show_default=True, type=click.IntRange(2), help="Tokens of each --text scored.")
@click.option(
    "--layers",
    metavar="L1,L2,…",
    callback=_layer_list,
    help="With --drafter self:L: score these early-exit depths too (e.g. 4,8,14,20), the target loaded once, "
    "each with its draft cost relative to a full target forward.",
)
@json_option("Print the configuration and the figures as JSON.")
def eval_drafter_cmd(spec, texts, prompts, continuation_tokens, max_positions, layers, as_json):
    """Offline expected acceptance of a drafter, without the generate loop.

    Per draft position, the share of positions where the drafter's first j proposals equal the
    target's greedy tokens, and the mean target probability of its first proposal. On the
    target's own greedy continuations this is the greedy acceptance the engine would get.

    \b
    Examples:
      vocabbridge eval-drafter --target qwen2.5-coder-1.5b --drafter smollm2-135m --mode bridged
      vocabbridge eval-drafter --drafter smollm2-135m --mode text --text notes.md
      vocabbridge eval-drafter --target qwen2.5-coder-1.5b --drafter self:8 --layers 4,14,20
    """
    if layers and spec.self_layers is None:
        raise ConfigError(
            "--layers sweeps self-speculation depths; use it with --drafter self:L (e.g. --drafter self:8 --layers 4,14)."
        )
    with status("loading models…"):
        built = build_engine(spec)
    click.echo(f"vocabbridge eval-drafter: {built.ready_line()}", err=True)
    depths = sorted({spec.self_layers, *layers}) if layers else []
    for n in depths:
        SelfSpecDrafter(built.target, layers=n)  # a bad L fails here, before the scoring
    with status("the sequences to score (the target's greedy continuations unless --text)…"):
        seqs, source = eval_sequences(
            built.target, texts=texts, prompts=prompts, continuation_tokens=continuation_tokens, max_positions=max_positions
        )
    if depths:
        k = spec.num_speculative_tokens
        with status(f"scoring self-speculation at {len(depths)} depths…"):
            points = sweep_self_spec(built.target, seqs, depths, k=k, min_confidence=spec.min_confidence)
        if as_json:
            click.echo(to_json({"config": built.describe(), "source": source, "k": k, "sweep": points}))
            return
        print_sections([self_sweep_section(points, source, k)])
        return
    with status("scoring the drafter…"):
        ev = eval_drafter(built.target, built.engine.drafter, seqs, k=spec.num_speculative_tokens, name=built.mode)
    if as_json:
        click.echo(to_json({"config": built.describe(), "source": source, "eval": ev}))
        return
    print_sections([offline_section(ev, source)])
