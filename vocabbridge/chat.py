"""Chat prompts: a model's chat template rendered by transformers' own renderer.

>>> render_chat(view, [{"role": "user", "content": "hi"}], enable_thinking=False)  # doctest: +SKIP
'<|im_start|>user\\nhi<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n'
"""

from __future__ import annotations

from typing import Any

from .errors import RequestError
from .tokenizer.view import TokenizerView


def render_chat(
    view: TokenizerView,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    **template_kwargs: Any,
) -> str:
    """The prompt text for ``messages``; ``template_kwargs`` reach the template (``enable_thinking``...).

    ``continue_final_message`` (vLLM's and transformers' option) ends the prompt inside the last
    message, an assistant turn, so the model continues its text instead of starting a new turn;
    it needs ``add_generation_prompt=False``.
    """
    if not view.chat_template:
        raise RequestError(f"{view.source} has no chat template; send a plain completion (/v1/completions, --raw) instead.")
    from transformers.utils.chat_template_utils import render_jinja_template

    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m:
            raise RequestError(f"messages[{i}] must be an object with 'role' and 'content'.")
    if continue_final_message:
        if add_generation_prompt:
            raise RequestError(
                "continue_final_message cannot be combined with add_generation_prompt; pass add_generation_prompt=False."
            )
        if not messages or messages[-1]["role"] != "assistant":
            role = messages[-1]["role"] if messages else "none"
            raise RequestError(
                f"continue_final_message continues the last message, which must be the assistant's (got {role!r}); "
                'end the messages with {"role": "assistant", "content": TEXT}.'
            )
    try:
        rendered, _ = render_jinja_template(
            [messages],
            chat_template=view.chat_template,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            **template_kwargs,
        )
    except Exception as e:  # noqa: BLE001 - jinja raises many types; the template's own message is the useful part
        raise RequestError(f"the chat template rejected the messages: {e}") from e
    return rendered[0]


def chat_prompt_ids(view: TokenizerView, messages: list[dict[str, Any]], **template_kwargs: Any) -> list[int]:
    """Token ids of the rendered chat (special tokens in the template become their ids)."""
    return view.encode(render_chat(view, messages, **template_kwargs))
