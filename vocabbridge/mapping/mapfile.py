"""The map file, format ``vocabbridge.map/1``: one JSON object, written atomically, checked on load.

Readable fields say what the map is (mode, each side's source, fingerprint and sizes, the build
figures and coverage); the id arrays are little-endian int32, zlib-compressed, base64 text, so a
150k-vocabulary map stays around a megabyte. ``sha256`` is the hash of the canonical JSON of
everything else (sorted keys, no spaces): a truncated file fails to parse, an edited one fails the
hash, and neither is half-used.

Arrays: ``draft_to_target`` and ``target_to_draft`` (``-1`` = none); the input bridge as CSR:
``bridge.target_ids``, ``bridge.offsets`` (len + 1) and ``bridge.draft_ids``.

A tokenizer given as a local path is recorded twice: absolute (``source``) and relative to the
map file's folder (``source_from_map``), so a map committed beside its tokenizers reloads them
from any working directory and any clone.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import zlib
from dataclasses import asdict
from pathlib import Path

import numpy as np

from .. import __version__
from ..errors import MapFileError
from ..report import to_jsonable
from ..tokenizer.view import TokenizerView
from ..util import atomic_write_text
from .coverage import Coverage
from .tokenmap import FORMAT, MODES, BuildStats, MapSide, TokenMap


def _pack(a) -> str:
    arr = np.asarray(a, dtype="<i4")
    return base64.b64encode(zlib.compress(arr.tobytes(), 6)).decode("ascii")


def _unpack(text: str, what: str, path: Path) -> np.ndarray:
    try:
        raw = zlib.decompress(base64.b64decode(text, validate=True))
    except (binascii.Error, zlib.error, TypeError, ValueError) as e:
        raise MapFileError(f"{path}: the {what} array is damaged ({e}); rebuild the map with `vocabbridge build-map`.") from e
    if len(raw) % 4:
        raise MapFileError(f"{path}: the {what} array has a partial entry; rebuild the map with `vocabbridge build-map`.")
    return np.frombuffer(raw, dtype="<i4").astype(np.int64)


def _canonical_bytes(doc: dict) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _side_record(side: MapSide, folder: Path) -> dict:
    rec = asdict(side)
    if Path(side.source).expanduser().exists():  # a local path: also where it is from the map's folder
        where = os.path.abspath(Path(side.source).expanduser())
        rec["source"] = where
        rec["source_from_map"] = os.path.relpath(where, os.path.abspath(folder))
    return rec


def map_to_dict(tm: TokenMap, coverage: Coverage | None = None, *, folder: Path = Path(".")) -> dict:
    """The file's content (without ``sha256``); materializes the input bridge. ``folder``: where the file goes."""
    bridge = tm.input_bridge
    targets = sorted(bridge)
    lengths = [len(bridge[t]) for t in targets]
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]) if targets else np.zeros(1, dtype=np.int64)
    flat = [d for t in targets for d in bridge[t]]
    return {
        "format": FORMAT,
        "tool_version": __version__,
        "mode": tm.mode,
        "drafter": _side_record(tm.drafter, folder),
        "target": _side_record(tm.target, folder),
        "draft_unk_id": tm.draft_unk_id,
        "target_unk_id": tm.target_unk_id,
        "stats": asdict(tm.stats),
        "pairs": tm.pairs,
        "coverage": None if coverage is None else to_jsonable(coverage),
        "arrays": {
            "encoding": "int32-le, zlib, base64",
            "draft_to_target": _pack(tm.draft_to_target),
            "target_to_draft": _pack(tm.target_to_draft),
            "bridge_target_ids": _pack(targets),
            "bridge_offsets": _pack(offsets),
            "bridge_draft_ids": _pack(flat),
        },
    }


def save_map(tm: TokenMap, path: str | Path, *, coverage: Coverage | None = None) -> Path:
    """Write ``tm`` (and the ``coverage`` figures computed for it) to ``path``, atomically: temp
    file + rename, so an interrupted write leaves no partial file."""
    path = Path(path)
    doc = map_to_dict(tm, coverage, folder=path.parent)
    doc["sha256"] = hashlib.sha256(_canonical_bytes(doc)).hexdigest()
    atomic_write_text(path, json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n")
    return path


def _rebuild_hint(doc: dict | None) -> str:
    try:
        d, t, mode = doc["drafter"]["source"], doc["target"]["source"], doc["mode"]
        return f"rebuild it with `vocabbridge build-map {d} {t} --mode {mode} -o MAP.json`"
    except (KeyError, TypeError):
        return "rebuild it with `vocabbridge build-map DRAFTER TARGET -o MAP.json`"


def _read(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise MapFileError(f"{path}: no such map file; build one with `vocabbridge build-map DRAFTER TARGET -o {path}`.") from e
    except (OSError, UnicodeDecodeError) as e:
        raise MapFileError(f"{path}: cannot read the map file ({e}).") from e
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        why = "is truncated" if e.pos >= len(text.rstrip()) - 1 else f"is not valid JSON (line {e.lineno}, column {e.colno})"
        raise MapFileError(f"{path}: the map file {why}; {_rebuild_hint(None)}.") from e
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise MapFileError(
            f"{path}: not a {FORMAT} map file (format {got!r}); {_rebuild_hint(doc if isinstance(doc, dict) else None)}."
        )
    stored = doc.pop("sha256", None)
    if stored != hashlib.sha256(_canonical_bytes(doc)).hexdigest():
        what = "has no checksum" if stored is None else "does not match its checksum (edited or corrupted)"
        raise MapFileError(f"{path}: the map file {what}; maps are not edited by hand, {_rebuild_hint(doc)}.")
    return doc


def _side(d: dict, what: str, path: Path) -> MapSide:
    try:
        source = str(d["source"])
        if d.get("source_from_map"):
            beside = os.path.normpath(os.path.join(os.path.abspath(path.parent), d["source_from_map"]))
            if os.path.exists(beside):
                source = beside
        return MapSide(source, str(d["fingerprint"]), int(d["tokenizer_size"]), d.get("model_vocab_size"))
    except (KeyError, TypeError, ValueError) as e:
        raise MapFileError(f"{path}: the {what} record is incomplete ({e}); {_rebuild_hint(None)}.") from e


def load_map(path: str | Path, *, drafter: TokenizerView | None = None, target: TokenizerView | None = None) -> TokenMap:
    """Read a map file; with views given, refuse it unless their fingerprints are the map's."""
    return read_map(path, drafter=drafter, target=target)[0]


def read_map(
    path: str | Path, *, drafter: TokenizerView | None = None, target: TokenizerView | None = None
) -> tuple[TokenMap, Coverage | None]:
    """The map in a map file and the coverage figures stored beside it (None when it has none)."""
    path = Path(path)
    doc = _read(path)
    mode = doc.get("mode")
    if mode not in MODES:
        raise MapFileError(f"{path}: unknown map mode {mode!r}; {_rebuild_hint(doc)}.")
    dside, tside = _side(doc.get("drafter"), "drafter", path), _side(doc.get("target"), "target", path)
    arrays = doc.get("arrays") or {}
    names = ("draft_to_target", "target_to_draft", "bridge_target_ids", "bridge_offsets", "bridge_draft_ids")
    missing = [n for n in names if not isinstance(arrays.get(n), str)]
    if missing:
        raise MapFileError(f"{path}: the map file lacks {', '.join(missing)}; {_rebuild_hint(doc)}.")
    d2t, t2d, b_t, b_off, b_d = (_unpack(arrays[n], n, path) for n in names)
    if len(d2t) != dside.id_space or len(t2d) != tside.id_space:
        raise MapFileError(f"{path}: array lengths do not match the recorded vocabulary sizes; {_rebuild_hint(doc)}.")
    if len(b_off) != len(b_t) + 1 or (len(b_off) and int(b_off[-1]) != len(b_d)):
        raise MapFileError(f"{path}: the input bridge is inconsistent; {_rebuild_hint(doc)}.")
    flat, offs = b_d.tolist(), b_off.tolist()
    bridge = {t: tuple(flat[offs[k] : offs[k + 1]]) for k, t in enumerate(b_t.tolist())}
    stats = BuildStats(**{k: v for k, v in (doc.get("stats") or {}).items() if k in BuildStats.__dataclass_fields__})
    cov = doc.get("coverage")
    tm = TokenMap(
        mode,
        dside,
        tside,
        d2t,
        t2d,
        bridge,
        draft_unk_id=doc.get("draft_unk_id"),
        target_unk_id=doc.get("target_unk_id"),
        stats=stats,
    )
    if drafter is not None or target is not None:
        tm.check(drafter or _stand_in(dside), target or _stand_in(tside), path=str(path))
    return tm, Coverage.from_dict(cov) if cov else None


class _stand_in:
    """A side that always matches (when only one of drafter / target is given to load_map)."""

    def __init__(self, side: MapSide):
        self.source, self.fingerprint = side.source, side.fingerprint
