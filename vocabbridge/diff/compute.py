"""``diff_tokenizers(a, b)``: everything that differs between two tokenizer views, as data.

Pure: takes two views (and optional texts), returns a :class:`TokenizerDiff`; rendering lives in
``render.py``. Token counts are over *base* tokens (the BPE model's own vocabulary); added and
special tokens are compared in their own section, by role.

>>> d = diff_tokenizers(view_a, view_b)  # doctest: +SKIP
>>> d.vocab.identical_prefix, d.vocab.only_b  # doctest: +SKIP
(100256, 27744)
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..tokenizer.encoding import display
from ..tokenizer.roles import ROLE_ORDER
from ..tokenizer.scripts import SCRIPTS, is_multiword, script_of
from ..tokenizer.view import TokenizerView
from ..util import common_prefix_len
from .samples import SAMPLES


@dataclass(frozen=True)
class Side:
    source: str
    format: str
    model_type: str
    encoding: str
    fingerprint: str
    ids: int  # max id + 1
    base: int  # BPE vocabulary entries that are not added tokens
    added: int
    special: int
    merges: int
    model_vocab_size: int | None


@dataclass(frozen=True)
class Example:
    text: str  # display form (␠ for space)
    id_a: int | None = None
    id_b: int | None = None


@dataclass(frozen=True)
class VocabSection:
    identical_prefix: int  # ids 0..n-1 have the same bytes in both
    same_id: int  # base tokens with the same bytes at the same id
    moved: int  # same bytes, different id
    only_a: int
    only_b: int
    shared: int  # same_id + moved (counted on A's side)
    moved_examples: list[Example] = field(default_factory=list)
    only_a_examples: list[Example] = field(default_factory=list)
    only_b_examples: list[Example] = field(default_factory=list)


@dataclass(frozen=True)
class MergesSection:
    identical_prefix: int  # the first n merges agree in order
    shared: int
    only_a: int
    only_b: int
    first_difference: dict | None  # {"index", "a", "b"}


@dataclass(frozen=True)
class SampleDiff:
    name: str
    text: str
    normalized_a: str
    normalized_b: str
    split_a: list[str]
    split_b: list[str]

    @property
    def normalizes_differently(self) -> bool:
        return self.normalized_a != self.normalized_b

    @property
    def splits_differently(self) -> bool:
        return self.split_a != self.split_b


@dataclass(frozen=True)
class PipelineSection:
    normalizer_a: list[str]
    normalizer_b: list[str]
    pre_tokenizer_a: list[str]
    pre_tokenizer_b: list[str]
    regexes_a: list[str]
    regexes_b: list[str]
    same_normalizer: bool
    same_pre_tokenizer: bool
    samples: list[SampleDiff]  # every sample; see .differing

    @property
    def differing(self) -> list[SampleDiff]:
        return [s for s in self.samples if s.normalizes_differently or s.splits_differently]


@dataclass(frozen=True)
class SpecialRow:
    role: str
    id_a: int | None
    content_a: str | None
    id_b: int | None
    content_b: str | None

    @property
    def status(self) -> str:
        if self.id_a is None:
            return "only_b"
        if self.id_b is None:
            return "only_a"
        moved, renamed = self.id_a != self.id_b, self.content_a != self.content_b
        return "moved+renamed" if moved and renamed else "moved" if moved else "renamed" if renamed else "same"


@dataclass(frozen=True)
class SpecialsSection:
    by_role: list[SpecialRow]
    only_a: list[Example]  # special tokens whose content the other side lacks
    only_b: list[Example]
    only_a_count: int
    only_b_count: int


@dataclass(frozen=True)
class MultiwordSection:
    count_a: int
    count_b: int
    only_a: int  # multi-word tokens among A's only-A tokens
    only_b: int
    examples_a: list[Example]
    examples_b: list[Example]


@dataclass(frozen=True)
class ScriptRow:
    script: str
    shared: int
    only_a: int
    only_b: int


@dataclass(frozen=True)
class TextStat:
    file: str
    chars: int
    tokens_a: int
    tokens_b: int
    roundtrip_a: bool  # decode(encode(text)) == text, byte for byte
    roundtrip_b: bool

    @property
    def tokens_per_char_a(self) -> float:
        return self.tokens_a / max(self.chars, 1)

    @property
    def tokens_per_char_b(self) -> float:
        return self.tokens_b / max(self.chars, 1)


@dataclass(frozen=True)
class TokenizerDiff:
    a: Side
    b: Side
    vocab: VocabSection
    merges: MergesSection
    pipeline: PipelineSection
    specials: SpecialsSection
    multiword: MultiwordSection
    scripts: list[ScriptRow]
    texts: list[TextStat]


# ==== sections ================================================================================


def _side(v: TokenizerView) -> Side:
    return Side(
        source=v.source,
        format=v.format,
        model_type=v.model_type,
        encoding=v.encoding,
        fingerprint=v.fingerprint,
        ids=v.size,
        base=v.base_size,
        added=len(v.added),
        special=len(v.special_ids),
        merges=len(v.merges),
        model_vocab_size=v.model_vocab_size,
    )


def identical_prefix(xs, ys) -> int:
    """Length of the common prefix of two sequences.

    >>> identical_prefix([1, 2, 3], [1, 2, 4])
    2
    """
    return common_prefix_len(xs, ys)


def _base_bytes(v: TokenizerView) -> dict[bytes, int]:
    """bytes → lowest base id."""
    out: dict[bytes, int] = {}
    toks = v.tokens
    for i in v.base_ids:
        out.setdefault(toks[i], i)
    return out


def _vocab(a: TokenizerView, b: TokenizerView, base_a: dict, base_b: dict, n_examples: int) -> VocabSection:
    same = moved = only_a = 0
    moved_ex: list[Example] = []
    only_a_ex: list[Example] = []
    tb, b_added = b.tokens, b.added_ids
    for i in a.base_ids:
        t = a.tokens[i]
        if i < len(tb) and tb[i] == t and i not in b_added:
            same += 1
        elif t in base_b:
            moved += 1
            if len(moved_ex) < n_examples:
                moved_ex.append(Example(display(t), i, base_b[t]))
        else:
            only_a += 1
            if len(only_a_ex) < n_examples:
                only_a_ex.append(Example(display(t), i, None))
    only_b_ids = [i for i in b.base_ids if b.tokens[i] not in base_a]
    return VocabSection(
        identical_prefix=identical_prefix(a.tokens, b.tokens),
        same_id=same,
        moved=moved,
        only_a=only_a,
        only_b=len(only_b_ids),
        shared=same + moved,
        moved_examples=moved_ex,
        only_a_examples=only_a_ex,
        only_b_examples=[Example(display(b.tokens[i]), None, i) for i in only_b_ids[:n_examples]],
    )


def _merges(a: TokenizerView, b: TokenizerView) -> MergesSection:
    prefix = identical_prefix(a.merges, b.merges)
    sa, sb = set(a.merges), set(b.merges)
    shared = len(sa & sb)
    first = None
    if prefix < max(len(a.merges), len(b.merges)):
        pair = lambda m, i: [display(m[i][0]), display(m[i][1])] if i < len(m) else None  # noqa: E731
        first = {"index": prefix, "a": pair(a.merges, prefix), "b": pair(b.merges, prefix)}
    return MergesSection(prefix, shared, len(sa) - shared, len(sb) - shared, first)


def _pipeline(a: TokenizerView, b: TokenizerView, samples: dict[str, str]) -> PipelineSection:
    da, db = a.describe(full_patterns=False), b.describe(full_patterns=False)
    rows = [
        SampleDiff(name, text, a.normalize(text), b.normalize(text), a.split(text), b.split(text))
        for name, text in samples.items()
    ]
    return PipelineSection(
        normalizer_a=da["normalizer"],
        normalizer_b=db["normalizer"],
        pre_tokenizer_a=da["pre_tokenizer"],
        pre_tokenizer_b=db["pre_tokenizer"],
        regexes_a=a.pre_tokenizer_regexes,
        regexes_b=b.pre_tokenizer_regexes,
        same_normalizer=a.normalizer == b.normalizer or (not a.normalizer and not b.normalizer),
        same_pre_tokenizer=a.pre_tokenizer == b.pre_tokenizer,
        samples=rows,
    )


def _specials(a: TokenizerView, b: TokenizerView, n_examples: int) -> SpecialsSection:
    roles = [r for r in ROLE_ORDER if r in a.roles or r in b.roles]
    rows = []
    for r in roles:
        ia, ib = a.roles.get(r), b.roles.get(r)
        rows.append(
            SpecialRow(
                r,
                ia,
                None if ia is None else (a.tokens[ia] or b"").decode("utf-8", "replace"),
                ib,
                None if ib is None else (b.tokens[ib] or b"").decode("utf-8", "replace"),
            )
        )
    ca = {t.content: t.id for t in a.added if t.special}
    cb = {t.content: t.id for t in b.added if t.special}
    only_a = [Example(c, i, None) for c, i in ca.items() if c not in cb]
    only_b = [Example(c, None, i) for c, i in cb.items() if c not in ca]
    return SpecialsSection(rows, only_a[:n_examples], only_b[:n_examples], len(only_a), len(only_b))


def _multiword(a: TokenizerView, b: TokenizerView, base_a: dict, base_b: dict, n_examples: int) -> MultiwordSection:
    mw_a = [(t, i) for t, i in base_a.items() if is_multiword(t)]
    mw_b = [(t, i) for t, i in base_b.items() if is_multiword(t)]
    only_a = [(t, i) for t, i in mw_a if t not in base_b]
    only_b = [(t, i) for t, i in mw_b if t not in base_a]
    return MultiwordSection(
        count_a=len(mw_a),
        count_b=len(mw_b),
        only_a=len(only_a),
        only_b=len(only_b),
        examples_a=[Example(display(t), i, base_b.get(t)) for t, i in (only_a or mw_a)[:n_examples]],
        examples_b=[Example(display(t), base_a.get(t), i) for t, i in (only_b or mw_b)[:n_examples]],
    )


def _scripts(base_a: dict, base_b: dict) -> list[ScriptRow]:
    counts = {s: [0, 0, 0] for s in SCRIPTS}
    for t in base_a:
        counts[script_of(t)][0 if t in base_b else 1] += 1
    for t in base_b:
        if t not in base_a:
            counts[script_of(t)][2] += 1
    return [ScriptRow(s, *counts[s]) for s in SCRIPTS]


def text_stat(a: TokenizerView, b: TokenizerView, name: str, text: str) -> TextStat:
    ida, idb = a.encode(text), b.encode(text)
    raw = text.encode("utf-8")
    return TextStat(name, len(text), len(ida), len(idb), a.decode_bytes(ida) == raw, b.decode_bytes(idb) == raw)


def diff_tokenizers(
    a: TokenizerView,
    b: TokenizerView,
    *,
    texts: dict[str, str] | None = None,
    examples: int = 8,
    samples: dict[str, str] | None = None,
) -> TokenizerDiff:
    """Compare two views; ``texts`` maps a name (file path) to its content for per-text figures."""
    base_a, base_b = _base_bytes(a), _base_bytes(b)
    return TokenizerDiff(
        a=_side(a),
        b=_side(b),
        vocab=_vocab(a, b, base_a, base_b, examples),
        merges=_merges(a, b),
        pipeline=_pipeline(a, b, SAMPLES if samples is None else samples),
        specials=_specials(a, b, examples),
        multiword=_multiword(a, b, base_a, base_b, examples),
        scripts=_scripts(base_a, base_b),
        texts=[text_stat(a, b, name, t) for name, t in (texts or {}).items()],
    )
