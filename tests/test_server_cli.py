"""``vocabbridge serve`` and ``vocabbridge presets``: the exact vLLM command per drafter kind
(--dry-run), the message without vLLM, and the embedded server run as a user runs it."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import time

import httpx
import pytest
from click.testing import CliRunner

from vocabbridge.cli import main
from vocabbridge.errors import ConfigError
from vocabbridge.vllm.backend import prepare, vllm_command, vllm_installed

QWEN = "Qwen/Qwen2.5-Coder-1.5B-Instruct"


@pytest.fixture(autouse=True)
def _no_local_models(monkeypatch):
    monkeypatch.delenv("VOCABBRIDGE_MODELS", raising=False)  # presets resolve to hub ids
    monkeypatch.delenv("VOCABBRIDGE_API_KEY", raising=False)
    # with vLLM's CPU build installed, serve adds VLLM_CPU_KVCACHE_SPACE unless the user set it: set
    # here, so the exact commands below are the same with and without vLLM (and in any test order)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")


def dry_run(*args: str) -> tuple[list[str], str]:
    r = CliRunner().invoke(main, ["serve", "--backend", "vllm", "--dry-run", *args])
    assert r.exit_code == 0, r.output
    return shlex.split(r.stdout.strip()), r.stderr


def spec_config(argv: list[str]) -> dict | None:
    return json.loads(argv[argv.index("--speculative-config") + 1]) if "--speculative-config" in argv else None


def test_vllm_argv_for_ngram():
    argv, _ = dry_run(
        "--target", "qwen2.5-coder-1.5b", "--drafter", "ngram", "-k", "5", "--prompt-lookup-min", "2", "--prompt-lookup-max", "6"
    )
    assert argv == [
        "vllm",
        "serve",
        QWEN,
        "--host",
        "127.0.0.1",
        "--port",
        "8000",
        "--served-model-name",
        "qwen2.5-coder-1.5b",
        "--speculative-config",
        '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_min":2,"prompt_lookup_max":6}',
    ]


def test_vllm_argv_without_a_drafter():
    argv, _ = dry_run("--target", "qwen2.5-coder-1.5b", "--port", "9001", "--host", "0.0.0.0")
    assert argv == ["vllm", "serve", QWEN, "--host", "0.0.0.0", "--port", "9001", "--served-model-name", "qwen2.5-coder-1.5b"]


def test_vllm_argv_for_mtp_and_every_passthrough():
    argv, _ = dry_run(
        "--drafter",
        "mtp",
        "--target",
        "exaone-4.5-33b",
        "-k",
        "3",
        "--tensor-parallel-size",
        "4",
        "--max-num-seqs",
        "64",
        "--served-model-name",
        "exaone",
        "--",
        "--max-model-len",
        "32768",
        "--gpu-memory-utilization",
        "0.9",
    )
    assert argv == [
        "vllm",
        "serve",
        "LGAI-EXAONE/EXAONE-4.5-33B",
        "--host",
        "127.0.0.1",
        "--port",
        "8000",
        "--served-model-name",
        "exaone",
        "--tensor-parallel-size",
        "4",
        "--max-num-seqs",
        "64",
        "--speculative-config",
        '{"method":"mtp","num_speculative_tokens":3}',
        "--max-model-len",
        "32768",
        "--gpu-memory-utilization",
        "0.9",
    ]


def test_vllm_draft_model_with_another_vocabulary_is_heterogeneous_and_greedy():
    argv, notes = dry_run("--drafter", "exaone-1.2b", "--mode", "tli", "-k", "3")  # the preset picks its target
    assert argv[:3] == ["vllm", "serve", "LGAI-EXAONE/EXAONE-4.5-33B"]
    assert spec_config(argv) == {
        "method": "draft_model",
        "model": "LGAI-EXAONE/EXAONE-4.0-1.2B",
        "num_speculative_tokens": 3,
        "use_heterogeneous_vocab": True,
        "draft_sample_method": "greedy",
    }
    assert "different vocabulary" in notes


def test_vllm_with_another_vocabulary_runs_its_token_level_path_with_our_map_by_default():
    """Measured fastest inside vLLM (the map plugin 5.32 tok/s, our text proposer 4.05, none 4.67)."""
    argv, notes = dry_run("--drafter", "exaone-1.2b", "-k", "3")
    start = argv.index("vllm")
    assert not any(a.startswith("VOCABBRIDGE_VLLM_DRAFTER=") for a in argv[:start])
    assert argv[start : start + 3] == ["vllm", "serve", "LGAI-EXAONE/EXAONE-4.5-33B"]
    assert spec_config(argv) == {
        "method": "draft_model",
        "model": "LGAI-EXAONE/EXAONE-4.0-1.2B",
        "num_speculative_tokens": 3,
        "use_heterogeneous_vocab": True,
        "draft_sample_method": "greedy",
    }
    assert "our bytes map, built and cached before vLLM starts (the vocabbridge plugin)" in notes
    cmd = vllm_command(_spec(drafter="exaone-1.2b"))
    assert cmd.map_build is not None and cmd.map_build[2] == "bytes"


def test_vllm_with_another_vocabulary_runs_our_text_drafter_when_asked():
    argv, notes = dry_run("--drafter", "exaone-1.2b:text", "-k", "3")
    start = argv.index("vllm")
    assert any(a.startswith("VOCABBRIDGE_VLLM_DRAFTER=") for a in argv[:start])
    assert spec_config(argv) == {
        "method": "custom_class",
        "model": "vocabbridge.vllm.proposers.TextProposer",
        "num_speculative_tokens": 3,
    }
    assert "text drafter runs inside vLLM's worker" in notes


@pytest.mark.skipif(importlib.util.find_spec("arctic_inference") is not None, reason="arctic-inference is installed here")
def test_vllms_suffix_method_without_arctic_inference_is_refused_before_vllm_starts():
    argv, notes = dry_run("--target", "qwen2.5-coder-1.5b", "--drafter", "suffix", "--suffix-min-prob", "0.2")
    assert spec_config(argv)["method"] == "suffix" and spec_config(argv)["suffix_decoding_min_token_prob"] == 0.2
    assert "arctic-inference" in notes  # the dry run says what vLLM will need
    with pytest.raises(ConfigError, match="arctic-inference.*CMAKE_ARGS.*--backend embedded"):
        prepare(vllm_command(_spec(target="qwen2.5-coder-1.5b", drafter="suffix")), say=print)


def test_vllm_runs_the_ngram_map_as_our_proposer_with_its_settings():
    argv, notes = dry_run("--target", "qwen2.5-coder-1.5b", "--drafter", "ngram-map", "--ngram-map-n", "6", "-k", "5")
    assert any(a.startswith("VOCABBRIDGE_VLLM_DRAFTER=") for a in argv[: argv.index("vllm")])
    assert spec_config(argv) == {
        "method": "custom_class",
        "model": "vocabbridge.vllm.proposers.NgramMapProposer",
        "num_speculative_tokens": 5,
    }
    assert "ngram-map drafter runs inside vLLM's worker" in notes and "embedded engine only" not in notes
    cmd = vllm_command(_spec(target="qwen2.5-coder-1.5b", drafter="ngram-map", ngram_map_min_hits=2))
    doc = json.loads(cmd.files[0][1])
    assert doc["drafter"] is None and doc["spec"]["ngram_map_min_hits"] == 2  # the proposer reads the map's settings


def test_vllm_draft_model_with_the_same_vocabulary_is_plain():
    argv, notes = dry_run("--drafter", "qwen2.5-coder-0.5b")
    assert spec_config(argv) == {
        "method": "draft_model",
        "model": "Qwen/Qwen2.5-Coder-0.5B-Instruct",
        "num_speculative_tokens": 4,
    }
    assert "same vocabulary" in notes


def test_vllm_vocabularies_of_local_models_are_compared_token_by_token(tiny):
    t, spm, draft = tiny["target"].source, tiny["spm"].source, tiny["draft"].source
    same = vllm_command(_spec(target=t, drafter=draft)).speculative_config
    other = vllm_command(_spec(target=t, drafter=spm, mode="tli", map_path="m.json"))
    assert same == {"method": "draft_model", "model": draft, "num_speculative_tokens": 4}
    assert other.speculative_config["use_heterogeneous_vocab"] is True
    assert any("token by token" in n for n in other.notes) and any("vocabbridge plugin" in n for n in other.notes)
    assert other.env["VOCABBRIDGE_VLLM_MAP"].endswith("m.json") and other.map_check[0] == "m.json"
    assert other.argv[2] == t and other.model_name == "target"  # a path is served under its file name
    ours = vllm_command(_spec(target=t, drafter=spm, mode="bridged", min_confidence=0.3))
    assert ours.speculative_config == {
        "method": "custom_class",
        "model": "vocabbridge.vllm.proposers.BridgedProposer",
        "num_speculative_tokens": 4,
    }
    assert ours.files and ours.env["VOCABBRIDGE_VLLM_DRAFTER"] == ours.files[0][0]
    assert json.loads(ours.files[0][1])["spec"]["min_confidence"] == 0.3  # the proposer reads the engine's options


def test_a_same_vocabulary_drafter_with_our_policies_runs_as_our_draft_proposer_in_vllm(tiny):
    """vLLM's draft_model drafts k tokens every step with no prompt lookup: with --ngram-first or
    --min-confidence the drafter runs as our DraftProposer, which honours both (and says so)."""
    t, draft = tiny["target"].source, tiny["draft"].source
    for kw in ({"ngram_first": True}, {"min_confidence": 0.3}):
        ours = vllm_command(_spec(target=t, drafter=draft, **kw))
        assert ours.speculative_config == {
            "method": "custom_class",
            "model": "vocabbridge.vllm.proposers.DraftProposer",
            "num_speculative_tokens": 4,
        }
        doc = json.loads(ours.files[0][1])
        assert doc["drafter"] == draft and doc["spec"]["ngram_first"] == kw.get("ngram_first", False)
        assert any("draft proposer" in n for n in ours.notes)
        assert not any("embedded engine only" in n for n in ours.notes)  # ours honours them
    plain = vllm_command(_spec(target=t, drafter=draft, backoff=False))
    assert plain.speculative_config["method"] == "draft_model" and not plain.files
    assert any("--backoff" in n and "embedded engine only" in n for n in plain.notes)


def test_vllm_api_key_goes_through_the_environment():
    cmd = vllm_command(_spec(target="qwen2.5-coder-1.5b"), api_key="s3cret")
    assert "s3cret" not in cmd.argv and cmd.env == {"VLLM_API_KEY": "s3cret"}
    assert cmd.shell().startswith("VLLM_API_KEY=$VOCABBRIDGE_API_KEY vllm serve ")


def test_mtp_needs_a_target_with_an_mtp_head():
    r = CliRunner().invoke(
        main, ["serve", "--backend", "vllm", "--dry-run", "--target", "qwen2.5-coder-1.5b", "--drafter", "mtp"]
    )
    assert r.exit_code == 1 and "has no MTP head" in r.output


@pytest.mark.skipif(vllm_installed(), reason="vLLM is installed here")
def test_without_vllm_a_clear_message_says_how_to_install_it():
    r = CliRunner().invoke(main, ["serve", "--backend", "vllm", "--target", "qwen2.5-coder-1.5b", "--drafter", "ngram"])
    assert r.exit_code == 1
    assert "pip install 'vocabbridge[vllm]'" in r.output and "CUDA GPU" in r.output and len(r.output.strip().splitlines()) == 1


@pytest.mark.skipif(vllm_installed(), reason="vLLM is installed here")
def test_auto_picks_the_embedded_engine_here_and_says_why(tiny):
    r = CliRunner().invoke(main, ["serve", "--target", tiny["target"].source, "--drafter", "ngram", "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "backend embedded (vLLM is not installed" in r.stderr and "http://127.0.0.1:8000" in r.stdout


def test_embedded_refuses_vllm_only_options(tiny):
    base = ["serve", "--backend", "embedded", "--target", tiny["target"].source]
    r = CliRunner().invoke(main, [*base, "--tensor-parallel-size", "2"])
    assert r.exit_code == 1 and "--backend vllm" in r.output
    r = CliRunner().invoke(main, [*base, "--", "--max-model-len", "10"])
    assert r.exit_code == 1 and "arguments after -- are for vLLM" in r.output


def test_presets_list_what_each_resolves_to(tmp_path, monkeypatch):
    r = CliRunner().invoke(main, ["presets", "--json"])
    rows = {p["name"]: p for p in json.loads(r.stdout)}
    assert {
        "exaone-1.2b",
        "exaone-4.5-33b",
        "exaone-4.5-33b-fp8",
        "qwen2.5-coder-1.5b",
        "qwen2.5-coder-0.5b",
        "smollm2-135m",
    } <= set(rows)
    assert rows["exaone-1.2b"]["pairs_with"] == "exaone-4.5-33b" and rows["qwen2.5-coder-1.5b"]["resolves_to"] == QWEN
    (tmp_path / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf").write_bytes(b"GGUF")
    monkeypatch.setenv("VOCABBRIDGE_MODELS", str(tmp_path))
    rows = {p["name"]: p for p in json.loads(CliRunner().invoke(main, ["presets", "--json"]).stdout)}
    assert rows["qwen2.5-coder-1.5b"]["local"] and rows["qwen2.5-coder-1.5b"]["resolves_to"].startswith(str(tmp_path))
    r = CliRunner().invoke(main, ["presets"])
    assert r.exit_code == 0 and "exaone-1.2b" in r.stdout and "(local)" in r.stdout


def test_serve_runs_until_sigint_like_a_user_runs_it(tiny):
    """The contract the benchmark relies on: a line with the URL once ready, /health 200, exit 0 on SIGINT."""
    env = os.environ | {"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "vocabbridge", "serve", "--target", tiny["target"].source, "--drafter", "ngram", "--port", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = proc.stdout.readline()
        assert "ready on http://127.0.0.1:" in line, line + proc.stderr.read()
        url = line.split("ready on ")[1].split()[0]
        assert httpx.get(url + "/health").status_code == 200
        r = httpx.post(url + "/v1/completions", json={"model": "target", "prompt": "hi", "max_tokens": 5}, timeout=30)
        assert r.json()["usage"]["completion_tokens"] == 5
        assert "drafter ngram" in line and "model target" in line
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
        assert "loading target" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            time.sleep(0.1)


def _spec(**kw):
    from vocabbridge.engine.factory import EngineSpec

    return EngineSpec(**kw)


def test_the_queue_limit_is_an_option_of_the_embedded_server(tiny):
    target = ["serve", "--backend", "embedded", "--target", tiny["target"].source, "--dry-run"]
    r = CliRunner().invoke(main, target)
    assert r.exit_code == 0 and "32768 queued prompt tokens" in r.stdout, r.output
    r = CliRunner().invoke(main, [*target, "--max-queued-tokens", "0"])
    assert r.exit_code == 0 and "unlimited queued prompt tokens" in r.stdout, r.output
    r = CliRunner().invoke(main, ["serve", "--backend", "vllm", "--dry-run", "--target", QWEN, "--max-queued-tokens", "9"])
    assert r.exit_code == 1 and "vLLM has no such limit" in r.output
