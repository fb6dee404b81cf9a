"""End to end on a real checkpoint (SmolLM2-135M-Instruct, the GGUF file itself): what a user runs
after `pip install`, so a missing dependency or a broken loader fails here and not on their machine.

The file comes from ``../shared/tools/fetch-models.sh DEST smollm2-135m`` (CI fetches it); set
``VOCABBRIDGE_MODELS`` to DEST. Without it the tests skip, saying so, unless
``VOCABBRIDGE_REQUIRE_REAL=1`` (as in CI), where a missing file is a failure.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from vocabbridge.chat import chat_prompt_ids
from vocabbridge.cli import main
from vocabbridge.engine import SamplingParams, SpecEngine
from vocabbridge.engine.factory import build_engine
from vocabbridge.server import serve_in_thread
from vocabbridge.spec import EngineSpec

REPO = Path(__file__).resolve().parents[1]
MODELS = Path(os.environ.get("VOCABBRIDGE_MODELS", REPO.parent / "models"))
SMOL = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = ["Write a Python function that reverses a string.", "한국의 수도는 어디인가요? 짧게 답해 주세요."]


def need_model(path: Path) -> None:
    """Skip (or, with VOCABBRIDGE_REQUIRE_REAL=1 as in CI, fail) when a real checkpoint is missing."""
    if not path.is_file():
        why = f"needs {path} (../shared/tools/fetch-models.sh DEST smollm2-135m qwen2.5-coder-0.5b, then VOCABBRIDGE_MODELS=DEST)"
        if os.environ.get("VOCABBRIDGE_REQUIRE_REAL"):
            pytest.fail(why)
        pytest.skip(why)


@pytest.fixture(scope="module")
def smol():
    """The models a module's tests load, shared (``build_engine(loaded=...)``); the fp32 copies of the
    GGUF weights go to the test run's cache (conftest), converted once per run."""
    need_model(SMOL)
    return {}


def _built(loaded, drafter, **kw):
    kw.setdefault("dtype", "float32")  # these tests check the fp32 torch target (the default is llama.cpp's or int8)
    kw.setdefault("cost_aware", False)  # they count drafts: a length chosen from timings would vary with the machine's load
    return build_engine(EngineSpec(target=str(SMOL), drafter=drafter, num_speculative_tokens=4, **kw), loaded=loaded)


@pytest.mark.parametrize(
    "drafter, mode", [("ngram", "auto"), ("suffix", "auto"), ("self", "draft"), ("self", "text"), ("self", "bridged")]
)
def test_every_drafter_is_lossless_on_the_real_model(smol, drafter, mode):
    built = _built(smol, str(SMOL) if drafter == "self" else drafter, mode=mode)
    assert built.mode == (mode if drafter == "self" else drafter)
    plain = SpecEngine(built.target)
    params = SamplingParams(max_new_tokens=40)
    accepted = 0
    for p in PROMPTS:
        ids = chat_prompt_ids(built.target.view, [{"role": "user", "content": p}])
        got = built.engine.generate(ids, params)
        want = plain.generate(ids, params)
        assert got.tokens == want.tokens, (drafter, mode, p)
        accepted += got.stats.accepted
    if drafter == "self":  # the int8 copy of the target drafting for it agrees most of the time
        assert accepted > 20


def test_served_chat_equals_the_engine_alone(smol):
    built = _built(smol, "ngram")
    messages = [{"role": "user", "content": PROMPTS[0]}]
    want = built.engine.generate(chat_prompt_ids(built.target.view, messages), SamplingParams(max_new_tokens=24))
    with serve_in_thread(built) as srv, httpx.Client(base_url=srv.url, timeout=120) as c:
        r = c.post(
            "/v1/chat/completions", json={"messages": messages, "max_tokens": 24, "temperature": 0, "return_token_ids": True}
        )
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        assert choice["token_ids"] == want.tokens and choice["message"]["content"] == want.text
        metrics = c.get("/metrics").text
        assert "vllm:spec_decode_num_drafts_total" in metrics and "vllm:generation_tokens_total" in metrics


def test_generate_command_on_the_real_model(smol):
    r = CliRunner().invoke(
        main,
        [
            "generate",
            "--target",
            str(SMOL),
            "--drafter",
            "ngram",
            "-p",
            PROMPTS[0],
            "--max-tokens",
            "16",
            "--compare-plain",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["plain"]["identical"] is True and out["stats"]["generated"] == 16


def test_generate_and_the_server_show_no_end_of_turn_token(smol):
    """SmolLM2 ends its answer with <|im_end|>, which `generate` printed as text: the text stops
    before it (the token ids keep it), in `generate` and in the server, streaming or not."""
    say = "Say hello in one short sentence."
    printed = CliRunner().invoke(main, ["generate", "--target", str(SMOL), "--drafter", "ngram", "-p", say, "--max-tokens", "64"])
    assert printed.exit_code == 0, printed.output
    built = _built(smol, "ngram")
    messages = [{"role": "user", "content": say}]
    want = built.engine.generate(chat_prompt_ids(built.target.view, messages), SamplingParams(max_new_tokens=64))
    end = built.target.view.encode("<|im_end|>")
    assert want.finish_reason == "stop" and want.tokens[-1:] == end  # the model ended its turn
    assert "<|im_end|>" not in want.text
    generated = int(re.search(r"generated tokens\s*│\s*(\d+)", printed.stdout).group(1))
    assert generated < 64 and "<|im_end|>" not in printed.stdout  # generate's model ended its turn too
    with serve_in_thread(built) as srv, httpx.Client(base_url=srv.url, timeout=120) as c:
        body = {"messages": messages, "max_tokens": 64, "temperature": 0}
        whole = c.post("/v1/chat/completions", json=body | {"return_token_ids": True}).json()["choices"][0]
        with c.stream("POST", "/v1/chat/completions", json=body | {"stream": True}) as r:
            chunks = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: {")]
    streamed = "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks if ch["choices"])
    assert (whole["token_ids"], whole["finish_reason"]) == (want.tokens, "stop")
    assert whole["message"]["content"] == streamed == want.text


def test_the_conversion_cache_outlives_a_transformers_upgrade(smol, tmp_path, monkeypatch):
    """Converted folders were keyed by transformers' version, so installing the vLLM extra (another
    transformers) converted every model again (13 GB). Now the key is the GGUF file and our FORMAT:
    folders written under the old key by any transformers version are taken over (no conversion),
    one of them kept, the others and those of earlier versions of the file removed."""
    import hashlib
    import shutil

    import transformers

    from vocabbridge.engine import convert, load_causal_lm

    made = convert.converted_folder(SMOL)  # the run's cache (conftest): converted once per run, at most
    gguf = tmp_path / "models" / SMOL.name
    gguf.parent.mkdir()
    shutil.copy2(SMOL, gguf)
    cache = tmp_path / "cache"
    monkeypatch.setenv("VOCABBRIDGE_CACHE", str(cache))

    def old_folder(version: str) -> Path:
        """A folder as the old key named it, written by transformers ``version`` (weights linked, not copied)."""
        st = gguf.stat()
        key = f"{gguf.resolve()}|{st.st_size}|{int(st.st_mtime)}|1|{version}"
        folder = cache / "converted" / f"{gguf.stem}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
        folder.mkdir(parents=True)
        for f in made.iterdir():
            if f.suffix == ".safetensors":
                (folder / f.name).symlink_to(f)
            elif f.name != convert.SOURCE_FILE:
                shutil.copy2(f, folder / f.name)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(config | {"transformers_version": version}))
        return folder

    vllm_extras, ours = old_folder("4.57.1"), old_folder(transformers.__version__)
    said: list[str] = []
    got = convert.converted_folder(gguf, say=said.append)
    assert got == convert.converted_dir(gguf) and convert.is_converted(got)
    assert not any("converting" in s for s in said), said  # taken over, not converted again
    assert not vllm_extras.exists() and not ours.exists()  # one folder per GGUF file
    assert json.loads((got / convert.SOURCE_FILE).read_text())["gguf"] == str(gguf.resolve())
    assert convert.converted_folder(gguf, say=said.append) == got  # and found again by the new key
    assert load_causal_lm(str(gguf), dtype="float32").vocab_size == 49152  # the engine loads it as it is
    assert sorted(p.name for p in (cache / "converted").iterdir()) == [got.name]

    os.utime(gguf, (gguf.stat().st_atime, gguf.stat().st_mtime + 60))  # a new version of the file
    newer = old_folder(transformers.__version__)
    again = convert.converted_folder(gguf, say=said.append)
    assert again != got and again.is_dir() and not newer.exists()
    assert not got.exists(), "the folder of the file's earlier version stays behind"
    assert sorted(p.name for p in (cache / "converted").iterdir()) == [again.name]
