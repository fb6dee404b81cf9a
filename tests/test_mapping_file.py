"""The map file: round trip, refused for other tokenizers, truncated / edited files rejected, atomic writes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vocabbridge.errors import MapFileError
from vocabbridge.mapping import build_token_map, compute_coverage, load_map, read_map, save_map


@pytest.fixture(scope="module")
def saved(tmp_path_factory, spm_view, base_view):
    tm = build_token_map(spm_view, base_view)
    cov = compute_coverage(tm, spm_view, base_view, texts={"t": "안녕하세요. Hello!"})
    path = tmp_path_factory.mktemp("maps") / "spm_to_base.json"
    save_map(tm, path, coverage=cov)
    return tm, path, cov


def test_round_trip_keeps_everything(saved, spm_view, base_view):
    tm, path, cov = saved
    back, back_cov = read_map(path, drafter=spm_view, target=base_view)
    assert back.mode == "bytes" and back.drafter == tm.drafter and back.target == tm.target
    assert np.array_equal(back.draft_to_target, tm.draft_to_target)
    assert np.array_equal(back.target_to_draft, tm.target_to_draft)
    assert back.input_bridge == tm.input_bridge
    assert back_cov == cov and back.stats == tm.stats
    assert back.draft_unk_id == tm.draft_unk_id
    doc = json.loads(path.read_text())
    assert doc["format"] == "vocabbridge.map/1" and doc["drafter"]["fingerprint"] == spm_view.fingerprint
    assert doc["target"]["source"] == base_view.source and doc["pairs"] == tm.pairs


def test_refused_for_the_wrong_tokenizer(saved, spm_view, base_view, extended_view):
    _, path, _ = saved
    with pytest.raises(MapFileError) as e:
        load_map(path, drafter=spm_view, target=extended_view)
    msg = str(e.value)
    assert base_view.fingerprint[:16] in msg and extended_view.fingerprint[:16] in msg
    assert base_view.source in msg and extended_view.source in msg and "vocabbridge build-map" in msg
    with pytest.raises(MapFileError, match="swapped"):
        load_map(path, drafter=base_view, target=spm_view)
    with pytest.raises(MapFileError, match="drafter expected"):
        load_map(path, drafter=extended_view)  # one side given: only that side is checked


def test_truncated_file_is_rejected(saved, tmp_path):
    _, path, _ = saved
    cut = tmp_path / "cut.json"
    text = path.read_text()
    cut.write_text(text[: len(text) // 2])
    with pytest.raises(MapFileError, match="truncated.*vocabbridge build-map"):
        load_map(cut)


@pytest.mark.parametrize(
    "edit",
    [
        lambda d: d.update(pairs=d["pairs"] + 1),
        lambda d: d.update(mode="vllm"),
        lambda d: d["drafter"].update(fingerprint="0" * 64),
        lambda d: d["arrays"].update(target_to_draft=d["arrays"]["draft_to_target"]),
    ],
    ids=["pairs", "mode", "fingerprint", "array"],
)
def test_hand_edited_file_is_rejected(saved, tmp_path, edit):
    _, path, _ = saved
    doc = json.loads(path.read_text())
    edit(doc)
    bad = tmp_path / "edited.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(MapFileError, match="checksum"):
        load_map(bad)


def test_other_json_is_not_a_map(tmp_path):
    p = tmp_path / "x.json"
    p.write_text('{"model": {}}')
    with pytest.raises(MapFileError, match="not a vocabbridge.map/1"):
        load_map(p)
    with pytest.raises(MapFileError, match="no such map file"):
        load_map(tmp_path / "missing.json")


def test_interrupted_save_leaves_the_old_file(saved, tmp_path, monkeypatch):
    tm, path, _ = saved
    target = tmp_path / "m.json"
    target.write_text(path.read_text())
    before = target.read_bytes()

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("vocabbridge.util.os.replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        save_map(tm, target)
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["m.json"]  # no temp file left behind


def test_vllm_map_round_trips_too(tmp_path, base_view, extended_view):
    tm = build_token_map(base_view, extended_view, mode="vllm")
    save_map(tm, tmp_path / "v.json")
    back = load_map(tmp_path / "v.json", drafter=base_view, target=extended_view)
    assert back.mode == "vllm" and back.stats.space_markers == {"drafter": ["Ġ"], "target": ["Ġ"]}
    assert np.array_equal(back.target_to_draft, tm.target_to_draft) and back.input_bridge == tm.input_bridge


def test_saved_map_is_readable_like_any_written_file(saved):
    import os
    import stat

    umask = os.umask(0)
    os.umask(umask)
    _, path, _ = saved
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask  # not mkstemp's 0600
