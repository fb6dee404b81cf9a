"""The OpenAI wire format: request models (pydantic), their checks, and the response bodies.

Requests are parsed strictly (``"max_tokens": "5"`` is a type error, as in OpenAI's API); fields
this server does not know are ignored, fields it knows but cannot honour (``n > 1``, ``logprobs``,
``tools``...) are refused with a message saying so. vLLM's extensions are accepted where the
embedded engine has them: ``top_k``, ``stop_token_ids``, ``ignore_eos``, ``skip_special_tokens``,
``include_stop_str_in_output``, ``chat_template_kwargs``, ``return_token_ids``, ``add_generation_prompt``,
``continue_final_message``.

>>> r = parse_request(CompletionRequest, b'{"prompt": "hi", "max_tokens": 4}')
>>> (r.prompt, r.max_tokens, r.n)
('hi', 4, 1)
>>> parse_request(CompletionRequest, b'{"prompt": "hi", "max_tokens": "4"}')
Traceback (most recent call last):
...
vocabbridge.server.openai_api.ApiError: max_tokens: Input should be a valid integer
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

# ==== errors =============================================================================


class ApiError(Exception):
    """An error answered as OpenAI's ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers  # sent with the answer (Retry-After on a 429)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def parse_request(model: type[BaseModel], raw: bytes) -> Any:
    """Validate a JSON body; a malformed body or a bad field → ApiError 400 naming the field."""
    try:
        return model.model_validate_json(raw or b"")
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        if err["type"] == "json_invalid":
            raise ApiError(400, f"malformed JSON body: {err['msg']}; send a JSON object.", code="json_invalid") from None
        if err["type"] == "model_type" or not err["loc"]:
            raise ApiError(400, "the body must be a JSON object.", code="invalid_type") from None
        param = ".".join(str(p) for p in err["loc"] if _is_field(p))
        code = "missing_required_parameter" if err["type"] == "missing" else "invalid_type"
        raise ApiError(400, f"{param}: {err['msg']}", param=param or None, code=code) from None


_TYPE_NAMES = {"str", "int", "float", "bool", "dict", "list", "none", "json-or-python"}


def _is_field(p) -> bool:
    """Path items of a validation error that name fields or indexes (not union members)."""
    return isinstance(p, int) or (p.isidentifier() and p not in _TYPE_NAMES)


# ==== requests ===========================================================================


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool = False


class _Sampling(BaseModel):
    """Fields both endpoints share."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    temperature: float | None = None  # None → 1.0, as in OpenAI's API
    top_p: float | None = None
    top_k: int | None = None  # vLLM extension; -1 or 0 = off
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None  # vLLM extension
    ignore_eos: bool = False  # vLLM extension
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    return_token_ids: bool = False  # vLLM extension: prompt_token_ids and token_ids in the answer
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        """(param, why) for options given but not honoured; the endpoints refuse them."""
        out = []
        if self.presence_penalty or self.frequency_penalty:
            out.append(("presence_penalty" if self.presence_penalty else "frequency_penalty", "penalties are not supported"))
        if self.repetition_penalty not in (None, 1.0):
            out.append(("repetition_penalty", "penalties are not supported"))
        if self.logit_bias:
            out.append(("logit_bias", "logit_bias is not supported"))
        return out


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = 16  # OpenAI's (and vLLM's) default for completions
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        out = super().unsupported()
        if self.echo:
            out.append(("echo", "echo is not supported; prepend the prompt yourself"))
        if self.logprobs is not None:
            out.append(("logprobs", "logprobs are not supported"))
        if self.best_of not in (None, 1):
            out.append(("best_of", "best_of must be 1"))
        if self.suffix:
            out.append(("suffix", "suffix (insertion) is not supported"))
        return out


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)  # name, tool_calls... reach the template
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]  # OpenAI's roles
    content: str | list[ContentPart] | None = None

    def for_template(self, i: int) -> dict:
        """The message as the chat template sees it (text parts joined, as vLLM's "string" format)."""
        msg = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            bad = [p.type for p in self.content if p.type != "text"]
            if bad:
                raise ApiError(
                    400, f"messages[{i}].content: only text parts are supported, got {bad[0]!r}.", param=f"messages.{i}.content"
                )
            msg["content"] = "\n".join(p.text or "" for p in self.content)
        return msg


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None  # None → the rest of the context, as vLLM
    max_completion_tokens: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True  # vLLM extension
    continue_final_message: bool = False  # vLLM extension: the model continues the last (assistant) message
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    response_format: dict[str, Any] | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        out = super().unsupported()
        if self.logprobs or self.top_logprobs:
            out.append(("logprobs", "logprobs are not supported"))
        if self.tools:
            out.append(("tools", "tool calling is not supported by the embedded server"))
        if self.response_format and self.response_format.get("type", "text") != "text":
            out.append(("response_format", 'only response_format {"type": "text"} is supported'))
        return out

    def template_kwargs(self) -> dict[str, Any]:
        """What reaches the chat template: ``chat_template_kwargs`` over ``add_generation_prompt`` and
        ``continue_final_message`` (vLLM's precedence), with vLLM's checks of the two.

        >>> r = parse_request(ChatCompletionRequest, b'{"messages": [{"role": "user", "content": "hi"},'
        ...     b' {"role": "assistant", "content": "<think>"}], "continue_final_message": true,'
        ...     b' "add_generation_prompt": false}')
        >>> r.template_kwargs()
        {'add_generation_prompt': False, 'continue_final_message': True}
        >>> r.model_copy(update={"add_generation_prompt": True}).template_kwargs()  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        vocabbridge.server.openai_api.ApiError: Cannot set both ... send "add_generation_prompt": false with ...
        """
        kw = {"add_generation_prompt": self.add_generation_prompt, "continue_final_message": self.continue_final_message}
        kw |= self.chat_template_kwargs or {}
        if not kw["continue_final_message"]:
            return kw
        if kw["add_generation_prompt"]:
            raise ApiError(
                400,
                "Cannot set both `continue_final_message` and `add_generation_prompt` to True; add_generation_prompt "
                'defaults to true: send "add_generation_prompt": false with "continue_final_message": true.',
                param="add_generation_prompt",
            )
        last = self.messages[-1].role
        if last != "assistant":
            raise ApiError(
                400,
                f"continue_final_message continues the last message, which must be the assistant's (got {last!r}); "
                'end messages with {"role": "assistant", "content": "..."}, the text the answer continues.',
                param="messages",
            )
        return kw


# ==== checks shared by both endpoints ====================================================


def check_common(req: _Sampling) -> None:
    """Refuse options the engine cannot honour and values out of range, naming the fix."""
    for param, why in req.unsupported():
        raise ApiError(400, f"{param}: {why} by the embedded vocabbridge server.", param=param, code="unsupported_parameter")
    if req.n != 1:
        raise ApiError(400, f"n: only n=1 is supported (got {req.n}); send {req.n} requests instead.", param="n")
    if req.temperature is not None and req.temperature < 0:
        raise ApiError(400, f"temperature must be ≥ 0 (0 = greedy), got {req.temperature}.", param="temperature")
    if req.top_p is not None and not 0 < req.top_p <= 1:
        raise ApiError(400, f"top_p must be in (0, 1], got {req.top_p}.", param="top_p")
    if req.top_k is not None and req.top_k < -1:
        raise ApiError(400, f"top_k must be -1 or 0 (off) or ≥ 1, got {req.top_k}.", param="top_k")
    if req.stop_token_ids and any(t < 0 for t in req.stop_token_ids):
        raise ApiError(400, "stop_token_ids must be token ids (≥ 0).", param="stop_token_ids")


def stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    items = (stop,) if isinstance(stop, str) else tuple(stop)
    if any(s == "" for s in items):
        raise ApiError(400, "stop: empty stop strings are not allowed.", param="stop")
    return items


# ==== responses ==========================================================================


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_body(
    rid: str,
    model: str,
    text: str,
    finish: str | None,
    stop_reason,
    use: dict,
    *,
    token_ids: list[int] | None = None,
    prompt_ids: list[int] | None = None,
) -> dict:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": stop_reason}
    if token_ids is not None:
        choice |= {"token_ids": token_ids, "prompt_token_ids": prompt_ids}
    return {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": use,
    }


def chat_body(
    rid: str,
    model: str,
    text: str,
    finish: str | None,
    stop_reason,
    use: dict,
    *,
    token_ids: list[int] | None = None,
    prompt_ids: list[int] | None = None,
) -> dict:
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": text},
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": stop_reason,
    }
    if token_ids is not None:
        choice["token_ids"] = token_ids
    body = {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": use,
    }
    if prompt_ids is not None:
        body["prompt_token_ids"] = prompt_ids
    return body


def completion_chunk(
    rid: str, model: str, created: int, text: str, finish: str | None = None, stop_reason=None, token_ids: list[int] | None = None
) -> dict:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": stop_reason}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [choice]}


def chat_chunk(
    rid: str,
    model: str,
    created: int,
    delta: dict,
    finish: str | None = None,
    stop_reason=None,
    token_ids: list[int] | None = None,
) -> dict:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, "stop_reason": stop_reason}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [choice]}


def usage_chunk(rid: str, model: str, created: int, obj: str, use: dict) -> dict:
    """The last chunk when ``stream_options.include_usage``: no choices, the usage."""
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [], "usage": use}
