"""``transplant(drafter, target, out)``: a drafter model folder with the target's tokenizer.

    tokenizers  both read (seconds); the plan of rows (plan.py): copied, special, composed, empty
    weights     the drafter loaded in float32 (a GGUF converted once); the target's embedding
                matrices too for ``--init omp``
    rows        the new embedding and lm_head (rows.py); tied drafters stay tied where the method
                gives both the same rows, else the lm_head gets its own matrix
    folder      config.json (the target's vocabulary size and bos/eos/pad), model.safetensors, the
                target's tokenizer files and chat template (transformers' save_pretrained), the
                target's generation config, transplant.json (both fingerprints, the method, the
                row counts); written under a temporary name and renamed when complete
    gguf        optionally the same model as a GGUF file for llama.cpp (gguf_out.py)

The result is a plain same-vocabulary drafter: ``serve --drafter FOLDER`` runs it in draft mode,
vLLM as a ``draft_model`` without ``use_heterogeneous_vocab``, llama.cpp as a draft model.

>>> r = transplant("smollm2-135m", "qwen2.5-coder-1.5b", Path("drafters/smollm2-qwen"), init="mean")  # doctest: +SKIP
>>> r.plan.counts, r.tied  # doctest: +SKIP
({'copied': 39234, 'special': 3, 'composed': 112678, 'empty': 21}, True)
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .. import __version__
from ..errors import ConfigError, ModelLoadError
from ..presets import resolve_model
from ..tokenizer import TokenizerView, load_tokenizer
from ..util import atomic_write_text
from .plan import RowPlan, plan_rows
from .rows import Init, NewRows, build_rows
from .weights import load_drafter_model, save_target_tokenizer, target_embeddings, target_generation_config, target_rows

FORMAT = "vocabbridge.transplant/1"
RECORD = "transplant.json"
ROWS_FILE = "transplant-rows.npz"  # each target row's kind and drafter source (healing trains the new rows); not *.safetensors, which vLLM would load


@dataclass
class TransplantResult:
    folder: Path
    plan: RowPlan
    init: str
    tied: bool
    record: dict
    gguf: Path | None = None
    seconds: float = 0.0


def read_record(folder: str | Path) -> dict | None:
    """A transplanted drafter's ``transplant.json`` (None for any other folder)."""
    f = Path(folder).expanduser() / RECORD
    if not f.is_file():
        return None
    rec = json.loads(f.read_text())
    return rec if rec.get("format") == FORMAT else None


def read_rows(folder: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """(kind [rows] int8, drafter source [rows] int64) of a transplanted drafter's rows (plan.py's kinds)."""
    f = Path(folder).expanduser() / ROWS_FILE
    if not f.is_file():
        raise ConfigError(
            f"{folder}: no {ROWS_FILE}; it was not written by vocabbridge transplant (or by an older version): transplant again."
        )
    with np.load(f) as z:
        return z["kind"], z["source"]


def load_views(drafter: str, target: str) -> tuple[TokenizerView, TokenizerView]:
    return load_tokenizer(resolve_model(drafter)), load_tokenizer(resolve_model(target))


def transplant(
    drafter: str,
    target: str,
    out: str | Path,
    *,
    init: str | Init = "mean",
    untie: bool = False,
    gguf: bool = False,
    gguf_type: str = "q8_0",
    overwrite: bool = False,
    say=None,
) -> TransplantResult:
    """Give ``drafter`` the ``target``'s tokenizer; write the new drafter folder ``out``."""
    say = say or (lambda msg: print(f"transplant: {msg}", file=sys.stderr, flush=True))
    t0 = time.perf_counter()
    out = Path(out).expanduser()
    if out.exists() and not overwrite:
        raise ConfigError(f"{out} exists; pass --overwrite to replace it, or another -o folder.")
    init = Init.parse(init) if isinstance(init, str) else init
    dview, tview = load_views(drafter, target)
    t_rows = target_rows(target, tview.size, tview.model_vocab_size)
    target_emb = target_embeddings(target) if init.name == "omp" else None
    if target_emb is not None and target_emb[0].shape[0] < tview.size:
        raise ModelLoadError(f"{target}: its embedding has {target_emb[0].shape[0]} rows for {tview.size} token ids.")
    model = load_drafter_model(drafter, say=say)
    emb_in = model.get_input_embeddings().weight
    emb_out = model.get_output_embeddings().weight
    plan = plan_rows(dview, tview, drafter_rows=emb_in.shape[0], target_rows=t_rows)
    c = plan.counts
    say(
        f"{plan.target.rows:,} rows: {c['copied']:,} copied, {c['special']} special, {c['composed']:,} composed "
        f"(mean {plan.mean_pieces:.2f} pieces), {c['empty']} empty; init {init}"
    )
    rows = build_rows(plan, emb_in, emb_out, init=init, target_emb=target_emb, untie=untie)
    del target_emb
    set_rows(model, rows, roles=tview.roles)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        model.save_pretrained(str(tmp))
        save_target_tokenizer(target, tmp)
        if not (tmp / "chat_template.jinja").is_file() and tview.chat_template and "chat_template" not in _tok_config(tmp):
            (tmp / "chat_template.jinja").write_text(tview.chat_template, encoding="utf-8")
        atomic_write_text(tmp / "generation_config.json", json.dumps(generation_config(target, tview), indent=2) + "\n")
        written = load_tokenizer(str(tmp))
        check_same_vocabulary(written, tview)
        record = make_record(drafter, target, plan, init, rows.tied, written)
        np.savez_compressed(tmp / ROWS_FILE, kind=plan.kind, source=plan.source)
        gguf_path = None
        if gguf:
            from .gguf_out import write_gguf

            gguf_path = write_gguf(tmp, target=target, qtype=gguf_type, dest=tmp / f"{out.name}.gguf")
            record["gguf"] = {"file": gguf_path.name, "type": gguf_type}
            say(f"wrote {gguf_path.name} ({gguf_path.stat().st_size / 2**20:.0f} MiB, {gguf_type})")
        atomic_write_text(tmp / RECORD, json.dumps(record, indent=2, ensure_ascii=False) + "\n")
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    seconds = time.perf_counter() - t0
    say(f"wrote {out} in {seconds:.0f} s")
    gguf_final = out / record["gguf"]["file"] if record.get("gguf") else None
    return TransplantResult(out, plan, str(init), rows.tied, record, gguf_final, seconds)


def set_rows(model, rows: NewRows, *, roles: dict[str, int]) -> None:
    """Put the new matrices into ``model`` and its config (vocabulary size, tying, bos/eos/pad ids)."""
    n, d = rows.input.shape
    old = model.get_input_embeddings()
    emb = torch.nn.Embedding(n, d, padding_idx=roles.get("pad"), dtype=old.weight.dtype)
    with torch.no_grad():
        emb.weight.copy_(rows.input)
    model.set_input_embeddings(emb)
    head = torch.nn.Linear(d, n, bias=False, dtype=old.weight.dtype)
    if rows.tied:
        head.weight = emb.weight
    else:
        with torch.no_grad():
            head.weight.copy_(rows.output)
    model.set_output_embeddings(head)
    cfg = model.config
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    for c in {id(cfg): cfg, id(text): text}.values():
        c.vocab_size = n
        c.tie_word_embeddings = rows.tied
        for role in ("bos", "eos", "pad"):
            setattr(c, f"{role}_token_id", roles.get(role))


def generation_config(target: str, view: TokenizerView) -> dict:
    """The target's generation config: its folder's file, else one with its bos/eos/pad ids."""
    given = target_generation_config(target)
    if given is not None:
        return given
    eos = [view.roles[r] for r in ("eos", "end_of_turn") if r in view.roles]
    cfg = {
        "bos_token_id": view.roles.get("bos"),
        "eos_token_id": sorted(set(eos)) if len(set(eos)) > 1 else (eos[0] if eos else None),
    }
    if "pad" in view.roles:
        cfg["pad_token_id"] = view.roles["pad"]
    return {k: v for k, v in cfg.items() if v is not None}


def _tok_config(folder: Path) -> dict:
    f = folder / "tokenizer_config.json"
    return json.loads(f.read_text()) if f.is_file() else {}


def check_same_vocabulary(written: TokenizerView, target: TokenizerView) -> None:
    """The saved tokenizer must spell every id as the target's does."""
    n = max(written.size, target.size)
    bad = next(
        (
            i
            for i in range(n)
            if (written.tokens[i] if i < written.size else None) != (target.tokens[i] if i < target.size else None)
        ),
        None,
    )
    if bad is not None:
        raise ModelLoadError(
            f"transformers saved the target's tokenizer with another vocabulary (id {bad}: "
            f"{target.tokens[bad] if bad < target.size else None!r} became {written.tokens[bad] if bad < written.size else None!r}); "
            "pass the target's tokenizer folder (tokenizer.json) as --to."
        )


def make_record(drafter: str, target: str, plan: RowPlan, init: Init, tied: bool, written: TokenizerView) -> dict:
    return {
        "format": FORMAT,
        "drafter": dataclasses.asdict(plan.drafter) | {"given": drafter},
        "target": dataclasses.asdict(plan.target) | {"given": target},
        "tokenizer_fingerprint": written.fingerprint,
        "init": str(init),
        "tied": tied,
        "rows": plan.counts,
        "pieces": plan.piece_lengths,
        "mean_pieces": round(plan.mean_pieces, 3),
        "lossy": plan.lossy,
        "special_pairs": {r: list(p) for r, p in plan.special_pairs.items()},
        "composed_specials": plan.composed_specials,
        "gguf": None,
        "heal": None,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "vocabbridge": __version__,
    }
