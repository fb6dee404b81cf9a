"""How much of the target a map covers: over the vocabulary, and over real text.

Vocabulary level: target ids with a single-token partner (``pairs``), as a share of the target's
and the drafter's vocabulary (model sizes where known, as vLLM reports them), per script, and the
special tokens by role. Corpus level, per text: of the target tokens the target's tokenizer makes
of it, the share with a single-token partner (what the drafter can propose) and the share that
vLLM's map would hand the drafter as ``unk`` (what the input bridge repairs).

>>> cov = compute_coverage(tm, drafter, target, texts=default_texts())  # doctest: +SKIP
>>> f"{cov.pct_target:.1%}", cov.texts[0].vllm_unk_share  # doctest: +SKIP
('25.9%', 0.043)
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from importlib import resources

import numpy as np

from ..tokenizer.encoding import display
from ..tokenizer.scripts import SCRIPTS, script_of
from ..tokenizer.view import TokenizerView
from .build import build_token_map
from .bytes_mode import ROLE_PRIORITY
from .tokenmap import TokenMap


@dataclass(frozen=True)
class ScriptCoverage:
    script: str
    target_tokens: int  # target ids of this script (specials excluded)
    paired: int

    @property
    def share(self) -> float:
        return self.paired / self.target_tokens if self.target_tokens else float("nan")


@dataclass(frozen=True)
class RoleCoverage:
    role: str
    target_id: int | None
    target_token: str | None
    drafter_id: int | None
    drafter_token: str | None
    mapped_to: int | None  # target_to_draft[target_id] (None: no partner)

    @property
    def status(self) -> str:
        """paired (with the drafter's token of the same role) | other (another drafter id) | bridged | absent."""
        if self.target_id is None:
            return "absent"
        if self.mapped_to is None:
            return "bridged"
        return "paired" if self.mapped_to == self.drafter_id else "other"


@dataclass(frozen=True)
class TextCoverage:
    file: str
    chars: int
    target_tokens: int  # occurrences in the target's tokenization of the text
    partnered: int  # occurrences with a single-token partner in this map
    vllm_unk: int  # occurrences vLLM's map would hand the drafter as unk (else eos)

    @property
    def partnered_share(self) -> float:
        return self.partnered / self.target_tokens if self.target_tokens else float("nan")

    @property
    def vllm_unk_share(self) -> float:
        return self.vllm_unk / self.target_tokens if self.target_tokens else float("nan")


@dataclass(frozen=True)
class Coverage:
    mode: str
    target_vocab: int  # denominator: the target's model vocabulary (else tokenizer) size
    drafter_vocab: int
    pairs: int  # target ids with a single-token partner
    drafter_paired: int  # drafter ids whose proposals have a target id
    bridged: int  # target ids with bytes and no partner: fed to the drafter through the input bridge
    bridge_lossy: int | None  # bridge entries that do not spell their bytes exactly (None: not checked)
    roles_paired: int  # target roles whose partner is the drafter's token of the same role
    roles_total: int  # roles the target has
    scripts: tuple[ScriptCoverage, ...]
    roles: tuple[RoleCoverage, ...]
    texts: tuple[TextCoverage, ...] = ()

    @property
    def pct_target(self) -> float:
        return self.pairs / self.target_vocab if self.target_vocab else float("nan")

    @property
    def pct_drafter(self) -> float:
        return self.drafter_paired / self.drafter_vocab if self.drafter_vocab else float("nan")

    def total_text(self) -> TextCoverage | None:
        """All texts together (None without texts)."""
        if not self.texts:
            return None
        s = lambda f: sum(getattr(t, f) for t in self.texts)  # noqa: E731
        return TextCoverage("all texts", s("chars"), s("target_tokens"), s("partnered"), s("vllm_unk"))

    @classmethod
    def from_dict(cls, d: dict) -> Coverage:
        """Inverse of ``report.to_jsonable`` (computed properties are dropped)."""

        def build(kind, item):
            return kind(**{f.name: item.get(f.name) for f in fields(kind)})

        plain = {f.name: d.get(f.name) for f in fields(cls) if f.name not in ("scripts", "roles", "texts")}
        return cls(
            **plain,
            scripts=tuple(build(ScriptCoverage, x) for x in d.get("scripts") or ()),
            roles=tuple(build(RoleCoverage, x) for x in d.get("roles") or ()),
            texts=tuple(build(TextCoverage, x) for x in d.get("texts") or ()),
        )


# ==== texts ========================================================================================


def default_texts() -> dict[str, str]:
    """The small text set shipped with vocabbridge (Korean and English chat and prose, code): name → text."""
    root = resources.files("vocabbridge") / "data" / "texts"
    return {
        p.name: p.read_text(encoding="utf-8") for p in sorted(root.iterdir(), key=lambda p: p.name) if p.name.endswith(".txt")
    }


# ==== computing =====================================================================================


def _scripts(tm: TokenMap, target: TokenizerView) -> tuple[ScriptCoverage, ...]:
    total = dict.fromkeys(SCRIPTS, 0)
    paired = dict.fromkeys(SCRIPTS, 0)
    t2d, special = tm.target_to_draft, target.special_ids
    for i, b in enumerate(target.tokens[: tm.target.vocab_size]):
        if b is None or i in special:
            continue
        s = script_of(b)
        total[s] += 1
        if t2d[i] >= 0:
            paired[s] += 1
    return tuple(ScriptCoverage(s, total[s], paired[s]) for s in SCRIPTS if total[s])


def _text(view: TokenizerView, i: int | None) -> str | None:
    return None if i is None or i >= view.size else display(view.tokens[i])


def _roles(tm: TokenMap, drafter: TokenizerView, target: TokenizerView) -> tuple[RoleCoverage, ...]:
    rows = []
    for role in ROLE_PRIORITY:
        t, d = target.roles.get(role), drafter.roles.get(role)
        if t is None and d is None:
            continue
        m = None if t is None or t >= len(tm.target_to_draft) or tm.target_to_draft[t] < 0 else int(tm.target_to_draft[t])
        rows.append(RoleCoverage(role, t, _text(target, t), d, _text(drafter, d), m))
    return tuple(rows)


def bridge_lossy(tm: TokenMap, drafter: TokenizerView, target: TokenizerView) -> int:
    """Bridge entries whose drafter ids do not spell the target token's bytes."""
    dt, tt = drafter.tokens, target.tokens
    return sum(1 for t, ids in tm.input_bridge.items() if t < len(tt) and b"".join(dt[i] or b"" for i in ids) != tt[t])


def compute_coverage(
    tm: TokenMap,
    drafter: TokenizerView,
    target: TokenizerView,
    *,
    texts: dict[str, str] | None = None,
    vllm_map: TokenMap | None = None,
    check_bridge: bool = False,
) -> Coverage:
    """Coverage of ``tm``; ``texts`` (name → text) adds the corpus figures. The vLLM-unk share uses
    ``vllm_map`` (built here when ``tm`` is not a vllm map and texts are given)."""
    tm.check(drafter, target)
    t2d = tm.target_to_draft
    has_bytes = np.fromiter((b is not None for b in target.tokens), dtype=bool, count=target.size)
    unpaired = t2d[: target.size] < 0
    roles = _roles(tm, drafter, target)
    text_rows: list[TextCoverage] = []
    if texts:
        if tm.mode == "vllm":
            vllm_map = tm
        elif vllm_map is None:
            vllm_map = build_token_map(
                drafter,
                target,
                mode="vllm",
                drafter_vocab_size=tm.drafter.model_vocab_size,
                target_vocab_size=tm.target.model_vocab_size,
            )
        names = list(texts)
        for name, ids in zip(names, target.encode_batch([texts[n] for n in names])):
            a = np.asarray(ids, dtype=np.int64)
            a = a[a < len(t2d)]
            partnered = int(np.count_nonzero(t2d[a] >= 0))
            unk = int(np.count_nonzero(vllm_map.target_to_draft[a] < 0))
            text_rows.append(TextCoverage(name, len(texts[name]), len(ids), partnered, unk))
    return Coverage(
        mode=tm.mode,
        target_vocab=tm.target.vocab_size,
        drafter_vocab=tm.drafter.vocab_size,
        pairs=tm.pairs,
        drafter_paired=tm.drafter_pairs,
        bridged=int(np.count_nonzero(has_bytes & unpaired)),
        bridge_lossy=bridge_lossy(tm, drafter, target) if check_bridge else None,
        roles_paired=sum(1 for r in roles if r.status == "paired"),
        roles_total=sum(1 for r in roles if r.target_id is not None),
        scripts=_scripts(tm, target),
        roles=roles,
        texts=tuple(text_rows),
    )
