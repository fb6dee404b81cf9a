"""``vocabbridge transplant``: parse, plan or transplant (and heal) (vocabbridge/transplant/), render."""

from __future__ import annotations

import json
from pathlib import Path

import click

from ..report import Section, fmt_int, fmt_pct, print_sections, to_markdown
from ..tokenizer import load_tokenizer
from .common import DATA_DTYPES, emit, format_options, status, writable_path


class _NewFolder(click.Path):
    """The drafter folder to write: its parent must be writable (the folder itself is made at the end)."""

    def __init__(self):
        super().__init__(file_okay=False, path_type=Path)

    def convert(self, value, param, ctx):
        path = Path(value).expanduser()
        why = writable_path(path.parent, folder=True) or (f"{path} is a file" if path.is_file() else None)
        if why:
            self.fail(f"{why}; choose another path.", param, ctx)
        return path


@click.command("transplant")
@click.argument("drafter", metavar="DRAFTER")
@click.option(
    "--to",
    "targets",
    multiple=True,
    required=True,
    metavar="TARGET",
    help="The target whose tokenizer the drafter gets: a preset, a model folder, a .gguf file or a hub id "
    "(with --plan-only also a tokenizer; repeatable there).",
)
@click.option("-o", "--output", type=_NewFolder(), help="The drafter folder to write (drafters/NAME).")
@click.option(
    "--init",
    default="mean",
    show_default=True,
    metavar="METHOD",
    help="How a target token without a byte-identical drafter token gets its rows, from the drafter's pieces "
    "spelling it: mean, first (output row = the first piece's), decay:F (output row = pieces weighted F^i), "
    "omp:K (K copied anchor tokens chosen in the target's embedding space; needs the target's weights).",
)
@click.option("--untie", is_flag=True, help="Give the lm_head its own matrix even where the method keeps a tied drafter tied.")
@click.option(
    "--gguf", "write_gguf", is_flag=True, help="Also write the drafter as a GGUF file for llama.cpp (and --kernels llama.cpp)."
)
@click.option(
    "--gguf-type", type=click.Choice(["q8_0", "f16", "f32"]), default="q8_0", show_default=True, help="The GGUF's matrices."
)
@click.option(
    "--heal-minutes",
    type=click.FloatRange(0),
    default=0.0,
    show_default=True,
    help="Then distill it on the target's own greedy answers for this long (data generation included): the new rows "
    "first, then (--heal-whole) the whole model. Resumable: run again with the same folder.",
)
@click.option(
    "--heal-whole",
    type=click.FloatRange(0, 1),
    default=0.0,
    show_default=True,
    help="Share of the healing steps that train the whole model after the new rows.",
)
@click.option(
    "--heal-data-share",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    default=0.5,
    show_default=True,
    help="Share of --heal-minutes for the target to write data (when none is on disk yet); the rest trains. On a "
    "CPU the rows stage peaked after about one epoch of 30 K positions (results/2026-12-04-transplant-heal): more data "
    "helps a short heal more than more steps.",
)
@click.option(
    "--heal-data-dtype",
    type=click.Choice(DATA_DTYPES),
    default="auto",
    show_default=True,
    help="The target writing the heal data: auto is int8 on a CPU (as --dtype int8 serves it) and bfloat16 on CUDA. "
    "On a CPU with AMX, bfloat16 writes 2.3-3.1 times the answers a minute (33 against 11 tok/s, 16 prompts a "
    "batch, on 2 Intel AMX cores: benchmarks/results/2026-12-07-heal-data-dtype); its greedy answers may differ a "
    "little from the int8 target's.",
)
@click.option(
    "--heal-prompts", type=click.Path(exists=True, dir_okay=False), help="JSONL training prompts (default: the built-in set)."
)
@click.option(
    "--heal-data",
    type=click.Path(file_okay=False),
    help="A self-distillation data folder to use (e.g. a train-head run's heads/NAME/train/data).",
)
@click.option(
    "--heal-only", is_flag=True, help="Heal the existing -o folder (made by an earlier transplant) without transplanting again."
)
@click.option("--plan-only", "--dry-run", "plan_only", is_flag=True, help="Only the coverage, from the tokenizers (no weights).")
@click.option("--overwrite", is_flag=True, help="Replace an existing -o folder.")
@format_options
def transplant_cmd(
    drafter,
    targets,
    output,
    init,
    untie,
    write_gguf,
    gguf_type,
    heal_minutes,
    heal_whole,
    heal_data_share,
    heal_data_dtype,
    heal_prompts,
    heal_data,
    heal_only,
    plan_only,
    overwrite,
    fmt,
):
    """Give a drafter the target's tokenizer, so every engine drafts with it natively.

    Rows of byte-identical tokens are copied, special tokens paired by role, every other target token
    built from the drafter's own spelling of it (--init); the folder holds the target's tokenizer,
    chat template and generation config, and transplant.json (both fingerprints, the method, the row
    counts). Serve it as a drafter path: our engine runs it in draft mode, vLLM as a plain draft_model,
    llama.cpp (--gguf) as a draft model.

    \b
    Examples:
      vocabbridge transplant smollm2-135m --to qwen2.5-coder-1.5b -o drafters/smollm2-qwen --gguf
      vocabbridge transplant smollm2-135m --to qwen2.5-coder-1.5b -o drafters/smollm2-qwen --heal-only --heal-minutes 25
      vocabbridge transplant LGAI-EXAONE/EXAONE-4.0-1.2B --to LGAI-EXAONE/EXAONE-4.5-33B -o drafters/exaone-1.2b-4.5vocab
      vocabbridge transplant ../shared/tokenizers/exaone-4.0 --to ../shared/tokenizers/qwen3 --to ../shared/tokenizers/llama-3 --plan-only
    """
    if plan_only:
        return _plan_only(drafter, targets, fmt, output)
    if len(targets) > 1:
        raise click.UsageError("one --to per transplant (several only with --plan-only).")
    if output is None:
        raise click.UsageError("-o/--output is required: the drafter folder to write (drafters/NAME).")
    target = targets[0]
    from ..transplant import transplant

    result = None
    if not heal_only:
        result = transplant(
            drafter, target, output, init=init, untie=untie, gguf=write_gguf, gguf_type=gguf_type, overwrite=overwrite
        )
    elif not (output / "transplant.json").is_file():
        raise click.UsageError(f"--heal-only: {output} has no transplant.json; transplant first (without --heal-only).")
    healed = None
    if heal_minutes > 0:
        from ..transplant.heal import HealRecipe, heal

        recipe = HealRecipe(
            budget_minutes=heal_minutes,
            data_share=heal_data_share,
            whole_share=heal_whole,
            prompts=heal_prompts,
            data_dtype=heal_data_dtype,
        )
        healed = heal(
            output,
            target,
            recipe,
            data_folder=Path(heal_data) if heal_data else None,
            gguf_type=gguf_type if write_gguf else None,
        )
    record = json.loads((output / "transplant.json").read_text())
    if fmt == "json":
        emit(json.dumps(record, indent=2, ensure_ascii=False), None)
        return
    sections = [_summary(output, record, result.seconds if result else None)]
    if healed is not None:
        sections.append(_heal_section(record["heal"]))
    if fmt == "markdown":
        emit(to_markdown(sections), None)
    else:
        print_sections(sections)


def _plan_only(drafter, targets, fmt, output):
    from ..presets import resolve_model
    from ..transplant import plan_rows
    from ..transplant.report import coverage_json, coverage_sections

    with status("loading tokenizers…"):
        dview = load_tokenizer(resolve_model(drafter))
        plans = []
        for t in targets:
            tview = load_tokenizer(resolve_model(t))
            plans.append((plan_rows(dview, tview), tview))
    if fmt == "json":
        data = [coverage_json(p, v) for p, v in plans]
        emit(json.dumps(data[0] if len(data) == 1 else data, indent=2, ensure_ascii=False), None)
    elif fmt == "markdown":
        emit(to_markdown(coverage_sections(plans), title=f"vocabbridge transplant {drafter} --plan-only"), None)
    else:
        print_sections(coverage_sections(plans))


def _summary(folder: Path, rec: dict, seconds: float | None) -> Section:
    rows, n = rec["rows"], rec["target"]["rows"]
    return Section(
        f"Transplanted: {folder}",
        ["", ""],
        [
            ["drafter", f"{rec['drafter']['given']} ({fmt_int(rec['drafter']['rows'])} rows)"],
            ["target", f"{rec['target']['given']} ({fmt_int(n)} rows)"],
            ["init", rec["init"] + (" (tied)" if rec["tied"] else " (untied lm_head)")],
            *[[k, f"{fmt_int(v)} ({fmt_pct(v / n)})"] for k, v in rows.items()],
            ["pieces per composed token", f"{rec['mean_pieces']:.2f}"],
            ["GGUF", rec["gguf"]["file"] if rec.get("gguf") else "—"],
            ["tokenizer fingerprint", rec["tokenizer_fingerprint"][:16]],
        ]
        + ([["seconds", f"{seconds:.0f}"]] if seconds is not None else []),
        [f"serve it: vocabbridge serve --target {rec['target']['given']} --drafter {folder}"],
    )


def _heal_section(h: dict) -> Section:
    ev0, ev1 = h.get("before", {}), h.get("after", {})
    acc = lambda ev: " / ".join(f"{100 * a:.0f}" for a in ev.get("acceptance_per_position", [])) or "—"  # noqa: E731
    return Section(
        "Healed",
        ["", "before", "after"],
        [
            ["held-out acceptance per position %", acc(ev0), acc(ev1)],
            [
                "mean acceptance length",
                f"{ev0.get('mean_acceptance_length', 0):.2f}",
                f"{ev1.get('mean_acceptance_length', 0):.2f}",
            ],
            ["steps (rows / whole)", "", f"{h.get('steps_rows', 0)} / {h.get('steps_whole', 0)}"],
            [
                "minutes (data / training)",
                "",
                f"{h['timings_s'].get('data', 0) / 60:.1f} / {h['timings_s'].get('train', 0) / 60:.1f}",
            ],
        ],
        [f"curves: {h.get('curves', '—')}"],
    )
