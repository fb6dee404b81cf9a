"""A transplanted drafter in real vLLM (its CPU build): SmolLM2-135M given Qwen2.5-Coder's tokenizer is
served as a plain draft_model (no use_heterogeneous_vocab), greedy output identical to vLLM without
speculation, and vLLM accepts its drafts. The same needs and skips as tests/test_vllm_real.py."""

from __future__ import annotations

import json

import pytest

from .test_vllm_real import QWEN, SMOL, _vllm_here, greedy, plain, spec_counters, vllm_serve  # noqa: F401  (fixtures)


@pytest.fixture(scope="module")
def transplanted(tmp_path_factory):
    from vocabbridge.transplant import transplant

    folder = tmp_path_factory.mktemp("drafters") / "smollm2-qwen"
    transplant(str(SMOL), str(QWEN), folder, init="mean", say=lambda m: None)
    return folder


def test_a_transplanted_drafter_serves_as_a_plain_draft_model(plain, transplanted):  # noqa: F811
    with vllm_serve("--drafter", str(transplanted)) as (url, lines):
        assert greedy(url) == plain
        c = spec_counters(url)
    cmd = next(line for line in lines if "--speculative-config" in line)
    cfg = json.loads(cmd.split("--speculative-config", 1)[1].split()[0].strip("'"))
    assert cfg["method"] == "draft_model" and cfg["model"] == str(transplanted) and "use_heterogeneous_vocab" not in cfg
    assert c["num_drafts"] and c["num_draft_tokens"] and c["num_accepted_tokens"] > 0, c
