"""Training prompts the target writes itself (Magpie): the chat template rendered up to the start
of a user turn, and the model continues it as a user would, until its end-of-turn token.

Three kinds, steered by a system prompt and a few words that open the user's message: Korean
chat, English chat and code. Each candidate is kept only if it ended by itself (not cut at the
token limit), is of a useful length, holds no chat marker (the first 1.5B run on an H200 kept 1,000
of 9,047 that went on with ``<|im_start|>`` turns of their own), is in its kind's language, is new (no repeat after
normalisation, nor of another's opening), and shares no run of eight words with the bench suite
(so no benchmark prompt is trained on). A share of the kept prompts carry a system prompt, as
chats do.

>>> kept = synthesize_prompts(lm, 20000, out=Path("prompts.jsonl"))  # doctest: +SKIP
>>> language_of("파이썬에서 리스트를 정렬하는 방법을 알려주세요"), language_of("How do I sort a list?")
('ko', 'en')
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..chat import render_chat
from ..prompts import Prompt, load_prompts
from ..util import atomic_write_text

SENTINEL = "\u2063VOCABBRIDGE\u2063"  # where the user's text would start in the rendered template

KINDS = ("ko", "en", "code")
CATEGORY = {"ko": "korean_chat", "en": "english_chat", "code": "code_generation"}
STEER = {  # system prompt (used only to write the prompt) and words a user message may open with
    "ko": (
        "당신은 한국어 사용자를 돕는 AI 어시스턴트입니다. 사용자는 항상 한국어로 질문합니다.",
        ["", "", "안녕하세요, ", "혹시 ", "파이썬으로 ", "다음 ", "요즘 ", "회사에서 ", "한국의 ", "어떻게 "],
    ),
    "en": (
        "You are a helpful assistant. Users ask about everyday life, science, writing, history and work.",
        ["", "", "Can you ", "I need ", "What ", "How ", "Write ", "Explain ", "Why ", "Give me "],
    ),
    "code": (
        "You are an expert programming assistant. Users ask you to write, explain, review or fix code.",
        ["", "", "Write a Python function ", "In JavaScript, ", "Fix this code:\n", "How do I ", "Implement ", "SQL: "],
    ),
}
SYSTEM_PROMPTS = {  # carried by a share of the kept prompts (the answer is generated with them)
    "ko": ["당신은 친절하고 정확한 AI 어시스턴트입니다.", "간결하게 답하세요."],
    "en": ["You are a helpful, concise assistant.", "Answer clearly and briefly."],
    "code": ["You are a senior software engineer. Answer with working code.", "Explain your code briefly."],
}
CODE_HINTS = re.compile(
    r"```|\bdef |\bclass |\bfunction\b|\breturn\b|\bSELECT\b|#include|\bimport\b|\bconst\b|=>|\bcode\b|\bPython\b|"
    r"\bJavaScript\b|\bTypeScript\b|\bJava\b|\bC\+\+|\bRust\b|\bGo\b|\bSQL\b|\bbash\b|\bAPI\b|\bregex\b|코드|함수",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Filter:
    min_chars: int = 12
    max_chars: int = 1500
    shingle: int = 8  # words per run shared with the bench suite that disqualify a prompt


def language_of(text: str) -> str:
    """``ko`` when Hangul makes up at least 30 % of the letters, ``en`` when the letters are Latin, else ``other``."""
    letters = [c for c in text if c.isalpha()]
    if not letters:
        return "other"
    hangul = sum("\uac00" <= c <= "\ud7a3" or "\u3131" <= c <= "\u318e" for c in letters)
    if hangul >= 0.3 * len(letters):
        return "ko"
    latin = sum(c.isascii() for c in letters)
    return "en" if latin >= 0.9 * len(letters) else "other"


def fits_kind(text: str, kind: str) -> bool:
    lang = language_of(text)
    if kind == "code":
        return lang in ("en", "ko") and bool(CODE_HINTS.search(text))
    return lang == kind


def _norm(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def _shingles(text: str, n: int) -> set[str]:
    words = _norm(text).split()
    return {" ".join(words[i : i + n]) for i in range(max(1, len(words) - n + 1))} if words else set()


class Keeper:
    """Decides which candidates are kept: filters, de-duplication, disjointness from the bench suite."""

    def __init__(self, flt: Filter, bench: list[Prompt], kept: list[Prompt] = (), specials: tuple[str, ...] = ()):
        self.flt = flt
        self.specials = tuple(s for s in specials if s)  # chat markers a user's text never holds
        self.bench = set().union(*(_shingles(m["content"], flt.shingle) for p in bench for m in p.messages)) if bench else set()
        self.seen: set[str] = set()
        self.openings: set[str] = set()
        self.rejected: dict[str, int] = {}
        for p in kept:
            self._remember(p.messages[-1]["content"])

    def _remember(self, text: str) -> None:
        norm = _norm(text)
        self.seen.add(hashlib.sha1(norm.encode()).hexdigest())
        self.openings.add(norm[:60])

    def _reject(self, why: str) -> bool:
        self.rejected[why] = self.rejected.get(why, 0) + 1
        return False

    def keep(self, text: str, kind: str, *, finished: bool) -> bool:
        text = text.strip()
        if not finished:
            return self._reject("cut at the token limit")
        if not self.flt.min_chars <= len(text) <= self.flt.max_chars:
            return self._reject("length")
        if any(s in text for s in self.specials):
            return self._reject("holds special tokens")
        if not fits_kind(text, kind):
            return self._reject("language or kind")
        norm = _norm(text)
        if hashlib.sha1(norm.encode()).hexdigest() in self.seen or norm[:60] in self.openings:
            return self._reject("duplicate")
        if self.bench and _shingles(text, self.flt.shingle) & self.bench:
            return self._reject("overlaps the bench suite")
        self._remember(text)
        return True


def user_turn_prefix(view, kind: str) -> str:
    """The chat template rendered up to where the user's message starts, with the kind's steering
    system prompt (or without one, where the template refuses system messages)."""
    system = STEER[kind][0]
    for messages in ([{"role": "system", "content": system}], []):
        try:
            text = render_chat(view, [*messages, {"role": "user", "content": SENTINEL}], add_generation_prompt=False)
        except Exception:  # noqa: BLE001 - a template without system turns: try without
            continue
        if SENTINEL in text:
            return text[: text.index(SENTINEL)]
    raise ValueError(f"{view.source}: could not find where a user message starts in the chat template")


def read_kept(path: Path) -> list[Prompt]:
    return load_prompts(path) if path.is_file() and path.stat().st_size else []


@torch.inference_mode()
def synthesize_prompts(
    model,
    view,
    n: int,
    *,
    out: Path,
    batch: int = 256,
    max_tokens: int = 160,
    temperature: float = 1.0,
    top_p: float = 0.98,
    system_share: float = 0.3,
    seed: int = 0,
    flt: Filter = Filter(),
    kinds: tuple[str, ...] = KINDS,
    progress: Callable[[int, dict], None] | None = None,
    deadline: float | None = None,
    give_up: int = 4,
) -> tuple[list[Prompt], dict]:
    """Write ``n`` prompts the target writes itself to ``out`` (JSONL, the bench's prompt format),
    the ``kinds`` in turn (the one furthest behind next); resumes from what ``out`` holds. A kind
    that yields nothing ``give_up`` rounds in a row is dropped (a small English model writes no
    Korean). Returns the prompts and statistics."""
    out.parent.mkdir(parents=True, exist_ok=True)
    kept = read_kept(out)
    keeper = Keeper(flt, load_prompts(), kept, specials=tuple(a.content for a in view.added if a.special))
    roles = view.roles
    stops = sorted({roles[r] for r in ("eos", "end_of_turn") if r in roles})
    pad = roles.get("pad", stops[0] if stops else 0)
    dev = model.get_input_embeddings().weight.device
    rng = random.Random(seed + len(kept))
    counts = {k: sum(p.id.startswith(f"magpie-{k}-") for p in kept) for k in KINDS}
    live, empty, dropped = list(kinds), dict.fromkeys(kinds, 0), []
    t0, candidates, rounds = time.perf_counter(), 0, 0
    while len(kept) < n and live and (deadline is None or time.perf_counter() < deadline):
        kind = min(live, key=lambda k: (counts[k], KINDS.index(k)))  # the kind furthest behind
        prefix = user_turn_prefix(view, kind)
        openers = [rng.choice(STEER[kind][1]) for _ in range(batch)]
        rows = [view.encode(prefix + o) for o in openers]
        width = max(len(r) for r in rows)
        ids = torch.full((batch, width), pad, dtype=torch.long)
        mask = torch.zeros((batch, width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, width - len(r) :] = torch.tensor(r)
            mask[i, width - len(r) :] = 1
        torch.manual_seed(seed * 1_000_003 + rounds)
        gen = model.generate(
            input_ids=ids.to(dev),
            attention_mask=mask.to(dev),
            max_new_tokens=max_tokens,
            do_sample=True,
            temperature=temperature,
            top_p=top_p,
            top_k=None,
            eos_token_id=stops or None,
            pad_token_id=pad,
        )
        rounds += 1
        new = []
        for opener, g in zip(openers, gen[:, width:].tolist()):
            candidates += 1
            cut = next((i for i, x in enumerate(g) if x in stops), None)
            text = opener + view.decode_bytes(g[: cut if cut is not None else len(g)]).decode("utf-8", errors="replace")
            if not keeper.keep(text, kind, finished=cut is not None):
                continue
            messages = [{"role": "user", "content": text.strip()}]
            if rng.random() < system_share:
                messages.insert(0, {"role": "system", "content": rng.choice(SYSTEM_PROMPTS[kind])})
            p = Prompt(
                f"magpie-{kind}-{counts[kind]:06d}", CATEGORY[kind], tuple(messages), language=kind if kind != "code" else "en"
            )
            counts[kind] += 1
            new.append(p)
            if len(kept) + len(new) >= n:
                break
        empty[kind] = 0 if new else empty[kind] + 1
        if empty[kind] >= give_up:
            live.remove(kind)
            dropped.append(kind)
        kept += new
        with out.open("a", encoding="utf-8") as f:
            f.writelines(json.dumps(p.to_dict(), ensure_ascii=False) + "\n" for p in new)
        if progress:
            progress(len(new), {"kind": kind, "kept": len(kept), "candidates": candidates})
    stats = {
        "kept": len(kept),
        "by_kind": counts,
        "candidates_this_run": candidates,
        "rejected_this_run": keeper.rejected,
        "kinds_dropped": dropped,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    atomic_write_text(out.with_suffix(".stats.json"), json.dumps(stats, indent=1, ensure_ascii=False) + "\n")
    return kept[:n], stats
