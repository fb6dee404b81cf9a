"""The OpenAI-compatible app over a built engine: ``/v1/models``, ``/v1/completions``,
``/v1/chat/completions`` (SSE with ``stream: true``), ``/health``, ``/metrics``, ``/version``.

>>> app = create_app(build_engine(EngineSpec(target="qwen2.5-coder-1.5b", drafter="ngram")))  # doctest: +SKIP
>>> handle = serve_in_thread(built, port=0); handle.url  # doctest: +SKIP
'http://127.0.0.1:54321'
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from ..chat import chat_prompt_ids
from ..engine.sampling import SamplingParams
from ..errors import VocabBridgeError
from ..spec import served_name
from . import openai_api as P
from .output_text import OutputText
from .prometheus import ServerMetrics
from .worker import EngineWorker, Event, GenRequest, QueueFull

log = logging.getLogger("vocabbridge.server")


class ServerState:
    """What the routes share: the engine worker, the metrics, the served name, the API key."""

    def __init__(
        self,
        built,
        *,
        served_model_name: str | None,
        api_key: str | None,
        max_num_seqs: int,
        max_queued_tokens: int | None = None,
        engine_thread: bool = True,
    ):
        self.built = built
        self.engine = built.engine
        self.view = built.target.view
        self.max_context = built.target.max_context
        self.model_name = served_model_name or served_name(built.spec.target_name)
        self.api_key = api_key
        self.created = int(time.time())
        speculative = built.mode != "none"
        self.metrics = ServerMetrics(
            self.model_name, speculative=speculative, num_spec_tokens=built.engine.k, max_model_len=self.max_context
        )
        self.worker = EngineWorker(
            built.engine, self.metrics, max_num_seqs=max_num_seqs, max_queued_tokens=max_queued_tokens, thread=engine_thread
        )

    # ==== request → engine =================================================================

    def check_auth(self, request: Request) -> None:
        if self.api_key is None:
            return
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise P.ApiError(
                401,
                "Incorrect or missing API key; send the header 'Authorization: Bearer <key>' "
                "with the key the server was started with (--api-key).",
                code="invalid_api_key",
            )

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise P.ApiError(
                404,
                f"The model '{model}' does not exist; this server serves '{self.model_name}' (GET /v1/models).",
                param="model",
                code="model_not_found",
            )

    def completion_prompt(self, prompt) -> list[int]:
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            if len(prompt) != 1:
                raise P.ApiError(
                    400, f"prompt: one prompt per request (got {len(prompt)}); send several requests.", param="prompt"
                )
            prompt = prompt[0]
        if isinstance(prompt, str):
            return self.view.encode(prompt)
        bad = [t for t in prompt if not 0 <= t < self.built.target.vocab_size]
        if bad:
            raise P.ApiError(
                400,
                f"prompt: token id {bad[0]} is outside the vocabulary (0–{self.built.target.vocab_size - 1}).",
                param="prompt",
            )
        return list(prompt)

    def chat_prompt(self, req: P.ChatCompletionRequest) -> list[int]:
        messages = [m.for_template(i) for i, m in enumerate(req.messages)]
        kwargs = req.template_kwargs()
        try:
            return chat_prompt_ids(self.view, messages, **kwargs)
        except VocabBridgeError as e:
            raise P.ApiError(400, str(e), param="messages") from None

    def sampling(self, req, prompt: list[int], max_tokens: int | None) -> SamplingParams:
        """Check lengths against the context and build the engine's parameters."""
        n, ctx = len(prompt), self.max_context
        if n == 0:
            raise P.ApiError(400, "the prompt is empty; give at least one token.", param="prompt")
        if n >= ctx:
            raise P.ApiError(
                400,
                f"the prompt has {n} tokens but the model's context is {ctx} tokens; shorten the prompt.",
                param="prompt",
                code="context_length_exceeded",
            )
        if max_tokens is None:
            max_tokens = ctx - n
        if max_tokens < 1:
            raise P.ApiError(400, f"max_tokens must be at least 1, got {max_tokens}.", param="max_tokens")
        if n + max_tokens > ctx:
            raise P.ApiError(
                400,
                f"this model's context is {ctx} tokens; the prompt has {n} and max_tokens asks for "
                f"{max_tokens}: lower max_tokens to at most {ctx - n} or shorten the prompt.",
                param="max_tokens",
                code="context_length_exceeded",
            )
        try:
            return SamplingParams(
                max_new_tokens=max_tokens,
                temperature=1.0 if req.temperature is None else req.temperature,
                top_p=1.0 if req.top_p is None else req.top_p,
                top_k=max(0, req.top_k or 0),
                seed=req.seed,
                stop_token_ids=tuple(req.stop_token_ids or ()),
                ignore_eos=req.ignore_eos,
            )
        except VocabBridgeError as e:
            raise P.ApiError(400, str(e)) from None

    def submit(self, req, prompt: list[int], params: SamplingParams) -> GenRequest:
        eos = frozenset() if params.ignore_eos else self.engine.eos_ids
        text = OutputText(
            self.view,
            stop=P.stop_strings(req.stop),
            stop_ids=frozenset(params.stop_token_ids) | eos,
            skip_special=req.skip_special_tokens,
            include_stop=req.include_stop_str_in_output,
        )
        gen = GenRequest(prompt, params, text, asyncio.get_running_loop())
        try:
            self.worker.submit(gen)
        except QueueFull as e:  # as OpenAI's rate limits: a 429 the client retries after Retry-After
            raise P.ApiError(
                429, str(e), type="rate_limit_error", code="queue_full", headers={"Retry-After": str(e.retry_after)}
            ) from None
        except VocabBridgeError as e:
            raise P.ApiError(503, str(e), type="server_error") from None
        return gen


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


async def _stream(state: ServerState, gen: GenRequest, kind: str, rid: str, *, include_usage: bool, return_ids: bool):
    """SSE chunks in OpenAI's format, then ``data: [DONE]``; a client gone mid-stream cancels the request."""
    created, model = int(time.time()), state.model_name

    def ids(ev: Event) -> list[int] | None:
        return ev.token_ids if return_ids else None

    finished = False
    try:
        if kind == "chat":
            yield _sse(P.chat_chunk(rid, model, created, {"role": "assistant", "content": ""}))
        while True:
            ev: Event = await gen.queue.get()
            if ev.error:
                finished = True
                status, message = ev.error
                yield _sse(P.ApiError(status, message, type="server_error" if status >= 500 else "invalid_request_error").body())
                break
            if ev.text or (return_ids and ev.token_ids):
                yield _sse(
                    P.chat_chunk(rid, model, created, {"content": ev.text}, token_ids=ids(ev))
                    if kind == "chat"
                    else P.completion_chunk(rid, model, created, ev.text, token_ids=ids(ev))
                )
            if ev.finish_reason:
                finished = True
                yield _sse(
                    P.chat_chunk(rid, model, created, {}, ev.finish_reason, ev.stop_reason)
                    if kind == "chat"
                    else P.completion_chunk(rid, model, created, "", ev.finish_reason, ev.stop_reason)
                )
                if include_usage:
                    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
                    yield _sse(P.usage_chunk(rid, model, created, obj, P.usage(len(gen.prompt), ev.completion_tokens)))
                break
        yield "data: [DONE]\n\n"
    finally:
        if not finished:
            state.worker.cancel(gen)


async def _until_disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _collect(state: ServerState, gen: GenRequest, request: Request) -> tuple[str, list[int], Event] | None:
    """All of a request's output; None when the client disconnected first (the request is cancelled)."""

    async def consume():
        parts, ids = [], []
        while True:
            ev = await gen.queue.get()
            parts.append(ev.text)
            ids += ev.token_ids
            if ev.finish_reason:
                return "".join(parts), ids, ev

    task, watch = asyncio.ensure_future(consume()), asyncio.ensure_future(_until_disconnected(request))
    done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        watch.cancel()
        return task.result()
    task.cancel()
    state.worker.cancel(gen)
    return None


def create_app(
    built,
    *,
    served_model_name: str | None = None,
    api_key: str | None = None,
    max_num_seqs: int = 8,
    max_queued_tokens: int | None = None,
    engine_thread: bool = True,
) -> FastAPI:
    """A FastAPI app serving ``built`` (a :class:`~vocabbridge.engine.factory.BuiltEngine`).

    The engine worker starts with the app's lifespan and stops with it: in a thread of its own, or
    (``engine_thread=False``) on the thread that calls ``app.state.vocabbridge.worker.run()``.
    ``max_queued_tokens``: refuse (429) a request whose prompt would take the prompt tokens waiting
    for a slot past this (None: no limit; see :class:`~vocabbridge.server.worker.EngineWorker`).
    """
    state = ServerState(
        built,
        served_model_name=served_model_name,
        api_key=api_key,
        max_num_seqs=max_num_seqs,
        max_queued_tokens=max_queued_tokens,
        engine_thread=engine_thread,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app):
        state.worker.start()
        try:
            yield
        finally:
            await run_in_threadpool(state.worker.stop)

    app = FastAPI(title="vocabbridge", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.vocabbridge = state

    @app.exception_handler(P.ApiError)
    async def _api_error(request, e: P.ApiError):
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request, e: StarletteHTTPException):
        err = P.ApiError(e.status_code, f"{e.detail}: {request.method} {request.url.path}", code=str(e.status_code))
        return JSONResponse(err.body(), status_code=e.status_code)

    @app.exception_handler(Exception)
    async def _internal(request, e: Exception):
        log.exception("unhandled error on %s", request.url.path)
        err = P.ApiError(500, f"internal server error: {type(e).__name__}: {e}", type="server_error")
        return JSONResponse(err.body(), status_code=500)

    @app.get("/health")
    async def health():
        return Response(status_code=200 if state.worker.alive else 503)

    @app.get("/version")
    async def version():
        return {"version": __version__}

    @app.get("/metrics")
    async def metrics():

        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request):
        state.check_auth(request)
        card = {
            "id": state.model_name,
            "object": "model",
            "created": state.created,
            "owned_by": "vocabbridge",
            "root": built.target.source,
            "parent": None,
            "max_model_len": state.max_context,
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    async def completions(request: Request):
        state.check_auth(request)
        req = P.parse_request(P.CompletionRequest, await request.body())
        P.check_common(req)
        state.check_model(req.model)
        prompt = await run_in_threadpool(state.completion_prompt, req.prompt)
        return await _respond(request, req, prompt, req.max_tokens, "completion")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        state.check_auth(request)
        req = P.parse_request(P.ChatCompletionRequest, await request.body())
        P.check_common(req)
        state.check_model(req.model)
        prompt = await run_in_threadpool(state.chat_prompt, req)
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        return await _respond(request, req, prompt, max_tokens, "chat")

    async def _respond(request: Request, req, prompt: list[int], max_tokens: int | None, kind: str):
        params = state.sampling(req, prompt, max_tokens)
        gen = state.submit(req, prompt, params)
        rid = P.new_id("chatcmpl" if kind == "chat" else "cmpl")
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            body = _stream(state, gen, kind, rid, include_usage=include_usage, return_ids=req.return_token_ids)
            return StreamingResponse(body, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        got = await _collect(state, gen, request)
        if got is None:
            return Response(status_code=499)  # the client is gone; nobody reads this
        text, ids, last = got
        if last.error:
            status, message = last.error
            raise P.ApiError(status, message, type="server_error" if status >= 500 else "invalid_request_error")
        use = P.usage(len(prompt), last.completion_tokens)
        extra = {"token_ids": ids, "prompt_ids": prompt} if req.return_token_ids else {}
        make = P.chat_body if kind == "chat" else P.completion_body
        return make(rid, state.model_name, text, last.finish_reason, last.stop_reason, use, **extra)

    return app
