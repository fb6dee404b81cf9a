"""EAGLE-3 heads (train-head --arch eagle3): trained end to end on a tiny target, the offline chain
against the engine's incremental drafting, lossless drafting in the engine, and the start."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file
from transformers import DynamicCache

from vocabbridge.cli import main
from vocabbridge.engine import SamplingParams, SpecEngine, load_causal_lm
from vocabbridge.engine.drafters.mtp import MTPDrafter
from vocabbridge.engine.factory import build_engine
from vocabbridge.errors import ConfigError
from vocabbridge.heads.draft_head import causal_mask, target_parts
from vocabbridge.heads.eagle3 import Eagle3Head, default_aux_layers, new_eagle3_head
from vocabbridge.spec import EngineSpec
from vocabbridge.testing import tiny_model
from vocabbridge.training.chain import chain, collate
from vocabbridge.training.data import load_shard
from vocabbridge.training.train import Recipe, train_head

CPU_ONLY = pytest.mark.skipif(
    torch.cuda.is_available(), reason="int8 (fbgemm's dynamic quantization) runs on the CPU only; on a GPU the target runs bf16"
)


RECIPE = Recipe(
    arch="eagle3",
    max_prompts=16,
    new_tokens=16,
    gen_batch=8,
    epochs=2,
    batch_tokens=384,
    lr=3e-3,
    draft_vocab=400,
    dtype="float32",
    data_dtype="float32",
)
PROMPTS = ["Hello world! It's a beautiful day", "def tokenize(text):", "안녕하세요. 오늘 날씨가"]


@pytest.fixture(scope="module")
def trained(tok_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle3")
    target = tiny_model(root / "target", tok_dirs["base"], seed=0, layers=3)
    messages = []
    result = train_head(str(target), root / "head", RECIPE, say=messages.append, quiet=True)
    return {"target": target, "head": root / "head", "result": result, "messages": messages}


@pytest.fixture(scope="module")
def engine_target(trained):
    return load_causal_lm(str(trained["target"]), dtype="float32")


def _drafter(engine_target, head_dir, dtype="float32") -> MTPDrafter:
    spec = EngineSpec(target=str(head_dir), drafter=f"mtp:{head_dir}", drafter_dtype=dtype)
    return MTPDrafter.from_spec(spec, engine_target, None)


def test_training_writes_an_eagle3_head_that_reads_three_layers(trained):
    cfg = json.loads((trained["head"] / "config.json").read_text())
    assert cfg["arch"] == "eagle3" and cfg["aux_layers"] == [0, 1, 3] == list(default_aux_layers(3))
    assert cfg["draft_vocab_size"] == 400
    assert set(cfg["training"]["least_squares_r2"]) == {"fc", "mlp.down_proj"}
    ev = trained["result"].eval
    assert ev["positions"] > 0 and len(ev["acceptance_per_position"]) == 3
    assert "acceptance_per_position_full_vocab" not in ev  # its vLLM export drafts over its own rows (d2t)
    losses = [h["loss"] for h in trained["result"].history if "loss" in h]
    assert sum(losses[-3:]) / 3 < 0.95 * sum(losses[:3]) / 3
    assert any(m.startswith("least-squares start: fc R²") for m in trained["messages"])


def test_the_data_hold_the_residual_streams_entering_the_chosen_layers(trained):
    """aux = the streams entering layers 0 and 1 (transformers' hidden_states[0], [1]) and the final
    norm's input (whose norm is the final hidden state), as the engine hands them to the head."""
    target = load_causal_lm(str(trained["target"]), dtype="float32", pack=False)
    s = load_shard(sorted((trained["head"] / "train" / "data").glob("*.safetensors"))[0])[0]
    d = 64
    with torch.inference_mode():
        out = target.model(input_ids=s.tokens[None, :-1].to(target.device), output_hidden_states=True)
        streams = [h[0].cpu() for h in out.hidden_states[:2]]
        final = target.final_norm(s.aux[:, 2 * d :].float().to(target.device)).cpu()
    assert s.aux.shape == (len(s.tokens) - 1, 3 * d)
    assert torch.allclose(s.aux[:, :d].float(), streams[0], atol=2e-2, rtol=1e-2)
    assert torch.allclose(s.aux[:, d : 2 * d].float(), streams[1], atol=2e-2, rtol=1e-2)
    assert torch.allclose(final, s.hidden.float(), atol=3e-2, rtol=1e-2)
    _, feats = target.session().extend(s.tokens[:-1].tolist(), keep=1, hidden=(0, 1, 3))
    assert torch.allclose(s.aux.float(), feats.cpu(), atol=2e-2, rtol=1e-2)


def test_the_parallel_chain_equals_incremental_drafting(trained, engine_target):
    head = _drafter(engine_target, trained["head"]).head
    seq = load_shard(sorted((trained["head"] / "train" / "data").glob("*.safetensors"))[0])[1]
    t2d = torch.full((engine_target.vocab_size,), -1, dtype=torch.long)
    t2d[head.d2t.cpu()] = torch.arange(head.draft_vocab_size)
    dev = engine_target.device
    b = collate([seq], t2d, 10_000, features="aux").to(dev)
    with torch.inference_mode():
        outs = chain(head, b, 3)
        feats, tokens = b.hidden[0], b.next_tokens[0]
        for p1 in (5, seq.gen_start, b.hidden.shape[1] - 3):
            cache = DynamicCache()
            pos = torch.arange(p1 + 1, device=dev)
            g = head(
                head.combine(feats[None, : p1 + 1]),
                tokens[None, : p1 + 1],
                pos[None],
                cache=cache,
                mask=causal_mask(p1 + 1, 0, device=dev),
            )
            g = g[0, -1]
            assert torch.allclose(g, outs[0][0, p1], atol=1e-4)
            for s in (1, 2):
                at = torch.tensor([[p1 + s]], device=dev)
                g = head(g.view(1, 1, -1), tokens[None, p1 + s : p1 + s + 1], at, cache=cache)[0, -1]
                assert torch.allclose(g, outs[s][0, p1 + s], atol=1e-4), (p1, s)


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("dtype", ["float32", pytest.param("int8", marks=CPU_ONLY)])
def test_eagle3_drafter_greedy_output_is_identical_to_plain(trained, engine_target, k, dtype):
    d = _drafter(engine_target, trained["head"], dtype)
    drafted = 0
    for p in PROMPTS:
        ids = engine_target.view.encode(p)
        params = SamplingParams(max_new_tokens=40, ignore_eos=True)
        want = SpecEngine(engine_target).generate(ids, params)
        got = SpecEngine(engine_target, d, num_speculative_tokens=k, prefill_chunk=7).generate(ids, params)
        assert got.tokens == want.tokens, p
        drafted += got.stats.draft_tokens
    assert drafted > 0


def test_ngram_first_with_an_eagle3_head_stays_lossless(trained, engine_target):
    built = build_engine(
        EngineSpec(
            target=engine_target.source,
            drafter=f"mtp:{trained['head']}",
            dtype="float32",
            drafter_dtype="float32",
            ngram_first=True,
        ),
        loaded={engine_target.source: engine_target},
    )
    ids = engine_target.view.encode(PROMPTS[0] * 3)
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    assert built.engine.generate(ids, params).tokens == SpecEngine(engine_target).generate(ids, params).tokens


def test_eagle3_sampling_keeps_the_targets_distribution(trained, engine_target):
    """Rejection sampling with the head's q: the first sampled token's frequencies match plain sampling's."""
    d = _drafter(engine_target, trained["head"])
    ids = engine_target.view.encode(PROMPTS[1])
    counts_spec, counts_plain = {}, {}
    for seed in range(120):
        params = SamplingParams(max_new_tokens=2, temperature=1.0, seed=seed)
        a = SpecEngine(engine_target, d, num_speculative_tokens=2).generate(ids, params).tokens[1]
        b = SpecEngine(engine_target).generate(ids, params).tokens[1]
        counts_spec[a] = counts_spec.get(a, 0) + 1
        counts_plain[b] = counts_plain.get(b, 0) + 1
    top = max(counts_plain, key=counts_plain.get)
    assert abs(counts_spec.get(top, 0) - counts_plain[top]) < 30


def test_a_fresh_head_starts_by_repeating_the_targets_prediction(trained):
    """With the final norm's input among its layers, a fresh head's first step is the target's own
    final hidden state: its logits are the target's next-token logits (the least-squares fit then
    moves it to x_{t+2})."""
    lm = load_causal_lm(str(trained["target"]), dtype="float32", pack=False)
    parts = target_parts(lm.model)
    head = new_eagle3_head(parts, aux_layers=(1, 3), draft_ids=None)
    ids = lm.view.encode(PROMPTS[0])
    with torch.inference_mode():
        logits, feats = lm.session().extend(ids, keep=len(ids), hidden=(1, 3))
        dev = feats.device
        head.to(dev)
        nxt, pos = torch.tensor([ids[1:] + [0]], device=dev), torch.arange(len(ids), device=dev)[None]
        s = head(head.combine(feats[None]), nxt, pos, mask=causal_mask(len(ids), 0, device=dev))
        got = head.logits(s)[0]
    assert torch.allclose(got, logits, rtol=2e-3, atol=1e-3)  # two norms' epsilons apart
    assert torch.equal(got.argmax(-1), logits.argmax(-1))


def test_an_eagle3_head_needs_a_llama_or_qwen2_layer(trained):
    lm = load_causal_lm(str(trained["target"]), dtype="float32", pack=False)
    parts = target_parts(lm.model)
    parts.config.model_type = "gemma2"
    try:
        with pytest.raises(ConfigError, match="vLLM's eagle3"):
            Eagle3Head(parts, aux_layers=(1,), draft_ids=None)
    finally:
        parts.config.model_type = "llama"
    with pytest.raises(ConfigError, match="aux_layers"):
        replace(RECIPE, arch="mtp", aux_layers=(1, 2))


def test_train_head_cli_trains_an_eagle3_head_and_exports_it_as_vllms_eagle3_checkpoint(trained, tmp_path):
    out = tmp_path / "h"
    args = ["train-head", "--target", str(trained["target"]), "-o", str(out), "--arch", "eagle3", "--aux-layers", "1,3"]
    args += ["--max-prompts", "6", "--new-tokens", "8", "--epochs", "1", "--draft-vocab", "300"]
    args += ["--dtype", "float32", "--data-dtype", "float32", "--export-vllm", "--json"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)  # progress goes to stderr
    assert got["vllm"] == {"method": "eagle3", "model": str(out / "vllm"), "num_speculative_tokens": 3}
    cfg = json.loads((out / "vllm" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
    assert cfg["draft_vocab_size"] == 300 and cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3]
    assert cfg["fc_norm"] is True and cfg["target_hidden_size"] == 64
    w = load_file(str(out / "vllm" / "model.safetensors"))
    head = load_file(str(out / "head.safetensors"))
    assert w["midlayer.self_attn.q_proj.weight"].shape == (64, 128)  # reads [embedding, hidden]
    assert {"fc.weight", "fc_norm.0.weight", "fc_norm.1.weight", "norm.weight", "midlayer.hidden_norm.weight"} <= set(w)
    assert torch.equal(w["d2t"] + torch.arange(300), head["d2t"])  # vLLM's offsets give back the target ids
    target = load_causal_lm(str(trained["target"]), dtype="float32", pack=False)
    rows = target.model.get_output_embeddings().weight.cpu()[head["d2t"]]
    assert torch.allclose(w["lm_head.weight"].float(), rows, atol=1e-2)
    assert "embed_tokens" not in " ".join(w)  # vLLM shares the target's


def test_an_mtp_head_trains_on_the_data_made_for_an_eagle3_head(trained, tmp_path):
    """Data holding EAGLE-3's layer streams serve an MTP head as they are (one generation, two heads)."""
    import shutil

    data = tmp_path / "mtp" / "train" / "data"
    shutil.copytree(trained["head"] / "train" / "data", data)
    before = {p.name: p.stat().st_mtime_ns for p in data.glob("*.safetensors")}
    r = train_head(
        str(trained["target"]), tmp_path / "mtp", replace(RECIPE, arch="mtp", epochs=1), quiet=True, say=lambda m: None
    )
    assert {p.name: p.stat().st_mtime_ns for p in data.glob("*.safetensors")} == before
    assert r.head.arch == "mtp" and r.eval["positions"] > 0
