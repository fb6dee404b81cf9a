"""Shared fixtures: tokenizers trained on the spot (no downloads), and the real ones in ../shared."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vocabbridge import load_tokenizer
from vocabbridge.testing import make_extended, train_base, train_sentencepiece

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach the hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# One cache for the whole run, both xdist workers and the servers they start: a GGUF checkpoint is
# converted to its fp32 HF folder once (35 s for SmolLM2, minutes for the 0.5B under load), not once
# per test module; kept between runs (the key holds the file's size, mtime and transformers'
# version), never in the user's ~/.cache. Tests of the caching itself point it at their own folder.
os.environ.setdefault("VOCABBRIDGE_CACHE", str(Path(__file__).resolve().parents[1] / ".pytest_cache" / "vocabbridge"))

FIRST = ("test_vllm_real.py",)  # the longest file (a vLLM start per test): started first, so it is not the tail
# real checkpoints, vLLM starts, llama.cpp builds: `python -m pytest -q -m "not slow"` leaves them out
SLOW_FILES = {"test_vllm_real.py", "test_real_models.py", "test_llama_cpp.py", "test_heads_real.py"}


def pytest_collection_modifyitems(config, items):
    """The real-vLLM tests first: under ``-n 2 --dist loadfile`` one worker takes them at once while
    the other runs everything else. Tests on real checkpoints (their files, or the ``smol``
    fixture) are marked slow."""
    items.sort(key=lambda item: item.path.name not in FIRST)  # stable: the rest keep their order
    for item in items:
        if item.path.name in SLOW_FILES or "smol" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


SHARED = Path(os.environ.get("VOCABBRIDGE_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))
SHARED_TOKENIZERS = SHARED / "tokenizers"


def shared_tokenizer(name: str) -> Path:
    """Path of a real tokenizer in ../shared/tokenizers, or skip the test saying why."""
    p = SHARED_TOKENIZERS / name
    if not p.is_dir():
        pytest.skip(f"needs ../shared/tokenizers/{name} (real tokenizers are not in a fresh clone; set VOCABBRIDGE_SHARED)")
    return p


@pytest.fixture(scope="session")
def tok_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tokenizers")
    base = train_base(root / "base")
    _, facts = make_extended(base, root / "extended")
    train_sentencepiece(root / "spm")
    return {"base": root / "base", "extended": root / "extended", "spm": root / "spm", "facts": facts}


@pytest.fixture(scope="session")
def base_view(tok_dirs):
    return load_tokenizer(tok_dirs["base"])


@pytest.fixture(scope="session")
def extended_view(tok_dirs):
    return load_tokenizer(tok_dirs["extended"])


@pytest.fixture(scope="session")
def spm_view(tok_dirs):
    return load_tokenizer(tok_dirs["spm"])


@pytest.fixture(scope="session")
def facts(tok_dirs):
    return tok_dirs["facts"]


@pytest.fixture(scope="session")
def tiny(tok_dirs, tmp_path_factory):
    """Tiny random-weight causal LMs (float32, CPU): a target and drafters of three vocabularies."""
    from vocabbridge.engine import load_causal_lm
    from vocabbridge.testing import tiny_model

    root = tmp_path_factory.mktemp("models")
    specs = {
        "target": (tok_dirs["base"], 0, 2),
        "draft": (tok_dirs["base"], 1, 1),  # same vocabulary, other weights
        "spm": (tok_dirs["spm"], 2, 1),  # SentencePiece-style vocabulary
        "extended": (tok_dirs["extended"], 3, 1),  # the EXAONE-4.5-like vocabulary
    }
    out = {}
    for name, (tdir, seed, layers) in specs.items():
        out[name] = load_causal_lm(str(tiny_model(root / name, tdir, seed=seed, layers=layers)), dtype="float32")
    return out
