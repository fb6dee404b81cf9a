import json
import shutil

from hypothesis import given, settings
from hypothesis import strategies as st

from vocabbridge import load_tokenizer


def test_every_base_token_bytes_match_the_tokenizers_library(base_view):
    # The backend decodes single byte-level tokens through the same table: compare on valid UTF-8.
    backend = base_view.backend
    for i in base_view.base_ids:
        b = base_view.tokens[i]
        try:
            text = b.decode("utf-8")
        except UnicodeDecodeError:
            continue
        assert backend.decode([i], skip_special_tokens=False) == text


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("abc 안녕하세요\n\t.,!0123 XYZ😀")), max_size=40))
def test_decode_bytes_of_encode_round_trips_text(base_view, text):
    assert base_view.decode_bytes(base_view.encode(text)) == text.encode("utf-8")


def test_sentencepiece_view_decodes_marker_and_byte_fallback(spm_view):
    assert spm_view.encoding == "sentencepiece" and spm_view.byte_fallback
    ids = spm_view.encode("give 😀")
    # Metaspace prepends one space; the emoji falls back to its four UTF-8 bytes.
    assert spm_view.decode_bytes(ids) == " give 😀".encode()
    assert spm_view.tokens[spm_view.encode("😀")[-1]] == "😀".encode()[-1:]


def test_roles_come_from_config_and_chat_template(base_view, extended_view, spm_view):
    assert base_view.roles["bos"] == 1 and base_view.role_evidence["bos"] == "config"
    assert base_view.roles["end_of_turn"] == 4 and base_view.role_evidence["end_of_turn"] == "chat_template"
    assert extended_view.tokens[extended_view.roles["end_of_turn"]] == b"<|endofturn|>"
    assert spm_view.roles["end_of_turn"] == 2  # '</s>' closes each message in its template


def test_added_tokens_carry_their_roles(base_view):
    eot = next(a for a in base_view.added if a.id == 4)
    assert eot.content == "[|endofturn|]" and eot.special and set(eot.roles) == {"eos", "end_of_turn"}


def test_fingerprint_depends_on_content_not_path(tok_dirs, tmp_path, base_view):
    copy = tmp_path / "copy"
    shutil.copytree(tok_dirs["base"], copy)
    assert load_tokenizer(copy).fingerprint == base_view.fingerprint
    doc = json.loads((copy / "tokenizer.json").read_text())
    doc["normalizer"] = {"type": "NFC"}
    (copy / "tokenizer.json").write_text(json.dumps(doc))
    assert load_tokenizer(copy).fingerprint != base_view.fingerprint


def test_split_runs_the_real_pre_tokenizer(base_view, extended_view):
    assert base_view.split("give them") == ["give", " them"]
    assert extended_view.split("give them") == ["give them"]  # the multi-word regex


def test_normalizer_is_applied(extended_view, base_view):
    import unicodedata

    nfd = unicodedata.normalize("NFD", "한국어")
    assert extended_view.normalize(nfd) == "한국어"
    assert base_view.normalize(nfd) == nfd


def test_merges_are_byte_pairs(base_view):
    a, b = base_view.merges[0]
    assert isinstance(a, bytes) and isinstance(b, bytes)
    assert base_view.id_of(a + b) is not None
