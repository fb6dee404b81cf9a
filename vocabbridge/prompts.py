"""Prompt suites as JSONL, one prompt per line::

    {"id": "en-chat", "category": "english_chat", "language": "en",
     "messages": [{"role": "user", "content": "..."}], "max_tokens": 200}
    {"id": "q1", "prompt": "Summarize the plot of Hamlet in three sentences."}

A line has ``messages`` or a plain ``prompt`` (one user message). ``category`` (default
``custom``), ``max_tokens`` (the run's ``--max-tokens`` applies otherwise) and ``language`` are
optional.
The built-in suite (``vocabbridge/data/prompts/suite.jsonl``, written for this project) follows the
five categories of the EXAONE speculative-decoding study.

>>> [p.category for p in load_prompts()]
['korean_chat', 'english_chat', 'code_review', 'document_summary', 'code_generation']
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from .errors import PromptFileError

BUILTIN_SUITE = "suite.jsonl"
FIELDS = {"id", "category", "language", "messages", "prompt", "max_tokens"}
ROLES = {"system", "user", "assistant", "developer", "tool"}


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    messages: tuple[dict[str, str], ...]
    language: str = ""
    max_tokens: int | None = None

    @property
    def chars(self) -> int:
        return sum(len(m["content"]) for m in self.messages)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "id": self.id,
            "category": self.category,
            "language": self.language,
            "messages": [dict(m) for m in self.messages],
        }
        if self.max_tokens is not None:
            d["max_tokens"] = self.max_tokens
        return d


def builtin_suite_path() -> Path:
    return Path(str(resources.files("vocabbridge") / "data" / "prompts" / BUILTIN_SUITE))


def load_prompts(path: str | Path | None = None) -> list[Prompt]:
    """Read a JSONL prompt file (the built-in suite when ``path`` is None); blank lines are skipped."""
    path = Path(path) if path is not None else builtin_suite_path()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PromptFileError(f"{path}: no such prompt file; pass a JSONL file (one prompt object per line).") from None
    except (OSError, UnicodeDecodeError) as e:
        raise PromptFileError(f"{path}: cannot read it as UTF-8 text ({e}).") from None
    return parse_prompts(text, source=str(path))


def parse_prompts(text: str, *, source: str = "<prompts>") -> list[Prompt]:
    """Validate every line; the first bad one raises a PromptFileError naming ``source:line``."""
    prompts: list[Prompt] = []
    seen: dict[str, int] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{source}:{n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptFileError(
                f"{where}: not valid JSON ({e.msg} at column {e.colno}); each line must be one JSON object."
            ) from None
        p = _prompt_from_obj(obj, where)
        if p.id in seen:
            raise PromptFileError(f"{where}: id {p.id!r} already used on line {seen[p.id]}; ids must be unique.")
        seen[p.id] = n
        prompts.append(p)
    if not prompts:
        raise PromptFileError(f"{source}: no prompts; write one JSON object per line with id, category and messages.")
    return prompts


def _prompt_from_obj(obj: Any, where: str) -> Prompt:
    if not isinstance(obj, dict):
        raise PromptFileError(f"{where}: expected a JSON object, got {type(obj).__name__}.")
    unknown = sorted(set(obj) - FIELDS)
    if unknown:
        raise PromptFileError(f"{where}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(FIELDS))}.")
    obj = {"category": "custom"} | obj
    for key in ("id", "category"):
        if not isinstance(obj.get(key), str) or not obj[key].strip():
            raise PromptFileError(f"{where}: {key!r} must be a non-empty string.")
    if ("prompt" in obj) == ("messages" in obj):
        raise PromptFileError(f"{where}: give either 'messages' (a list of {{\"role\", \"content\"}}) or 'prompt' (a string).")
    if "prompt" in obj:
        if not isinstance(obj["prompt"], str) or not obj["prompt"].strip():
            raise PromptFileError(f"{where}: 'prompt' must be a non-empty string.")
        obj["messages"] = [{"role": "user", "content": obj.pop("prompt")}]
    language = obj.get("language", "")
    if not isinstance(language, str):
        raise PromptFileError(f'{where}: \'language\' must be a string such as "en" or "ko".')
    messages = obj.get("messages")
    if not isinstance(messages, list) or not messages:
        raise PromptFileError(f'{where}: \'messages\' must be a non-empty list of {{"role", "content"}} objects.')
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or set(m) - {"role", "content"} or not isinstance(m.get("content"), str):
            raise PromptFileError(f"{where}: messages[{i}] must be an object with a string 'role' and a string 'content' only.")
        if m.get("role") not in ROLES:
            raise PromptFileError(f"{where}: messages[{i}].role is {m.get('role')!r}; use one of {', '.join(sorted(ROLES))}.")
    max_tokens = obj.get("max_tokens")
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise PromptFileError(f"{where}: 'max_tokens' must be a positive integer (or left out), got {max_tokens!r}.")
    return Prompt(
        id=obj["id"],
        category=obj["category"],
        messages=tuple(dict(m) for m in messages),
        language=language,
        max_tokens=max_tokens,
    )


def select_prompts(prompts: list[Prompt], *, categories: list[str] | None = None, ids: list[str] | None = None) -> list[Prompt]:
    """The prompts of the given categories / ids, in file order; unknown names raise, listing the known ones."""
    checks = ((categories, {p.category for p in prompts}, "category"), (ids, {p.id for p in prompts}, "prompt id"))
    for wanted, have, what in checks:
        missing = [w for w in wanted or [] if w not in have]
        if missing:
            raise PromptFileError(f"unknown {what} {', '.join(missing)}; the prompts have: {', '.join(sorted(have))}.")
    out = [p for p in prompts if (not categories or p.category in categories) and (not ids or p.id in ids)]
    return out
