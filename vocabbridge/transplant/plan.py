"""``plan_rows(drafter, target)``: where each row of the transplanted drafter comes from, from the
two tokenizers alone (no weights).

Every row of the new embedding (and lm_head) stands for one target id, and falls in one kind:

- ``copied``: a target token whose raw bytes are a drafter token's (the ``bytes`` map's pairs):
  the drafter's row, as it is;
- ``special``: a target special token paired by role or content (``[|endofturn|]`` for
  ``<|endofturn|>``): the drafter's row for the token doing the same job;
- ``composed``: every other target token with bytes, built from the drafter's own spelling of it
  (the map's input bridge: ``␠give␠them`` → ``␠give``, ``␠them``) by one of the ``--init`` methods
  (:mod:`.rows`); unpaired special tokens are spelled from their text the same way;
- ``empty``: ids without bytes (holes, the model's padding rows past the tokenizer): the mean row.

>>> plan = plan_rows(smollm2_view, qwen3_view, target_rows=151936)  # doctest: +SKIP
>>> plan.counts  # doctest: +SKIP
{'copied': 36270, 'special': 5, 'composed': 115394, 'empty': 267}
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError
from ..mapping import build_token_map
from ..tokenizer.scripts import SCRIPTS, script_of
from ..tokenizer.view import TokenizerView

COPIED, SPECIAL, COMPOSED, EMPTY = 0, 1, 2, 3
KINDS = ("copied", "special", "composed", "empty")


@dataclass(frozen=True)
class Side:
    """One tokenizer of a plan, as recorded in ``transplant.json``."""

    source: str
    fingerprint: str
    tokenizer_size: int  # ids (max id + 1)
    rows: int  # the model's embedding rows (>= tokenizer_size for the target)

    @classmethod
    def of(cls, view: TokenizerView, rows: int | None = None) -> Side:
        return cls(view.source, view.fingerprint, view.size, rows or view.model_vocab_size or view.size)


@dataclass(frozen=True, eq=False)
class RowPlan:
    """Where each target row comes from. Arrays are indexed by target id over ``target.rows``."""

    drafter: Side
    target: Side
    kind: np.ndarray  # int8 [target.rows]: COPIED | SPECIAL | COMPOSED | EMPTY
    source: np.ndarray  # int64 [target.rows]: the drafter id copied (copied, special), -1 otherwise
    pieces: dict[int, tuple[int, ...]]  # composed target id → the drafter ids spelling its bytes, in order
    lossy: int  # composed tokens the drafter cannot spell exactly (no byte tokens for some byte)
    special_pairs: dict[str, tuple[int, int]] = field(default_factory=dict)  # role → (target id, drafter id)
    composed_specials: int = 0  # target special tokens without a partner, composed from their text

    # ==== figures ====================================================================

    @property
    def counts(self) -> dict[str, int]:
        c = np.bincount(self.kind, minlength=len(KINDS))
        return {k: int(c[i]) for i, k in enumerate(KINDS)}

    @property
    def piece_lengths(self) -> dict[str, int]:
        """How many drafter pieces spell each composed token: ``1``, ``2``, ``3``, ``4+``."""
        c = Counter(min(len(p), 4) for p in self.pieces.values())
        return {"1": c[1], "2": c[2], "3": c[3], "4+": c[4]}

    @property
    def mean_pieces(self) -> float:
        return float(np.mean([len(p) for p in self.pieces.values()])) if self.pieces else 0.0

    def by_script(self, target: TokenizerView) -> dict[str, dict[str, int]]:
        """script → {copied, composed} over the target's base tokens (``tokenizer.scripts``)."""
        out = {s: {"copied": 0, "composed": 0} for s in SCRIPTS}
        toks, added = target.tokens, target.added_ids
        for i in range(min(len(toks), len(self.kind))):
            b, k = toks[i], self.kind[i]
            if b is None or i in added or k not in (COPIED, COMPOSED):
                continue
            out[script_of(b)]["copied" if k == COPIED else "composed"] += 1
        return out

    def rows_of(self, kind: int) -> np.ndarray:
        """Target ids of one kind, ascending."""
        return np.flatnonzero(self.kind == kind)

    def check(self, drafter: TokenizerView, target: TokenizerView) -> None:
        """Refuse tokenizers other than the ones this plan was made from."""
        for role, side, view in (("drafter", self.drafter, drafter), ("target", self.target, target)):
            if side.fingerprint != view.fingerprint:
                raise ConfigError(
                    f"this transplant plan was made for the {role} tokenizer {side.source} "
                    f"(fingerprint {side.fingerprint[:16]}), not {view.source} ({view.fingerprint[:16]}); make the plan again."
                )


def plan_rows(
    drafter: TokenizerView, target: TokenizerView, *, drafter_rows: int | None = None, target_rows: int | None = None
) -> RowPlan:
    """The row plan for giving a drafter with ``drafter``'s tokenizer the ``target``'s (pure: tokenizers only).

    ``drafter_rows``/``target_rows`` are the models' embedding rows (default: what the views know,
    else the tokenizers' sizes); the new drafter gets ``target_rows`` rows, so that engines which
    require equal vocabulary sizes (vLLM's draft_model) take it.
    """
    d_rows = drafter_rows or drafter.model_vocab_size or drafter.size
    t_rows = max(target_rows or target.model_vocab_size or target.size, target.size)
    tm = build_token_map(drafter, target, mode="bytes", drafter_vocab_size=d_rows, target_vocab_size=t_rows)
    t2d = np.full(t_rows, -1, dtype=np.int64)
    n = min(t_rows, len(tm.target_to_draft))
    t2d[:n] = tm.target_to_draft[:n]
    t2d[t2d >= d_rows] = -1
    kind = np.full(t_rows, EMPTY, dtype=np.int8)
    kind[t2d >= 0] = COPIED
    for t in target.added_ids:
        if t < t_rows and t2d[t] >= 0:
            kind[t] = SPECIAL
    pairs = {
        role: (t, int(t2d[t]))
        for role, t in target.roles.items()
        if t < t_rows and t2d[t] >= 0 and t2d[t] == drafter.roles.get(role, -1)
    }
    unk = drafter.roles.get("unk")
    bridge = tm.input_bridge
    lossy = 0
    pieces: dict[int, tuple[int, ...]] = {}
    toks = target.tokens
    for t in np.flatnonzero(t2d < 0).tolist():
        if t >= len(toks) or not toks[t]:
            continue
        spelled = tuple(int(d) for d in bridge.get(t, ()) if 0 <= d < d_rows)
        if not spelled:
            continue
        if drafter.decode_bytes(spelled) != toks[t]:
            lossy += 1
            if unk is not None and spelled == (unk,):
                continue  # nothing of it is spelled: an empty row, not the unk token's
        pieces[t] = spelled
        kind[t] = COMPOSED
    composed_specials = sum(1 for t in target.added_ids if t in pieces)
    return RowPlan(
        drafter=Side.of(drafter, d_rows),
        target=Side.of(target, t_rows),
        kind=kind,
        source=np.where(np.isin(kind, (COPIED, SPECIAL)), t2d, -1),
        pieces=pieces,
        lossy=lossy,
        special_pairs=pairs,
        composed_specials=composed_specials,
    )
