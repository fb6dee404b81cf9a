from __future__ import annotations

import sys
from pathlib import Path

import click

from .common import engine_options, status


def _stats_section(stats, title="Speculative decoding"):
    from ..report import Section, fmt_float, fmt_int, fmt_pct

    s = stats
    return Section(title, ["", "value"], [
        ["prompt tokens", fmt_int(s.prompt_tokens)],
        ["generated tokens", fmt_int(s.generated)],
        ["drafts / draft tokens / accepted", f"{s.drafts:,} / {s.draft_tokens:,} / {s.accepted:,}"],
        ["acceptance rate", fmt_pct(s.acceptance_rate)],
        ["mean acceptance length", fmt_float(s.mean_acceptance_length)],
        ["accepted per position", ", ".join(str(x) for x in s.accepted_per_pos) or "—"],
        ["target forwards (prefill incl.)", fmt_int(s.target_forwards)],
        ["tokens per target forward", fmt_float(s.tokens_per_target_forward)],
        ["drafter forwards", fmt_int(s.drafter_forwards)],
        ["steps without drafting (back-off)", fmt_int(s.skipped_drafts)],
        ["time to first token", f"{s.ttft:.2f} s"],
        ["time: draft / verify / other", f"{s.time_draft:.2f} / {s.time_verify:.2f} / {s.time_other:.2f} s"],
        ["tokens/s (decode)", fmt_float(s.decode_tokens_per_second)],
    ])  # fmt: skip


def _prompt_ids(view, prompt: str, raw: bool, thinking: bool | None):
    from ..chat import chat_prompt_ids

    if raw:
        return view.encode(prompt)
    kw = {} if thinking is None else {"enable_thinking": thinking}
    return chat_prompt_ids(view, [{"role": "user", "content": prompt}], **kw)


@click.command("generate")
@engine_options
@click.option("-p", "--prompt", help="The prompt (a user message unless --raw).")
@click.option("--prompt-file", type=click.Path(exists=True, dir_okay=False, path_type=Path), help="Read the prompt from a file.")
@click.option("--raw", is_flag=True, help="Send the prompt as is, without the chat template.")
@click.option("--thinking/--no-thinking", default=None, help="enable_thinking for chat templates that know it.")
@click.option("--max-tokens", default=128, show_default=True, type=click.IntRange(1))
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(0), help="0 = greedy.")
@click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(0, 1, min_open=True))
@click.option("--top-k", default=0, show_default=True, type=click.IntRange(0))
@click.option("--seed", type=int)
@click.option("--compare-plain", is_flag=True, help="Also decode without drafting and check the outputs are identical.")
@click.option("--json", "as_json", is_flag=True, help="Print text and stats as JSON.")
def generate_cmd(spec, prompt, prompt_file, raw, thinking, max_tokens, temperature, top_p, top_k, seed, compare_plain, as_json):
    """Generate once with a drafter and print the text and the drafting statistics.

    \b
    Examples:
      vocabbridge generate --target qwen2.5-coder-1.5b --drafter ngram -p "Write a binary search in Python."
      vocabbridge generate --drafter smollm2-135m --mode text -p "안녕하세요!" --compare-plain
    """
    from ..engine import SamplingParams, SpecEngine
    from ..engine.factory import build_engine
    from ..errors import ConfigError
    from ..report import print_sections, to_json

    if (prompt is None) == (prompt_file is None):
        raise ConfigError("give exactly one of --prompt and --prompt-file.")
    text = prompt if prompt is not None else prompt_file.read_text(encoding="utf-8")
    with status("loading models…"):
        built = build_engine(spec)
    ids = _prompt_ids(built.target.view, text, raw, thinking)
    params = SamplingParams(max_new_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    result = built.engine.generate(ids, params) if as_json else _stream(built, ids, params)
    out = {"config": built.describe(), "text": result.text, "tokens": result.tokens, "finish_reason": result.finish_reason,
           "stats": result.stats}  # fmt: skip
    if compare_plain:
        plain = SpecEngine(built.target).generate(ids, params)
        out["plain"] = {"identical": plain.tokens == result.tokens, "stats": plain.stats,
                        "speedup": plain.stats.time_total / result.stats.time_total}  # fmt: skip
    if as_json:
        click.echo(to_json(out))
        return
    sections = [_stats_section(result.stats, f"Speculative decoding ({built.mode})")]
    if compare_plain:
        p = out["plain"]
        sections.append(_stats_section(p["stats"], "Plain decoding"))
        sections[-1].notes.append(f"identical to plain: {'yes' if p['identical'] else 'NO'}; speedup ×{p['speedup']:.2f}")
    print_sections(sections)


def _stream(built, ids, params):
    """Print text as it is generated (an incremental UTF-8 decoder holds split characters back)."""
    import codecs

    from ..engine.engine import GenerationResult
    from ..engine.stats import SpecStats

    stats, tokens, finish = SpecStats(), [], "length"
    view = built.target.view
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for step in built.engine.stream(ids, params, stats):
        tokens += step.tokens
        sys.stdout.write(decoder.decode(view.decode_bytes(step.tokens)))
        sys.stdout.flush()
        if step.finished:
            finish = step.finish_reason
    sys.stdout.write(decoder.decode(b"", final=True) + "\n")
    return GenerationResult(tokens, finish, stats, view.decode_bytes(tokens).decode("utf-8", errors="replace"))


DEFAULT_EVAL_PROMPTS = [
    "Write a Python function that merges two sorted lists, with a docstring and two tests.",
    "Explain in a short paragraph what a KV cache is in transformer inference.",
    "오늘 저녁 메뉴로 간단한 한식 요리를 추천해 주세요.",
]


@click.command("eval-drafter")
@engine_options
@click.option("--text", "texts", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Score along this text (repeatable). Without --text, the target's own greedy continuations are used.")  # fmt: skip
@click.option("-p", "--prompt", "prompts", multiple=True, help="A chat prompt whose greedy continuation is scored (repeatable).")
@click.option("--continuation-tokens", default=64, show_default=True, type=click.IntRange(1))
@click.option("--max-positions", default=512, show_default=True, type=click.IntRange(2), help="Tokens of each --text scored.")
@click.option("--json", "as_json", is_flag=True)
def eval_drafter_cmd(spec, texts, prompts, continuation_tokens, max_positions, as_json):
    """Offline expected acceptance of a drafter, without the generate loop.

    Per draft position, the share of positions where the drafter's first j proposals equal the
    target's greedy tokens, and the mean target probability of its first proposal. On the
    target's own greedy continuations this is the greedy acceptance the engine would get.

    \b
    Examples:
      vocabbridge eval-drafter --target qwen2.5-coder-1.5b --drafter smollm2-135m --mode bridged
      vocabbridge eval-drafter --drafter smollm2-135m --mode text --text notes.md
    """
    from ..chat import chat_prompt_ids
    from ..diff.core import read_text_file
    from ..engine.factory import build_engine
    from ..engine.offline import eval_drafter, greedy_continuations
    from ..report import Section, fmt_float, fmt_int, fmt_pct, print_sections, to_json

    with status("loading models…"):
        built = build_engine(spec)
    target = built.target
    if texts:
        seqs = [(1, target.view.encode(read_text_file(t))[:max_positions]) for t in texts]
        source = "texts: " + ", ".join(str(t) for t in texts)
    else:
        ps = [chat_prompt_ids(target.view, [{"role": "user", "content": p}]) for p in (prompts or DEFAULT_EVAL_PROMPTS)]
        with status("target greedy continuations…"):
            seqs = greedy_continuations(target, ps, continuation_tokens)
        source = f"the target's greedy continuations ({continuation_tokens} tokens) of {len(ps)} prompts"
    with status("scoring the drafter…"):
        ev = eval_drafter(target, built.engine.drafter, seqs, k=spec.num_speculative_tokens, name=built.mode)
    if as_json:
        click.echo(to_json({"config": built.describe(), "source": source, "eval": ev}))
        return
    rows = [[f"position {j + 1}", fmt_pct(a)] for j, a in enumerate(ev.acceptance_per_position)]
    rows += [
        ["mean target probability of the first proposal", fmt_float(ev.mean_target_prob, 3)],
        ["expected acceptance length (1 + Σ positions)", fmt_float(ev.expected_acceptance_length)],
        ["positions scored / with a proposal", f"{fmt_int(ev.positions)} / {fmt_int(ev.proposed)}"],
        ["seconds", fmt_float(ev.seconds)],
    ]
    print_sections([Section(f"Offline acceptance: {built.mode} drafter", ["", "value"], rows, [f"scored along {source}"])])
