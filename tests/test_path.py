"""--kernels auto and --dtype auto: the fast exact path by default, fp32 only when asked, and the reason said."""

from __future__ import annotations

import pytest

from vocabbridge.engine import path as P
from vocabbridge.spec import EngineSpec


@pytest.fixture()
def gguf(tmp_path):
    f = tmp_path / "model.gguf"
    f.write_bytes(b"GGUF")
    return str(f)


def test_a_gguf_target_runs_on_llama_cpps_kernels_where_they_are_installed(gguf, monkeypatch):
    monkeypatch.setattr(P, "llama_cpp_installed", lambda: True)
    p = P.choose_path(EngineSpec(target=gguf, drafter="ngram"), device="cpu")
    assert (p.kernels, p.dtype) == ("llama.cpp", "gguf") and "llama.cpp's kernels" in p.why
    assert p.apply(EngineSpec(target=gguf)).kernels == "llama.cpp"


def test_a_gguf_nearly_all_q4k_drafts_on_our_q4_kernels_and_a_q4_k_m_file_is_told_of_them(gguf, monkeypatch):
    monkeypatch.setattr(P, "llama_cpp_installed", lambda: True)
    monkeypatch.setattr(P, "q4_built", lambda: True)
    monkeypatch.setattr(P, "q4k_share", lambda source: 0.97)  # a Q4_K_S file
    p = P.choose_path(EngineSpec(target=gguf, drafter="ngram"), device="cpu")
    assert (p.kernels, p.dtype) == ("q4", "q4") and "97% Q4_K" in p.why and p.apply(EngineSpec(target=gguf)).kernels == "q4"
    assert P.choose_path(EngineSpec(target=gguf), device="cpu").kernels == "llama.cpp"  # no drafter: level with llama.cpp
    monkeypatch.setattr(P, "q4k_share", lambda source: 0.64)  # Qwen2.5-Coder-1.5B's Q4_K_M: a third Q6_K
    p = P.choose_path(EngineSpec(target=gguf, drafter="ngram"), device="cpu")
    assert p.kernels == "llama.cpp" and "--kernels q4 is faster with a drafter" in p.why and "36% of the weights" in p.why
    monkeypatch.setattr(P, "q4_built", lambda: False)
    assert "--kernels q4" not in P.choose_path(EngineSpec(target=gguf, drafter="ngram"), device="cpu").why


def test_the_q4k_share_of_real_ggufs():
    from .test_real_models import SMOL

    if not SMOL.is_file():
        pytest.skip(f"needs {SMOL} (../shared/tools/fetch-models.sh DEST smollm2-135m, then VOCABBRIDGE_MODELS=DEST)")
    assert P.q4k_share(str(SMOL)) == 0.0  # Q4_1 and Q8_0
    assert P.q4k_share(str(SMOL.parent / "no-such.gguf")) is None


def test_without_llama_cpp_or_without_a_gguf_the_int8_target(gguf, tmp_path, monkeypatch):
    monkeypatch.setattr(P, "llama_cpp_installed", lambda: False)
    p = P.choose_path(EngineSpec(target=gguf), device="cpu")
    assert (p.kernels, p.dtype) == ("torch", "int8") and "pip install 'vocabbridge[llama]'" in p.why
    monkeypatch.setattr(P, "llama_cpp_installed", lambda: True)
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{}")
    p = P.choose_path(EngineSpec(target=str(hf)), device="cpu")
    assert (p.kernels, p.dtype) == ("torch", "int8") and "not a GGUF" in p.why
    assert p.apply(EngineSpec(target="t")).dtype == "int8"


def test_fp32_only_when_asked_and_hidden_state_drafters_stay_on_torch(gguf, monkeypatch):
    monkeypatch.setattr(P, "llama_cpp_installed", lambda: True)
    p = P.choose_path(EngineSpec(target=gguf, dtype="float32"), device="cpu")
    assert (p.kernels, p.dtype, p.why) == ("torch", "float32", "--dtype float32 asked for: the torch target in float32")
    for drafter in ("mtp", "self:2"):
        p = P.choose_path(EngineSpec(target=gguf, drafter=drafter), device="cpu")
        assert (p.kernels, p.dtype) == ("torch", "int8") and "hidden states" in p.why
    p = P.choose_path(EngineSpec(target=gguf, kernels="torch"), device="cpu")
    assert (p.kernels, p.dtype, p.why) == ("torch", "int8", "--kernels torch asked for")


def test_on_a_gpu_torch_in_bf16(gguf):
    p = P.choose_path(EngineSpec(target=gguf), device="cuda")
    assert (p.kernels, p.dtype) == ("torch", "bfloat16") and p.label().startswith("torch bfloat16 on cuda (static cache")


def test_the_built_engine_says_which_path_runs_and_why(tiny):
    from vocabbridge.engine.factory import build_engine

    t = tiny["target"]
    built = build_engine(EngineSpec(target=t.source, drafter="ngram", device="cpu"))  # a folder, not a GGUF: the int8 target
    d = built.describe()
    assert d["kernels"] == "torch" and d["path"] == "torch int8 (batch-invariant)" and "not a GGUF" in d["path_why"]
    assert built.target.rows and d["draft_length"].startswith("fixed k=4")
    line = built.ready_line()
    assert line.startswith("target on torch int8 (batch-invariant) (the target is not a GGUF file") and "draft length" in line
