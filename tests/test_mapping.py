"""The bytes map and the input bridge, on tokenizers trained in the test (no ../shared needed)."""

from __future__ import annotations

import json
import unicodedata

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vocabbridge.errors import ConfigError
from vocabbridge.mapping import build_token_map, compute_coverage, default_texts
from vocabbridge.mapping.bytes_mode import byte_fallback_pieces
from vocabbridge.mapping.tokenmap import LazyBridge
from vocabbridge.testing import train_base
from vocabbridge.tokenizer.encoding import byte_level_encode
from vocabbridge.tokenizer.view import view_from_doc


@pytest.fixture(scope="module")
def views(base_view, extended_view, spm_view):
    return {"base": base_view, "extended": extended_view, "spm": spm_view}


PAIRS = [("spm", "base"), ("base", "spm"), ("base", "extended"), ("extended", "base"), ("spm", "extended")]


def test_bytes_mode_pairs_non_ascii_tokens_that_vllm_mode_cannot(spm_view, base_view):
    # SentencePiece drafter (▁안, UTF-8 text) → byte-level target (Ġìķ..., byte aliases).
    bm = build_token_map(spm_view, base_view, mode="bytes")
    vm = build_token_map(spm_view, base_view, mode="vllm")
    non_ascii = [t for t, b in enumerate(base_view.tokens) if b and not b.isascii()]
    paired_bytes = [t for t in non_ascii if bm.target_to_draft[t] >= 0]
    paired_vllm = [t for t in non_ascii if vm.target_to_draft[t] >= 0]
    assert len(paired_bytes) > 50 and paired_vllm == []
    hangul = " 필요하시다면".encode()
    t = base_view.id_of(hangul)
    d = spm_view.id_of(hangul)
    assert t is not None and d is not None
    assert bm.target_to_draft[t] == d and bm.draft_to_target[d] == t
    assert vm.target_to_draft[t] == -1
    assert bm.pairs > vm.pairs


def test_special_tokens_pair_by_role_not_by_string(base_view, extended_view, facts):
    # base [|endofturn|] (id 4) ↔ extended <|endofturn|> (appended): same role, different string.
    bm = build_token_map(base_view, extended_view, mode="bytes")
    assert bm.target_to_draft[facts.eot_b] == facts.eot_a
    assert bm.draft_to_target[facts.eot_a] == facts.eot_b
    assert bm.stats.role_pairs == 2 and bm.stats.content_pairs == 3  # end_of_turn, bos; <pad> <eos> <unk>
    assert [bm.target_to_draft[i] for i in range(4)] == [0, 1, 2, 3]
    vm = build_token_map(base_view, extended_view, mode="vllm")
    assert vm.target_to_draft[facts.eot_b] == -1 and vm.draft_to_target[facts.eot_a] == -1
    # extended id 4 is now "[unused4]": neither map pairs it with base's old end-of-turn.
    assert bm.target_to_draft[4] == -1 and vm.target_to_draft[4] == -1


def test_same_special_string_beats_the_weak_pad_role():
    # Target pad is <|endoftext|>; the drafter has <|endoftext|> too, but its pad is [PAD]:
    # identical specials pair before the weak pad role (vLLM pairs them by string as well).
    base = train_base(vocab_size=300)
    doc = json.loads(json.dumps(base))
    n = max(doc["model"]["vocab"].values()) + 1
    doc["model"]["vocab"]["<|endoftext|>"] = n
    doc["added_tokens"].append(
        {
            "id": n,
            "content": "<|endoftext|>",
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
    )
    drafter = view_from_doc(doc, source="d", config={"pad_token": "<pad>", "eos_token": "[|endofturn|]"})
    target = view_from_doc(doc, source="t", config={"pad_token": "<|endoftext|>", "eos_token": "[|endofturn|]"})
    tm = build_token_map(drafter, target)
    assert tm.target_to_draft[n] == n and tm.target_to_draft[0] == 0


def test_role_priority_keeps_end_of_turn_when_pad_reuses_it():
    # Target pad and eos share one id; the drafter's pad is another token: end-of-turn wins the pair.
    base = train_base(vocab_size=300)
    drafter = view_from_doc(base, source="d", config={"eos_token": "[|endofturn|]", "pad_token": "<pad>", "bos_token": "<bos>"})
    target = view_from_doc(
        base, source="t", config={"eos_token": "[|endofturn|]", "pad_token": "[|endofturn|]", "bos_token": "<bos>"}
    )
    tm = build_token_map(drafter, target)
    assert tm.target_to_draft[4] == 4 and tm.draft_to_target[4] == 4
    assert tm.draft_to_target[0] == 0  # <pad> ↔ <pad> by content, as nothing else claimed it


def _with_token(doc: dict, text: str, *, nfc: bool) -> dict:
    d = json.loads(json.dumps(doc))
    vocab = d["model"]["vocab"]
    vocab[byte_level_encode(text.encode())] = max(vocab.values()) + 1
    d["normalizer"] = {"type": "NFC"} if nfc else None
    return d


def test_target_normalizer_refuses_tokens_it_would_rewrite():
    nfd = unicodedata.normalize("NFD", "한국")  # conjoining jamo: NFC turns them back into syllables
    base = train_base()
    drafter = view_from_doc(_with_token(base, nfd, nfc=False), source="drafter-nfd")
    target = view_from_doc(_with_token(base, nfd, nfc=True), source="target-nfc")
    t = target.id_of(nfd.encode())
    bm = build_token_map(drafter, target, mode="bytes")
    vm = build_token_map(drafter, target, mode="vllm")
    assert bm.target_to_draft[t] == -1 and bm.stats.normalizer_rejected == 1
    assert vm.target_to_draft[t] == drafter.id_of(nfd.encode())  # vLLM has no NFC step
    # ASCII and NFC text still pair.
    for text in (" the", " 필요하시다면"):
        assert bm.target_to_draft[target.id_of(text.encode())] == drafter.id_of(text.encode())


def test_byte_fallback_pieces_prefer_the_plain_token(spm_view):
    pieces = byte_fallback_pieces(spm_view)
    assert len(pieces) == 256
    a_piece = next(i for i, b in pieces.items() if b == b"a")
    (a_plain,) = [i for i in spm_view.ids_by_bytes[b"a"] if i != a_piece]
    tm = build_token_map(spm_view, spm_view)
    assert tm.target_to_draft[a_piece] == a_plain  # the piece reaches the drafter as the plain token
    assert tm.draft_to_target[a_piece] == a_plain  # a proposed piece means the target's plain "a"
    assert tm.target_to_draft[a_plain] == a_plain


@pytest.mark.parametrize("mode", ["bytes", "vllm"])
@pytest.mark.parametrize("drafter,target", PAIRS)
def test_input_bridge_round_trips_every_target_id(views, drafter, target, mode):
    dv, tv = views[drafter], views[target]
    tm = build_token_map(dv, tv, mode=mode)
    for t, b in enumerate(tv.tokens):
        if b is None:
            continue
        ids = tm.draft_ids_for_target(t)
        assert ids, f"target id {t} has no drafter ids"
        if tm.target_to_draft[t] < 0:
            assert dv.decode_bytes(ids) == b, (t, b, ids)
        else:
            assert t not in tm.input_bridge
    assert set(tm.input_bridge) == {t for t, b in enumerate(tv.tokens) if b and tm.target_to_draft[t] < 0}


def test_unpaired_special_tokens_reach_the_drafter_as_their_text(base_view, spm_view):
    tm = build_token_map(spm_view, base_view)
    pad = base_view.roles["pad"]  # <pad>: the SentencePiece drafter has no pad role and no such token
    assert tm.target_to_draft[pad] == -1
    assert spm_view.decode_bytes(tm.input_bridge[pad]) == b"<pad>"
    assert spm_view.roles["unk"] not in tm.input_bridge[pad]


def test_bridge_uses_single_bytes_for_fragments(base_view, spm_view):
    tm = build_token_map(spm_view, base_view)

    def partial(b):
        try:
            b.decode("utf-8")
        except UnicodeDecodeError:
            return len(b) > 1
        return False

    frag = next(t for t, b in enumerate(base_view.tokens) if b and partial(b) and tm.target_to_draft[t] < 0)
    pieces = byte_fallback_pieces(spm_view)
    assert [pieces[i] for i in tm.input_bridge[frag]] == [bytes([x]) for x in base_view.tokens[frag]]


@pytest.mark.parametrize("drafter,target", PAIRS)
def test_map_and_inverse_agree(views, drafter, target):
    dv, tv = views[drafter], views[target]
    tm = build_token_map(dv, tv)

    @settings(max_examples=200, deadline=None)
    @given(st.integers(0, tv.size - 1))
    def check(t):
        d = int(tm.target_to_draft[t])
        if d < 0:
            return
        back = int(tm.draft_to_target[d])
        assert back >= 0
        if t in tv.added_ids or back in tv.added_ids:
            assert back == t  # specials pair one to one
        else:
            # Same bytes always; the same id unless t shares its bytes with another id (a <0xNN>
            # piece and the plain token): then back is the canonical id, a fixed point of the map.
            assert tv.tokens[back] == tv.tokens[t] == dv.tokens[d]
            assert back == t or len(tv.ids_by_bytes[tv.tokens[t]]) > 1
            assert tm.target_to_draft[back] == d and tm.draft_to_target[tm.target_to_draft[back]] == back

    check()


def test_model_vocab_size_limits_the_pairs(base_view, extended_view):
    full = build_token_map(base_view, extended_view)
    small = build_token_map(base_view, extended_view, target_vocab_size=500)
    assert (small.target_to_draft[500:] == -1).all() and (small.draft_to_target < 500).all()
    assert small.pairs < full.pairs
    assert len(small.target_to_draft) == extended_view.size  # id space keeps every tokenizer id
    big = build_token_map(base_view, extended_view, target_vocab_size=1000)
    assert len(big.target_to_draft) == 1000 and big.target.model_vocab_size == 1000


def test_bad_options_say_what_to_pass(base_view):
    with pytest.raises(ConfigError, match="'bytes'.*'vllm'"):
        build_token_map(base_view, base_view, mode="strings")
    with pytest.raises(ConfigError, match="positive integer"):
        build_token_map(base_view, base_view, drafter_vocab_size=0)


def test_coverage_counts_vocabulary_and_text(spm_view, base_view):
    tm = build_token_map(spm_view, base_view)
    cov = compute_coverage(
        tm,
        spm_view,
        base_view,
        texts={"ko": "안녕하세요. 도움이 필요하시다면 문의해 주세요.", "en": "Hello world!"},
        check_bridge=True,
    )
    assert cov.pairs == tm.pairs and cov.target_vocab == base_view.size
    assert cov.bridge_lossy == 0 and cov.bridged == sum(
        1 for t, b in enumerate(base_view.tokens) if b and tm.target_to_draft[t] < 0
    )
    assert sum(s.target_tokens for s in cov.scripts) == sum(
        1 for t, b in enumerate(base_view.tokens) if b and t not in base_view.special_ids
    )
    ko = cov.texts[0]
    assert ko.file == "ko" and ko.target_tokens == len(base_view.encode("안녕하세요. 도움이 필요하시다면 문의해 주세요."))
    assert ko.partnered_share > 0.5 and ko.vllm_unk_share > 0.3  # vLLM pairs no Hangul here
    eot = next(r for r in cov.roles if r.role == "end_of_turn")
    assert eot.status == "paired"


def test_default_texts_are_shipped():
    texts = default_texts()
    assert set(texts) == {"code.txt", "english_chat.txt", "english_prose.txt", "korean_chat.txt", "korean_prose.txt"}
    assert all(1000 < len(t.encode()) < 8000 for t in texts.values())


def test_bytes_build_is_one_pass(base_view, extended_view):
    tm = build_token_map(base_view, extended_view)
    assert isinstance(tm.draft_to_target, np.ndarray) and tm.draft_to_target.dtype == np.int64
    assert isinstance(tm.input_bridge, LazyBridge) and tm.input_bridge._data is None  # the bridge waits for first use
    assert tm.input_bridge is tm.input_bridge
