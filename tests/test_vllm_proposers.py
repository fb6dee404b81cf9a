"""Our custom_class proposers driven exactly as vLLM's model runner drives them (batch rows, request
ids on the runner's input batch, sampled tokens, the committed-token buffer), with tiny models and
a greedy verifier: no vLLM needed. tests/test_vllm_real.py runs them inside real vLLM."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from vocabbridge.engine import SamplingParams, SpecEngine
from vocabbridge.spec import EngineSpec
from vocabbridge.vllm import proposers
from vocabbridge.vllm.proposers import BridgedProposer, DraftProposer, NgramMapProposer, TextProposer, proposer_config

MAX_LEN = 512


class FakeModelRunner:
    """What our proposer reads of vLLM's GPUModelRunner: ``input_batch.req_ids``; it is constructed
    inside the runner's ``__init__``, as vLLM's create_custom_proposer does."""

    def __init__(self, cls, vllm_config):
        self.input_batch = SimpleNamespace(req_ids=[])
        self.drafter = cls(vllm_config)


def _proposer(cls, tiny, tmp_path, monkeypatch, **spec_kw):
    t = tiny["target"]
    model = cls is not NgramMapProposer
    drafter = (tiny["draft"] if cls is DraftProposer else tiny["spm"]).source if model else "ngram-map"
    spec = EngineSpec(target=t.source, drafter=drafter, drafter_dtype="float32", **spec_kw)
    path, text = proposer_config(spec, drafter if model else None)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    monkeypatch.setenv(proposers.CONFIG_ENV, str(path))
    cfg = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=3),
        model_config=SimpleNamespace(max_model_len=MAX_LEN, tokenizer=t.view.source, get_vocab_size=lambda: t.vocab_size),
    )
    runner = FakeModelRunner(cls, cfg)
    runner.drafter.load_model(object())  # vLLM passes its target nn.Module
    return runner


def _drive(runner, tiny, prompts: dict[str, list[int]], n_new: int):
    """vLLM's loop for several requests in one batch: verify the last proposals greedily with the
    target, append what was kept, ask the proposer for the next drafts. Returns outputs and counts."""
    target = tiny["target"]
    ctx = {rid: list(p) for rid, p in prompts.items()}
    out = {rid: [] for rid in prompts}
    drafts = {rid: [] for rid in prompts}
    accepted = proposed = 0
    buf = np.zeros((8, MAX_LEN), dtype=np.int32)
    while any(len(o) < n_new for o in out.values()):
        live = [rid for rid in prompts if len(out[rid]) < n_new]
        runner.input_batch.req_ids = live
        sampled = []
        for rid in live:
            s = target.session()
            logits = s.extend(ctx[rid] + drafts[rid], keep=len(drafts[rid]) + 1)
            best = logits.argmax(-1).tolist()
            n_acc = next((i for i, d in enumerate(drafts[rid]) if d != best[i]), len(drafts[rid]))
            new = drafts[rid][:n_acc] + [best[n_acc]]
            accepted, proposed = accepted + n_acc, proposed + len(drafts[rid])
            ctx[rid] += new
            out[rid] += new
            sampled.append(new)
        counts = np.zeros(8, dtype=np.int32)
        for i, rid in enumerate(live):
            buf[i, : len(ctx[rid])] = ctx[rid]
            counts[i] = len(ctx[rid])
        got = runner.drafter.propose(sampled, counts, buf, slot_mappings={})
        assert len(got) == len(live) and all(len(g) <= 3 and all(isinstance(t, int) for t in g) for g in got)
        drafts = {rid: g for rid, g in zip(live, got)}
    return {rid: o[:n_new] for rid, o in out.items()}, accepted, proposed


@pytest.mark.parametrize(
    "cls, spec_kw",
    [
        (TextProposer, {}),
        (BridgedProposer, {}),
        (DraftProposer, {"ngram_first": True, "min_confidence": 0.05}),
        (NgramMapProposer, {"ngram_map_n": 2, "ngram_map_value": 3}),
    ],
)
def test_proposers_driven_like_vllm_give_the_targets_greedy_output(cls, spec_kw, tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("VOCABBRIDGE_CACHE", str(tmp_path))
    runner = _proposer(cls, tiny, tmp_path, monkeypatch, **spec_kw)
    view = tiny["target"].view
    prompts = {
        "a": view.encode("Hello world, give them the results. Hello world, give them the results. Hello world,"),
        "b": view.encode("안녕하세요. 오늘 날씨가"),
    }
    got, accepted, proposed = _drive(runner, tiny, prompts, 24)
    plain = SpecEngine(tiny["target"])
    for rid, p in prompts.items():
        assert got[rid] == plain.generate(p, SamplingParams(max_new_tokens=24)).tokens
    assert proposed > 0 and set(runner.drafter.requests) == {"a", "b"}  # state keyed by vLLM's request ids


def test_state_follows_request_ids_and_is_evicted(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("VOCABBRIDGE_CACHE", str(tmp_path))
    monkeypatch.setattr(proposers, "EVICT_AFTER", 2)
    runner = _proposer(TextProposer, tiny, tmp_path, monkeypatch)
    view = tiny["target"].view
    _drive(runner, tiny, {"a": view.encode("The quick brown fox")}, 3)
    assert set(runner.drafter.requests) == {"a"}
    _drive(runner, tiny, {"b": view.encode("for i in range(10):")}, 6)
    assert set(runner.drafter.requests) == {"b"}  # "a" left the batch and was dropped


def test_without_configuration_the_message_says_how_to_start_vllm(monkeypatch):
    monkeypatch.delenv(proposers.CONFIG_ENV, raising=False)
    with pytest.raises(RuntimeError, match="vocabbridge serve --backend vllm --drafter MODEL --mode text"):
        TextProposer(SimpleNamespace())
