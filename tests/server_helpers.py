"""Shared pieces of the server tests: the tiny engine, a real server on a free loopback port, the
oracle (the engine alone, no server, no drafter), and SSE / metrics parsing."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from vocabbridge.engine import SamplingParams, SpecEngine
from vocabbridge.engine.factory import EngineSpec, build_engine
from vocabbridge.server import serve_in_thread

PROMPTS = [
    "Hello world, give them the results.",
    "안녕하세요. 오늘 날씨가 정말 좋네요!",
    "def tokenize(text):\n",
    "The quick brown fox",
    "Speculative decoding lets a small model",
    "회의록을 요약하면 다음과 같습니다:",
    "for i in range(10):",
    "Could you give them a short summary",
]


def tiny_built(tiny, drafter: str = "draft", **kw):
    """The tiny target with a same-vocabulary draft model (greedy speculative decoding is lossless),
    in float32: the loaded models, the same the oracle runs (the default on a CPU is the int8 target)."""
    t = tiny["target"]
    loaded = {t.source: t}
    if drafter in tiny:
        loaded[tiny[drafter].source] = tiny[drafter]
        drafter = tiny[drafter].source
    kw.setdefault("dtype", "float32")
    # a fixed k: with the length chosen from timings (a loaded machine measures rows dear), the draft
    # lengths vary between two requests and with them the seeded sampling's random draws
    kw.setdefault("cost_aware", False)
    return build_engine(EngineSpec(target=t.source, drafter=drafter, num_speculative_tokens=3, **kw), loaded=loaded)


@pytest.fixture(scope="module")
def built(tiny):
    return tiny_built(tiny)


@pytest.fixture(scope="module")
def server(built):
    with serve_in_thread(built, max_num_seqs=4, served_model_name="tiny") as srv:
        yield srv


@pytest.fixture()
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def oracle(lm, prompt_ids: list[int], max_tokens: int, **kw) -> tuple[list[int], str, str]:
    """(tokens, text, finish_reason) of the engine alone with no drafter: what the server must return.

    The text leaves out the stop token that ended generation and special tokens, as vLLM's does.
    """
    r = SpecEngine(lm).generate(prompt_ids, SamplingParams(max_new_tokens=max_tokens, **kw))
    eos = SpecEngine(lm).eos_ids
    stop = set(kw.get("stop_token_ids", ())) | (set() if kw.get("ignore_eos") else eos)
    shown = r.tokens[:-1] if r.finish_reason == "stop" and r.tokens[-1] in stop else r.tokens
    text = lm.view.decode_bytes([t for t in shown if t not in lm.view.special_ids]).decode("utf-8", errors="replace")
    return r.tokens, text, r.finish_reason


def sse_events(response: httpx.Response) -> list:
    """The JSON payloads of an SSE response, and the final "[DONE]" as a string."""
    out = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def metrics(client: httpx.Client) -> dict[str, float]:
    """``name{labels}`` → value for every sample of /metrics (labels sorted, model/engine dropped)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(client.get("/metrics").text):
        for s in fam.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k not in ("model_name", "engine"))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def per_pos(m: dict[str, float]) -> list[float]:
    items = sorted(
        (int(k.split("position=")[1].rstrip("}")), v)
        for k, v in m.items()
        if k.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total")
    )
    return [v for _, v in items]


def wait_idle(client: httpx.Client, timeout: float = 10.0) -> dict[str, float]:
    """Metrics once no request is running or waiting."""
    deadline = time.monotonic() + timeout
    while True:
        m = metrics(client)
        if m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0:
            return m
        if time.monotonic() > deadline:
            raise AssertionError(f"server still busy: {m['vllm:num_requests_running']} running")
        time.sleep(0.02)
