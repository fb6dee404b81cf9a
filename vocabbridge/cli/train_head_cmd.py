"""``vocabbridge train-head``: parse, train (vocabbridge/training/train.py), render."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click

from ..errors import ConfigError
from ..heads import head_from_checkpoint
from ..report import Section, fmt_int, fmt_pct, print_sections, to_json
from ..training.export import export_for_vllm
from ..training.train import ARCHS, Recipe, train_heads
from .common import DATA_DTYPES, OUTPUT_DIR, json_option

_DEFAULTS = Recipe()


def _layers(value: str | None) -> tuple[int, ...] | None:
    if not value:
        return None
    try:
        return tuple(int(x) for x in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r}: give layer indices separated by commas, e.g. 14,25,28") from None


def _archs(value: str) -> tuple[str, ...]:
    archs = tuple(a.strip() for a in value.split(",") if a.strip())
    bad = [a for a in archs if a not in ARCHS]
    if bad or not archs or len(set(archs)) < len(archs):
        raise click.BadParameter(f"{value!r}: give one or more of {', '.join(ARCHS)}, e.g. eagle3,peagle or eagle3,mtp.")
    return archs


def _opt(name: str, help: str, **kw):
    return click.option(f"--{name.replace('_', '-')}", name, default=getattr(_DEFAULTS, name), show_default=True, help=help, **kw)


@click.command("train-head")
@click.option("--target", required=True, metavar="MODEL", help="The target: a preset, a model folder, a .gguf file or a hub id.")
@click.option(
    "-o",
    "--output",
    "outputs",
    required=True,
    multiple=True,
    type=OUTPUT_DIR,
    help="The head folder to write (heads/NAME); with several --arch, one -o each, in the same order.",
)
@click.option("--prompts", type=click.Path(exists=True, dir_okay=False), help="JSONL training prompts (bench format).")
@_opt("max_prompts", "Use the first N prompts (all by default).", type=click.IntRange(1))
@_opt(
    "magpie",
    "Also N prompts the target writes itself (Magpie: the chat template up to a user turn, continued by the "
    "model), Korean, English and code, filtered, de-duplicated and disjoint from the bench suite; 20000 on a GPU.",
    type=click.IntRange(0),
)
@_opt(
    "thinking_share",
    "Where the chat template has enable_thinking: the share of prompts answered with thinking on.",
    type=click.FloatRange(0, 1),
)
@click.option(
    "--data",
    "data_dir",
    type=OUTPUT_DIR,
    help="Where the generated data (and the prompts the target wrote) live [default: OUTPUT/train/data]; "
    "an MTP head and an EAGLE-3 head can share one (train the EAGLE-3 head first: its data serve both).",
)
@_opt("new_tokens", "Greedy tokens generated per prompt.", type=click.IntRange(1))
@_opt("gen_batch", "Prompts per generation batch (0: 16 on a CPU, 1024 on a GPU).", type=click.IntRange(0))
@_opt("top_k", "Soft labels (target probabilities) kept per position.", type=click.IntRange(1))
@_opt(
    "draft_vocab", "Draft vocabulary: the N target tokens the data uses most (0: the whole vocabulary).", type=click.IntRange(0)
)
@click.option(
    "--arch",
    "archs",
    default="mtp",
    show_default=True,
    callback=lambda ctx, param, value: _archs(value),
    help="The head: mtp (DeepSeek-V3's MTP module on the target's final hidden state; vLLM serves it in MiMo's MTP "
    "layout over the whole vocabulary), eagle3 (vLLM's EAGLE-3 layer over the streams entering three target "
    "layers; vLLM serves it as is, drafting over its draft vocabulary) or peagle (P-EAGLE: EAGLE-3's layer with a "
    "learned mask position, proposing all its draft tokens in one forward; vLLM serves it with parallel_drafting); "
    "several, comma-separated (eagle3,peagle; eagle3,mtp), train from one generation of data.",
)
@click.option(
    "--aux-layers",
    callback=lambda ctx, param, value: _layers(value),
    metavar="I,J,K",
    help="eagle3, peagle: the target layers whose input streams it reads (the layer count: the final norm's input). "
    "Default: the middle layer, three before the end, and the end.",
)
@_opt(
    "parallel_tokens",
    "peagle: the draft tokens its one forward proposes (k − 1 mask positions after the real one), trained over all "
    "of them; the engine drafts no more than that.",
    type=click.IntRange(1, 16),
)
@_opt(
    "init",
    "The start: least-squares (eh_proj or fc, then down_proj: the best linear predictors of the target's next "
    "hidden state, fit to the data), identity (the head starts by repeating h_t) or checkpoint (--arch mtp: the "
    "target's own MTP head, DeepSeek-V3, EXAONE 4.5 / Qwen3.5 or MiMo layout, retrained over the whole vocabulary; "
    "--export-vllm writes it back in the target's own layout for vLLM's native mtp).",
    type=click.Choice(["least-squares", "identity", "checkpoint"]),
)
@_opt("depth", "Chained draft steps trained (the head re-runs on its own output).", type=click.IntRange(1, 8))
@_opt("epochs", "Passes over the training data.", type=click.IntRange(1))
@_opt("batch_tokens", "Positions per optimizer step (0: 512 on a CPU, 16384 on a GPU).", type=click.IntRange(0))
@_opt(
    "lr", "Peak learning rate (AdamW; linear warm-up, cosine decay; 0: 3e-5 on a CPU, 5e-5 on a GPU).", type=click.FloatRange(0)
)
@_opt("heldout", "Share of prompts held out for the evaluation.", type=click.FloatRange(0, 1, max_open=True))
@_opt("seed", "Random seed (data split, batch order, initialisation).", type=int)
@_opt("eval_k", "Draft positions evaluated.", type=click.IntRange(1, 16))
@_opt(
    "budget_minutes",
    "Time-box the whole run, data included: data generation stops at its share, training plans the steps that fit "
    "(0: no budget; the recipe for Qwen2.5-Coder-1.5B on 2 CPU cores is 45).",
    type=click.FloatRange(0),
)
@_opt("data_share", "Share of --budget-minutes for data generation.", type=click.FloatRange(0, 1, min_open=True, max_open=True))
@_opt(
    "data_dtype",
    "The target generating the data: auto (int8 on a CPU, as --dtype int8 serves it; bfloat16 on CUDA), int8, "
    "float32 or bfloat16.",
    type=click.Choice(DATA_DTYPES),
)
@_opt(
    "dtype",
    "Training autocast: auto (bfloat16 on CUDA and on CPUs with native bf16, else float32), float32 or bfloat16.",
    type=click.Choice(["auto", "float32", "bfloat16"]),
)
@_opt("device", "auto (CUDA when present, else the CPU), cpu, cuda, cuda:1 …", type=str)
@click.option("--restart", is_flag=True, help="Discard the training checkpoint (the generated data is kept).")
@click.option(
    "--export-vllm",
    is_flag=True,
    help="Also write the head for vLLM (OUTPUT/vllm: EAGLE-3's layout, MiMo's MTP layout, or with --init checkpoint "
    "the target's own checkpoint with only its MTP tensors replaced: its weight files linked, not copied).",
)
@json_option("Print the result as JSON.")
def train_head_cmd(target, outputs, archs, prompts, data_dir, restart, export_vllm, as_json, **recipe):
    """Train a draft head for TARGET on its own greedy outputs (self-distillation).

    --arch mtp (default): DeepSeek-V3's MTP module: the target's last hidden state and the next
    token's embedding, normalized, concatenated, projected, one decoder layer of the target's own
    architecture, the target's lm_head. --arch eagle3: vLLM's EAGLE-3 layer over the streams
    entering three of the target's layers, with the draft vocabulary's own lm_head rows. --arch
    peagle: the same layer with a learned mask position, proposing --parallel-tokens draft tokens in
    one forward (P-EAGLE). Each drafts with --drafter mtp:OUTPUT. Generated data and checkpoints
    live in OUTPUT/train; running the same command again resumes.

    \b
    Examples:
      vocabbridge train-head --target qwen2.5-coder-1.5b -o heads/qwen2.5-coder-1.5b --budget-minutes 45
      vocabbridge generate --target qwen2.5-coder-1.5b --drafter mtp:heads/qwen2.5-coder-1.5b -k 3 -p "Hi" --compare-plain
      vocabbridge train-head --target qwen2.5-coder-1.5b --arch eagle3 -o heads/q15-eagle3 --budget-minutes 45
      vocabbridge train-head --target smollm2-135m --arch eagle3,peagle -o heads/s-eagle3 -o heads/s-peagle
      vocabbridge train-head --target smollm2-135m -o heads/smollm2 --max-prompts 40 --epochs 2 --export-vllm
      vocabbridge train-head --target models/MiMo-7B-RL --init checkpoint -o heads/mimo-own --export-vllm

    \b
    At scale, on a GPU (the data stay on the machine that trains; two heads from one generation):
      vocabbridge train-head --target Q.gguf --device cuda --arch eagle3,mtp --magpie 20000 \\
          --depth 3 --budget-minutes 14 -o heads/q15-eagle3 -o heads/q15-mtp
    """
    if len(outputs) != len(archs):
        raise ConfigError(f"--arch {','.join(archs)} trains {len(archs)} heads: give one -o for each ({len(outputs)} given).")
    r = Recipe(prompts=prompts, arch=archs[0], **recipe)
    results = train_heads(target, dict(zip(archs, outputs)), r, restart=restart, quiet=as_json, data_dir=data_dir)
    if as_json and len(archs) > 1:
        out = {
            a: {"folder": str(o), "eval": results[a].eval, "timings_s": results[a].timings, "tokens": results[a].tokens}
            for a, o in zip(archs, outputs)
        }
        for a, o in zip(archs, outputs):
            if export_vllm:
                out[a]["vllm"] = export_for_vllm(o, num_speculative_tokens=r.eval_k)
        click.echo(to_json(out))
        return
    for arch, output in zip(archs, outputs):
        _report(results[arch], output, r, export_vllm, as_json)


def _report(result, output: Path, r: Recipe, export_vllm: bool, as_json: bool) -> None:
    spec = export_for_vllm(output, num_speculative_tokens=r.eval_k) if export_vllm else None
    if as_json:
        out = {
            "folder": str(output),
            "recipe": dataclasses.asdict(r),
            "eval": result.eval,
            "timings_s": result.timings,
            "tokens": result.tokens,
            "vllm": spec,
        }
        click.echo(to_json(out))
        return
    ev = result.eval
    full = ev.get("acceptance_per_position_full_vocab")
    columns = ["", "draft vocabulary (our engine)"] + (["whole vocabulary (the vLLM export)"] if full else [])
    rows = [
        [f"position {i + 1}", fmt_pct(a)] + ([fmt_pct(full[i])] if full else [])
        for i, a in enumerate(ev.get("acceptance_per_position", []))
    ]
    if ev:
        mal = [f"{ev['mean_acceptance_length']:.2f}"] + ([f"{ev['mean_acceptance_length_full_vocab']:.2f}"] if full else [])
        rows.append(["mean acceptance length", *mal])
        rows.append(["held-out draft windows", fmt_int(ev["positions"])] + ([""] if full else []))
    notes = [
        "timings: " + ", ".join(f"{k} {v:.0f} s" for k, v in result.timings.items()),
        f"data: {fmt_int(result.tokens['positions'])} positions ({fmt_int(result.tokens['generated'])} generated) "
        f"in {result.tokens['sequences']} sequences",
        f"wrote {output}/head.safetensors, config.json; curves in {output}/train/loss.png, acceptance.png",
        f"draft with it: --drafter mtp:{output}",
    ]
    if spec and spec["method"] == "mtp" and head_from_checkpoint(output):
        notes.append(
            f"vLLM (the target's own MTP layout): --speculative-config '{json.dumps(spec, separators=(',', ':'))}' "
            "(vocabbridge serve --backend vllm --drafter mtp:HEAD writes it)"
        )
    elif spec and spec["method"] == "mtp":
        notes.append(
            f"vLLM: --speculative-config '{json.dumps(spec, separators=(',', ':'))}' --hf-overrides "
            "'{\"num_nextn_predict_layers\":1}' (vocabbridge serve --backend vllm --drafter mtp:HEAD writes both)"
        )
    elif spec:
        notes.append(
            f"vLLM: --speculative-config '{json.dumps(spec, separators=(',', ':'))}' "
            "(vocabbridge serve --backend vllm --drafter mtp:HEAD writes it)"
        )
    print_sections([Section("Held-out greedy acceptance (the target's own continuations)", columns, rows, notes)])
