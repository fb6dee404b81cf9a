"""Training an MTP head by self-distillation: the recipe, timed phase by phase.

    load     the target (bf16 on a CPU: data only; the engine's target stays fp32)
    data     greedy continuations of the training prompts, batched (data.py), cached on disk
    vocab    the draft vocabulary: the ids the data uses most (Recipe.draft_vocab)
    train    AdamW on the head (the embedding, lm_head and rotary stay the target's, frozen),
             soft cross-entropy against the target's top-k over ``depth`` chained steps (chain.py;
             a P-EAGLE head: over its ``parallel_tokens`` positions, in one pass)
    eval     held-out prompts: greedy acceptance per draft position, mean acceptance length

With ``budget_minutes`` the run is time-boxed: data generation stops starting new batches when its
share of the budget is spent (the batches are shuffled, so a cut still covers every kind of
prompt; a later run with a larger budget generates the rest), and training plans as many steps as
the time left allows, measured on its first steps (the learning-rate schedule follows the plan).
Everything is resumable: the data per batch, the training from its last checkpoint.

>>> r = train_head("qwen2.5-coder-1.5b", Path("heads/qwen2.5-coder-1.5b"), Recipe(budget_minutes=45))  # doctest: +SKIP
>>> r.eval["acceptance_per_position"], r.eval["mean_acceptance_length"]  # doctest: +SKIP
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import math
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..engine.invariant import quantize_rows
from ..engine.model import load_causal_lm, resolve_device
from ..errors import ConfigError
from ..heads.draft_head import DraftHead, MTPHead, new_head, target_parts
from ..heads.eagle3 import check_host, default_aux_layers, new_eagle3_head
from ..heads.layouts import KNOWN, checkpoint_files, head_from_weights, read_mtp_weights
from ..heads.peagle import new_peagle_head
from ..heads.store import save_head, target_record
from ..presets import resolve_model
from ..util import atomic_write_text
from .chain import batches, chain_loss, collate, evaluate, least_squares_start, mean_inputs
from .curves import plot_curves
from .data import DATA_DIR, DataPlan, Sequence, draft_vocabulary, generate_data, load_shard, render_prompts, training_prompts
from .magpie import synthesize_prompts
from .progress import Progress

TRAIN_DIR = "train"
MAGPIE_FILE = "prompts-written.jsonl"  # the prompts the target wrote, in the data folder
MAGPIE_SHARE = 0.35  # of the data's share of a budget, at most this much for writing prompts
CKPT = "checkpoint.pt"
CKPT_EVERY = 25  # optimizer steps between checkpoints (and at every epoch's end)
TIMING_STEPS = 4  # steps timed before a budgeted run plans its total (after WARM_STEPS, then again every CKPT_EVERY)
WARM_STEPS = 2  # first steps left out of the timing: on a GPU they pay for kernel selection and allocations
SAVE_RESERVE_S = 20.0  # of a budget, kept for saving the head and plotting
FINAL_EVAL_COST = 2.5  # the final evaluation (draft and whole vocabulary) against one evaluation on the curves (measured: ~2.3×)
INITS = ("least-squares", "identity", "checkpoint")
ARCHS = ("mtp", "eagle3", "peagle")
AUX_ARCHS = ("eagle3", "peagle")  # heads that read the streams entering a few target layers
HEAD_NAMES = {"mtp": "MTP head", "eagle3": "EAGLE-3 head", "peagle": "P-EAGLE head"}
DRAFT_VOCAB = 32768  # the recipe's draft vocabulary


@dataclass(frozen=True)
class Recipe:
    """How a head is trained. The defaults are the CPU recipe for Qwen2.5-Coder-1.5B (run it with
    ``budget_minutes=45``: the budget decides how much data and how many epochs fit).

    Chosen on the 1.5B (80k positions of int8 data, 28 held-out prompts): the least-squares start
    (eh_proj, then down_proj: 0.35 / 0.11 / 0.04 greedy acceptance before any gradient step) is
    worth the first ~15 minutes of gradient training. From it, lr 1e-4 (10 % warm-up) drove the
    training loss up (1.6 → 2.9 nats in 80 steps) and held-out acceptance down (0.38 → 0.35 after
    an epoch); 3e-5 kept the training loss level and took held-out acceptance from 0.32 / 0.12 /
    0.05 to 0.36 / 0.17 / 0.08 in the 185 steps a 45-minute budget leaves (the fit overfits: 1.5
    nats on its training positions, 4.1 held out). Earlier, from the identity start, on SmolLM2-135M
    and Qwen2.5-Coder-0.5B: the learning rate mattered most (SmolLM2 best at 5e-4, the 0.5B at 1e-4
    to 2e-4, 1e-3 did not learn); Gaussian noise on the hidden states, EAGLE's feature loss
    (``hidden_weight``) and a frozen layer did not help; smaller batches (512 positions) helped.
    """

    prompts: str | None = None  # JSONL prompt file (bench format); None: the built-in training set
    max_prompts: int | None = None  # use the first N prompts
    magpie: int = 0  # also this many prompts the target writes itself (magpie.py); 0: none
    thinking_share: float = 0.2  # where the template has enable_thinking: the share of prompts answered thinking
    new_tokens: int = 160  # greedy tokens generated per prompt
    gen_batch: int = 0  # prompts per generation batch; 0: 16 on a CPU, 1024 on a GPU (prompts the target writes: 2x)
    top_k: int = 20  # soft labels kept per position
    draft_vocab: int = DRAFT_VOCAB  # draft vocabulary (0: the whole target vocabulary; always with init checkpoint)
    depth: int = 2  # chained draft steps trained
    epochs: int = 6  # at most; a budget may cut training short
    batch_tokens: int = 0  # positions per optimizer step; 0: 512 on a CPU, 16384 on a GPU
    lr: float = 0.0  # peak learning rate; 0: 3e-5 on a CPU (small data, the least-squares start), 5e-5 on a GPU
    warmup: float = 0.1  # share of steps with a linear warm-up, then cosine decay to 10 %
    arch: str = "mtp"  # mtp (DeepSeek-V3's MTP module on the final hidden state), eagle3 (vLLM's EAGLE-3 layer,
    # several layers) or peagle (EAGLE-3's layer proposing all its draft tokens in one forward: heads/peagle.py)
    aux_layers: tuple[int, ...] | None = None  # eagle3, peagle: the target layers it reads (None: eagle3.default_aux_layers)
    parallel_tokens: int = 4  # peagle: the draft tokens one forward proposes (mask positions + 1), trained and drafted
    # the head's start: least-squares (eh_proj/fc and down_proj fit to the data, chain.py), identity, or checkpoint
    # (the target's own MTP weights, heads/layouts.py: that head retrained, over the whole vocabulary)
    init: str = "least-squares"
    step_weight: float = 0.7  # loss weight of chained step d: step_weight ** (d - 1)
    hidden_weight: float = 0.0  # weight of EAGLE's feature loss (the head's output against h_{t+1})
    heldout: float = 0.1  # share of prompts kept out of training for the evaluation
    seed: int = 0
    eval_k: int = 3  # draft positions evaluated
    budget_minutes: float = 0.0  # wall-clock budget of the whole run, data included; 0: none
    data_share: float = 0.5  # of a budget, for data generation
    data_dtype: str = "auto"  # the target generating the data: auto = int8 on a CPU (the engine's --dtype int8), bf16 on CUDA
    dtype: str = "auto"  # training autocast: auto = bf16 on CUDA and on CPUs with native bf16, else float32
    device: str = "auto"

    def __post_init__(self):
        if min(self.depth, self.epochs, self.new_tokens, self.top_k, self.eval_k) < 1:
            raise ConfigError("depth, epochs, new_tokens, top_k and eval_k must be at least 1.")
        if not 0 <= self.heldout < 1 or not 0 < self.data_share < 1:
            raise ConfigError(f"heldout must be in [0, 1) and data_share in (0, 1); got {self.heldout}, {self.data_share}.")
        if self.init not in INITS:
            raise ConfigError(f"init must be one of {', '.join(INITS)}; got {self.init!r}.")
        if self.arch not in ARCHS:
            raise ConfigError(f"arch must be one of {', '.join(ARCHS)}; got {self.arch!r}.")
        if self.init == "checkpoint":
            self._check_checkpoint_init()
        if self.aux_layers is not None and self.arch not in AUX_ARCHS:
            raise ConfigError("aux_layers are the target layers an eagle3 or peagle head reads; pass them with those archs.")
        if not 1 <= self.parallel_tokens <= 16:
            raise ConfigError(f"parallel_tokens must be in 1 … 16; got {self.parallel_tokens}.")
        if self.aux_layers is not None:
            object.__setattr__(self, "aux_layers", tuple(int(i) for i in self.aux_layers))
        if self.budget_minutes < 0:
            raise ConfigError(f"budget_minutes must be ≥ 0 (0: no budget), got {self.budget_minutes}.")
        if self.magpie < 0 or not 0 <= self.thinking_share <= 1:
            raise ConfigError(f"magpie must be ≥ 0 and thinking_share in [0, 1]; got {self.magpie}, {self.thinking_share}.")

    def _check_checkpoint_init(self) -> None:
        """``init="checkpoint"`` retrains the target's own MTP head as it is: an mtp head drafting over
        the whole vocabulary (as the model's head does, and as vLLM's native ``mtp`` serves it)."""
        if self.arch != "mtp":
            raise ConfigError(
                f"--init checkpoint retrains the target's own MTP head, an mtp head; a {self.arch} head starts "
                "from --init least-squares (the default) or identity. Drop --init checkpoint, or pass --arch mtp."
            )
        if self.draft_vocab not in (0, DRAFT_VOCAB):
            raise ConfigError(
                f"--init checkpoint retrains the target's own MTP head, which drafts over the whole vocabulary (as vLLM "
                f"serves it); --draft-vocab {self.draft_vocab} does not apply: leave --draft-vocab out."
            )
        object.__setattr__(self, "draft_vocab", 0)

    def on(self, device: str) -> Recipe:
        """The recipe with its device-dependent defaults filled in (0 = auto): a GPU's batches are
        sized for a GPU (1.57 s per 512-position step was measured with the CPU sizes on an H200)."""
        gpu = device.startswith("cuda")
        return dataclasses.replace(
            self,
            gen_batch=self.gen_batch or (1024 if gpu else 16),
            batch_tokens=self.batch_tokens or (16384 if gpu else 512),
            lr=self.lr or (5e-5 if gpu else 3e-5),
        )

    def training_key(self) -> dict:
        """The fields a checkpoint must agree on to be resumed."""
        skip = {"epochs", "device", "gen_batch", "budget_minutes", "data_share", "magpie"}
        if self.arch != "peagle":
            skip.add("parallel_tokens")  # checkpoints of the other heads from before it resume
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in skip}


@dataclass
class TrainResult:
    folder: Path
    head: DraftHead
    eval: dict
    timings: dict[str, float]
    tokens: dict[str, int]
    history: list[dict] = field(default_factory=list)


def native_bf16(device: str) -> bool:
    """True where bf16 matmuls run at full speed: CUDA, and CPUs with AVX512-BF16 or AMX. Elsewhere
    (AVX2 CPUs) oneDNN emulates bf16 and is several times slower than fp32 (measured on an AMD EPYC
    without AVX-512: a batched 1.5B prefill did not finish in 10 minutes in bf16, 48 tok/s in fp32)."""
    if device.startswith("cuda"):
        return True
    cpu = getattr(torch, "cpu", None)
    return any(bool(getattr(cpu, f, lambda: False)()) for f in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))


def training_dtype(recipe: Recipe, device: str) -> torch.dtype:
    if recipe.dtype in ("float32", "fp32"):
        return torch.float32
    if recipe.dtype in ("bfloat16", "bf16"):
        return torch.bfloat16
    return torch.bfloat16 if native_bf16(device) else torch.float32


def data_dtype(recipe: Recipe, device: str) -> str:
    """``int8`` (per-row int8 linears: what ``--dtype int8`` serves, 2-3× faster than fp32 on a CPU,
    each row independent of the batch), ``float32`` or ``bfloat16``."""
    if recipe.data_dtype in ("float32", "fp32"):
        return "float32"
    if recipe.data_dtype in ("bfloat16", "bf16"):
        return "bfloat16"
    if recipe.data_dtype == "int8":
        return "int8"
    return "bfloat16" if device.startswith("cuda") else "int8"


def _autocast(device: str, dtype: torch.dtype):
    enabled = dtype != torch.float32
    return lambda: torch.autocast(device_type=device.split(":")[0], dtype=dtype, enabled=enabled)


def lr_at(step: int, total: int, recipe: Recipe) -> float:
    """Linear warm-up over ``warmup`` of the steps, then cosine decay to 10 % of ``lr``."""
    warm = max(1, int(total * recipe.warmup))
    if step < warm:
        return recipe.lr * (step + 1) / warm
    t = min(1.0, (step - warm) / max(1, total - warm))
    return recipe.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def split_heldout(seqs: list[Sequence], share: float, seed: int) -> tuple[list[Sequence], list[Sequence]]:
    """Held-out sequences by prompt (both thinking variants of a prompt fall on the same side)."""
    base = lambda s: s.prompt_id.rsplit("+think", 1)[0].rsplit("-think", 1)[0]  # noqa: E731
    ids = sorted({base(s) for s in seqs})
    random.Random(seed).shuffle(ids)
    held = set(ids[: int(round(len(ids) * share))]) if share > 0 and len(ids) > 1 else set()
    return [s for s in seqs if base(s) not in held], [s for s in seqs if base(s) in held]


def prompt_kind(prompt_id: str) -> str:
    """What kind of prompt an id names: ``magpie-ko-000012+think`` → ``ko``, ``code-gen-003`` → ``code-gen``.

    >>> prompt_kind("magpie-ko-000012+think"), prompt_kind("code-gen-003-think"), prompt_kind("x")
    ('ko', 'code-gen', 'x')
    """
    base = prompt_id.rsplit("+think", 1)[0].rsplit("-think", 1)[0]
    if base.startswith("magpie-"):
        return base.split("-")[1]
    head, sep, tail = base.rpartition("-")
    return head if sep and tail.isdigit() else base


# ==== the whole recipe ==============================================================================


def train_head(
    target: str,
    folder: Path,
    recipe: Recipe,
    *,
    restart: bool = False,
    say=None,
    quiet: bool = False,
    data_dir: Path | None = None,
) -> TrainResult:
    """Train (or resume training) a head for ``target`` into ``folder``; see the module docstring.
    ``data_dir``: where the generated data (and the prompts the target wrote) live, default
    ``folder/train/data``."""
    return train_heads(target, {recipe.arch: folder}, recipe, restart=restart, say=say, quiet=quiet, data_dir=data_dir)[
        recipe.arch
    ]


def train_heads(
    target: str,
    folders: dict[str, Path],
    recipe: Recipe,
    *,
    restart: bool = False,
    say=None,
    quiet: bool = False,
    data_dir: Path | None = None,
) -> dict[str, TrainResult]:
    """Heads of several architectures (``{"eagle3": folder, "peagle": folder, "mtp": folder}``) from
    one load of the target and one generation of data (with the layer streams EAGLE-3 and P-EAGLE
    read when one of them is among them), trained one after the other on the same data and draft
    vocabulary, the training time left shared between them."""
    say = say or (lambda msg: print(f"train-head: {msg}", file=sys.stderr, flush=True))
    folders = {a: Path(f).expanduser() for a, f in folders.items()}
    for arch in folders:
        if arch not in ARCHS:
            raise ConfigError(f"arch must be one of {', '.join(ARCHS)}; got {arch!r}.")
        dataclasses.replace(recipe, arch=arch)  # refused now, not after the data (init checkpoint: mtp only)
    first = next(iter(folders.values()))
    data_dir = Path(data_dir).expanduser() if data_dir else first / TRAIN_DIR / DATA_DIR
    torch.manual_seed(recipe.seed)
    device = resolve_device(recipe.device)
    recipe = recipe.on(device)
    gpu = device.startswith("cuda")
    dtype = training_dtype(recipe, device)
    autocast = _autocast(device, dtype)
    gen_dtype = data_dtype(recipe, device)
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    budget = recipe.budget_minutes * 60 or None

    # load
    if gen_dtype == "int8" and device != "cpu":
        raise ConfigError("data_dtype int8 runs on the CPU only; use bfloat16 on CUDA.")
    lm = load_causal_lm(resolve_model(target), dtype="float32" if gen_dtype == "int8" else gen_dtype, device=device, pack=False)
    lm.model.requires_grad_(False)
    parts = target_parts(lm.model)
    aux_layers: tuple[int, ...] = ()
    if any(a in folders for a in AUX_ARCHS):
        check_host(parts)
        aux_layers = recipe.aux_layers or default_aux_layers(parts.num_layers)
    if gen_dtype == "int8":  # the head starts from the fp32 last layer and lm_head: keep them out of the quantization
        parts = dataclasses.replace(parts, last_layer=copy.deepcopy(parts.last_layer))
        quantize_rows(lm.model)  # replaces the lm_head module (parts keeps the fp32 one) and the layers' linears in place
    start = checkpoint_start(target, lm.source, parts) if recipe.init == "checkpoint" else None
    timings["load"] = time.perf_counter() - t0
    say(
        f"loaded {lm.name} in {timings['load']:.0f} s on {device}: data in {gen_dtype}, "
        f"training in {str(dtype).replace('torch.', '')}"
    )

    # data
    t1 = time.perf_counter()
    prompts = training_prompts(recipe.prompts)[: recipe.max_prompts]
    magpie_stats = {}
    if recipe.magpie:
        with Progress(recipe.magpie, "prompts the target writes", quiet=quiet) as bar:
            written, magpie_stats = synthesize_prompts(
                lm.model,
                lm.view,
                recipe.magpie,
                out=data_dir / MAGPIE_FILE,
                batch=2 * recipe.gen_batch,
                max_tokens=128,
                seed=recipe.seed,
                progress=lambda n, info: bar.update(n, kept=info["kept"], kind=info["kind"]),
                deadline=t0 + budget * recipe.data_share * MAGPIE_SHARE if budget else None,
            )
        timings["prompts"] = time.perf_counter() - t1
        say(
            f"prompts the target wrote: {magpie_stats['kept']:,} kept ({magpie_stats['by_kind']}) of "
            f"{magpie_stats['candidates_this_run']:,} candidates this run in {timings['prompts']:.0f} s; "
            f"rejected: {magpie_stats['rejected_this_run']}"
        )
        prompts = prompts + written
    rendered = render_prompts(lm.view, prompts, thinking_share=recipe.thinking_share)
    plan = DataPlan.make(rendered, batch_size=recipe.gen_batch, seed=recipe.seed)
    roles = lm.view.roles
    stops = {roles[r] for r in ("eos", "end_of_turn") if r in roles}
    fresh: list[Sequence] = []
    in_memory = gpu and bool(aux_layers)
    with Progress(len(rendered), "data (prompts)", quiet=quiet) as bar:
        shards = generate_data(
            lm.model,
            plan,
            data_dir,
            max_new_tokens=recipe.new_tokens,
            stop_ids=stops,
            top_k=recipe.top_k,
            pad_id=roles.get("pad", next(iter(stops), 0)),
            progress=bar,
            deadline=t0 + budget * recipe.data_share if budget else None,
            settings={"new_tokens": recipe.new_tokens, "top_k": recipe.top_k, "data_dtype": gen_dtype}
            | ({"aux_layers": list(aux_layers)} if aux_layers else {}),
            aux_layers=aux_layers,
            # A GPU's EAGLE-3 data stay in its memory (tens of GB of layer streams): no shards. An MTP
            # head's are written as on a CPU (a few GB): a later run, or a transplant's heal, reads them.
            keep=fresh if in_memory else None,
        )
    seqs = fresh if in_memory else [s for path in shards for s in load_shard(path)]
    timings["data"] = time.perf_counter() - t1
    train_seqs, held = split_heldout(seqs, recipe.heldout, recipe.seed)
    tokens = {
        "sequences": len(seqs),
        "positions": sum(s.positions for s in seqs),
        "generated": sum(len(s.tokens) - s.gen_start for s in seqs),
        "train_positions": sum(s.positions for s in train_seqs),
        "heldout_positions": sum(s.positions for s in held),
        "batches_planned": len(plan.batches),
        "batches_generated": len(shards),
        "prompts": len(rendered),
        "prompts_written_by_target": magpie_stats.get("kept", 0),
    }
    say(
        f"data: {tokens['sequences']} sequences ({len(shards)} of {len(plan.batches)} batches), {tokens['positions']:,} "
        f"positions ({tokens['generated']:,} generated) in {timings['data']:.0f} s; {len(held)} sequences held out"
    )
    vocab = parts.embed.weight.shape[0]
    full = recipe.draft_vocab <= 0 or recipe.draft_vocab >= vocab
    draft_ids = None if full else draft_vocabulary(train_seqs, size=recipe.draft_vocab, vocab_size=vocab, always=stops)
    shared = dict(
        parts=parts,
        train=train_seqs,
        held=held,
        draft_ids=draft_ids,
        aux_layers=aux_layers,
        device=device,
        autocast=autocast,
        start=start,
    )
    results = {}
    for i, (arch, folder) in enumerate(folders.items()):
        left = (t0 + budget - time.perf_counter()) / (len(folders) - i) if budget else None
        deadline = time.perf_counter() + left - SAVE_RESERVE_S if left is not None else None
        r = dataclasses.replace(recipe, arch=arch)
        results[arch] = _train_one(
            r,
            folder,
            restart=restart,
            say=say,
            quiet=quiet,
            deadline=deadline,
            timings=dict(timings),
            tokens=tokens,
            magpie=magpie_stats,
            target=target,
            view=lm.view,
            source=lm.source,
            t0=t0,
            **shared,
        )
    return results


def _train_one(
    recipe: Recipe,
    folder: Path,
    *,
    parts,
    train,
    held,
    draft_ids,
    aux_layers,
    device,
    autocast,
    restart,
    say,
    quiet,
    deadline,
    timings,
    tokens,
    magpie,
    target,
    view,
    source,
    t0,
    start=None,
) -> TrainResult:
    """One head on data already generated: its start, the training loop, the final evaluation, the files.
    ``start``: (layout, head) of the target's own MTP weights (init checkpoint)."""
    work = folder / TRAIN_DIR
    work.mkdir(parents=True, exist_ok=True)
    vocab = parts.embed.weight.shape[0]
    if recipe.arch == "eagle3":
        head = new_eagle3_head(parts, aux_layers=aux_layers, draft_ids=draft_ids).to(device)
    elif recipe.arch == "peagle":
        feats, emb = mean_inputs(parts, train)
        head = new_peagle_head(
            parts,
            aux_layers=aux_layers,
            draft_ids=draft_ids,
            parallel_tokens=recipe.parallel_tokens,
            mask_hidden=feats,
            mask_embed=emb,
        ).to(device)
    elif recipe.init == "checkpoint":
        head = start[1].to(device)  # the target's own head, over the whole vocabulary (no least-squares start)
    else:
        head = new_head(parts, draft_ids=draft_ids).to(device)
    t2d = torch.full((vocab,), -1, dtype=torch.long)
    t2d[draft_ids if draft_ids is not None else torch.arange(vocab)] = torch.arange(head.draft_vocab_size)
    fits: dict[str, float] = {}
    if recipe.init == "least-squares" and not _Training.has_checkpoint(work, restart):
        t_fit = time.perf_counter()
        fits = least_squares_start(head, train, t2d, say=say)
        timings["fit"] = time.perf_counter() - t_fit

    # train
    t2 = time.perf_counter()
    run = _Training(head, train, held, t2d, recipe, work, device=device, autocast=autocast, say=say)
    run.resume(restart)
    with Progress(run.planned, f"train {recipe.arch} (steps)", quiet=quiet) as bar:
        run.loop(bar, deadline)
    timings["train"] = time.perf_counter() - t2
    head.eval()

    # eval and save
    t3 = time.perf_counter()
    ev = run.final_eval()
    by_kind = run.eval_by_kind()
    timings["eval"] = time.perf_counter() - t3
    timings["total"] = time.perf_counter() - t0
    training = {
        "recipe": dataclasses.asdict(recipe),
        "steps": run.step,
        "steps_planned": run.planned,
        "steps_this_run": run.step - run.resumed_at,
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "tokens": tokens,
        "least_squares_r2": fits,
        **({"checkpoint_mtp": {"layout": start[0], "source": source}} if recipe.init == "checkpoint" else {}),
        "heldout_eval": ev,
        "heldout_eval_by_kind": by_kind,
        "magpie": magpie,
        "device": device,
        "torch": torch.__version__,
    }
    save_head(
        head,
        folder,
        target=target_record(parts, source=target, tokenizer_fingerprint=view.fingerprint, resolved=source),
        training=training,
    )
    atomic_write_text(work / "eval.json", json.dumps(ev | {"by_kind": by_kind}, indent=2) + "\n")
    atomic_write_text(work / "metrics.jsonl", "".join(json.dumps(h) + "\n" for h in run.history))
    plot_curves(run.history, work, name=HEAD_NAMES[recipe.arch])
    say(
        f"{HEAD_NAMES[recipe.arch]}: held-out acceptance per position "
        + ", ".join(f"{a:.3f}" for a in ev["acceptance_per_position"])
        + f"; mean length {ev['mean_acceptance_length']:.2f}; written to {folder}"
    )
    return TrainResult(folder, head, ev, timings, tokens, run.history)


def checkpoint_start(target: str, source: str, parts) -> tuple[str, MTPHead]:
    """``init="checkpoint"``: (layout, the head) of the MTP weights in the target's own checkpoint
    (``source``: the file or folder it was loaded from), refused when it has none in a layout we read."""
    files = checkpoint_files(source)
    layout, weights = read_mtp_weights(files, num_layers=parts.num_layers) if files else (None, {})
    if layout is None:
        found = (
            f"{len(files)} safetensors file(s) without MTP tensors"
            if files
            else "no safetensors files (a GGUF has no MTP weights)"
        )
        raise ConfigError(
            f"--init checkpoint retrains the target's own MTP head, and {target} has none in a layout vocabbridge reads "
            f"({found}; the layouts: {KNOWN}). Train a new head instead: drop --init checkpoint (the least-squares start) "
            "or pass --init identity."
        )
    return layout, head_from_weights(parts, layout, weights, source=source).float()


class _Training:
    """The optimizer loop: epochs of shuffled batches, checkpoints, an evaluation per epoch, and
    under a deadline a plan of as many steps as fit (timed on the first ``TIMING_STEPS``)."""

    def __init__(self, head: DraftHead, train, held, t2d, recipe: Recipe, work: Path, *, device, autocast, say):
        self.head, self.held, self.t2d, self.recipe, self.work = head, held, t2d, recipe, work
        self.device, self.autocast, self.say = device, autocast, say
        self.params = [p for p in head.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=recipe.lr, weight_decay=0.0)
        self.epochs = [
            batches(train, batch_tokens=recipe.batch_tokens, rng=random.Random(recipe.seed + e)) for e in range(recipe.epochs)
        ]
        self.planned = self.full = sum(len(b) for b in self.epochs)
        self.step = self.resumed_at = 0
        self.eval_s = 0.0  # how long one evaluation on the curves took (a budget plans for them)
        self.history: list[dict] = []
        self.ckpt = work / CKPT

    @staticmethod
    def has_checkpoint(work: Path, restart: bool) -> bool:
        """A checkpoint will be resumed (so the head's start need not be computed)."""
        return (work / CKPT).is_file() and not restart

    def resume(self, restart: bool) -> None:
        if not self.ckpt.is_file() or restart:
            return
        ck = torch.load(self.ckpt, map_location=self.device, weights_only=False)
        d2t = self.head.d2t.cpu() if self.head.d2t is not None else torch.empty(0)
        if ck["recipe"] != self.recipe.training_key() or not torch.equal(ck["d2t"].cpu(), d2t):
            raise ConfigError(
                f"{self.ckpt} was written by another recipe or other data; pass --restart to train from scratch "
                f"(the generated data is kept), or use another -o folder."
            )
        self.head.load_state_dict(ck["head"], strict=False)
        self.opt.load_state_dict(ck["opt"])
        self.step = self.resumed_at = ck["step"]
        self.history = ck["history"]
        self.say(f"resumed at step {self.step} of {self.planned}")

    def loop(self, bar: Progress, deadline: float | None) -> None:
        r, head = self.recipe, self.head
        if self.step:
            bar.update(self.step)
        if self.step == 0 and self.held:  # where training starts from, on the curves
            self._evaluate(0, 0.0)
        head.train()
        t_start, n = time.perf_counter(), 0
        for epoch, group in enumerate(self.epochs):
            for i, seqs in enumerate(group):
                n += 1
                if n <= self.step:
                    continue  # done before a resume
                if self.step >= self.planned:  # a budget cut the plan short
                    return self._checkpoint()
                for g in self.opt.param_groups:
                    g["lr"] = lr_at(self.step, self.planned, r)
                b = collate(seqs, self.t2d, r.batch_tokens, features=head.features).to(self.device)
                with self.autocast():
                    loss, per_depth = chain_loss(head, b, r.depth, r.step_weight, r.hidden_weight)
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.params, 1.0)
                self.opt.step()
                self.step += 1
                value = float(loss.detach())
                self.history.append(
                    {"step": self.step, "epoch": epoch + (i + 1) / len(group), "loss": value, "per_depth": per_depth}
                )
                bar.update(1, epoch=epoch + 1, loss=value)
                done = self.step - self.resumed_at
                if done == WARM_STEPS:
                    t_start = time.perf_counter()  # the warm steps' time is not a step's time
                if deadline is not None and done > WARM_STEPS and (done - WARM_STEPS) % CKPT_EVERY == TIMING_STEPS % CKPT_EVERY:
                    self._plan(deadline, (time.perf_counter() - t_start) / (done - WARM_STEPS))
                if i == len(group) - 1:
                    self._end_of_epoch(epoch + 1)
                elif self.step % CKPT_EVERY == 0:
                    self._checkpoint()

    def final_eval(self) -> dict:
        """The held-out evaluation at the end, over the draft vocabulary and the whole vocabulary
        (what vLLM runs from the export)."""
        r = self.recipe
        self.head.eval()
        ev = evaluate(
            self.head,
            self.held,
            self.t2d,
            k=r.eval_k,
            batch_tokens=r.batch_tokens,
            device=self.device,
            autocast=self.autocast,
            full_vocab=True,
        )
        last = self.history[-1] if self.history else {}
        if not ("eval" in last and last["step"] == self.step):
            epoch = next((h["epoch"] for h in reversed(self.history) if "loss" in h), 0)
            self.history.append({"step": self.step, "epoch": epoch, "eval": ev})
        return ev

    def eval_by_kind(self) -> dict[str, dict]:
        """The held-out evaluation per kind of prompt (``magpie-ko-…`` → ko; ``code-gen-003`` → code-gen)."""
        groups: dict[str, list[Sequence]] = {}
        for s in self.held:
            groups.setdefault(prompt_kind(s.prompt_id), []).append(s)
        r = self.recipe
        out = {}
        for kind, seqs in sorted(groups.items()):
            ev = evaluate(
                self.head, seqs, self.t2d, k=r.eval_k, batch_tokens=r.batch_tokens, device=self.device, autocast=self.autocast
            )
            out[kind] = {"sequences": len(seqs)} | ev
        return out

    def _plan(self, deadline: float, per_step: float) -> None:
        """As many steps as fit before ``deadline``, leaving time for the evaluation at each epoch's
        end the plan reaches and for the final one. Planned again as the steps are timed (the
        first ones on a GPU are dear: an EAGLE-3 head on an H200 was planned 72 of 439 steps from
        2.05 s steps that later ran far faster), so the plan may grow back toward the full one."""
        left = deadline - time.perf_counter() - FINAL_EVAL_COST * self.eval_s
        ends = list(itertools.accumulate(len(g) for g in self.epochs))
        fit = self.step
        while fit < self.full:
            evals = sum(1 for e in ends if self.step < e <= fit + 1)
            if (fit + 1 - self.step) * per_step + evals * self.eval_s > left:
                break
            fit += 1
        if fit != self.planned:
            self.say(f"budget: {fit} of {self.full} steps fit ({per_step:.2f} s per step)")
            self.planned = fit

    def _evaluate(self, step: int, epoch: float) -> dict:
        r, head = self.recipe, self.head
        t = time.perf_counter()
        head.eval()
        ev = evaluate(
            head, self.held, self.t2d, k=r.eval_k, batch_tokens=r.batch_tokens, device=self.device, autocast=self.autocast
        )
        head.train()
        self.eval_s = time.perf_counter() - t
        self.history.append({"step": step, "epoch": epoch, "eval": ev})
        accs = ", ".join(f"{a:.2f}" for a in ev["acceptance_per_position"])
        when = f"epoch {epoch:g}" if step else "before training"
        self.say(f"{when}: held-out acceptance per position {accs}; mean length {ev['mean_acceptance_length']:.2f}")
        return ev

    def _end_of_epoch(self, epoch: int) -> None:
        self._evaluate(self.step, epoch)
        self._checkpoint()
        plot_curves(self.history, self.work, name=HEAD_NAMES[self.recipe.arch])

    def _checkpoint(self) -> None:
        state = {
            "recipe": self.recipe.training_key(),
            "head": self.head.trainable_state(),
            "d2t": self.head.d2t.cpu() if self.head.d2t is not None else torch.empty(0),
            "opt": self.opt.state_dict(),
            "step": self.step,
            "history": self.history,
        }
        tmp = self.ckpt.with_name(self.ckpt.name + ".tmp")
        torch.save(state, tmp)
        tmp.replace(self.ckpt)
