"""The real server (uvicorn on a loopback port) over the tiny engine: outputs equal the engine
alone, streaming and not, completions and chat, concurrency, and /metrics under vLLM's names."""

from __future__ import annotations

import dataclasses
import threading

import httpx
import pytest

from vocabbridge.chat import chat_prompt_ids, render_chat
from vocabbridge.server import serve_in_thread

from .server_helpers import PROMPTS, built, client, metrics, oracle, per_pos, server, sse_events, wait_idle  # noqa: F401

GREEDY = {"temperature": 0, "max_tokens": 24}


def test_health_models_and_version(client):
    assert client.get("/health").status_code == 200
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["tiny"]
    assert models["data"][0]["max_model_len"] == 512
    assert "version" in client.get("/version").json()


def test_completion_equals_the_engine_alone(client, tiny):
    t = tiny["target"]
    ids = t.view.encode(PROMPTS[0])
    tokens, text, finish = oracle(t, ids, 24)
    r = client.post("/v1/completions", json={"model": "tiny", "prompt": PROMPTS[0], "return_token_ids": True, **GREEDY})
    assert r.status_code == 200, r.text
    body = r.json()
    choice = body["choices"][0]
    assert (choice["text"], choice["token_ids"], choice["finish_reason"]) == (text, tokens, finish)
    assert choice["prompt_token_ids"] == ids and body["object"] == "text_completion" and body["model"] == "tiny"
    assert body["usage"] == {"prompt_tokens": len(ids), "completion_tokens": len(tokens), "total_tokens": len(ids) + len(tokens)}


def test_completion_accepts_token_ids_as_the_prompt(client, tiny):
    t = tiny["target"]
    ids = t.view.encode(PROMPTS[2])
    _, text, _ = oracle(t, ids, 24)
    for prompt in (ids, [ids], [PROMPTS[2]]):
        assert client.post("/v1/completions", json={"prompt": prompt, **GREEDY}).json()["choices"][0]["text"] == text


def test_completion_stream_equals_the_engine_alone(client, tiny):
    t = tiny["target"]
    tokens, text, finish = oracle(t, t.view.encode(PROMPTS[1]), 24)
    body = {"prompt": PROMPTS[1], "stream": True, "stream_options": {"include_usage": True}, **GREEDY}
    with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = [e for e in events[:-1] if e["choices"]]
    assert all(e["object"] == "text_completion" for e in chunks) and len(chunks) > 2
    assert "".join(c["choices"][0]["text"] for c in chunks) == text
    assert chunks[-1]["choices"][0]["finish_reason"] == finish
    assert events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == len(tokens)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_uses_the_template_and_equals_the_engine_alone(client, tiny, stream):
    t = tiny["target"]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": PROMPTS[3]}]
    ids = chat_prompt_ids(t.view, messages)
    _, text, finish = oracle(t, ids, 24)
    body = {"model": "tiny", "messages": messages, "stream": stream, **GREEDY}
    if not stream:
        r = client.post("/v1/chat/completions", json=body | {"return_token_ids": True}).json()
        assert r["object"] == "chat.completion" and r["prompt_token_ids"] == ids
        assert r["choices"][0]["message"] == {"role": "assistant", "content": text}
        assert r["choices"][0]["finish_reason"] == finish and r["usage"]["prompt_tokens"] == len(ids)
        return
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        events = sse_events(r)
    assert events[-1] == "[DONE]" and all(e["object"] == "chat.completion.chunk" for e in events[:-1])
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1]) == text
    assert events[-2]["choices"][0]["finish_reason"] == finish and events[-2]["choices"][0]["delta"] == {}


def test_chat_content_parts_and_max_completion_tokens(client, tiny):
    t = tiny["target"]
    ids = chat_prompt_ids(t.view, [{"role": "user", "content": "Hello\nworld"}])
    _, text, _ = oracle(t, ids, 7)
    parts = [{"type": "text", "text": "Hello"}, {"type": "text", "text": "world"}]
    r = client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": parts}], "temperature": 0, "max_completion_tokens": 7},
    ).json()
    assert r["choices"][0]["message"]["content"] == text and r["usage"]["completion_tokens"] == 7


def test_chat_template_kwargs_reach_the_template(tiny):
    t = tiny["target"]
    template = "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}" + t.view.chat_template
    target = dataclasses.replace(t, view=dataclasses.replace(t.view, chat_template=template))
    from vocabbridge.engine.engine import SpecEngine
    from vocabbridge.engine.factory import BuiltEngine, EngineSpec

    built = BuiltEngine(SpecEngine(target), target, None, EngineSpec(target=t.source), "none")
    messages = [{"role": "user", "content": "hi"}]
    with serve_in_thread(built) as srv:
        body = {"messages": messages, "max_tokens": 2, "temperature": 0, "return_token_ids": True}
        off = httpx.post(f"{srv.url}/v1/chat/completions", json=body | {"chat_template_kwargs": {"enable_thinking": False}})
        plain = httpx.post(f"{srv.url}/v1/chat/completions", json=body)
    assert off.json()["prompt_token_ids"] == t.view.encode(render_chat(target.view, messages, enable_thinking=False))
    assert render_chat(target.view, messages, enable_thinking=False).startswith("<think></think>")
    assert plain.json()["prompt_token_ids"] == t.view.encode(render_chat(target.view, messages))
    assert off.json()["prompt_token_ids"] != plain.json()["prompt_token_ids"]


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_cuts_the_text(client, tiny, stream):
    t = tiny["target"]
    _, text, _ = oracle(t, t.view.encode(PROMPTS[4]), 40, ignore_eos=True)
    stop = text[12:15]
    want = text[: text.index(stop)]
    body = {"prompt": PROMPTS[4], "stop": [stop, "never-seen-stop"], "ignore_eos": True, "temperature": 0, "max_tokens": 40}
    if stream:
        with client.stream("POST", "/v1/completions", json=body | {"stream": True}) as r:
            events = sse_events(r)[:-1]
        got, last = "".join(e["choices"][0]["text"] for e in events), events[-1]["choices"][0]
    else:
        last = client.post("/v1/completions", json=body).json()["choices"][0]
        got = last["text"]
    assert got == want and (last["finish_reason"], last["stop_reason"]) == ("stop", stop)
    incl = client.post("/v1/completions", json=body | {"include_stop_str_in_output": True}).json()["choices"][0]["text"]
    assert incl == want + stop


def test_stop_token_ids_end_the_output_without_the_stop_token(client, tiny):
    t = tiny["target"]
    ids = t.view.encode(PROMPTS[5])
    tokens, _, _ = oracle(t, ids, 30, ignore_eos=True)
    stop_id = tokens[6]
    want_tokens, want_text, finish = oracle(t, ids, 30, ignore_eos=True, stop_token_ids=(stop_id,))
    r = client.post(
        "/v1/completions",
        json={
            "prompt": ids,
            "stop_token_ids": [stop_id],
            "ignore_eos": True,
            "temperature": 0,
            "max_tokens": 30,
            "return_token_ids": True,
        },
    ).json()["choices"][0]
    assert finish == "stop" and want_tokens[-1] == stop_id
    assert (r["text"], r["token_ids"], r["finish_reason"], r["stop_reason"]) == (want_text, want_tokens, "stop", stop_id)


def test_sampling_with_a_seed_is_reproducible(client):
    body = {"prompt": PROMPTS[6], "temperature": 0.9, "top_p": 0.9, "top_k": 50, "seed": 1234, "max_tokens": 16}
    a, b = (client.post("/v1/completions", json=body).json()["choices"][0]["text"] for _ in range(2))
    assert a == b
    assert client.post("/v1/completions", json=body | {"top_k": -1}).status_code == 200


def test_eight_concurrent_clients_all_get_their_own_answer(server, tiny):
    t = tiny["target"]
    want = [oracle(t, t.view.encode(p), 32, ignore_eos=True)[1] for p in PROMPTS]
    got: dict[int, str] = {}

    def ask(i):
        body = {"prompt": PROMPTS[i], "temperature": 0, "max_tokens": 32, "ignore_eos": True, "stream": i % 2 == 1}
        with httpx.Client(base_url=server.url, timeout=60) as c:
            if i % 2:
                with c.stream("POST", "/v1/completions", json=body) as r:
                    got[i] = "".join(e["choices"][0]["text"] for e in sse_events(r)[:-1])
            else:
                got[i] = c.post("/v1/completions", json=body).json()["choices"][0]["text"]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(PROMPTS))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert [got.get(i) for i in range(len(PROMPTS))] == want


def test_metrics_move_consistently_with_the_requests(client, tiny):
    before = wait_idle(client)
    usages = []
    for p in PROMPTS[:3]:
        usages.append(client.post("/v1/completions", json={"prompt": p, "max_tokens": 20, "temperature": 0}).json()["usage"])
    # A scrape while a request streams: every counter is moved under one lock per engine step.
    with client.stream(
        "POST",
        "/v1/completions",
        json={"prompt": PROMPTS[7], "max_tokens": 200, "ignore_eos": True, "temperature": 0, "stream": True},
    ) as r:
        lines = r.iter_lines()
        for _ in range(6):
            next(lines)
        mid = metrics(client)
        for _ in lines:
            pass
    after = wait_idle(client)

    def delta(name):
        return after.get(name, 0) - before.get(name, 0)

    for m in (mid, after):
        assert m["vllm:spec_decode_num_accepted_tokens_total"] <= m["vllm:spec_decode_num_draft_tokens_total"]
        assert sum(per_pos(m)) == m["vllm:spec_decode_num_accepted_tokens_total"]
    assert delta("vllm:spec_decode_num_drafts_total") > 0 and delta("vllm:spec_decode_num_draft_tokens_total") > 0
    assert len(per_pos(after)) == 3  # one series per draft position (k = 3)
    assert delta("vllm:request_success_total{finished_reason=length}") == 4
    prompt = sum(u["prompt_tokens"] for u in usages) + len(tiny["target"].view.encode(PROMPTS[7]))
    assert delta("vllm:prompt_tokens_total") == prompt
    assert delta("vllm:generation_tokens_total") == sum(u["completion_tokens"] for u in usages) + 200
    assert delta("vllm:time_to_first_token_seconds_count") == 4 and delta("vllm:e2e_request_latency_seconds_count") == 4
    assert delta("vllm:inter_token_latency_seconds_count") > 0 and delta("vllm:request_time_per_output_token_seconds_count") == 4
    assert not any(k.endswith("_created") for k in after)


def test_no_drafter_means_no_spec_decode_metrics(tiny):
    from .server_helpers import tiny_built

    with serve_in_thread(tiny_built(tiny, drafter="none")) as srv, httpx.Client(base_url=srv.url) as c:
        assert c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3}).status_code == 200
        m = metrics(c)
    assert m["vllm:generation_tokens_total"] == 3 and not any("spec_decode" in k for k in m)


def test_the_stock_openai_client_works(server, tiny):
    openai = pytest.importorskip("openai")
    t = tiny["target"]
    oa = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    assert [m.id for m in oa.models.list().data] == ["tiny"]
    _, text, _ = oracle(t, t.view.encode(PROMPTS[0]), 16)
    c = oa.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=16, temperature=0)
    assert c.choices[0].text == text
    messages = [{"role": "user", "content": PROMPTS[1]}]
    _, chat_text, _ = oracle(t, chat_prompt_ids(t.view, messages), 16)
    r = oa.chat.completions.create(model="tiny", messages=messages, max_tokens=16, temperature=0)
    assert r.choices[0].message.content == chat_text and r.usage.completion_tokens == 16
    stream = oa.chat.completions.create(
        model="tiny", messages=messages, max_tokens=16, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == chat_text
    assert chunks[-1].usage.completion_tokens == 16
    with pytest.raises(openai.NotFoundError):
        oa.completions.create(model="gpt-4", prompt="x", max_tokens=1)


@pytest.mark.parametrize("stream", [False, True])
def test_continue_final_message_continues_the_assistant_message(client, tiny, stream):
    """The prompt ends inside the assistant's turn (no end of turn, no new generation prompt); the
    answer is only what the model wrote after it, as vLLM's."""
    t = tiny["target"]
    user = [{"role": "user", "content": PROMPTS[3]}]
    prefill = "<think>\nThe user wants a direct answer. I will answer now.\n</think>\n\n"
    messages = user + [{"role": "assistant", "content": prefill}]
    rendered = render_chat(t.view, messages, add_generation_prompt=False, continue_final_message=True)
    assert rendered == render_chat(t.view, user) + prefill  # by hand: the generation prompt, then the text
    ids = t.view.encode(rendered)
    shown = t.view.decode_bytes(ids).decode("utf-8")
    assert shown.endswith("[|assistant|]" + prefill) and shown.count("[|assistant|]") == 1  # no end of turn, no new turn
    _, text, finish = oracle(t, ids, 24)
    body = {"messages": messages, "continue_final_message": True, "add_generation_prompt": False, **GREEDY}
    if not stream:
        r = client.post("/v1/chat/completions", json=body | {"return_token_ids": True}).json()
        assert r["prompt_token_ids"] == ids and r["usage"]["prompt_tokens"] == len(ids)
        assert r["choices"][0]["message"] == {"role": "assistant", "content": text} and r["choices"][0]["finish_reason"] == finish
        return
    with client.stream(
        "POST", "/v1/chat/completions", json=body | {"stream": True, "stream_options": {"include_usage": True}}
    ) as r:
        events = sse_events(r)
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1] if e["choices"]) == text
    assert events[-2]["usage"]["prompt_tokens"] == len(ids)


def test_continue_final_message_through_chat_template_kwargs(client, tiny):
    """chat_template_kwargs win over the request's fields, as in vLLM."""
    t = tiny["target"]
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure"}]
    kwargs = {"continue_final_message": True, "add_generation_prompt": False}
    r = client.post(
        "/v1/chat/completions",
        json={"messages": messages, "chat_template_kwargs": kwargs, "return_token_ids": True, **GREEDY},
    ).json()
    assert r["prompt_token_ids"] == t.view.encode(render_chat(t.view, messages, **kwargs))


def test_the_engine_can_run_on_the_callers_thread(built, tiny):
    """engine_thread=False (what `vocabbridge serve` and the bench's in-process launch use): the engine
    loop runs on the calling thread, a client in another thread gets the same answers, the worker
    stops when the client is done, and the client's exception reaches the caller."""
    t = tiny["target"]
    tokens, _, _ = oracle(t, t.view.encode(PROMPTS[3]), 16)

    def ask(url):
        with httpx.Client(base_url=url, timeout=60) as c:
            assert c.get("/health").status_code == 200  # alive before the loop runs: requests wait for it
            r = c.post(
                "/v1/completions",
                json={"model": "tiny", "prompt": PROMPTS[3], "return_token_ids": True, **GREEDY | {"max_tokens": 16}},
            )
            return threading.current_thread() is not threading.main_thread(), r.json()["choices"][0]["token_ids"]

    with serve_in_thread(built, served_model_name="tiny", engine_thread=False) as srv:
        assert not srv.worker.threaded
        elsewhere, got = srv.run_with_engine_here(lambda: ask(srv.url))
        assert elsewhere and got == tokens
        assert not srv.worker.alive  # stopped once the client was done
    with serve_in_thread(built, served_model_name="tiny", engine_thread=False) as srv:
        with pytest.raises(ZeroDivisionError):
            srv.run_with_engine_here(lambda: 1 / 0)
    with serve_in_thread(built, served_model_name="tiny") as srv, pytest.raises(RuntimeError, match="thread=False"):
        srv.run_engine()  # a worker with its own thread is not run here too
