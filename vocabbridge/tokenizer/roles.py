"""Find what each added/special token is *for*: bos, eos, pad, unk, end-of-turn, role headers...

Evidence, strongest first:

1. ``config``: the tokenizer config (``bos_token``, ``eos_token``, ...) or GGUF metadata ids;
2. ``chat_template``: the chat template rendered on sentinel messages; the special token right
   after an assistant message is the end-of-turn marker, the ones before each message are the
   start-of-turn marker and the role headers;
3. ``name``: a short table of well-known token names (``<think>``, ``<|fim_prefix|>``, ...),
   used only for roles the first two did not settle.

>>> roles = detect_roles([(0, "<s>"), (1, "</s>"), (2, "<|eot|>")],
...                      config={"bos_token": "<s>", "eos_token": "</s>"},
...                      chat_template="{% for m in messages %}{{ m['content'] }}<|eot|>{% endfor %}")
>>> roles.ids["end_of_turn"], roles.evidence["end_of_turn"]
(2, 'chat_template')
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROLE_ORDER = (
    "bos",
    "eos",
    "pad",
    "unk",
    "end_of_turn",
    "start_of_turn",
    "end_of_header",
    "role:system",
    "role:user",
    "role:assistant",
    "think_start",
    "think_end",
    "tool_call_start",
    "tool_call_end",
    "fim_prefix",
    "fim_middle",
    "fim_suffix",
    "fim_pad",
)

# Names are compared after lower-casing and dropping the usual bracket characters.
_NAME_ROLES = {
    "endofturn": "end_of_turn",
    "eotid": "end_of_turn",
    "imend": "end_of_turn",
    "end": "end_of_turn",
    "eot": "end_of_turn",
    "startofturn": "start_of_turn",
    "imstart": "start_of_turn",
    "think": "think_start",
    "/think": "think_end",
    "toolcall": "tool_call_start",
    "/toolcall": "tool_call_end",
    "fimprefix": "fim_prefix",
    "fimmiddle": "fim_middle",
    "fimsuffix": "fim_suffix",
    "fimpad": "fim_pad",
    "fimbegin": "fim_prefix",
    "fimhole": "fim_middle",
    "fimend": "fim_suffix",
    "bos": "bos",
    "s": "bos",
    "beginoftext": "bos",
    "beginofsentence": "bos",
    "eos": "eos",
    "/s": "eos",
    "endoftext": "eos",
    "endofsentence": "eos",
    "pad": "pad",
    "unk": "unk",
}
_STRIP = re.compile(r"[<>|\[\]｜▁_\s-]")

_SENTINELS = {
    "system": "VBSENTINELSYS",
    "user1": "VBSENTINELUSERA",
    "assistant": "VBSENTINELASST",
    "user2": "VBSENTINELUSERB",
}


@dataclass(frozen=True)
class Roles:
    """role → token id, and for each role where the answer came from."""

    ids: dict[str, int] = field(default_factory=dict)
    evidence: dict[str, str] = field(default_factory=dict)


def _token_content(v: Any) -> str | None:
    if isinstance(v, str):
        return v
    if isinstance(v, dict):
        return v.get("content")
    return None


def _render_template(template: str, config: dict) -> str | None:
    """Render ``template`` on sentinel messages; None when it cannot be rendered."""

    def raise_exception(msg):
        raise ValueError(msg)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: "1 Jan 2026"
    env.filters.setdefault("tojson", lambda x, **kw: __import__("json").dumps(x))
    messages = [
        {"role": "system", "content": _SENTINELS["system"]},
        {"role": "user", "content": _SENTINELS["user1"]},
        {"role": "assistant", "content": _SENTINELS["assistant"]},
        {"role": "user", "content": _SENTINELS["user2"]},
    ]
    kwargs = {k: _token_content(config.get(k)) or "" for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
    try:
        return env.from_string(template).render(messages=messages, add_generation_prompt=True, **kwargs)
    except Exception:  # noqa: BLE001 - any template failure just means "no template evidence"
        return None


def _specials_in(text: str, pattern: re.Pattern | None) -> list[str]:
    return pattern.findall(text) if pattern else []


def _from_template(rendered: str, contents: list[str]) -> dict[str, str]:
    """role → token content, read off a rendered conversation."""
    pos = {k: rendered.find(v) for k, v in _SENTINELS.items()}
    if pos["assistant"] < 0 or pos["user1"] < 0 or pos["user2"] < 0:
        return {}
    alts = sorted((c for c in contents if c), key=len, reverse=True)
    pattern = re.compile("|".join(re.escape(c) for c in alts)) if alts else None
    end = {k: p + len(_SENTINELS[k]) for k, p in pos.items()}
    out: dict[str, str] = {}
    after_asst = _specials_in(rendered[end["assistant"] : pos["user2"]], pattern)
    if not after_asst:
        return out
    out["end_of_turn"] = after_asst[0]
    # The segment that opens a message: from the previous message's end-of-turn to its content.
    seg_user = _specials_in(rendered[end["assistant"] : pos["user2"]], pattern)[1:]
    seg_asst = _specials_in(rendered[end["user1"] : pos["assistant"]], pattern)
    if seg_asst and seg_asst[0] == out["end_of_turn"]:
        seg_asst = seg_asst[1:]
    sys_start = 0 if pos["system"] < 0 else pos["system"]
    seg_sys = _specials_in(rendered[:sys_start], pattern) if pos["system"] >= 0 else []
    common = [c for c in seg_user if c in seg_asst]
    if common:
        out["start_of_turn"] = common[0]
        if len(common) > 1:
            out["end_of_header"] = common[-1]
    for role, seg, other in (("role:user", seg_user, seg_asst), ("role:assistant", seg_asst, seg_user)):
        own = [c for c in seg if c not in other]
        if len(own) == 1:
            out[role] = own[0]
    own_sys = [c for c in seg_sys if c not in seg_user and c not in seg_asst]
    if own_sys:
        out["role:system"] = own_sys[-1]
    return out


def _name_role(content: str) -> str | None:
    key = _STRIP.sub("", content.lower())
    return _NAME_ROLES.get(key)


def detect_roles(
    added: list[tuple[int, str]],
    *,
    config: dict | None = None,
    chat_template: str | None = None,
    config_ids: dict[str, int] | None = None,
) -> Roles:
    """Assign roles to added tokens. ``added`` is ``[(id, content), ...]``.

    ``config`` is a tokenizer_config-like dict; ``config_ids`` maps roles straight to ids
    (GGUF metadata, generation_config); both count as ``config`` evidence.
    """
    config = config or {}
    by_content: dict[str, int] = {}
    for tid, content in added:
        by_content.setdefault(content, tid)
    ids: dict[str, int] = {}
    evidence: dict[str, str] = {}

    def put(role: str, tid: int | None, how: str) -> None:
        if tid is not None and role not in ids:
            ids[role] = tid
            evidence[role] = how

    for role in ("bos", "eos", "pad", "unk"):
        content = _token_content(config.get(f"{role}_token"))
        if content is not None:
            put(role, by_content.get(content), "config")
    for role, tid in (config_ids or {}).items():
        put(role, tid, "config")

    if chat_template:
        rendered = _render_template(chat_template, config)
        if rendered:
            for role, content in _from_template(rendered, list(by_content)).items():
                tid = by_content.get(content)
                # The system segment starts with bos in many templates: bos is not a header.
                if role.startswith("role:") and tid in (ids.get("bos"), ids.get("eos")):
                    continue
                put(role, tid, "chat_template")

    for tid, content in added:
        role = _name_role(content)
        if role:
            put(role, tid, "name")
    ordered = {r: ids[r] for r in ROLE_ORDER if r in ids}
    return Roles(ids=ordered, evidence={r: evidence[r] for r in ordered})
