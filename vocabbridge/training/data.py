"""Self-distillation data for an MTP head: the target's own greedy continuations of chat prompts,
with the target's final hidden state and its top-k next-token distribution at every position.

One batched greedy decode gives everything (no second pass): its prefill yields the prompt
positions' features, each decode step the features of the token it feeds. Batching is what makes
this affordable on a CPU (the engine serves one request at a time; a forward over 8–16 rows costs
little more than one, decoding being bound by reading the weights).

Per sequence of n tokens (prompt + continuation), positions 0 … n−2 carry features::

    tokens   [n]        int64    prompt + the target's greedy continuation
    hidden   [n−1, d]   float16  final hidden state after tokens[i] (what the lm_head reads)
    topk_ids [n−1, K]   int32    the target's K likeliest next tokens after tokens[:i+1]
    topk_p   [n−1, K]   float16  their probabilities (the soft labels)
    aux      [n−1, m·d] float16  for EAGLE-3 heads: the residual streams entering m chosen layers
                                 (the layer count standing for the final norm's input), concatenated
    gen_start           int      index of the first generated token

Shards (one per generation batch) are safetensors files under ``train/data/``; a manifest lists the
finished ones, so an interrupted run resumes after the last finished batch.

>>> seqs = generate_batch(model, [ids_a, ids_b], max_new_tokens=64, stop_ids={2}, top_k=20)  # doctest: +SKIP
"""

from __future__ import annotations

import inspect
import json
import random
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import DynamicCache

from ..chat import render_chat
from ..engine.model import capture_streams
from ..errors import InputFileError
from ..heads.draft_head import decoder_of
from ..heads.store import save_tensors
from ..prompts import Prompt, load_prompts
from ..util import atomic_write_text

DATA_DIR = "data"
MANIFEST = "manifest.json"


@dataclass
class Sequence:
    tokens: torch.Tensor  # [n] int64
    hidden: torch.Tensor  # [n-1, d] float16
    topk_ids: torch.Tensor  # [n-1, K] int32
    topk_p: torch.Tensor  # [n-1, K] float16
    gen_start: int
    prompt_id: str = ""
    aux: torch.Tensor | None = None  # [n-1, m·d] float16 (EAGLE-3 heads' features), None when not asked for

    @property
    def positions(self) -> int:
        return self.hidden.shape[0]


# ==== prompts ====================================================================================


def builtin_train_prompts() -> Path:
    return Path(str(resources.files("vocabbridge") / "data" / "train_prompts.jsonl"))


def render_prompts(view, prompts: list[Prompt], *, thinking_share: float = 0.2) -> list[tuple[str, list[int]]]:
    """(id, token ids) per prompt, chat template applied; where the template knows
    ``enable_thinking``, about ``thinking_share`` of the prompts (every one in 1/share, evenly spread)
    think and the rest do not (ids end in ``+think`` / ``-think``): the study's mix is ~20 % thinking."""
    thinking = "enable_thinking" in (view.chat_template or "")
    every = max(1, round(1 / thinking_share)) if thinking_share > 0 else 0
    out = []
    for i, p in enumerate(prompts):
        on = bool(every) and i % every == 0
        kw = {"enable_thinking": on} if thinking else {}
        pid = p.id + ("" if not thinking else "+think" if on else "-think")
        out.append((pid, view.encode(render_chat(view, list(p.messages), **kw))))
    return out


def training_prompts(path: str | Path | None = None) -> list[Prompt]:
    """The training prompt set (the built-in one, kept apart from the bench suite, by default)."""
    path = Path(path) if path is not None else builtin_train_prompts()
    if not path.is_file():
        raise InputFileError(f"{path}: no such prompt file; pass a JSONL prompt file (vocabbridge bench's format).")
    return load_prompts(path)


# ==== generation =================================================================================


def _topk(model, hidden: torch.Tensor, k: int, chunk: int = 256) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[n, d] hidden → (argmax [n], topk ids [n, k] int32, topk probs [n, k] fp16), in chunks (the
    full-vocabulary logits of a long prompt would not fit)."""
    head = model.get_output_embeddings()
    cap = getattr(getattr(model.config, "get_text_config", lambda: model.config)(), "final_logit_softcapping", None)
    ids, ps = [], []
    for s in range(0, hidden.shape[0], chunk):
        logits = head(hidden[s : s + chunk]).float()
        if cap:
            logits = torch.tanh(logits / cap) * cap
        p, i = torch.softmax(logits, -1).topk(k, dim=-1)
        ids.append(i.int())
        ps.append(p.half())
    ids_t, ps_t = torch.cat(ids), torch.cat(ps)
    return ids_t[:, 0].long(), ids_t, ps_t


@torch.inference_mode()
def generate_batch(
    model,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    stop_ids: set[int],
    top_k: int,
    pad_id: int = 0,
    aux_layers: tuple[int, ...] = (),
) -> list[Sequence]:
    """Greedy continuations of ``prompts`` (left-padded into one batch) with their features (and the
    residual streams entering ``aux_layers``, for an EAGLE-3 head). A row that has finished (a stop
    token or ``max_new_tokens``) leaves the batch and the KV cache, so the long answers do not make
    the short ones pay for their steps."""
    base = decoder_of(model)
    with capture_streams(base, aux_layers) as streams:
        return _generate(model, base, prompts, streams, max_new_tokens, stop_ids, top_k, pad_id)


def _generate(model, base, prompts, streams, max_new_tokens, stop_ids, top_k, pad_id) -> list[Sequence]:
    dev = model.get_input_embeddings().weight.device
    b, t = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((b, t), pad_id, dtype=torch.long)
    mask = torch.zeros((b, t), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, t - len(p) :] = torch.tensor(p)
        mask[i, t - len(p) :] = 1
    ids, mask = ids.to(dev), mask.to(dev)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache()
    kw = {"cache" if "cache" in _forward_params(base) else "past_key_values": cache}
    h = base(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **kw).last_hidden_state  # [b, t, d]
    a = streams()  # [b, t, m·d] or None

    hid: list[list[torch.Tensor]] = [[h[i, t - len(p) :].half().cpu()] for i, p in enumerate(prompts)]
    aux: list[list[torch.Tensor]] = [[a[i, t - len(p) :].half().cpu()] if a is not None else [] for i, p in enumerate(prompts)]
    tk_ids: list[list[torch.Tensor]] = []
    tk_p: list[list[torch.Tensor]] = []
    nxt = []
    for i, p in enumerate(prompts):
        best, ti, tp = _topk(model, h[i, t - len(p) :], top_k)
        tk_ids.append([ti.cpu()])
        tk_p.append([tp.cpu()])
        nxt.append(int(best[-1]))
    out_tokens = [[x] for x in nxt]
    done = [x in stop_ids or max_new_tokens == 1 for x in nxt]
    live = list(range(b))  # rows still decoding, in the batch's order (finished rows leave the batch and its cache)
    last_pos = pos[:, -1]
    for _ in range(max_new_tokens - 1):
        keep = [j for j, i in enumerate(live) if not done[i]]
        if not keep:
            break
        if len(keep) < len(live):
            idx = torch.tensor(keep, device=dev)
            cache.batch_select_indices(idx)
            mask, last_pos = mask[idx], last_pos[idx]
            live = [live[j] for j in keep]
        step = torch.tensor([nxt[i] for i in live], device=dev)[:, None]  # [live, 1]
        mask = torch.cat([mask, torch.ones((len(live), 1), dtype=mask.dtype, device=dev)], dim=1)
        last_pos = last_pos + 1
        h = base(input_ids=step, attention_mask=mask, position_ids=last_pos[:, None], use_cache=True, **kw).last_hidden_state
        a = streams()
        best, ti, tp = _topk(model, h[:, -1], top_k)
        h, ti, tp = h[:, -1:].half().cpu(), ti.cpu(), tp.cpu()
        a = a[:, -1:].half().cpu() if a is not None else None
        for j, i in enumerate(live):
            hid[i].append(h[j])
            if a is not None:
                aux[i].append(a[j])
            tk_ids[i].append(ti[j : j + 1])
            tk_p[i].append(tp[j : j + 1])
            nxt[i] = int(best[j])
            out_tokens[i].append(nxt[i])
            done[i] = nxt[i] in stop_ids or len(out_tokens[i]) >= max_new_tokens
    return [
        Sequence(
            tokens=torch.tensor(p + out_tokens[i]),
            hidden=torch.cat(hid[i]),
            topk_ids=torch.cat(tk_ids[i]),
            topk_p=torch.cat(tk_p[i]),
            gen_start=len(p),
            aux=torch.cat(aux[i]) if aux[i] else None,
        )
        for i, p in enumerate(prompts)
    ]


@torch.inference_mode()
def generate_batch_fast(
    model,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    stop_ids: set[int],
    top_k: int,
    pad_id: int = 0,
    aux_layers: tuple[int, ...] = (),
) -> list[Sequence]:
    """:func:`generate_batch` for a GPU: transformers' batched greedy ``generate`` for the tokens, then
    one teacher-forced forward over the whole sequences for their features (:func:`sequence_features`).
    Two passes at full batch width instead of a Python step per token: what keeps a GPU busy. The
    features come from the teacher-forced pass, so they agree with each other (the greedy label is
    that pass's argmax, which a near-tie may set apart from the token generated)."""
    dev = model.get_input_embeddings().weight.device
    b, t = len(prompts), max(len(p) for p in prompts)
    ids = torch.full((b, t), pad_id, dtype=torch.long)
    mask = torch.zeros((b, t), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, t - len(p) :] = torch.tensor(p)
        mask[i, t - len(p) :] = 1
    out = model.generate(
        input_ids=ids.to(dev),
        attention_mask=mask.to(dev),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        temperature=None,
        top_p=None,
        top_k=None,
        eos_token_id=sorted(stop_ids) or None,
        pad_token_id=pad_id,
    )
    tokens = []
    for p, g in zip(prompts, out[:, t:].tolist()):
        cut = next((i + 1 for i, x in enumerate(g) if x in stop_ids), len(g))
        tokens.append(p + g[:cut])
    return sequence_features(model, tokens, [len(p) for p in prompts], top_k=top_k, aux_layers=aux_layers)


@torch.inference_mode()
def sequence_features(
    model,
    sequences: list[list[int]],
    gen_starts: list[int],
    *,
    top_k: int,
    aux_layers: tuple[int, ...] = (),
    batch_tokens: int = 65536,
) -> list[Sequence]:
    """The features of whole sequences in teacher-forced forwards (right-padded, about ``batch_tokens``
    tokens each): per position i ≤ n−2 the final hidden state after ``tokens[:i+1]``, the layer streams
    and the target's top-k next tokens. The tensors stay on the model's device."""
    base = decoder_of(model)
    dev = model.get_input_embeddings().weight.device
    out: list[Sequence | None] = [None] * len(sequences)
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    groups, cur = [], []
    for i in order:
        if cur and len(sequences[i]) * (len(cur) + 1) > batch_tokens:
            groups.append(cur)
            cur = []
        cur.append(i)
    if cur:
        groups.append(cur)
    with capture_streams(base, aux_layers) as streams:
        for group in groups:
            length = max(len(sequences[i]) for i in group)
            ids = torch.full((len(group), length), 0, dtype=torch.long)
            mask = torch.zeros((len(group), length), dtype=torch.long)
            for r, i in enumerate(group):
                ids[r, : len(sequences[i])] = torch.tensor(sequences[i])
                mask[r, : len(sequences[i])] = 1
            h = base(input_ids=ids.to(dev), attention_mask=mask.to(dev), use_cache=False).last_hidden_state
            a = streams()
            for r, i in enumerate(group):
                n = len(sequences[i])
                hid = h[r, : n - 1]
                _, ti, tp = _topk(model, hid, top_k, chunk=4096)
                out[i] = Sequence(
                    tokens=torch.tensor(sequences[i], device=dev),
                    hidden=hid.half(),
                    topk_ids=ti,
                    topk_p=tp,
                    gen_start=gen_starts[i],
                    aux=a[r, : n - 1].half() if a is not None else None,
                )
    return out  # type: ignore[return-value]


def _forward_params(module) -> set[str]:
    return set(inspect.signature(module.forward).parameters)


# ==== shards on disk =============================================================================


def save_shard(seqs: list[Sequence], path: Path) -> None:
    """One generation batch's sequences as one safetensors file (concatenated, with offsets)."""
    lengths = torch.tensor([len(s.tokens) for s in seqs])
    state = {
        "tokens": torch.cat([s.tokens for s in seqs]).cpu(),
        "hidden": torch.cat([s.hidden for s in seqs]).contiguous().cpu(),
        "topk_ids": torch.cat([s.topk_ids for s in seqs]).contiguous().cpu(),
        "topk_p": torch.cat([s.topk_p for s in seqs]).contiguous().cpu(),
        "lengths": lengths,
        "gen_start": torch.tensor([s.gen_start for s in seqs]),
    }
    if seqs and seqs[0].aux is not None:
        state["aux"] = torch.cat([s.aux for s in seqs]).contiguous().cpu()
    save_tensors(state, path, metadata={"prompt_ids": json.dumps([s.prompt_id for s in seqs])})


def load_shard(path: Path, *, device: str = "cpu") -> list[Sequence]:
    """A shard's sequences, their tensors views into the shard's, read straight onto ``device``."""
    with safe_open(str(path), "pt", device=str(device)) as f:
        ids = json.loads(f.metadata().get("prompt_ids", "[]"))
        st = {k: f.get_tensor(k) for k in f.keys()}
    out, a, b = [], 0, 0  # a: token offset, b: feature offset
    for i, (n, g) in enumerate(zip(st["lengths"].tolist(), st["gen_start"].tolist())):
        out.append(
            Sequence(
                tokens=st["tokens"][a : a + n],
                hidden=st["hidden"][b : b + n - 1],
                topk_ids=st["topk_ids"][b : b + n - 1],
                topk_p=st["topk_p"][b : b + n - 1],
                gen_start=g,
                prompt_id=ids[i] if i < len(ids) else "",
                aux=st["aux"][b : b + n - 1] if "aux" in st else None,
            )
        )
        a, b = a + n, b + n - 1
    return out


@dataclass
class DataPlan:
    """Which prompts go into which generation batch (sorted by length: little padding)."""

    batches: list[list[tuple[str, list[int]]]]

    @classmethod
    def make(cls, rendered: list[tuple[str, list[int]]], *, batch_size: int, seed: int) -> DataPlan:
        order = sorted(rendered, key=lambda r: (len(r[1]), r[0]))
        batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
        random.Random(seed).shuffle(batches)  # a budget cut short still sees every kind of prompt
        return cls(batches)


def generate_data(
    model,
    plan: DataPlan,
    folder: Path,
    *,
    max_new_tokens: int,
    stop_ids: set[int],
    top_k: int,
    pad_id: int,
    progress,
    deadline: float | None = None,
    settings: dict | None = None,
    aux_layers: tuple[int, ...] = (),
    keep: list[Sequence] | None = None,
) -> list[Path]:
    """Generate every batch of ``plan`` not already on disk under ``folder`` (with a ``deadline``
    on ``time.perf_counter()``, no batch that would end after it starts, two batches at least);
    returns the shard paths. Shards written under other ``settings`` (tokens per prompt, top-k, the
    target's dtype) are not reused: they are generated again; shards holding an EAGLE-3 head's layer
    streams also serve an MTP head (:func:`serves`). With ``keep``, the sequences are appended to it
    instead of being written (a GPU keeps its data in memory); the paths are then those it would have had."""
    folder.mkdir(parents=True, exist_ok=True)
    manifest_path = folder / MANIFEST
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {"shards": {}}
    settings = settings or {}
    if not serves(manifest.get("settings", {}), settings):
        manifest = {"settings": settings, "shards": {}}
    aux_layers = tuple(manifest["settings"].get("aux_layers", aux_layers))  # new batches keep the folder's kind
    paths: list[Path] = []
    spent: list[float] = []
    for n, batch in enumerate(plan.batches):
        name = f"shard-{n:05d}.safetensors"
        key = ",".join(pid for pid, _ in batch)
        if keep is None and manifest["shards"].get(name) == key and (folder / name).is_file():
            paths.append(folder / name)
            progress.update(len(batch), batch=f"{n + 1} (on disk)")
            continue
        if deadline is not None and len(paths) >= 2 and time.perf_counter() + max(spent, default=0.0) > deadline:
            break  # the next batch would end after the deadline (or the deadline has passed already)
        t = time.perf_counter()
        gen = generate_batch_fast if model.get_input_embeddings().weight.device.type == "cuda" else generate_batch
        seqs = gen(
            model,
            [ids for _, ids in batch],
            max_new_tokens=max_new_tokens,
            stop_ids=stop_ids,
            top_k=top_k,
            pad_id=pad_id,
            aux_layers=aux_layers,
        )
        for s, (pid, _) in zip(seqs, batch):
            s.prompt_id = pid
        paths.append(folder / name)
        if keep is not None:
            keep.extend(seqs)
        else:
            save_shard(seqs, folder / name)
            manifest["shards"][name] = key
            atomic_write_text(manifest_path, json.dumps(manifest, indent=1))
        spent.append(time.perf_counter() - t)
        new = sum(len(s.tokens) - s.gen_start for s in seqs)
        progress.update(len(batch), batch=n + 1, generated=new, s_per_batch=spent[-1])
    return paths


def serves(stored: dict, wanted: dict) -> bool:
    """Whether data made under ``stored`` settings serve a run that wants ``wanted``: the same, or
    the same but for the layer streams an EAGLE-3 head needs, which an MTP head does not read.

    >>> serves({"top_k": 20, "aux_layers": [14, 25, 28]}, {"top_k": 20}), serves({"top_k": 20}, {"top_k": 20, "aux_layers": [1]})
    (True, False)
    """
    if "aux_layers" not in wanted:
        stored = {k: v for k, v in stored.items() if k != "aux_layers"}
    return stored == wanted


# ==== the draft vocabulary ========================================================================


def draft_vocabulary(seqs: list[Sequence], *, size: int, vocab_size: int, always: set[int]) -> torch.Tensor:
    """The ``size`` target ids the head drafts over: those the data uses most (each occurrence as
    a token, plus the probability mass the target's top-k gives it), the stop tokens always, then
    the lowest ids (byte-level BPE ranks frequent merges first). Sorted by id.

    >>> s = Sequence(torch.tensor([5, 6, 5]), torch.zeros(2, 4), torch.tensor([[5, 7], [6, 5]]).int(), torch.ones(2, 2).half(), 1)
    >>> draft_vocabulary([s], size=4, vocab_size=100, always={99}).tolist()
    [5, 6, 7, 99]
    """
    if size <= 0 or size >= vocab_size:
        return torch.arange(vocab_size)
    dev = seqs[0].tokens.device if seqs else "cpu"  # counted where the data lie (a GPU's stay there)
    score = torch.zeros(vocab_size, dtype=torch.float64, device=dev)
    for s in seqs:
        score.index_add_(0, s.tokens.clamp(max=vocab_size - 1), torch.ones(len(s.tokens), dtype=torch.float64, device=dev))
        score.index_add_(0, s.topk_ids.long().flatten().clamp(max=vocab_size - 1), s.topk_p.double().flatten())
    score[list(always)] = float("inf")
    score += torch.linspace(1e-9, 0, vocab_size, dtype=torch.float64, device=dev)  # ties and unseen ids: lower id first
    return score.topk(size).indices.sort().values.cpu()
