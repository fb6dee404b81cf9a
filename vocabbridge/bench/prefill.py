"""Fake-think prefill: the assistant turn sent already started with a short, closed think block.

The EXAONE study brought MTP acceptance back in non-thinking mode this way: the request ends with
``{"role": "assistant", "content": BLOCK}`` and ``continue_final_message: true,
add_generation_prompt: false`` (vLLM's chat extension; ``vocabbridge serve`` has it too), so the
model continues after ``</think>`` as it would after thinking. A ``--prefill-think`` value is
``match`` (the built-in block in the prompt's own language), a key of :data:`THINK_BLOCKS`
(that block for every prompt), or the literal text to prefill (``\\n``, ``\\t`` and ``\\\\`` are
escapes, for shells).

>>> prefill_text("match", "ko") == THINK_BLOCKS["ko"]
True
>>> prefill_text("en", "ko") == THINK_BLOCKS["en"]
True
>>> prefill_text(r"<think>\\nOK.\\n</think>\\n\\n", "en")
'<think>\\nOK.\\n</think>\\n\\n'
"""

from __future__ import annotations

import re

from ..errors import BenchError

# The built-in blocks, by prompt language (a prompt's ``language``, its primary subtag: "ko-KR" → "ko").
# Short and closed, in the Qwen3 / EXAONE 4 format: the think tags on their own lines, a blank line after.
THINK_BLOCKS: dict[str, str] = {
    "en": "<think>\nThe user wants a direct answer. I will answer now.\n</think>\n\n",
    "ko": "<think>\n사용자가 바로 답을 원합니다. 이제 답하겠습니다.\n</think>\n\n",
}
DEFAULT_LANGUAGE = "en"  # for prompts in other languages, or with none given
MATCH = "match"  # the block in the prompt's own language
PLAIN = "plain"  # how reports name the requests sent without a prefill (never a value)

_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def decode_escapes(text: str) -> str:
    r"""``\n``, ``\t`` and ``\\`` as the characters they stand for; other backslashes stay.

    >>> decode_escapes(r"a\nb\\n\d")
    'a\nb\\n\\d'
    """
    return re.sub(r"\\([nt\\])", lambda m: _ESCAPES[m.group(1)], text)


def block_for_language(language: str) -> str:
    """The built-in block for a prompt's language (English when there is none for it)."""
    primary = language.strip().lower().replace("_", "-").split("-")[0]
    return THINK_BLOCKS.get(primary, THINK_BLOCKS[DEFAULT_LANGUAGE])


def prefill_text(variant: str, language: str) -> str:
    """The assistant text a ``--prefill-think`` value sends for a prompt in ``language``."""
    if variant == MATCH:
        return block_for_language(language)
    if variant in THINK_BLOCKS:
        return THINK_BLOCKS[variant]
    return decode_escapes(variant)


def check_variants(values: tuple[str, ...]) -> None:
    """Refuse what would make an unreadable comparison: empty text, ``plain``, the same value twice."""
    if isinstance(values, str):
        raise BenchError(f"prefill_think takes a tuple of values, e.g. ({values!r},), not a string.")
    seen = set()
    for v in values:
        if not isinstance(v, str) or not decode_escapes(v).strip():
            raise BenchError(
                f"--prefill-think {v!r}: give {MATCH}, {', '.join(THINK_BLOCKS)} or the text to prefill, "
                r"e.g. '<think>\nI will answer now.\n</think>\n\n'."
            )
        if v == PLAIN:
            raise BenchError(f"--prefill-think {PLAIN}: requests without a prefill always run; leave it out.")
        if v in seen:
            raise BenchError(f"--prefill-think {v!r} is given twice; give each variant once.")
        seen.add(v)


def variant_label(variant: str | None) -> str:
    """How tables name a variant: ``plain`` for none."""
    return PLAIN if variant is None else variant
