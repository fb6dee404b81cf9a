"""Turn a :class:`TokenizerDiff` into report sections (rich table / Markdown) or JSON."""

from __future__ import annotations

import unicodedata

from ..report import Section, fmt_float, fmt_int, to_json, to_jsonable
from ..tokenizer.scripts import SCRIPT_LABELS
from .compute import Example, TokenizerDiff


def _ex(examples: list[Example]) -> str:
    return ", ".join(
        f"{e.text}"
        + (
            f" ({e.id_a}→{e.id_b})"
            if e.id_a is not None and e.id_b is not None
            else f" ({e.id_a if e.id_a is not None else e.id_b})"
        )
        for e in examples
    )


def _range(n: int) -> str:
    return "none" if n == 0 else f"ids 0–{n - 1:,}"


def _pieces(ps: list[str]) -> str:
    return "│".join(p.replace(" ", "␠").replace("\n", "↵").replace("\t", "⇥") for p in ps)


def _cp(s: str) -> str:
    form = "NFC" if unicodedata.is_normalized("NFC", s) else "NFD" if unicodedata.is_normalized("NFD", s) else "mixed"
    return f"{len(s)} code points, {form}"


def sections(d: TokenizerDiff) -> list[Section]:
    a, b = d.a, d.b
    out = [
        Section(
            "Tokenizers",
            ["", "A", "B"],
            [
                ["source", a.source, b.source],
                ["format", a.format, b.format],
                ["model / encoding", f"{a.model_type} / {a.encoding}", f"{b.model_type} / {b.encoding}"],
                ["ids (max id + 1)", fmt_int(a.ids), fmt_int(b.ids)],
                ["base vocabulary", fmt_int(a.base), fmt_int(b.base)],
                ["added tokens (special)", f"{a.added:,} ({a.special:,})", f"{b.added:,} ({b.special:,})"],
                ["merges", fmt_int(a.merges), fmt_int(b.merges)],
                ["model vocab size", fmt_int(a.model_vocab_size), fmt_int(b.model_vocab_size)],
                ["fingerprint", a.fingerprint[:16], b.fingerprint[:16]],
            ],
        )
    ]
    v = d.vocab
    out.append(
        Section(
            "Vocabulary (base tokens, by raw bytes)",
            ["", "tokens"],
            [
                ["identical id prefix (same id, same bytes)", _range(v.identical_prefix)],
                ["same bytes, same id", fmt_int(v.same_id)],
                ["same bytes, different id (moved)", fmt_int(v.moved)],
                ["only in A", fmt_int(v.only_a)],
                ["only in B", fmt_int(v.only_b)],
            ],
            [
                n
                for n in (
                    v.moved_examples and f"moved (A id→B id): {_ex(v.moved_examples)}",
                    v.only_a_examples and f"only in A: {_ex(v.only_a_examples)}",
                    v.only_b_examples and f"only in B: {_ex(v.only_b_examples)}",
                )
                if n
            ],
        )
    )
    m = d.merges
    fd = m.first_difference
    out.append(
        Section(
            "Merges",
            ["", "merges"],
            [
                ["identical-order prefix", fmt_int(m.identical_prefix)],
                ["shared (any order)", fmt_int(m.shared)],
                ["only in A", fmt_int(m.only_a)],
                ["only in B", fmt_int(m.only_b)],
            ],
            [
                f"first difference at merge #{fd['index']:,}: A {fd['a'] and ' + '.join(fd['a'])}, B {fd['b'] and ' + '.join(fd['b'])}"
            ]
            if fd
            else [],
        )
    )
    p = d.pipeline
    out.append(
        Section(
            "Normalizer and pre-tokenizer",
            ["stage", "A", "B"],
            [
                ["normalizer", "\n".join(p.normalizer_a) or "none", "\n".join(p.normalizer_b) or "none"],
                ["pre-tokenizer", "\n".join(p.pre_tokenizer_a) or "none", "\n".join(p.pre_tokenizer_b) or "none"],
                ["split regexes", "\n".join(p.regexes_a) or "none", "\n".join(p.regexes_b) or "none"],
            ],
            [
                f"normalizer: {'same' if p.same_normalizer else 'DIFFERENT'}; "
                f"pre-tokenizer: {'same' if p.same_pre_tokenizer else 'DIFFERENT'}; "
                f"{len(p.differing)} of {len(p.samples)} sample texts split or normalize differently"
            ],
        )
    )
    rows = []
    for s in p.differing:
        what = []
        if s.normalizes_differently:
            what.append(f"normalized: A {_cp(s.normalized_a)}, B {_cp(s.normalized_b)}")
        if s.splits_differently:
            what.append(f"pieces: A {len(s.split_a)}, B {len(s.split_b)}")
        rows.append([s.name, _pieces(s.split_a), _pieces(s.split_b), "; ".join(what)])
    out.append(
        Section(
            "Behaviour on sample texts (pieces after normalization)",
            ["sample", "A", "B", "difference"],
            rows,
            [] if rows else ["all sample texts normalize and split identically"],
        )
    )
    sp = d.specials
    out.append(
        Section(
            "Special tokens by role",
            ["role", "A id", "A token", "B id", "B token", "status"],
            [
                [
                    r.role,
                    "" if r.id_a is None else str(r.id_a),
                    r.content_a or "",
                    "" if r.id_b is None else str(r.id_b),
                    r.content_b or "",
                    r.status,
                ]
                for r in sp.by_role
            ],
            [
                n
                for n in (
                    f"special tokens only in A: {sp.only_a_count:,}" + (f" — {_ex(sp.only_a)}" if sp.only_a else ""),
                    f"special tokens only in B: {sp.only_b_count:,}" + (f" — {_ex(sp.only_b)}" if sp.only_b else ""),
                )
                if n
            ],
        )
    )
    mw = d.multiword
    out.append(
        Section(
            "Multi-word tokens (a space with a letter on both sides)",
            ["", "A", "B"],
            [
                ["tokens", fmt_int(mw.count_a), fmt_int(mw.count_b)],
                ["of them only in this side", fmt_int(mw.only_a), fmt_int(mw.only_b)],
            ],
            [n for n in (mw.examples_a and f"A: {_ex(mw.examples_a)}", mw.examples_b and f"B: {_ex(mw.examples_b)}") if n],
        )
    )
    out.append(
        Section(
            "Base tokens by script",
            ["script", "shared", "only A", "only B"],
            [[SCRIPT_LABELS[r.script], fmt_int(r.shared), fmt_int(r.only_a), fmt_int(r.only_b)] for r in d.scripts],
        )
    )
    if d.texts:
        out.append(
            Section(
                "Texts",
                ["file", "chars", "A tokens", "B tokens", "A tok/char", "B tok/char", "A round-trips", "B round-trips"],
                [
                    [
                        t.file,
                        fmt_int(t.chars),
                        fmt_int(t.tokens_a),
                        fmt_int(t.tokens_b),
                        fmt_float(t.tokens_per_char_a, 3),
                        fmt_float(t.tokens_per_char_b, 3),
                        "yes" if t.roundtrip_a else "NO",
                        "yes" if t.roundtrip_b else "NO",
                    ]
                    for t in d.texts
                ],
            )
        )
    return out


def diff_json(d: TokenizerDiff) -> str:
    return to_json(d)


def diff_dict(d: TokenizerDiff) -> dict:
    return to_jsonable(d)
