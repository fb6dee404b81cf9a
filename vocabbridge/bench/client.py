"""An OpenAI-compatible HTTP client that measures one streamed chat completion at a time.

Per request: time to first token (first chunk with text), decode tokens/s ((output tokens − 1) over
the time after the first token), total time, output tokens (``usage`` when the server sends it,
else the number of text chunks, which undercounts when a chunk carries several tokens), the text.

>>> with BenchClient("http://127.0.0.1:8000") as c:  # doctest: +SKIP
...     c.chat(c.model(), [{"role": "user", "content": "hi"}], max_tokens=16).decode_tokens_per_second
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from ..errors import ServerError
from .counters import Counters, parse_counters


@dataclass
class Completion:
    """One streamed chat completion as the client saw it (times in seconds from sending)."""

    text: str = ""
    reasoning: str = ""  # reasoning_content, where the server splits it out
    output_tokens: int = 0
    tokens_from: str = "usage"  # "usage" | "chunks"
    prompt_tokens: int | None = None
    ttft: float | None = None
    total_time: float = 0.0
    last_token_time: float | None = None
    chunks: int = 0
    finish_reason: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def decode_time(self) -> float | None:
        return self.last_token_time - self.ttft if self.ttft is not None and self.last_token_time is not None else None

    @property
    def decode_tokens_per_second(self) -> float | None:
        t = self.decode_time
        return (self.output_tokens - 1) / t if t and t > 0 and self.output_tokens > 1 else None


def base_url(url: str) -> str:
    """``http://h:p``, ``http://h:p/``, ``http://h:p/v1`` → ``http://h:p`` (where /metrics lives)."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url[: -len("/v1")] if url.endswith("/v1") else url


class BenchClient:
    """Talks to one server: ``/v1/models``, streamed ``/v1/chat/completions``, ``/metrics``."""

    def __init__(self, url: str, *, api_key: str | None = None, timeout: float = 1800.0, max_connections: int = 64):
        self.url = base_url(url)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._http = httpx.Client(base_url=self.url, headers=headers, limits=limits, timeout=httpx.Timeout(timeout, connect=10.0))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> BenchClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ==== server facts ===================================================================

    def model(self) -> str:
        """The first model id the server lists (the name requests must carry)."""
        try:
            r = self._http.get("/v1/models", timeout=30.0)
        except httpx.HTTPError as e:
            raise ServerError(f"{self.url} is not reachable ({e}); is the server running, and is the URL right?") from None
        if r.status_code != 200:
            raise ServerError(
                f"{self.url}/v1/models answered {r.status_code}: {_error_text(r)}; is this an OpenAI-compatible server?"
            )
        try:
            data = r.json()["data"]
            return str(data[0]["id"])
        except (ValueError, KeyError, IndexError, TypeError):
            raise ServerError(f"{self.url}/v1/models did not list a model; is this an OpenAI-compatible server?") from None

    def scrape(self) -> Counters | None:
        """The server's counters, or None when it has no usable ``/metrics`` page."""
        try:
            r = self._http.get("/metrics", timeout=30.0)
        except httpx.HTTPError:
            return None
        if r.status_code != 200:
            return None
        return parse_counters(r.text)

    # ==== one request ====================================================================

    def chat(
        self,
        model: str,
        messages: list[dict[str, str]],
        *,
        max_tokens: int,
        temperature: float | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        prefill: str | None = None,
    ) -> Completion:
        """Stream one chat completion and time it; errors are returned in ``Completion.error``.

        ``prefill`` starts the answer: it is sent as a last assistant message with vLLM's
        ``continue_final_message: true, add_generation_prompt: false``, and the text returned is
        what the model wrote after it.
        """
        if prefill is not None:
            messages = [*messages, {"role": "assistant", "content": prefill}]
        body: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if temperature is not None:
            body["temperature"] = temperature
        if chat_template_kwargs:
            body["chat_template_kwargs"] = chat_template_kwargs
        if prefill is not None:
            body |= {"continue_final_message": True, "add_generation_prompt": False}
        out = Completion()
        text, reasoning = [], []
        usage_tokens = None
        t0 = time.perf_counter()
        try:
            with self._http.stream("POST", "/v1/chat/completions", json=body) as r:
                if r.status_code != 200:
                    r.read()
                    out.error = f"HTTP {r.status_code}: {_error_text(r)}"
                    return out
                for line in r.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        out.error = _message(chunk["error"])
                        break
                    now = time.perf_counter() - t0
                    for choice in chunk.get("choices") or []:
                        delta = choice.get("delta") or {}
                        piece = delta.get("content") or ""
                        thought = delta.get("reasoning_content") or delta.get("reasoning") or ""
                        if piece or thought:
                            out.chunks += 1
                            out.ttft = now if out.ttft is None else out.ttft
                            out.last_token_time = now
                            text.append(piece)
                            reasoning.append(thought)
                        if choice.get("finish_reason"):
                            out.finish_reason = choice["finish_reason"]
                    usage = chunk.get("usage")
                    if usage:
                        usage_tokens = usage.get("completion_tokens", usage_tokens)
                        out.prompt_tokens = usage.get("prompt_tokens", out.prompt_tokens)
        except httpx.HTTPError as e:
            out.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        except json.JSONDecodeError as e:
            out.error = f"the server sent a stream chunk that is not JSON ({e})"
        out.total_time = time.perf_counter() - t0
        out.text, out.reasoning = "".join(text), "".join(reasoning)
        if usage_tokens is not None:
            out.output_tokens = int(usage_tokens)
        else:
            out.output_tokens, out.tokens_from = out.chunks, "chunks"
        return out


def _message(err: Any) -> str:
    if isinstance(err, dict):
        return str(err.get("message") or err)
    return str(err)


def _error_text(r: httpx.Response) -> str:
    try:
        return _message(r.json().get("error") or r.json().get("detail") or r.text)[:300]
    except (ValueError, AttributeError):
        return r.text[:300] or r.reason_phrase
