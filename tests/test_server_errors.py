"""Bad requests get OpenAI-style 4xx errors and the server keeps serving; API keys; clients that
go away mid-request free their slot."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from vocabbridge.server import serve_in_thread

from .server_helpers import built, client, metrics, server, wait_idle  # noqa: F401

LONG = "안녕하세요 " * 400  # far more tokens than the tiny model's 512-token context
CONTINUED = {"role": "assistant", "content": "<think>\nI will answer now.\n</think>\n\n"}


@pytest.mark.parametrize(
    "path, body, status, param, code",
    [
        ("/v1/completions", b'{"prompt": "hi", ', 400, None, "json_invalid"),
        ("/v1/completions", b"[1, 2]", 400, None, "invalid_type"),
        ("/v1/completions", {"max_tokens": 4}, 400, "prompt", "missing_required_parameter"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": "4"}, 400, "max_tokens", "invalid_type"),
        ("/v1/completions", {"prompt": 12}, 400, "prompt", "invalid_type"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens", None),
        ("/v1/completions", {"prompt": "hi", "max_tokens": -3}, 400, "max_tokens", None),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 5000}, 400, "max_tokens", "context_length_exceeded"),
        ("/v1/completions", {"prompt": LONG, "max_tokens": 4}, 400, "prompt", "context_length_exceeded"),
        ("/v1/completions", {"prompt": "", "max_tokens": 4}, 400, "prompt", None),
        ("/v1/completions", {"prompt": [10**6], "max_tokens": 4}, 400, "prompt", None),
        ("/v1/completions", {"prompt": ["a", "b"], "max_tokens": 4}, 400, "prompt", None),
        ("/v1/completions", {"prompt": "hi", "model": "gpt-4"}, 404, "model", "model_not_found"),
        ("/v1/completions", {"prompt": "hi", "temperature": -0.5}, 400, "temperature", None),
        ("/v1/completions", {"prompt": "hi", "top_p": 1.5}, 400, "top_p", None),
        ("/v1/completions", {"prompt": "hi", "top_p": 0}, 400, "top_p", None),
        ("/v1/completions", {"prompt": "hi", "top_k": -7}, 400, "top_k", None),
        ("/v1/completions", {"prompt": "hi", "n": 2}, 400, "n", None),
        ("/v1/completions", {"prompt": "hi", "stop": [""]}, 400, "stop", None),
        ("/v1/completions", {"prompt": "hi", "logprobs": 2}, 400, "logprobs", "unsupported_parameter"),
        ("/v1/completions", {"prompt": "hi", "echo": True}, 400, "echo", "unsupported_parameter"),
        ("/v1/completions", {"prompt": "hi", "stream": "yes"}, 400, "stream", "invalid_type"),
        ("/v1/chat/completions", {"max_tokens": 4}, 400, "messages", "missing_required_parameter"),
        ("/v1/chat/completions", {"messages": []}, 400, "messages", "invalid_type"),
        ("/v1/chat/completions", {"messages": "hi"}, 400, "messages", "invalid_type"),
        ("/v1/chat/completions", {"messages": [{"content": "hi"}]}, 400, "messages.0.role", "missing_required_parameter"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": 3}]}, 400, "messages.0.content", "invalid_type"),
        ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages.0.role", "invalid_type"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            400,
            "messages.0.content",
            None,
        ),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}]}, 400, "prompt", "context_length_exceeded"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0},
            400,
            "max_tokens",
            None,
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "model": "x"},
            404,
            "model",
            "model_not_found",
        ),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": 3}, 400, "n", None),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]},
            400,
            "tools",
            "unsupported_parameter",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": []},
            400,
            "chat_template_kwargs",
            "invalid_type",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}, CONTINUED], "continue_final_message": True},
            400,
            "add_generation_prompt",
            None,
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "continue_final_message": True, "add_generation_prompt": False},
            400,
            "messages",
            None,
        ),
    ],
)
def test_bad_requests_get_openai_errors(client, path, body, status, param, code):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = client.post(path, content=content, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert (err["param"], err["code"]) == (param, code)
    assert err["type"] == "invalid_request_error"


def test_continue_final_message_errors_say_the_fix(client):
    user = {"role": "user", "content": "hi"}
    both = client.post("/v1/chat/completions", json={"messages": [user, CONTINUED], "continue_final_message": True})
    assert both.status_code == 400
    assert both.json()["error"]["message"].startswith("Cannot set both `continue_final_message` and `add_generation_prompt`")
    assert 'send "add_generation_prompt": false' in both.json()["error"]["message"]
    body = {"messages": [user], "continue_final_message": True, "add_generation_prompt": False}
    last = client.post("/v1/chat/completions", json=body)
    assert last.status_code == 400
    assert "must be the assistant's (got 'user')" in last.json()["error"]["message"]
    assert '{"role": "assistant", "content": "..."}' in last.json()["error"]["message"]


def test_the_server_keeps_serving_after_bad_requests(client):
    for _ in range(3):
        client.post("/v1/completions", content=b"{nope")
    assert client.get("/health").status_code == 200
    assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3}).json()["usage"]["completion_tokens"] == 3


def test_unknown_routes_and_methods_answer_json(client):
    r = client.get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["code"] == "404"
    assert client.get("/v1/completions").status_code == 405


def test_api_key_is_checked_on_v1_routes_only(built):
    with serve_in_thread(built, api_key="s3cret") as srv, httpx.Client(base_url=srv.url) as c:
        body = {"prompt": "hi", "max_tokens": 2}
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            r = c.post("/v1/completions", json=body, headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert c.get("/v1/models").status_code == 401
        ok = c.post("/v1/completions", json=body, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2
        assert c.get("/health").status_code == 200 and c.get("/metrics").status_code == 200


def test_a_client_leaving_mid_stream_frees_its_slot(tiny):
    from .server_helpers import tiny_built

    with serve_in_thread(tiny_built(tiny), max_num_seqs=1) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        long = {"prompt": "The quick brown fox", "max_tokens": 480, "ignore_eos": True, "temperature": 0}
        with c.stream("POST", "/v1/completions", json=long | {"stream": True}) as r:
            lines = r.iter_lines()
            for _ in range(4):  # a few chunks arrive, then the client goes away
                next(lines)
        # A non-streaming client that times out goes away too.
        with pytest.raises(httpx.ReadTimeout):
            c.post("/v1/completions", json=long, timeout=0.3)
        m = wait_idle(c)
        # The only slot is free again: a new request is served at once.
        t0 = time.perf_counter()
        assert c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4}).json()["usage"]["completion_tokens"] == 4
        assert time.perf_counter() - t0 < 5
        after = metrics(c)
    assert m["vllm:request_success_total{finished_reason=abort}"] == 2
    assert m["vllm:generation_tokens_total"] < 2 * 480  # both stopped early
    assert after["vllm:request_success_total{finished_reason=length}"] == 1


def test_stopping_the_server_ends_open_streams_with_an_error(tiny):
    from .server_helpers import tiny_built

    srv = serve_in_thread(tiny_built(tiny))
    got = []
    with httpx.Client(base_url=srv.url, timeout=30) as c:
        body = {"prompt": "The quick brown fox", "max_tokens": 480, "ignore_eos": True, "stream": True}
        with c.stream("POST", "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            next(lines)
            t0 = time.perf_counter()
            srv.stop()
            got = [ln[6:] if ln == "data: [DONE]" else json.loads(ln[6:]) for ln in lines if ln.startswith("data: ")]
    assert time.perf_counter() - t0 < 5 and not srv.thread.is_alive()
    assert got[-1] == "[DONE]" and got[-2]["error"]["message"].startswith("the server is shutting down")


def test_a_full_queue_answers_429_with_retry_after_and_serves_the_rest(tiny):
    """Admission is bounded by the prompt tokens *waiting* (not running): past --max-queued-tokens a
    request gets OpenAI's error body with a 429 and Retry-After at once, streaming or not, and is
    counted; the queued requests are then served as usual. (The engine loop is not run until the
    end, so what waits stays waiting.)"""
    from threading import Thread

    from .server_helpers import tiny_built

    built = tiny_built(tiny)
    prompt = "The quick brown fox jumps over the lazy dog"
    n = len(built.target.view.encode(prompt))
    with serve_in_thread(built, max_num_seqs=1, max_queued_tokens=2 * n, engine_thread=False) as srv:
        answers: list[httpx.Response] = []
        body = {"prompt": prompt, "max_tokens": 4, "temperature": 0}

        def ask():
            answers.append(httpx.post(srv.url + "/v1/completions", json=body, timeout=60))

        waiting = [Thread(target=ask) for _ in range(2)]  # 2n prompt tokens: the limit, reached
        for th in waiting:
            th.start()
        with httpx.Client(base_url=srv.url, timeout=30) as c:
            deadline = time.monotonic() + 10
            while metrics(c)["vocabbridge:queued_prompt_tokens"] < 2 * n:
                assert time.monotonic() < deadline, metrics(c)
                time.sleep(0.02)
            full = c.post("/v1/completions", json=body)
            streamed = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "stream": True})
            m = metrics(c)
        for r in (full, streamed):
            assert r.status_code == 429 and 1 <= int(r.headers["Retry-After"]) <= 60, r.text
            err = r.json()["error"]
            assert (err["type"], err["code"], err["param"]) == ("rate_limit_error", "queue_full", None)
            assert f"2 requests with {2 * n} prompt tokens wait" in err["message"]
            assert f"limit of {2 * n} queued prompt tokens (vocabbridge serve --max-queued-tokens)" in err["message"]
        assert m["vocabbridge:requests_rejected_total{reason=queue_full}"] == 2
        assert m["vllm:num_requests_waiting"] == 2

        def serve_them():
            for th in waiting:
                th.join(60)
            return httpx.post(srv.url + "/v1/completions", json=body, timeout=60)

        after = srv.run_with_engine_here(serve_them)  # the engine runs here until the client is done
    assert [r.status_code for r in answers] == [200, 200] and after.status_code == 200
    assert all(r.json()["usage"]["completion_tokens"] == 4 for r in [*answers, after])
