"""Exact facts on the real tokenizers in ../shared/tokenizers (skipped, with the reason, without it)."""

import pytest

from vocabbridge import load_tokenizer
from vocabbridge.diff import diff_tokenizers

from .conftest import shared_tokenizer


@pytest.fixture(scope="module")
def cl100k():
    return load_tokenizer(shared_tokenizer("cl100k"))


@pytest.fixture(scope="module")
def llama3():
    return load_tokenizer(shared_tokenizer("llama-3"))


def test_llama3_extends_cl100k(cl100k, llama3):
    d = diff_tokenizers(cl100k, llama3)
    assert d.vocab.identical_prefix == 100_256  # ids 0–100,255 identical in id and bytes
    assert d.vocab.same_id == 100_256 and d.vocab.moved == 0 and d.vocab.only_a == 0
    assert d.vocab.only_b == 27_744  # base tokens only in llama-3
    assert d.merges.shared == 100_000 and d.merges.only_a == 0


def test_exaone_35_specials():
    v = load_tokenizer(shared_tokenizer("exaone-3.5"))
    assert v.size == 102_400
    assert v.roles["end_of_turn"] == 361 and v.tokens[361] == b"[|endofturn|]"
    assert v.roles["bos"] == 1 and v.tokens[1] == b"[BOS]"
    assert v.roles["eos"] == 361


def test_qwen3_has_nfc_and_single_digit_split():
    v = load_tokenizer(shared_tokenizer("qwen3"))
    assert v.normalizer == {"type": "NFC"}
    assert v.split("2026") == ["2", "0", "2", "6"]
    assert v.roles["end_of_turn"] == v.roles["eos"] == 151645


def test_llama3_chat_roles(llama3):
    assert llama3.tokens[llama3.roles["end_of_turn"]] == b"<|eot_id|>"
    assert llama3.tokens[llama3.roles["start_of_turn"]] == b"<|start_header_id|>"


def test_exaone_vs_qwen3_korean_is_mostly_not_shared():
    d = diff_tokenizers(load_tokenizer(shared_tokenizer("exaone-3.5")), load_tokenizer(shared_tokenizer("qwen3")))
    hangul = next(r for r in d.scripts if r.script == "hangul")
    assert hangul.only_a > hangul.shared
