"""Chat prompts: a model's chat template rendered by transformers' own renderer.

>>> render_chat(view, [{"role": "user", "content": "hi"}], enable_thinking=False)  # doctest: +SKIP
'<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n'
"""

from __future__ import annotations

from typing import Any

from .errors import RequestError
from .tokenizer.view import TokenizerView


def render_chat(
    view: TokenizerView, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True, **template_kwargs: Any
) -> str:
    """The prompt text for ``messages``; ``template_kwargs`` reach the template (``enable_thinking``...)."""
    if not view.chat_template:
        raise RequestError(f"{view.source} has no chat template; send a plain completion (/v1/completions, --raw) instead.")
    from transformers.utils.chat_template_utils import render_jinja_template

    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m:
            raise RequestError(f"messages[{i}] must be an object with 'role' and 'content'.")
    try:
        rendered, _ = render_jinja_template(
            [messages], chat_template=view.chat_template, add_generation_prompt=add_generation_prompt, **template_kwargs
        )
    except Exception as e:  # noqa: BLE001 - jinja raises many types; the template's own message is the useful part
        raise RequestError(f"the chat template rejected the messages: {e}") from e
    return rendered[0]


def chat_prompt_ids(view: TokenizerView, messages: list[dict[str, Any]], **template_kwargs: Any) -> list[int]:
    """Token ids of the rendered chat (special tokens in the template become their ids)."""
    return view.encode(render_chat(view, messages, **template_kwargs))
