from hypothesis import given
from hypothesis import strategies as st

from vocabbridge.tokenizer.encoding import (
    byte_level_decode,
    byte_level_encode,
    bytes_to_unicode,
    display,
    token_bytes,
)


def test_byte_level_table_is_a_bijection_over_256_bytes():
    table = bytes_to_unicode()
    assert len(table) == 256 and len(set(table.values())) == 256
    assert table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ" and table[ord("a")] == "a"


@given(st.binary(max_size=64))
def test_byte_level_round_trips_any_bytes(b):
    assert byte_level_decode(byte_level_encode(b)) == b


def test_byte_level_korean_token_decodes_to_utf8():
    assert token_bytes("ìķĪëħķ", "byte_level").decode() == "안녕"


def test_byte_level_string_outside_alphabet_is_taken_as_text():
    assert byte_level_decode("안") is None
    assert token_bytes("안", "byte_level") == "안".encode()


def test_sentencepiece_space_marker_and_byte_fallback():
    assert token_bytes("▁the", "sentencepiece") == b" the"
    assert token_bytes("<0xEC>", "sentencepiece", byte_fallback=True) == b"\xec"
    # Without byte fallback, <0xEC> is just text.
    assert token_bytes("<0xEC>", "sentencepiece") == b"<0xEC>"


def test_display_marks_spaces_newlines_and_partial_utf8():
    assert display(b" give them") == "␠give␠them"
    assert display(b"a\nb") == "a↵b"
    assert display(b"\xec\x95") == "\\xec\\x95"
    assert display(None) == "∅"


@given(st.lists(st.one_of(st.binary(max_size=8).map(byte_level_encode), st.text(max_size=5)), max_size=30))
def test_decode_many_equals_token_bytes_one_by_one(strings):
    from vocabbridge.tokenizer.encoding import decode_many

    assert decode_many(strings, "byte_level") == [token_bytes(s, "byte_level") for s in strings]
