"""diff on a base tokenizer and an extended one derived from it: every figure has a known answer."""

import json

import pytest

from vocabbridge.diff import diff_tokenizers
from vocabbridge.diff.render import diff_dict, sections
from vocabbridge.report import to_markdown


@pytest.fixture(scope="module")
def d(base_view, extended_view):
    return diff_tokenizers(base_view, extended_view, texts={"chat": "I'll give them the results. 안녕하세요!"})


def test_vocabulary_counts(d, facts):
    v = d.vocab
    assert (v.identical_prefix, v.same_id, v.moved, v.only_a, v.only_b) == (
        facts.identical_prefix,
        facts.same_id,
        facts.moved,
        facts.only_a,
        facts.only_b,
    )
    assert d.a.base == facts.base_size_a and d.b.base == facts.base_size_b


def test_moved_examples_name_both_ids(d, base_view):
    ex = d.vocab.moved_examples
    assert {(e.id_a, e.id_b) for e in ex} == {(base_view.size - 2, base_view.size - 1), (base_view.size - 1, base_view.size - 2)}


def test_merges(d, facts):
    m = d.merges
    assert (m.identical_prefix, m.shared, m.only_a, m.only_b) == (
        facts.merges_prefix,
        facts.merges_shared,
        0,
        facts.merges_only_b,
    )
    assert m.first_difference["index"] == facts.merges_prefix


def test_end_of_turn_moved_and_renamed(d, facts):
    row = next(r for r in d.specials.by_role if r.role == "end_of_turn")
    assert (row.id_a, row.content_a, row.id_b, row.content_b) == (facts.eot_a, "[|endofturn|]", facts.eot_b, "<|endofturn|>")
    assert row.status == "moved+renamed"
    assert next(r for r in d.specials.by_role if r.role == "bos").status == "same"
    assert [e.text for e in d.specials.only_a] == ["[|endofturn|]"]
    assert {e.text for e in d.specials.only_b} == {"[unused4]", "<|endofturn|>"}


def test_multiword_tokens(d, facts):
    assert d.multiword.count_a == 0 and d.multiword.count_b == facts.multiword_b
    assert "␠give␠them" in [e.text for e in d.multiword.examples_b]


def test_normalizer_and_pre_tokenizer_differences(d):
    p = d.pipeline
    assert p.normalizer_a == [] and p.normalizer_b == ["NFC()"]
    assert not p.same_pre_tokenizer and len(p.regexes_b) == 1
    by_name = {s.name: s for s in p.differing}
    assert by_name["nfd_hangul"].normalizes_differently  # NFC on one side only
    assert by_name["english"].splits_differently  # multi-word pieces
    assert "give them" in " ".join(by_name["english"].split_b).replace("  ", " ")


def test_script_breakdown_adds_up(d, facts):
    assert sum(r.only_b for r in d.scripts) == facts.only_b
    assert sum(r.shared for r in d.scripts) == facts.same_id + facts.moved
    hangul = next(r for r in d.scripts if r.script == "hangul")
    assert hangul.only_b == 3  # "␠도움이␠필요하시다면", "␠언제든지␠문의해", "␠주세요."


def test_texts_figures(d):
    (t,) = d.texts
    assert t.tokens_b < t.tokens_a  # multi-word tokens make the extended tokenizer shorter
    assert t.roundtrip_a and t.roundtrip_b


def test_json_carries_every_figure(d):
    j = json.loads(json.dumps(diff_dict(d)))
    assert j["vocab"]["only_b"] == d.vocab.only_b
    assert j["merges"]["identical_prefix"] == d.merges.identical_prefix
    assert j["specials"]["by_role"][0]["status"] in ("same", "moved", "renamed", "moved+renamed", "only_a", "only_b")
    assert j["multiword"]["count_b"] == d.multiword.count_b
    assert {r["script"] for r in j["scripts"]} >= {"hangul", "latin", "han", "digits", "whitespace", "punct_code", "fragment"}
    assert j["texts"][0]["tokens_per_char_a"] == pytest.approx(d.texts[0].tokens_per_char_a)
    assert any(s["splits_differently"] for s in j["pipeline"]["samples"])


def test_markdown_has_every_section(d):
    md = to_markdown(sections(d))
    for title in (
        "Vocabulary",
        "Merges",
        "Normalizer and pre-tokenizer",
        "Special tokens by role",
        "Multi-word",
        "script",
        "Texts",
    ):
        assert title in md
    assert "| end_of_turn | 4 | [\\|endofturn\\|] |" in md


def test_diff_of_a_tokenizer_with_itself_is_empty(base_view):
    d = diff_tokenizers(base_view, base_view)
    assert d.vocab.only_a == d.vocab.only_b == d.vocab.moved == 0
    assert d.vocab.identical_prefix == base_view.size
    assert d.merges.first_difference is None and d.pipeline.differing == []
    assert all(r.status == "same" for r in d.specials.by_role)


def test_byte_level_vs_sentencepiece_share_tokens_by_bytes(base_view, spm_view):
    d = diff_tokenizers(base_view, spm_view)
    # Korean tokens are shared by bytes although their strings differ (ìķĪ... vs ▁안...).
    assert next(r for r in d.scripts if r.script == "hangul").shared > 10
