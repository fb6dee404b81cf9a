"""TokenMap: which drafter id stands for which target id, and how to feed any target id to the drafter.

A map has two directions and a bridge:

- ``draft_to_target[d]``: the target id for drafter id ``d`` (what a drafter proposal means to the
  target), ``-1`` where there is none;
- ``target_to_draft[t]``: the drafter id for target id ``t`` (a single-token partner), ``-1`` where
  there is none;
- ``input_bridge[t]``: for every target id without a partner, the drafter ids that spell the same
  bytes, so a drafter fed target text through the map never sees ``unk``.

>>> import numpy as np
>>> side = MapSide("a", "f" * 64, 3, None)
>>> tm = TokenMap("bytes", side, side, np.array([0, 1, -1]), np.array([0, 1, -1]), {2: (0, 1)})
>>> tm.draft_ids_for_target(1), tm.draft_ids_for_target(2), tm.pairs
((1,), (0, 1), 2)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..errors import MapFileError

if TYPE_CHECKING:  # pragma: no cover
    from ..tokenizer.view import TokenizerView

MODES = ("bytes", "vllm")
UNPAIRED_ENV = "VOCABBRIDGE_VLLM_MAP_UNPAIRED"  # what a one-token-per-token drafter reads for an unpaired target id


def unpaired_choice(default: str = "first") -> str:
    """``$VOCABBRIDGE_VLLM_MAP_UNPAIRED``: ``first`` (the first token of the input bridge's spelling)
    or ``unk`` (the drafter's unk, as vLLM does); see :meth:`TokenMap.single_token_inputs`."""
    value = os.environ.get(UNPAIRED_ENV, default)
    if value not in ("first", "unk"):
        raise ValueError(f"{UNPAIRED_ENV}={value!r}: use 'first' or 'unk'.")
    return value


FORMAT = "vocabbridge.map/1"


@dataclass(frozen=True)
class MapSide:
    """One tokenizer of a map, as recorded in the map file."""

    source: str  # what was passed to build-map (path, hub id, GGUF file); coverage reloads from it
    fingerprint: str  # TokenizerView.fingerprint
    tokenizer_size: int  # tokenizer ids (max id + 1)
    model_vocab_size: int | None  # rows of the model's embedding used for the map; None when unknown

    @property
    def vocab_size(self) -> int:
        """The vocabulary size ids are checked against (model's when known, else the tokenizer's)."""
        return self.model_vocab_size or self.tokenizer_size

    @property
    def id_space(self) -> int:
        """Length of this side's id arrays: every tokenizer id and every model row."""
        return max(self.tokenizer_size, self.model_vocab_size or 0)

    @classmethod
    def of(cls, view: TokenizerView, model_vocab_size: int | None = None) -> MapSide:
        return cls(view.source, view.fingerprint, view.size, model_vocab_size or view.model_vocab_size)


@dataclass(frozen=True)
class BuildStats:
    """How the pairs came about (figures for the report; not needed to use the map)."""

    role_pairs: int = 0  # special tokens paired by role (bos, eos, end_of_turn, ...)
    content_pairs: int = 0  # other added tokens paired by identical content
    byte_pairs: int = 0  # bytes mode: byte strings paired; vllm mode: normalized strings paired
    normalizer_rejected: int = 0  # drafter tokens the target's normalizer would rewrite: not partners
    ambiguous: int = 0  # strings (vllm) / byte strings (bytes) that several ids of one side share
    dropped_beyond_vocab: int = 0  # common strings dropped because an id is >= the model vocab size
    space_markers: dict[str, list[str]] = field(default_factory=dict)  # vllm: marker per side


class LazyBridge(Mapping):
    """The input bridge, computed on first use: building it runs the drafter's BPE over every
    unpaired target token (a few tenths of a second for 100k tokens), which most uses never need."""

    def __init__(self, build: Callable[[], dict[int, tuple[int, ...]]]):
        self._build = build
        self._data: dict[int, tuple[int, ...]] | None = None

    @property
    def data(self) -> dict[int, tuple[int, ...]]:
        if self._data is None:
            self._data = self._build()
        return self._data

    def __getitem__(self, t: int) -> tuple[int, ...]:
        return self.data[t]

    def __iter__(self):
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)


@dataclass(frozen=True, eq=False, repr=False)
class TokenMap:
    mode: str  # "bytes" | "vllm"
    drafter: MapSide
    target: MapSide
    draft_to_target: np.ndarray  # int64 [drafter.id_space]; -1 = no partner
    target_to_draft: np.ndarray  # int64 [target.id_space]; -1 = no partner
    input_bridge: Mapping[int, tuple[int, ...]] = field(default_factory=dict)  # target id → drafter ids spelling its bytes
    draft_unk_id: int | None = None  # what vLLM feeds the drafter for an unpaired target id (unk, else eos)
    target_unk_id: int | None = None
    stats: BuildStats = field(default_factory=BuildStats)

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        for name in ("draft_to_target", "target_to_draft"):
            a = getattr(self, name)
            if not isinstance(a, np.ndarray) or a.dtype != np.int64 or a.ndim != 1:
                raise TypeError(f"TokenMap.{name} must be a 1-d int64 numpy array")

    def __repr__(self) -> str:
        return (
            f"TokenMap({self.mode}, {self.drafter.source!r} → {self.target.source!r}, {self.pairs:,} pairs, "
            f"{100 * self.pairs / max(self.target.vocab_size, 1):.1f} % of target)"
        )

    # ==== the map ====================================================================

    @property
    def pairs(self) -> int:
        """Target ids with a single-token partner (vLLM's ``intersection_size`` in vllm mode)."""
        return int(np.count_nonzero(self.target_to_draft >= 0))

    @property
    def drafter_pairs(self) -> int:
        """Drafter ids whose proposals have a target id."""
        return int(np.count_nonzero(self.draft_to_target >= 0))

    def draft_ids_for_target(self, t: int) -> tuple[int, ...]:
        """The drafter ids to feed for target id ``t``: its partner, else its bridge (``()`` for an id without bytes)."""
        if 0 <= t < len(self.target_to_draft):
            d = int(self.target_to_draft[t])
            if d >= 0:
                return (d,)
        return self.input_bridge.get(int(t), ())

    def single_token_inputs(self, unpaired: str = "unk") -> np.ndarray:
        """target id → the one drafter id to feed for it, as vLLM's token-level path feeds its drafter:
        the partner where there is one; else the drafter's unk (else eos) id (``"unk"``, what vLLM
        does) or the first token of the input bridge's spelling of it (``"first"``).

        >>> side = MapSide("a", "f" * 64, 3, None)
        >>> tm = TokenMap("bytes", side, side, np.array([0, 1, -1]), np.array([0, -1, -1]), {1: (2, 0)}, draft_unk_id=0)
        >>> tm.single_token_inputs("unk").tolist(), tm.single_token_inputs("first").tolist()
        ([0, 0, 0], [0, 2, 0])
        """
        if unpaired not in ("unk", "first"):
            raise ValueError(f"unpaired must be 'unk' or 'first', got {unpaired!r}")
        out = self.target_to_draft.copy()
        if unpaired == "first":
            for t in np.nonzero(out < 0)[0].tolist():
                spelled = self.input_bridge.get(t)
                if spelled:
                    out[t] = spelled[0]
        out[out < 0] = self.draft_unk_id if self.draft_unk_id is not None else 0
        return out

    # ==== checks =====================================================================

    def check(self, drafter: TokenizerView, target: TokenizerView, *, path: str | None = None) -> None:
        """Refuse tokenizers other than the ones this map was built for (fingerprints differ)."""
        where = f"map {path}" if path else "this token map"
        bad = []
        if drafter.fingerprint != self.drafter.fingerprint:
            bad.append(("drafter", self.drafter, drafter))
        if target.fingerprint != self.target.fingerprint:
            bad.append(("target", self.target, target))
        if not bad:
            return
        details = "; ".join(
            f"{role} expected {want.source} (fingerprint {want.fingerprint[:16]}) but got {got.source} "
            f"(fingerprint {got.fingerprint[:16]})"
            for role, want, got in bad
        )
        swapped = drafter.fingerprint == self.target.fingerprint and target.fingerprint == self.drafter.fingerprint
        hint = " The drafter and target look swapped." if swapped else ""
        raise MapFileError(
            f"{where} was built for other tokenizers: {details}.{hint} Rebuild it for these tokenizers with "
            f"`vocabbridge build-map {drafter.source} {target.source} -o MAP.json`."
        )
