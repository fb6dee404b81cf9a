"""``--mode vllm``: vLLM's use_heterogeneous_vocab rule, case by case, and against a slow reference
written from the rule on transformers' own tokenizers."""

from __future__ import annotations

import numpy as np
import pytest

from vocabbridge.mapping import build_token_map
from vocabbridge.mapping.string_match import fallback_id, normalized_vocab, space_markers
from vocabbridge.tokenizer.view import view_from_doc

BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True, "trim_offsets": True}


def tiny(vocab: dict[str, int], merges: list[list[str]], *, added=(), config=None, source="tiny", pre=BYTE_LEVEL):
    """A complete tokenizer.json for a hand-made vocabulary (added: [(id, content)], all special)."""
    doc = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "normalizer": None,
        "pre_tokenizer": pre,
        "post_processor": None,
        "decoder": BYTE_LEVEL,
        "added_tokens": [
            {"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
            for i, c in added
        ],
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }
    return view_from_doc(doc, source=source, config=config)


def test_rule_on_a_small_example():
    # Drafter: byte-level ("Ġ" marker). Target: the same strings at other ids, plus a literal " x"
    # that normalizes like "Ġx", an end-of-turn spelled differently, and an id beyond its model.
    drafter = tiny(
        {"Ġ": 0, "a": 1, "Ġa": 2, "x": 3, "Ġx": 4, "<eot>": 5, "<|im_end|>": 6},
        [["Ġ", "a"], ["Ġ", "x"]],
        added=[(5, "<eot>"), (6, "<|im_end|>")],
        config={"eos_token": "<eot>"},
        source="drafter",
    )
    target = tiny(
        {"a": 0, "Ġ": 1, " x": 2, "Ġa": 3, "Ġx": 4, "x": 5, "<|endofturn|>": 6, "<|im_end|>": 7, "Ġz": 8, "z": 9},
        [["Ġ", "a"], ["Ġ", "x"], ["Ġ", "z"]],
        added=[(6, "<|endofturn|>"), (7, "<|im_end|>")],
        config={"eos_token": "<|endofturn|>"},
        source="target",
    )
    assert space_markers(drafter) == ("Ġ",) and space_markers(target) == ("Ġ",)
    norm, ambiguous, _ = normalized_vocab(target)
    assert ambiguous == 1 and norm[" x"] == 2  # "Ġx" (4) and " x" (2) collide: the lowest id keeps " x"
    tm = build_token_map(drafter, target, mode="vllm", target_vocab_size=8)
    pairs = {int(t): int(d) for t, d in enumerate(tm.target_to_draft) if d >= 0}
    assert pairs == {
        0: 1,  # a
        1: 0,  # Ġ → " "
        2: 4,  # " x" ↔ drafter "Ġx" (target's "Ġx" at 4 lost the collision)
        3: 2,  # Ġa
        5: 3,  # x
        7: 6,  # <|im_end|>: special tokens take part, by string
    }  # 6 <|endofturn|> ≠ <eot>: no role matching; 8 Ġz: no drafter partner (and beyond the model anyway)
    assert tm.stats.ambiguous == 1
    assert tm.draft_to_target[4] == 2 and tm.draft_to_target[5] == -1
    assert tm.draft_unk_id == 5  # no unk: eos


def test_id_beyond_the_model_vocabulary_is_dropped():
    v = tiny({"Ġ": 0, "a": 1, "Ġa": 2, "b": 3}, [["Ġ", "a"]])
    tm = build_token_map(v, v, mode="vllm", drafter_vocab_size=4, target_vocab_size=3)
    assert tm.target_to_draft.tolist() == [0, 1, 2, -1]
    assert tm.draft_to_target.tolist() == [0, 1, 2, -1]
    assert tm.stats.dropped_beyond_vocab == 1


def test_space_marker_falls_back_to_both_when_probe_fails():
    # No "Ġ a" merge: " a" encodes as ["Ġ", "a"], so the probe fails and Ġ then ▁ are tried.
    v = tiny({"Ġ": 0, "a": 1, "x": 2}, [])
    assert space_markers(v) == ("\u0120", "\u2581")


def test_sentencepiece_marker_is_detected(spm_view, base_view):
    assert space_markers(spm_view) == ("\u2581",)
    tm = build_token_map(spm_view, base_view, mode="vllm")
    the_t, the_d = base_view.id_of(b" the"), spm_view.id_of(b" the")
    assert tm.target_to_draft[the_t] == the_d  # "Ġthe" and "▁the" both become " the"


def test_unk_else_eos_from_the_config(base_view, spm_view):
    assert fallback_id(base_view) == base_view.roles["unk"]
    no_unk = tiny({"Ġ": 0, "<eos>": 1}, [], added=[(1, "<eos>")], config={"eos_token": "<eos>"})
    assert fallback_id(no_unk) == 1
    # A token merely named <unk> is not the tokenizer's unk for transformers (no config).
    named_only = tiny({"Ġ": 0, "<unk>": 1}, [], added=[(1, "<unk>")])
    assert named_only.roles.get("unk") == 1 and fallback_id(named_only) is None


# ==== a slow reference written from the rule, on transformers' tokenizers ====================


def reference_vllm_map(d_folder, t_folder, d_size: int, t_size: int):
    """vLLM's rule done the plain way with AutoTokenizer (get_vocab, encode, convert_ids_to_tokens)."""
    from transformers import AutoTokenizer

    def markers(tok):
        ids = tok.encode(" a", add_special_tokens=False)
        s = tok.convert_ids_to_tokens(ids[0]) if ids else None
        if isinstance(s, str) and len(s) > 1 and s.endswith("a") and s[0] not in " \t":
            return (s[:-1],)
        return ("Ġ", "▁")

    def norm(tok):
        ms = markers(tok)
        out: dict[str, int] = {}
        for s, i in sorted(tok.get_vocab().items(), key=lambda kv: kv[1]):  # ascending ids: lowest wins
            for m in ms:
                if s.startswith(m):
                    s = " " + s[len(m) :]
                    break
            out.setdefault(s, i)
        return out

    dt, tt = AutoTokenizer.from_pretrained(str(d_folder)), AutoTokenizer.from_pretrained(str(t_folder))
    dn, tn = norm(dt), norm(tt)
    d2t, t2d = np.full(d_size, -1), np.full(t_size, -1)
    for s in dn.keys() & tn.keys():
        if dn[s] < d_size and tn[s] < t_size:
            d2t[dn[s]], t2d[tn[s]] = tn[s], dn[s]
    unk = dt.unk_token_id if dt.unk_token_id is not None else dt.eos_token_id
    return d2t, t2d, unk


@pytest.mark.parametrize("drafter,target", [("base", "extended"), ("extended", "base"), ("spm", "base"), ("base", "spm")])
@pytest.mark.parametrize("shrink", [0, 40])
def test_matches_the_reference(tok_dirs, drafter, target, shrink):
    from vocabbridge import load_tokenizer

    dv, tv = load_tokenizer(tok_dirs[drafter]), load_tokenizer(tok_dirs[target])
    ds, ts = dv.size - shrink, tv.size - shrink
    tm = build_token_map(dv, tv, mode="vllm", drafter_vocab_size=ds, target_vocab_size=ts)
    d2t, t2d, unk = reference_vllm_map(tok_dirs[drafter], tok_dirs[target], ds, ts)
    # Our arrays cover every tokenizer id (vLLM's stop at the model size); the rest is -1.
    assert tm.draft_to_target[:ds].tolist() == d2t.tolist() and (tm.draft_to_target[ds:] == -1).all()
    assert tm.target_to_draft[:ts].tolist() == t2d.tolist() and (tm.target_to_draft[ts:] == -1).all()
    assert tm.pairs == int((t2d >= 0).sum()) and tm.draft_unk_id == unk
