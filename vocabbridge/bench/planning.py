r"""Does an answer start with planning notes instead of the answer?

The side effect the EXAONE study saw with a prefilled think block: the model, told it had
finished thinking, sometimes went on thinking in the answer ("Okay, the user wants…"). This is
a heuristic on the first words, not a classifier; it flags:

- a think tag anywhere in the answer (``<think>`` or ``</think>``: the block was reopened or
  closed again);
- an English answer whose first clause, after optional interjections (okay, ok, so, well, right,
  hmm), talks about the request or the writer's plan: "the user is asking / wants / 's request…",
  "the question asks", "let me…", "let's see / think / tackle / break…", "I need to", "I should",
  "I'll start by", "first, I need / I'll / let me", "we need to", "we have to"; and "Alright,"
  or "Hmm" as the first word, which is how thinking-mode text opens (an answer can start
  "Alright, here is…" too: such an answer is counted, a known false positive);
- a Korean answer that, after optional "알겠습니다." / "네," / "좋아요,", starts with the user as
  the subject ("사용자가", "사용자는", "사용자의"), with "먼저" / "우선" and a "…하겠" / "…보겠"
  plan in the same sentence, or with the request as the topic ("요청은", "이 질문을", "요청한").

Not flagged: answers that address the reader ("You could…", "요청하신 코스는…"), that open with
"Okay, here is…" or "First, preheat…", and code.

>>> starts_with_planning("Okay, the user wants a plan for the chores. Let me think.")
True
>>> starts_with_planning("Here is a fair way to split the chores:\n\n1. ...")
False
>>> starts_with_planning("사용자가 서울 근교 나들이를 원합니다. 먼저 코스를 정리하겠습니다.")
True
>>> starts_with_planning("토요일 당일치기라면 수원 화성을 추천합니다.")
False
"""

from __future__ import annotations

import re

# English: interjections, then what the writer plans or what the user wants.
_EN_LEAD = r"(?:(?:okay|ok|so|well|right|hmm+)[,.!]?\s+)*"
_EN_PLAN = (
    r"(?:the user(?:'s\s+(?:question|request|message|query|prompt)"
    r"|\s+(?:is|was|wants|wanted|asks|asked|has|had|needs|would|seems|might|may|mentioned|says|said|wrote|provided|shared"
    r"|requests|requested)\b)"
    r"|the question (?:is )?ask"
    r"|let me\b"
    r"|let's (?:see|think|figure|tackle|start|break|analy[sz]e|look|work|consider)\b"
    r"|i need to\b|i should\b|i(?: will|'ll) (?:start|begin) by\b|i'm going to (?:start|begin)\b"
    r"|first,? (?:i(?: need| should| must| have to| will|'ll|'m going to)\b|let me\b|we need to\b)"
    r"|we need to\b|we have to\b"
    r"|alright\b|all right,|hmm+\b)"
)
# Korean: an acknowledgement, then the user as the subject, a plan with 먼저/우선, or the request as the topic.
_KO_LEAD = r"(?:(?:알겠습니다|알겠어요|좋아요|좋습니다|좋아|네|음+)[.!,]?\s*)*"
_KO_PLAN = (
    r"(?:사용자(?:가|는|의|께서)"
    r"|(?:먼저|우선)[^.!?\n]{0,40}?(?:하겠|보겠)"
    r"|(?:이번\s*|이\s*)?(?:요청|질문)(?:은|을|이|한|했))"
)
_PLANNING = re.compile(rf"(?:{_EN_LEAD}{_EN_PLAN}|{_KO_LEAD}{_KO_PLAN})", re.IGNORECASE)
_THINK_TAG = re.compile(r"</?think>")


def starts_with_planning(text: str) -> bool:
    """True when ``text`` starts with planning or meta talk (see the module's docstring), or holds a think tag.

    >>> starts_with_planning("I need to explain how a token bucket works first.")
    True
    >>> starts_with_planning("**Alright, let's break this down.**")
    True
    >>> starts_with_planning("알겠습니다. 이 요청은 부모님과의 당일치기 코스 추천입니다.")
    True
    >>> starts_with_planning("알겠습니다! 요청하신 코스를 추천해 드릴게요.")
    False
    >>> starts_with_planning("First, preheat the oven.")
    False
    >>> starts_with_planning("The answer is 42.</think>\\n\\nThe answer is 42.")
    True
    """
    if _THINK_TAG.search(text):
        return True
    head = text.lstrip(" \t\r\n*#>_\"'“‘").replace("’", "'")
    return _PLANNING.match(head) is not None


def answer_text(text: str, reasoning: str = "", *, thinking: bool | None = None, prefilled: bool = False) -> str | None:
    """The part of a completion that should be the answer, or None when there is none to judge.

    ``text`` is the message content, ``reasoning`` the ``reasoning_content`` a server split off.

    - prefilled (the think block was in the request): the content; or the reasoning when the
      content is empty, because a reasoning parser that never saw ``</think>`` (it was in the
      prefill) files the whole continuation as reasoning;
    - thinking off: the content;
    - thinking on or the model's default: what follows the model's own think block. A server that
      split the reasoning off sent the answer alone; otherwise the answer starts after the first
      ``</think>``, and with none the model was still thinking when it stopped (None), unless it
      never opened one in the model's default mode.

    >>> answer_text("<think>\\nhmm\\n</think>\\n\\nParis.", thinking=True)
    '\\n\\nParis.'
    >>> answer_text("Okay, the user", thinking=True) is None  # cut off while thinking
    True
    >>> answer_text("", "Okay, the user wants…", prefilled=True)
    'Okay, the user wants…'
    """
    if prefilled:
        out = text if text.strip() else reasoning
    elif thinking is False or reasoning:
        out = text
    else:
        _, closed, after = text.partition("</think>")
        if closed:
            out = after
        elif thinking or text.lstrip().startswith("<think>"):
            return None
        else:
            out = text
    return out if out.strip() else None
