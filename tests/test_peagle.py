"""P-EAGLE heads (train-head --arch peagle): trained beside an EAGLE-3 head from one generation on a
tiny target, the parallel training pass against the engine's one-forward drafting, lossless drafting
with the head's KV cache rolled back, and the export vLLM's parallel drafting reads."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file
from transformers import DynamicCache

from vocabbridge.cli import main
from vocabbridge.engine import SamplingParams, SpecEngine, load_causal_lm
from vocabbridge.engine.drafters.base import record_proposals
from vocabbridge.engine.drafters.mtp import MTPDrafter
from vocabbridge.errors import ConfigError
from vocabbridge.heads.draft_head import causal_mask
from vocabbridge.heads.peagle import MASK, PEagleHead
from vocabbridge.spec import EngineSpec
from vocabbridge.testing import tiny_model
from vocabbridge.training.chain import chain, collate, parallel, parallel_mask
from vocabbridge.training.data import load_shard
from vocabbridge.training.train import Recipe, train_heads

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
    parallel_tokens=3,
)
PROMPTS = ["Hello world! It's a beautiful day", "def tokenize(text):", "안녕하세요. 오늘 날씨가"]


@pytest.fixture(scope="module")
def trained(tok_dirs, tmp_path_factory):
    """An EAGLE-3 head and a P-EAGLE head trained from one generation of data (--arch eagle3,peagle)."""
    root = tmp_path_factory.mktemp("peagle")
    target = tiny_model(root / "target", tok_dirs["base"], seed=0, layers=3)
    messages = []
    folders = {"eagle3": root / "eagle3", "peagle": root / "peagle"}
    results = train_heads(str(target), folders, RECIPE, say=messages.append, quiet=True)
    return {"target": target, "head": folders["peagle"], "eagle3": folders["eagle3"], "results": results, "messages": messages}


@pytest.fixture(scope="module")
def engine_target(trained):
    return load_causal_lm(str(trained["target"]), dtype="float32")


def _drafter(engine_target, head_dir, dtype="float32") -> MTPDrafter:
    spec = EngineSpec(target=str(head_dir), drafter=f"mtp:{head_dir}", drafter_dtype=dtype)
    return MTPDrafter.from_spec(spec, engine_target, None)


# ==== training ===================================================================================


def test_one_generation_trains_an_eagle3_head_and_a_peagle_head_on_the_same_data(trained):
    cfg = json.loads((trained["head"] / "config.json").read_text())
    assert cfg["arch"] == "peagle" and cfg["parallel_tokens"] == 3 and cfg["aux_layers"] == [0, 1, 3]
    other = json.loads((trained["eagle3"] / "config.json").read_text())
    assert other["arch"] == "eagle3" and cfg["training"]["tokens"] == other["training"]["tokens"]
    assert not (trained["head"] / "train" / "data").exists()  # the data of the first head serve both
    heads = {a: load_file(str(f / "head.safetensors")) for a, f in (("p", trained["head"]), ("e", trained["eagle3"]))}
    assert torch.equal(heads["p"]["d2t"], heads["e"]["d2t"])  # one draft vocabulary
    assert heads["p"]["mask_hidden"].shape == (3 * 64,) and heads["p"]["mask_embed"].shape == (64,)
    assert set(cfg["training"]["least_squares_r2"]) == {"fc", "self_attn.o_proj", "mlp.down_proj"}
    r = trained["results"]["peagle"]
    ev = r.eval
    assert ev["positions"] > 0 and len(ev["acceptance_per_position"]) == 3
    assert all(a >= b for a, b in zip(ev["acceptance_per_position"], ev["acceptance_per_position"][1:]))
    losses = [h["loss"] for h in r.history if "loss" in h]
    assert sum(losses[-3:]) / 3 < 0.95 * sum(losses[:3]) / 3
    assert len(r.history[-2]["per_depth"]) == 3  # the loss over every parallel position
    assert any(m.startswith("P-EAGLE head: held-out acceptance") for m in trained["messages"])


def test_the_parallel_mask_lets_a_mask_see_its_anchors_context_and_its_own_masks():
    m = parallel_mask(5, 3)[0, 0]
    q = lambda d, i: m[d * 5 + i]  # noqa: E731  block d, index i: mask d of the draft anchored at i − d
    assert q(0, 3)[:5].tolist() == [True] * 4 + [False] and not q(0, 3)[5:].any()
    # mask 2 of anchor 1 (index 3): real keys 0, 1; its own mask 1 (block 1, index 2) and itself
    assert q(2, 3).nonzero().flatten().tolist() == [0, 1, 5 + 2, 10 + 3]
    assert all(m[r].any() for r in range(15))


# ==== the training pass is what the engine computes =================================================


def _parts(trained, engine_target):
    head = _drafter(engine_target, trained["head"]).head
    seq = load_shard(sorted((trained["eagle3"] / "train" / "data").glob("*.safetensors"))[0])[1]
    t2d = torch.full((engine_target.vocab_size,), -1, dtype=torch.long)
    t2d[head.d2t.cpu()] = torch.arange(head.draft_vocab_size)
    return head, collate([seq], t2d, 10_000, features="aux").to(engine_target.device), seq


def test_the_parallel_pass_equals_one_forward_of_pairs_and_masks_after_a_cache(trained, engine_target):
    """Mask j of the draft anchored at p (one training pass, parallel_mask) equals what the engine
    computes: the pairs up to p fed in two pieces into the head's cache, then p's pair and the masks."""
    head, b, seq = _parts(trained, engine_target)
    dev = engine_target.device
    with torch.inference_mode():
        outs = parallel(head, b, 3)
        feats, tokens = head.combine(b.hidden), b.next_tokens
        for p in (4, seq.gen_start, b.hidden.shape[1] - 3):
            cache = DynamicCache()
            head(feats[:, :p], tokens[:, :p], b.positions[:, :p], cache=cache, mask=causal_mask(p, 0, device=dev))
            hidden = torch.cat([feats[:, p : p + 1], head.mask_state().expand(1, 2, -1)], dim=1)
            toks = torch.tensor([[int(tokens[0, p]), MASK, MASK]], device=dev)
            at = torch.arange(p, p + 3, device=dev)[None]
            g = head(hidden, toks, at, cache=cache, mask=causal_mask(3, p, device=dev))[0]
            for j in range(3):
                assert torch.allclose(g[j], outs[j][0, p + j], atol=1e-4), (p, j)


def test_its_real_positions_are_eagle3s_first_step(trained, engine_target):
    head, b, _ = _parts(trained, engine_target)
    with torch.inference_mode():
        assert torch.allclose(parallel(head, b, 3)[0], chain(head, b, 1)[0], atol=1e-5)


def test_in_the_loop_the_head_drafts_what_the_parallel_pass_predicts(trained, engine_target):
    """Every draft the engine gets (prefill chunks, rollbacks and all) is the argmax of the training
    pass's positions at its anchor over the finished text: offline acceptance measures the drafts."""
    d = _drafter(engine_target, trained["head"])
    head, dev = d.head, engine_target.device
    proposals = []
    record_proposals(d, proposals)
    engine = SpecEngine(engine_target, d, num_speculative_tokens=3, prefill_chunk=5, backoff=False)
    checked = 0
    for p in PROMPTS:
        proposals.clear()
        ids = engine_target.view.encode(p)
        full = ids + engine.generate(ids, SamplingParams(max_new_tokens=32, ignore_eos=True)).tokens
        _, feats = engine_target.session().extend(full[:-1], keep=1, hidden=head.target_features)
        n = len(full) - 1
        batch = SimpleNamespace(
            hidden=feats[None].to(dev),
            next_tokens=torch.tensor([full[1:]], device=dev),
            positions=torch.arange(n, device=dev)[None],
        )
        with torch.inference_mode():
            guesses = [[d.to_target(j) for j in head.logits(g[0]).argmax(-1).tolist()] for g in parallel(head, batch, 3)]
        drafted = [(n_ctx, toks) for n_ctx, toks in proposals if toks]
        assert drafted
        for n_ctx, toks in drafted:
            anchor = n_ctx - 2
            want = [guesses[j][anchor + j] for j in range(len(toks)) if anchor + j < n]
            assert toks[: len(want)] == want, (p, n_ctx)
        checked += len(drafted)
    assert checked > 10


# ==== the drafter in the engine ===================================================================


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("dtype", ["float32", pytest.param("int8", marks=CPU_ONLY)])
def test_peagle_drafter_greedy_output_is_identical_to_plain(trained, engine_target, k, dtype):
    d = _drafter(engine_target, trained["head"], dtype)
    drafted = 0
    for p in PROMPTS:
        ids = engine_target.view.encode(p)
        params = SamplingParams(max_new_tokens=40, ignore_eos=True)
        want = SpecEngine(engine_target).generate(ids, params)
        got = SpecEngine(engine_target, d, num_speculative_tokens=k, prefill_chunk=7).generate(ids, params)
        assert got.tokens == want.tokens, p
        drafted += got.stats.draft_tokens
        assert len(got.stats.accepted_per_pos) <= min(k, 3)  # no more than the head's parallel tokens
    assert drafted > 0


class _Recording(MTPDrafter):
    """Keeps its sessions, and the head forwards each proposal took."""

    def __init__(self, inner: MTPDrafter):
        self.__dict__.update(inner.__dict__)
        self.sessions, self.forwards = [], []

    def session(self, prompt):
        s = super().session(prompt)
        self.sessions.append(s)
        propose = s.propose

        def counted(context, k, params, generator):
            before = s.forwards
            out = propose(context, k, params, generator)
            self.forwards.append(s.forwards - before)
            return out

        s.propose = counted
        return s


def test_one_head_forward_per_draft_and_the_cache_after_rejections_equals_a_fresh_one(trained, engine_target):
    d = _Recording(_drafter(engine_target, trained["head"]))
    ids = engine_target.view.encode(PROMPTS[1])
    engine = SpecEngine(engine_target, d, num_speculative_tokens=3, backoff=False)
    r = engine.generate(ids, SamplingParams(max_new_tokens=60, ignore_eos=True))
    assert r.stats.draft_tokens > r.stats.accepted  # rejections happened (and were rolled back)
    assert set(d.forwards) == {1}  # one forward a draft: the catch-up and the k − 1 masks together
    used = d.sessions[-1]
    context = ids + r.tokens[:-1]  # the engine's last verification fed up to here
    fresh = d.session(ids)
    _, hidden = engine_target.session().extend(context[:-1], keep=1, hidden=d.head.target_features)
    fresh.observe_hidden(0, hidden)
    params = SamplingParams(temperature=1.0)
    a = used.propose(context, 3, params, torch.Generator().manual_seed(0))
    b = fresh.propose(context, 3, params, torch.Generator().manual_seed(0))
    assert a.tokens == b.tokens and torch.allclose(a.probs, b.probs, atol=1e-4)
    assert used.cached == fresh.cached == len(context) - 1 + 2  # the committed pairs, then k − 1 masks


def test_peagle_sampling_keeps_the_targets_distribution(trained, engine_target):
    """Rejection sampling with each position's own q (none conditioned on the draft tokens before it):
    the second token, which a draft carries, has plain sampling's frequencies."""
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


def test_a_peagle_head_needs_a_proposal_width(trained, engine_target):
    parts = _drafter(engine_target, trained["head"]).head.parts
    with pytest.raises(ConfigError, match="at least one token"):
        PEagleHead(parts, aux_layers=(1,), draft_ids=None, parallel_tokens=0)
    with pytest.raises(ConfigError, match="parallel_tokens"):
        replace(RECIPE, parallel_tokens=0)


# ==== vLLM's layout ===============================================================================


def test_train_head_cli_trains_both_and_exports_the_peagle_head_with_its_mask_position(trained, tmp_path):
    from vocabbridge.vllm.config import speculative_config

    out_e, out_p = tmp_path / "e", tmp_path / "p"
    args = ["train-head", "--target", str(trained["target"]), "--arch", "eagle3,peagle", "-o", str(out_e), "-o", str(out_p)]
    args += ["--max-prompts", "6", "--new-tokens", "8", "--epochs", "1", "--draft-vocab", "300", "--parallel-tokens", "4"]
    args += ["--dtype", "float32", "--data-dtype", "float32", "--export-vllm", "--json", "--eval-k", "4"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert got["eagle3"]["vllm"] == {"method": "eagle3", "model": str(out_e / "vllm"), "num_speculative_tokens": 4}
    want = {"method": "eagle3", "model": str(out_p / "vllm"), "num_speculative_tokens": 4, "parallel_drafting": True}
    assert got["peagle"]["vllm"] == want
    cfg = json.loads((out_p / "vllm" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 300
    ptd = cfg["ptd_token_id"]
    w = load_file(str(out_p / "vllm" / "model.safetensors"))
    head = load_file(str(out_p / "head.safetensors"))
    assert w["mask_hidden"].shape == (1, 3 * 64)
    assert torch.allclose(w["mask_hidden"][0].float(), head["mask_hidden"], atol=1e-2, rtol=1e-2)
    target = load_causal_lm(str(trained["target"]), dtype="float32", pack=False)
    embed = target.model.get_input_embeddings().weight.cpu()
    assert w["embed_tokens.weight"].shape == embed.shape
    assert torch.allclose(w["embed_tokens.weight"][ptd].float(), head["mask_embed"], atol=1e-2, rtol=1e-2)
    others = torch.arange(embed.shape[0]) != ptd
    assert torch.allclose(w["embed_tokens.weight"][others].float(), embed[others], atol=1e-2, rtol=1e-2)
    record = json.loads((out_p / "vllm" / "vocabbridge-export.json").read_text())
    assert record["layout"] == "peagle" and str(ptd) in record["mask_token"]
    notes = []
    spec = EngineSpec(target=str(trained["target"]), drafter=f"mtp:{out_p}", num_speculative_tokens=6)
    assert speculative_config(spec, notes=notes) == want
    assert any("parallel_drafting" in n for n in notes) and any("vLLM drafts 4, not 6" in n for n in notes)
