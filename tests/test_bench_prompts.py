"""The built-in prompt suite and the validation of a user's own prompt file."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from vocabbridge.cli import main
from vocabbridge.errors import PromptFileError
from vocabbridge.prompts import load_prompts, parse_prompts, select_prompts

from .conftest import shared_tokenizer

GOOD = {"id": "a", "category": "chat", "language": "en", "messages": [{"role": "user", "content": "hi"}]}


def test_builtin_suite_has_the_five_categories_of_the_study():
    ps = load_prompts()
    assert [p.category for p in ps] == ["korean_chat", "english_chat", "code_review", "document_summary", "code_generation"]
    assert [p.language for p in ps] == ["ko", "en", "en", "en", "en"]
    assert all(p.messages[-1]["role"] == "user" for p in ps)


def test_builtin_long_prompts_are_really_long_by_the_qwen_tokenizer():
    from vocabbridge.chat import chat_prompt_ids
    from vocabbridge.tokenizer import load_tokenizer

    view = load_tokenizer(shared_tokenizer("qwen3"))
    n = {p.category: len(chat_prompt_ids(view, [dict(m) for m in p.messages], enable_thinking=False)) for p in load_prompts()}
    assert 1400 <= n["code_review"] <= 1800  # ~1.6k
    assert 9000 <= n["document_summary"] <= 11000  # ~10k
    assert all(n[c] < 400 for c in ("korean_chat", "english_chat", "code_generation"))


def test_select_by_category_and_id():
    ps = load_prompts()
    assert [p.id for p in select_prompts(ps, categories=["korean_chat", "code_generation"])] == ["ko-chat", "code-gen"]
    assert [p.id for p in select_prompts(ps, ids=["en-chat"])] == ["en-chat"]
    with pytest.raises(PromptFileError, match="unknown category poetry; the prompts have: code_generation"):
        select_prompts(ps, categories=["poetry"])


def _lines(*objs) -> str:
    return "".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs)


@pytest.mark.parametrize(
    "bad, message",
    [
        ("{not json", r"p\.jsonl:2: not valid JSON"),
        ([1, 2], r"p\.jsonl:2: expected a JSON object, got list"),
        ({**GOOD, "id": ""}, r"p\.jsonl:2: 'id' must be a non-empty string"),
        ({**GOOD, "category": ""}, r"p\.jsonl:2: 'category' must be a non-empty string"),
        (
            {**GOOD, "max_token": 5},
            r"p\.jsonl:2: unknown field\(s\) max_token; allowed: category, id, language, max_tokens, messages, prompt",
        ),
        ({**GOOD, "prompt": "hi"}, r"p\.jsonl:2: give either 'messages' .* or 'prompt'"),
        ({"id": "b", "prompt": 3}, r"p\.jsonl:2: 'prompt' must be a non-empty string"),
        ({**GOOD, "messages": []}, r"p\.jsonl:2: 'messages' must be a non-empty list"),
        ({**GOOD, "messages": [{"role": "robot", "content": "x"}]}, r"p\.jsonl:2: messages\[0\]\.role is 'robot'"),
        ({**GOOD, "messages": [{"role": "user", "content": 3}]}, r"p\.jsonl:2: messages\[0\] must be an object"),
        ({**GOOD, "max_tokens": 0}, r"p\.jsonl:2: 'max_tokens' must be a positive integer"),
        ({**GOOD, "max_tokens": True}, r"p\.jsonl:2: 'max_tokens' must be a positive integer"),
        (GOOD, r"p\.jsonl:2: id 'a' already used on line 1"),
    ],
)
def test_a_bad_line_is_named(tmp_path, bad, message):
    f = tmp_path / "p.jsonl"
    f.write_text(_lines(GOOD, bad), encoding="utf-8")
    with pytest.raises(PromptFileError, match=message):
        load_prompts(f)


def test_blank_lines_are_skipped_and_max_tokens_kept():
    ps = parse_prompts(_lines(GOOD, "", {**GOOD, "id": "b", "max_tokens": 7}))
    assert [(p.id, p.max_tokens) for p in ps] == [("a", None), ("b", 7)]


def test_empty_and_missing_files(tmp_path):
    (tmp_path / "e.jsonl").write_text("\n\n", encoding="utf-8")
    with pytest.raises(PromptFileError, match="no prompts"):
        load_prompts(tmp_path / "e.jsonl")
    with pytest.raises(PromptFileError, match="no such prompt file"):
        load_prompts(tmp_path / "missing.jsonl")


def test_cli_shows_a_bad_prompt_file_as_one_line(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(_lines(GOOD, {**GOOD, "id": "b", "messages": "hi"}), encoding="utf-8")
    r = CliRunner().invoke(main, ["bench", "--url", "http://127.0.0.1:9", "--prompts", str(f)])
    assert r.exit_code == 1
    assert r.output.strip() == f'Error: {f}:2: \'messages\' must be a non-empty list of {{"role", "content"}} objects.'


def test_plain_prompt_lines_are_one_user_message():
    (p,) = parse_prompts(json.dumps({"id": "q1", "prompt": "Summarize Hamlet."}))
    assert p.messages == ({"role": "user", "content": "Summarize Hamlet."},) and p.category == "custom"
