"""Healing a transplanted drafter: distillation on the target's own greedy answers.

    data    the target's greedy continuations of the training prompts with its top-k next-token
            distribution at every position: train-head's self-distillation data path
            (``training.data``), its shards on disk, resumed batch by batch; a train-head run's
            data folder serves as it is (``data_folder``)
    rows    the new rows first: the lm_head rows of every composed (and empty) token, trained on
            the drafter's own final hidden states, computed once (its body and input rows do not
            change in this stage, so they are cached: each step is a softmax over the whole
            vocabulary at each position, ``rows_loss``). A tied drafter gets its own lm_head
            here (its input rows stay as they were).
            The stage ends on the rows of its best held-out evaluation (the longest mean
            acceptance length, then the lowest loss; zero-shot included): on a CPU's few
            thousand answers the rows overfit late in the schedule.
    whole   optionally (``whole_share`` of the training time) the whole model, every weight, at a
            small learning rate, on the same positions
    eval    held-out prompts: greedy acceptance per draft position (the drafter's first j argmax
            all equal to the target's greedy tokens), before, after each epoch and at the end

The loss is the soft cross-entropy against the target's top-k probabilities (renormalized), which
is the KL divergence up to the teacher's entropy; only the positions that predict a generated
token count (what the drafter is asked for when it drafts). Everything lives under
``FOLDER/heal/`` (data, checkpoint, metrics.jsonl, loss.png, acceptance.png); a run resumes from
its checkpoint, and the healed weights replace ``model.safetensors`` (and the GGUF, if there is
one) at the end.

>>> r = heal(Path("drafters/smollm2-qwen"), "qwen2.5-coder-1.5b", HealRecipe(budget_minutes=25))  # doctest: +SKIP
>>> r.before["acceptance_per_position"], r.after["acceptance_per_position"]  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..engine.invariant import quantize_rows
from ..engine.model import load_causal_lm, resolve_device
from ..errors import ConfigError
from ..presets import resolve_model
from ..tokenizer import load_tokenizer
from ..training.curves import plot_curves
from ..training.data import DataPlan, Sequence, generate_data, load_shard, render_prompts, training_prompts
from ..training.progress import Progress
from ..training.train import split_heldout
from ..util import atomic_write_text
from .build import RECORD, read_record, read_rows
from .plan import COPIED, SPECIAL

HEAL_DIR = "heal"
CKPT = "checkpoint.pt"
TIMING_AT = (4, 40)  # the rows stage plans its steps after these many (the first one left out of the timing)
SAVE_RESERVE_S = 30.0  # of a budget, for the final evaluation and saving
CANDIDATES = 64  # the drafter's own likeliest tokens per position whose rows the rows stage's gradient reaches
GPU_MICRO_TOKENS = 8192  # tokens per forward on a GPU (a 135M drafter's 8 K tokens with gradients: ~3 GB)


@dataclass(frozen=True)
class HealRecipe:
    """How a transplanted drafter is healed. The defaults are the CPU recipe for SmolLM2-135M on
    Qwen2.5-Coder's vocabulary (``budget_minutes`` decides how much data and how many steps fit)."""

    budget_minutes: float = 25.0  # wall clock, data generation included; 0: no budget (all epochs)
    data_share: float = 0.5  # of the budget, for generating data (when it is not on disk yet)
    whole_share: float = 0.0  # of the training time, for the whole-model stage after the rows
    prompts: str | None = None  # JSONL prompt file (bench format); None: the built-in training set
    max_prompts: int | None = None
    new_tokens: int = 160  # greedy tokens the target writes per prompt
    gen_batch: int = 16  # prompts per generation batch
    top_k: int = 20  # soft labels per position
    batch_positions: int = 1024  # positions per optimizer step
    lr_rows: float = 1e-3  # AdamW on the new lm_head rows
    lr_whole: float = 2e-5  # AdamW on every weight in the whole-model stage
    epochs: int = 8  # passes over the data in the rows stage (a budget may cut them short)
    heldout: float = 0.1  # share of prompts kept out for the evaluation
    seed: int = 0
    eval_k: int = 4
    data_dtype: str = "auto"  # the target writing the data: int8 on a CPU (as --dtype int8 serves it), bf16 on CUDA
    device: str = "auto"
    # Tokens per forward (sequences padded together) in the feature pass and the whole-model stage:
    # 0, one sequence at a time on a CPU and GPU_MICRO_TOKENS on a GPU (bf16 autocast there).
    micro_tokens: int = 0
    # The rows stage's loss: "exact" (the full vocabulary's softmax) or "candidates" (its value exact,
    # its gradient through the teacher's top-k and the drafter's own likeliest tokens: one
    # [positions × vocabulary] product instead of three, yet 4.0 s a step against exact's 3.4 on 2
    # AVX2 cores, its top-k and scatter costing more than the products saved; equal acceptance,
    # benchmarks/results/2026-12-06-gpu-heal/rows-loss.md).
    rows_loss: str = "exact"

    def __post_init__(self):
        if self.budget_minutes < 0 or not 0 < self.data_share < 1 or not 0 <= self.whole_share <= 1:
            raise ConfigError("budget_minutes must be ≥ 0, data_share in (0, 1) and whole_share in [0, 1].")
        if self.rows_loss not in ("exact", "candidates"):
            raise ConfigError(f"rows_loss is exact or candidates, not {self.rows_loss!r}.")
        if min(self.new_tokens, self.top_k, self.batch_positions, self.epochs, self.eval_k) < 1:
            raise ConfigError("new_tokens, top_k, batch_positions, epochs and eval_k must be at least 1.")

    def data_settings(self, gen_dtype: str) -> dict:
        """What the data depend on (the same keys as train-head's, so either's data serve the other)."""
        return {"new_tokens": self.new_tokens, "top_k": self.top_k, "data_dtype": gen_dtype}

    def training_key(self) -> dict:
        skip = {"budget_minutes", "data_share", "device", "gen_batch", "epochs", "whole_share", "micro_tokens"}
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in skip}


@dataclass
class HealResult:
    folder: Path
    before: dict
    after: dict
    record: dict
    history: list[dict] = field(default_factory=list)


# ==== data ==========================================================================================


def _gen_dtype(recipe: HealRecipe, device: str) -> str:
    if recipe.data_dtype != "auto":
        return recipe.data_dtype
    return "bfloat16" if device.startswith("cuda") else "int8"


def folder_data(data_dir: Path, *, vocab_size: int) -> tuple[list[Sequence], dict] | None:
    """Every shard a data folder's manifest lists, as it is (None: the folder holds none yet).

    A train-head run's folder (``heads/NAME/train/data``, or a GPU run's with its Magpie prompts)
    was planned over other prompts than :func:`heal_data`'s, so its shards would never match that
    plan: they are taken whole instead, whatever prompts, lengths or top-k made them. Token ids past
    the drafter's vocabulary mean another target's data, which would train the wrong rows."""
    manifest_path = data_dir / "manifest.json"
    if not manifest_path.is_file():
        return None
    manifest = json.loads(manifest_path.read_text())
    paths = [data_dir / name for name in sorted(manifest.get("shards", {})) if (data_dir / name).is_file()]
    if not paths:
        return None
    seqs = [s for p in paths for s in load_shard(p)]
    top = max(int(s.tokens.max()) for s in seqs if len(s.tokens))
    if top >= vocab_size:
        raise ConfigError(
            f"{data_dir}: its answers hold token id {top}, past the drafter's {vocab_size:,} rows: they were written "
            "by another target. Give the data folder of a run on this target (or none, to generate it)."
        )
    settings = manifest.get("settings", {})
    return seqs, {"batches": len(paths), "batches_planned": len(paths), "seconds": 0.0} | {
        "data_dtype": settings.get("data_dtype", "unknown"),
        "new_tokens": settings.get("new_tokens"),
        "top_k": settings.get("top_k"),
        "given_folder": True,
    }


def heal_data(
    target: str, data_dir: Path, recipe: HealRecipe, *, deadline: float | None, say, quiet: bool
) -> tuple[list[Sequence], dict]:
    """The self-distillation data: the shards on disk, and (until ``deadline``) the batches missing."""
    device = resolve_device(recipe.device)
    gen_dtype = _gen_dtype(recipe, device)
    view = load_tokenizer(resolve_model(target))
    rendered = render_prompts(view, training_prompts(recipe.prompts)[: recipe.max_prompts])
    plan = DataPlan.make(rendered, batch_size=recipe.gen_batch, seed=recipe.seed)
    settings = recipe.data_settings(gen_dtype)
    manifest_path = data_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    done = manifest.get("shards", {}) if manifest.get("settings", {}).get("top_k") == recipe.top_k else {}
    keys = [(f"shard-{n:05d}.safetensors", ",".join(pid for pid, _ in b)) for n, b in enumerate(plan.batches)]
    missing = [name for name, key in keys if done.get(name) != key or not (data_dir / name).is_file()]
    t0 = time.perf_counter()
    if missing and (deadline is None or time.perf_counter() < deadline):
        if gen_dtype == "int8" and device != "cpu":
            raise ConfigError("data_dtype int8 runs on the CPU only; use bfloat16 on CUDA.")
        lm = load_causal_lm(
            resolve_model(target), dtype="float32" if gen_dtype == "int8" else gen_dtype, device=device, pack=False
        )
        lm.model.requires_grad_(False)
        if gen_dtype == "int8":
            quantize_rows(lm.model)
        say(f"the target {lm.name} writes the data ({len(missing)} of {len(plan.batches)} batches missing; {gen_dtype})")
        roles = lm.view.roles
        stops = {roles[r] for r in ("eos", "end_of_turn") if r in roles}
        with Progress(len(rendered), "heal data (prompts)", quiet=quiet) as bar:
            paths = generate_data(
                lm.model,
                plan,
                data_dir,
                max_new_tokens=recipe.new_tokens,
                stop_ids=stops,
                top_k=recipe.top_k,
                pad_id=roles.get("pad", next(iter(stops), 0)),
                progress=bar,
                deadline=deadline,
                settings=settings,
            )
        del lm
    else:
        paths = [data_dir / name for name, _ in keys if name not in missing]
        if not paths:
            raise ConfigError(f"{data_dir}: no data and no time left to generate any; give a budget (--heal-minutes).")
    seqs = [s for p in paths for s in load_shard(p)]
    return seqs, {
        "batches": len(paths),
        "batches_planned": len(plan.batches),
        "seconds": time.perf_counter() - t0,
        "data_dtype": gen_dtype,
    }


# ==== positions and features ==========================================================================


@dataclass
class Positions:
    """The positions that predict a generated token, over a set of sequences."""

    topk_ids: torch.Tensor  # [P, K] int64
    topk_p: torch.Tensor  # [P, K] float32, renormalized
    next_ids: torch.Tensor  # [P] int64: the target's greedy token
    seq_of: torch.Tensor  # [P] int64: which sequence each position belongs to (chains stop at its end)
    hidden: torch.Tensor | None = None  # [P, d] float32: the drafter's final hidden state there

    def __len__(self) -> int:
        return len(self.next_ids)


def _span(s: Sequence) -> tuple[int, int]:
    """The positions of ``s`` that predict a generated token: ``a`` up to ``b`` (exclusive); feature
    i predicts tokens[i + 1]. Empty (``a == b``) where nothing was generated."""
    return max(s.gen_start - 1, 0), len(s.tokens) - 1


def _generated(s: Sequence) -> int:
    """How many of ``s``'s positions predict a generated token."""
    a, b = _span(s)
    return max(b - a, 0)


def _labels(s: Sequence) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's top-k ids and probabilities (renormalized) at ``s``'s generated positions."""
    a, b = _span(s)
    p = s.topk_p[a:b].float()
    return s.topk_ids[a:b].long(), p / p.sum(-1, keepdim=True).clamp_min(1e-8)


def positions_of(seqs: list[Sequence]) -> Positions:
    ids, ps, nxt, seq_of = [], [], [], []
    for j, s in enumerate(seqs):
        a, b = _span(s)
        if b <= a:
            continue
        top_ids, p = _labels(s)
        ids.append(top_ids)
        ps.append(p)
        nxt.append(s.tokens[a + 1 : b + 1].long())
        seq_of.append(torch.full((b - a,), j, dtype=torch.long))
    if not ids:
        raise ConfigError("the data hold no generated tokens to learn from; generate more (a larger --heal-minutes).")
    return Positions(torch.cat(ids), torch.cat(ps), torch.cat(nxt), torch.cat(seq_of))


def micro_batches(seqs: list[Sequence], max_tokens: int) -> list[list[int]]:
    """Indices of ``seqs`` grouped for padded forwards: each group's count × longest input at most
    ``max_tokens`` (one sequence at least), similar lengths together; ``max_tokens`` ≤ 0: one each.

    >>> class S:
    ...     def __init__(self, n): self.gen_start, self.tokens = 1, [0] * n
    >>> micro_batches([S(5), S(9), S(4), S(8)], 16)
    [[2, 0], [3, 1]]
    >>> micro_batches([S(5), S(1), S(4)], 0)  # S(1) predicts no generated token
    [[2], [0]]
    """
    spans = [_span(s) for s in seqs]
    order = sorted((i for i, (a, b) in enumerate(spans) if b > a), key=lambda i: spans[i][1])
    if max_tokens <= 0:
        return [[i] for i in order]
    groups: list[list[int]] = []
    for i in order:  # by input length: the newest is a group's longest
        if groups and (len(groups[-1]) + 1) * spans[i][1] <= max_tokens:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def micro_tokens(recipe: HealRecipe, device: str) -> int:
    """Tokens per padded forward: the recipe's, else one sequence at a time on a CPU (padding
    costs it time) and GPU_MICRO_TOKENS on a GPU (where one sequence leaves it mostly idle)."""
    if recipe.micro_tokens > 0:
        return recipe.micro_tokens
    return GPU_MICRO_TOKENS if str(device).startswith("cuda") else 0


def _autocast(device: str):
    """bf16 autocast on a GPU (the weights and the optimizer stay float32), nothing on a CPU."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if str(device).startswith("cuda") else contextlib.nullcontext()


def generated_hidden(base, seqs: list[Sequence], device) -> torch.Tensor:
    """The drafter body's final hidden states at the generated-token positions of ``seqs``, in their
    order, from one forward: padded on the right with an attention mask where there are several
    (a causal model's states before the padding are those of the sequence alone)."""
    spans = [_span(s) for s in seqs]
    if len(seqs) == 1:
        a, b = spans[0]
        return base(input_ids=seqs[0].tokens[:b][None].to(device)).last_hidden_state[0, a:b]
    width = max(b for _, b in spans)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, (s, (_, b)) in enumerate(zip(seqs, spans)):
        ids[i, :b], mask[i, :b] = s.tokens[:b].long(), 1
    h = base(input_ids=ids.to(device), attention_mask=mask.to(device)).last_hidden_state
    return torch.cat([h[i, a:b] for i, (a, b) in enumerate(spans)])


@torch.inference_mode()
def drafter_hidden(model, seqs: list[Sequence], *, progress=None, max_tokens: int = 0) -> torch.Tensor:
    """The drafter's final hidden states at each sequence's generated-token positions, concatenated
    in the order of ``seqs``; ``max_tokens`` > 0 pads sequences together (:func:`micro_batches`)."""
    base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    dev = model.get_input_embeddings().weight.device
    parts: dict[int, torch.Tensor] = {}
    with _autocast(str(dev)):
        for group in micro_batches(seqs, max_tokens):
            h = generated_hidden(base, [seqs[i] for i in group], dev).float().cpu()
            start = 0
            for i in group:
                a, b = _span(seqs[i])
                parts[i], start = h[start : start + b - a], start + b - a
            if progress is not None:
                progress.update(len(group))
    return torch.cat([parts[i] for i in range(len(seqs)) if i in parts])


def soft_ce(logits: torch.Tensor, topk_ids: torch.Tensor, topk_p: torch.Tensor) -> torch.Tensor:
    """Mean over positions of −Σ p·log q on the teacher's top-k (p renormalized): KL(p‖q) + H(p)."""
    logq = torch.log_softmax(logits.float(), -1).gather(-1, topk_ids)
    return -(topk_p * logq).sum(-1).mean()


def candidate_soft_ce(
    h: torch.Tensor, w: torch.Tensor, topk_ids: torch.Tensor, topk_p: torch.Tensor, *, rivals: int = CANDIDATES
) -> torch.Tensor:
    """:func:`soft_ce` of the logits ``h @ w.T``, its value exact, its gradient through the rows that
    matter only: the teacher's top-k and the drafter's own ``rivals`` likeliest tokens at each
    position. The full logits are computed once without a graph (the normalizer); the rest of the
    vocabulary enters as a constant mass, so a step costs one [positions × vocabulary] product
    instead of three (the rows left out would get gradients of their own tiny probabilities).

    >>> g = torch.Generator().manual_seed(0)
    >>> h, w = torch.randn(4, 8, generator=g), torch.randn(50, 8, generator=g)
    >>> ids, p = torch.randint(0, 50, (4, 3), generator=g), torch.full((4, 3), 1 / 3)
    >>> bool(torch.isclose(candidate_soft_ce(h, w, ids, p, rivals=5), soft_ce(h @ w.T, ids, p)))
    True
    """
    with torch.no_grad():
        full = h @ w.T  # [B, V]
        rival = full.topk(min(rivals, full.shape[1]), dim=-1).indices
        cand = torch.cat([topk_ids, rival], dim=1)  # [B, C] (a teacher id may repeat among the rivals)
        m = full.max(-1, keepdim=True).values
        keep = torch.zeros_like(full, dtype=torch.bool).scatter_(1, cand, True)
        rest = torch.where(keep, torch.zeros_like(full), (full - m).exp()).sum(-1, keepdim=True)  # the mass left out
    logits = torch.einsum("bd,bcd->bc", h, w[cand])  # [B, C], with a graph
    first = torch.zeros_like(cand, dtype=torch.bool)  # each id counted once in the normalizer
    first[:, : topk_ids.shape[1]] = True
    seen = torch.zeros_like(full, dtype=torch.bool)
    for j in range(cand.shape[1]):  # C is small (top-k + rivals)
        col = cand[:, j]
        fresh = ~seen.gather(1, col[:, None])[:, 0]
        first[:, j] = fresh
        seen.scatter_(1, col[:, None], True)
    z = torch.logsumexp(torch.cat([(logits - m).masked_fill(~first, float("-inf")), rest.log()], dim=1), dim=1) + m[:, 0]
    teacher = logits[:, : topk_ids.shape[1]]
    return -(topk_p * (teacher - z[:, None])).sum(-1).mean()


def acceptance(argmax: torch.Tensor, pos: Positions, k: int) -> dict:
    """Greedy acceptance per draft position from teacher-forced agreement: a draft of j tokens at
    position i survives when the drafter's argmax equals the target's token at i, …, i+j−1 (within
    the sequence).

    >>> p = Positions(torch.zeros(4, 1).long(), torch.ones(4, 1), torch.tensor([1, 2, 3, 4]), torch.tensor([0, 0, 0, 1]))
    >>> acceptance(torch.tensor([1, 2, 0, 4]), p, 2)["acceptance_per_position"]
    [0.75, 0.25]
    """
    agree = (argmax == pos.next_ids).numpy()
    same = pos.seq_of.numpy()
    n = len(agree)
    alive = agree.copy()
    acc = [float(alive.mean())]
    for j in range(1, k):
        nxt = np.zeros(n, dtype=bool)
        nxt[: n - j] = agree[j:] & (same[j:] == same[: n - j])
        alive = alive & nxt
        acc.append(float(alive.mean()))
    return {
        "acceptance_per_position": acc,
        "mean_acceptance_length": 1 + sum(acc),
        "acceptance_rate_fixed_k": sum(acc) / k,
        "positions": n,
    }


# ==== the recipe =======================================================================================


def heal(
    folder: str | Path,
    target: str,
    recipe: HealRecipe = HealRecipe(),
    *,
    data_folder: Path | None = None,
    restart: bool = False,
    say=None,
    quiet: bool = False,
    gguf_type: str | None = None,
) -> HealResult:
    """Heal (or resume healing) the transplanted drafter ``folder`` on ``target``'s answers."""
    from transformers import AutoModelForCausalLM

    say = say or (lambda msg: print(f"heal: {msg}", file=sys.stderr, flush=True))
    folder = Path(folder).expanduser()
    record = read_record(folder)
    if record is None:
        raise ConfigError(f"{folder}: no transplant.json; heal a folder written by vocabbridge transplant.")
    tview = load_tokenizer(resolve_model(target))
    if tview.fingerprint not in (record["target"]["fingerprint"], record["tokenizer_fingerprint"]):
        raise ConfigError(
            f"{folder} was transplanted onto {record['target']['given']}, whose tokenizer is not {target}'s; "
            f"heal it with --to {record['target']['given']}."
        )
    work = folder / HEAL_DIR
    work.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(recipe.seed)
    device = resolve_device(recipe.device)
    t0, cpu0 = time.perf_counter(), time.process_time()
    budget = recipe.budget_minutes * 60 or None
    timings: dict[str, float] = {}

    data_dir = Path(data_folder).expanduser() if data_folder else work / "data"
    given = folder_data(data_dir, vocab_size=len(read_rows(folder)[0])) if data_folder else None
    seqs, data_info = given or heal_data(
        target, data_dir, recipe, deadline=t0 + budget * recipe.data_share if budget else None, say=say, quiet=quiet
    )
    timings["data"] = time.perf_counter() - t0
    timings["data_cpu"] = (
        time.process_time() - cpu0
    )  # the process's CPU seconds (every thread): on a shared machine, what it cost
    train_seqs, held_seqs = split_heldout(seqs, recipe.heldout, recipe.seed)
    if not held_seqs:
        held_seqs = train_seqs[-1:]
    train_pos, held_pos = positions_of(train_seqs), positions_of(held_seqs)
    say(
        f"data: {len(seqs)} sequences ({data_info['batches']} of {data_info['batches_planned']} batches) in "
        f"{timings['data']:.0f} s: {len(train_pos):,} training and {len(held_pos):,} held-out positions"
    )

    t1 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).to(device)
    kind, _ = read_rows(folder)
    new = torch.from_numpy(~np.isin(kind, (COPIED, SPECIAL)))  # [rows]: the rows healing may change
    untied = _own_lm_head(model)
    with Progress(len(train_seqs) + len(held_seqs), "heal: the drafter's hidden states", quiet=quiet) as bar:
        micro = micro_tokens(recipe, device)
        train_pos.hidden = drafter_hidden(model, train_seqs, progress=bar, max_tokens=micro)
        held_pos.hidden = drafter_hidden(model, held_seqs, progress=bar, max_tokens=micro)
    timings["features"] = time.perf_counter() - t1

    run = _Healing(model, new.to(device), train_pos, held_pos, recipe, work, device=device, say=say)
    run.resume(restart)
    before = run.history[0]["eval"] if run.history and "eval" in run.history[0] else run.evaluate(step=0, stage="rows")
    deadline = t0 + budget - SAVE_RESERVE_S if budget else None
    t2 = time.perf_counter()
    whole_at = None
    if deadline is not None and recipe.whole_share > 0:
        whole_at = t2 + (deadline - t2) * (1 - recipe.whole_share)
    run.rows_stage(deadline=whole_at or deadline, quiet=quiet)
    timings["rows"] = time.perf_counter() - t2
    if recipe.whole_share > 0:
        t3 = time.perf_counter()
        run.whole_stage(train_seqs, held_seqs, deadline=deadline, quiet=quiet)
        timings["whole"] = time.perf_counter() - t3
    after = run.history[-1]["eval"] if run.history and "eval" in run.history[-1] else run.evaluate(step=run.step, stage=run.stage)
    timings["train"] = time.perf_counter() - t2

    t4 = time.perf_counter()
    model.save_pretrained(str(folder))
    atomic_write_text(work / "metrics.jsonl", "".join(json.dumps(h) + "\n" for h in run.history))
    curves = plot_curves(run.history, work, name="transplanted drafter")
    timings["total"] = time.perf_counter() - t0
    timings["total_cpu"] = time.process_time() - cpu0
    record = read_record(folder) or record
    record["tied"] = record["tied"] and not untied
    record["heal"] = {
        "recipe": dataclasses.asdict(recipe),
        "data": {k: (round(v, 1) if isinstance(v, float) else v) for k, v in data_info.items()}
        | {
            "folder": str(data_dir),
            "sequences": len(seqs),
            "train_positions": len(train_pos),
            "heldout_positions": len(held_pos),
        },
        "steps_rows": run.steps_by_stage.get("rows", 0),
        "steps_whole": run.steps_by_stage.get("whole", 0),
        "kept_rows_of_step": run.kept_step,
        "kept_whole_model": run.whole_kept,
        "untied_lm_head": untied,
        "before": before,
        "after": after,
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "curves": [str(p.relative_to(folder)) for p in curves],
        "device": device,
        "torch": torch.__version__,
    }
    if gguf_type or record.get("gguf"):
        from .gguf_out import write_gguf

        g = record.get("gguf") or {}
        path = write_gguf(
            folder,
            target=record["target"]["given"],
            qtype=gguf_type or g.get("type", "q8_0"),
            dest=folder / (g.get("file") or f"{folder.name}.gguf"),
        )
        record["gguf"] = {"file": path.name, "type": gguf_type or g.get("type", "q8_0")}
    atomic_write_text(folder / RECORD, json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    timings["save"] = time.perf_counter() - t4
    accs = lambda ev: " / ".join(f"{100 * a:.0f}" for a in ev["acceptance_per_position"])  # noqa: E731
    say(f"held-out acceptance per position {accs(before)} → {accs(after)} % in {timings['total'] / 60:.1f} min")
    return HealResult(folder, before, after, record, run.history)


def _own_lm_head(model) -> bool:
    """Give a tied drafter its own lm_head (a copy of the embedding), so that training the output
    rows leaves the input rows, and the cached hidden states, as they are. True when it untied."""
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    if head.weight.data_ptr() != emb.weight.data_ptr():
        return False
    head.weight = torch.nn.Parameter(emb.weight.detach().clone())
    cfg = model.config
    for c in {id(cfg): cfg, id(cfg.get_text_config()): cfg.get_text_config()}.values():
        c.tie_word_embeddings = False
    return True


class _Healing:
    """The optimizer loops of both stages, their evaluations, checkpoints and history."""

    def __init__(self, model, new_rows, train: Positions, held: Positions, recipe: HealRecipe, work: Path, *, device, say):
        self.model, self.new, self.train, self.held, self.recipe = model, new_rows, train, held, recipe
        self.work, self.device, self.say = work, device, say
        self.head = model.get_output_embeddings()
        self.step, self.stage, self.history = 0, "rows", []
        self.steps_by_stage: dict[str, int] = {}
        self.opt = None
        self.ckpt = work / CKPT
        self.best = None  # the rows stage's best held-out state: (score, step, eval, the new rows)
        self.kept_step: int | None = None  # the step whose rows the stage kept, where not its last
        self.whole_kept: bool | None = None  # whether the whole-model stage's weights were kept (None: no such stage)

    # ---- evaluation ------------------------------------------------------------------------

    @torch.no_grad()
    def evaluate(self, *, step: int, stage: str, epoch: float = 0.0) -> dict:
        w = self.head.weight
        argmax, losses = [], []
        for s in range(0, len(self.held), 2048):
            h = self.held.hidden[s : s + 2048].to(self.device)
            logits = h @ w.T
            argmax.append(logits.argmax(-1).cpu())
            losses.append(
                float(
                    soft_ce(
                        logits, self.held.topk_ids[s : s + 2048].to(self.device), self.held.topk_p[s : s + 2048].to(self.device)
                    )
                )
                * len(h)
            )
        ev = acceptance(torch.cat(argmax), self.held, self.recipe.eval_k) | {"loss": sum(losses) / len(self.held)}
        self.history.append({"step": step, "epoch": epoch, "stage": stage, "eval": ev})
        accs = ", ".join(f"{a:.2f}" for a in ev["acceptance_per_position"])
        self.say(f"{stage} step {step}: held-out acceptance per position {accs}; loss {ev['loss']:.3f}")
        return ev

    # ---- the rows stage --------------------------------------------------------------------

    def _last_evaluated(self) -> dict | None:
        """The newest history entry with a held-out evaluation (that of the current rows)."""
        return next((h for h in reversed(self.history) if "eval" in h), None)

    def _consider(self) -> None:
        """Remember the current rows if their held-out evaluation (the newest in the history) is the
        best so far: the longest mean acceptance length, then the lowest loss."""
        entry = self._last_evaluated()
        if entry is None:
            return
        ev = entry["eval"]
        score = _score(ev)
        if self.best is None or score > self.best[0]:
            self.best = (score, entry["step"], ev, self.head.weight.detach()[self.new].clone())

    def _keep_best(self) -> None:
        """End of the rows stage: where a held-out evaluation before the last was better (the rows
        overfit the small data late in the schedule), put its rows back."""
        if self.best is None:
            return
        _, step, ev, rows = self.best
        last = self._last_evaluated()["eval"]  # there is one: the best came from the history
        if last is ev:
            return
        with torch.no_grad():
            self.head.weight[self.new] = rows
        self.kept_step = step
        self.history.append(
            {"step": self.step, "epoch": self.history[-1].get("epoch", 0.0), "stage": "rows", "eval": ev, "kept_step": step}
        )
        self.say(
            f"kept step {step}'s rows: held-out mean acceptance length {ev['mean_acceptance_length']:.3f}, loss "
            f"{ev['loss']:.3f} (the last step: {last['mean_acceptance_length']:.3f}, {last['loss']:.3f})"
        )

    def rows_stage(self, *, deadline: float | None, quiet: bool) -> None:
        r = self.recipe
        if self.stage != "rows":
            return
        w = self.head.weight
        self.model.requires_grad_(False)
        w.requires_grad_(True)
        mask = self.new[:, None].to(w.dtype)
        opt = torch.optim.AdamW([w], lr=r.lr_rows, weight_decay=0.0)
        if self.opt is not None:
            opt.load_state_dict(self.opt)
        per_epoch = math.ceil(len(self.train) / r.batch_positions)
        planned = full = per_epoch * r.epochs
        done_here, t_first = 0, time.perf_counter()
        self._consider()  # the rows as they start: zero-shot, or where a resumed run stopped
        # On a GPU the positions move there once (a million of them are ~2.5 GB of hidden states);
        # each epoch's order is drawn once, not at every step (a permutation of 10⁶ costs ~10 ms).
        src = self.train
        if self.device != "cpu":
            src = dataclasses.replace(
                src, hidden=src.hidden.to(self.device), topk_ids=src.topk_ids.to(self.device), topk_p=src.topk_p.to(self.device)
            )
        orders: dict[int, torch.Tensor] = {}
        exact = r.rows_loss == "exact"
        with Progress(planned, "heal: the new rows (steps)", quiet=quiet) as bar:
            bar.update(self.step)
            while self.step < planned:
                epoch, i = divmod(self.step, per_epoch)
                if epoch not in orders:
                    orders = {epoch: torch.randperm(len(src), generator=torch.Generator().manual_seed(r.seed + epoch))}
                idx = orders[epoch][i * r.batch_positions : (i + 1) * r.batch_positions].to(src.hidden.device)
                for g in opt.param_groups:
                    g["lr"] = _lr(self.step, planned, r.lr_rows)
                h = src.hidden[idx].to(self.device)
                ids, p = src.topk_ids[idx].to(self.device), src.topk_p[idx].to(self.device)
                loss = soft_ce(h @ w.T, ids, p) if exact else candidate_soft_ce(h, w, ids, p)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                w.grad.mul_(mask)  # the copied and special rows stay the drafter's own
                opt.step()
                self.step += 1
                done_here += 1
                self.steps_by_stage["rows"] = self.steps_by_stage.get("rows", 0) + 1
                lv = float(loss.detach())
                self.history.append(
                    {"step": self.step, "epoch": self.step / per_epoch, "stage": "rows", "loss": lv, "per_depth": [lv]}
                )
                bar.update(1, epoch=epoch + 1, loss=lv)
                if done_here == 1:
                    t_first = time.perf_counter()  # the first step pays the warm-up (a GPU's: ~5 times a step)
                if deadline is not None and done_here in TIMING_AT:
                    # The steps that fit, from the steps after the first; planned again later, on more
                    # of them (the first few still run slow on a GPU), never past the full schedule.
                    now = time.perf_counter()
                    per_step = (now - t_first) / (done_here - 1)
                    fit = min(full, self.step + max(0, int((deadline - now) / (per_step * 1.08))))  # past it: stop here
                    if fit != planned:
                        self.say(f"budget: {fit} of {full} steps fit ({per_step:.3f} s a step)")
                        planned = fit
                if i == per_epoch - 1 or self.step == planned:
                    self.evaluate(step=self.step, stage="rows", epoch=self.step / per_epoch)
                    self._consider()
                    self._checkpoint(opt)
        w.requires_grad_(False)
        self._keep_best()
        self.stage, self.opt = "whole", None
        self._checkpoint(None)

    # ---- the whole-model stage -------------------------------------------------------------

    def whole_stage(self, train_seqs: list[Sequence], held_seqs: list[Sequence], *, deadline: float | None, quiet: bool) -> None:
        """Every weight, on the same positions, until ``deadline``: each step takes the next
        sequences of a shuffled order until they hold ``batch_positions`` positions, its loss the
        mean over them, in padded forwards of at most :func:`micro_tokens` tokens (one sequence at
        a time on a CPU; bf16 autocast on a GPU); the held-out features are then recomputed. Where
        the whole model then scores worse held out than the rows it started from (the same rule as
        the rows stage's), its weights are put back and ``whole_kept`` says so."""
        r, model = self.recipe, self.model
        micro = micro_tokens(r, self.device)
        start_eval = (self._last_evaluated() or {}).get("eval")
        start_state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
        start_hidden = self.held.hidden
        model.requires_grad_(True)
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=r.lr_whole, weight_decay=0.0)
        base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        order = [j for j, s in enumerate(train_seqs) if _generated(s)]
        random.Random(r.seed).shuffle(order)
        t_start, steps = time.perf_counter(), 0
        with Progress(len(order), "heal: the whole model (sequences)", quiet=quiet) as bar:
            pending: list[Sequence] = []
            n = 0
            for j in order:
                if deadline is not None and time.perf_counter() > deadline:
                    break
                s = train_seqs[j]
                pending.append(s)
                n += _generated(s)
                if n < r.batch_positions:
                    continue
                loss = self._whole_step(base, opt, params, pending, n, micro)
                bar.update(len(pending), loss=loss)
                pending, n = [], 0
                steps += 1
                self.step += 1
                self.steps_by_stage["whole"] = self.steps_by_stage.get("whole", 0) + 1
                self.history.append({"step": self.step, "epoch": 0.0, "stage": "whole", "loss": loss, "per_depth": [loss]})
        model.eval()
        model.requires_grad_(False)
        if steps:
            self.held.hidden = drafter_hidden(model, held_seqs, max_tokens=micro)
            ev = self.evaluate(step=self.step, stage="whole")
            if start_eval is not None and _score(ev) < _score(start_eval):
                model.load_state_dict(start_state)
                self.held.hidden = start_hidden
                self.whole_kept = False
                self.history.append({"step": self.step, "epoch": 0.0, "stage": "whole", "eval": start_eval, "kept_step": 0})
                self.say(
                    f"the whole model scored worse held out (mean acceptance length {ev['mean_acceptance_length']:.3f}, loss "
                    f"{ev['loss']:.3f}) than the rows it started from ({start_eval['mean_acceptance_length']:.3f}, "
                    f"{start_eval['loss']:.3f}): its weights are put back"
                )
            else:
                self.whole_kept = True
        self.say(f"whole model: {steps} steps in {time.perf_counter() - t_start:.0f} s")
        self.stage = "done"

    def _whole_step(self, base, opt, params, seqs: list[Sequence], n: int, micro: int) -> float:
        """One optimizer step of the whole model on ``seqs`` (``n`` positions): the mean soft
        cross-entropy, its gradient accumulated over padded forwards of ``micro`` tokens; the loss."""
        total = 0.0
        with _autocast(self.device):
            for group in micro_batches(seqs, micro):
                part = [seqs[i] for i in group]
                h = generated_hidden(base, part, self.device)
                ids, p = (torch.cat(t).to(self.device) for t in zip(*map(_labels, part)))
                loss = soft_ce(self.head(h), ids, p)
                (loss * len(h) / n).backward()
                total += float(loss.detach()) * len(h)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total / n

    # ---- checkpoints -----------------------------------------------------------------------

    def _checkpoint(self, opt) -> None:
        state = {
            "key": self.recipe.training_key(),
            "stage": self.stage,
            "step": self.step,
            "steps_by_stage": self.steps_by_stage,
            "history": self.history,
            "lm_head": self.head.weight.detach().cpu(),
            "opt": opt.state_dict() if opt is not None else None,
        }
        tmp = self.ckpt.with_name(CKPT + ".tmp")
        torch.save(state, tmp)
        tmp.replace(self.ckpt)

    def resume(self, restart: bool) -> None:
        if restart or not self.ckpt.is_file():
            return
        ck = torch.load(self.ckpt, map_location="cpu", weights_only=False)
        if ck["key"] != self.recipe.training_key():
            raise ConfigError(f"{self.ckpt} was written by another heal recipe; pass --restart (the data are kept) or delete it.")
        with torch.no_grad():
            self.head.weight.copy_(ck["lm_head"])
        self.step, self.stage, self.history = ck["step"], ck["stage"], ck["history"]
        self.steps_by_stage, self.opt = ck["steps_by_stage"], ck["opt"]
        if self.stage != "rows":
            self.stage = "rows"  # a finished rows stage resumes as done (its step count is reached)
        self.say(f"resumed at step {self.step}")


def _score(ev: dict) -> tuple[float, float]:
    """How a held-out evaluation ranks: the longest mean acceptance length, then the lowest loss."""
    return (round(ev["mean_acceptance_length"], 4), -ev["loss"])


def _lr(step: int, total: int, peak: float) -> float:
    """Linear warm-up over 5 % of the steps, then cosine decay to 10 %."""
    warm = max(1, total // 20)
    if step < warm:
        return peak * (step + 1) / warm
    t = min(1.0, (step - warm) / max(1, total - warm))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))
