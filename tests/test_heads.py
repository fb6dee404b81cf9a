"""MTP heads: training end to end on a tiny model, resume, the target check, the offline chain,
and the engine's mtp drafter (lossless, KV rollback)."""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import replace

import pytest
import torch
from click.testing import CliRunner
from transformers import DynamicCache

from vocabbridge.cli import main
from vocabbridge.engine import SamplingParams, SpecEngine, load_causal_lm
from vocabbridge.engine.drafters.base import record_proposals
from vocabbridge.engine.drafters.mtp import MTPDrafter
from vocabbridge.engine.factory import build_engine
from vocabbridge.errors import ConfigError
from vocabbridge.heads.draft_head import causal_mask, new_head, target_parts
from vocabbridge.heads.store import load_head
from vocabbridge.spec import EngineSpec
from vocabbridge.testing import tiny_model
from vocabbridge.training.chain import Batch, chain, collate
from vocabbridge.training.data import load_shard
from vocabbridge.training.train import TIMING_STEPS, WARM_STEPS, Recipe, train_head

CPU_ONLY = pytest.mark.skipif(
    torch.cuda.is_available(), reason="int8 (fbgemm's dynamic quantization) runs on the CPU only; on a GPU the target runs bf16"
)


TINY_RECIPE = Recipe(
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


@pytest.fixture(scope="module")
def trained(tok_dirs, tmp_path_factory):
    """A tiny target (its folder) and a head trained for it."""
    root = tmp_path_factory.mktemp("mtp")
    target = tiny_model(root / "target", tok_dirs["base"], seed=0, layers=2)
    messages = []
    result = train_head(str(target), root / "head", TINY_RECIPE, say=messages.append, quiet=True)
    return {"root": root, "target": target, "head": root / "head", "result": result, "messages": messages}


@pytest.fixture(scope="module")
def engine_target(trained):
    return load_causal_lm(str(trained["target"]), dtype="float32")  # packed, as the engine runs it


def _drafter(engine_target, head_dir, **kw) -> MTPDrafter:
    spec = EngineSpec(target=str(head_dir), drafter=f"mtp:{head_dir}", drafter_dtype="float32", **kw)
    return MTPDrafter.from_spec(spec, engine_target, None)


# ==== training ===================================================================================


def test_training_writes_the_head_its_curves_and_a_held_out_evaluation(trained):
    head, r = trained["head"], trained["result"]
    for f in [
        "head.safetensors",
        "config.json",
        "train/loss.png",
        "train/acceptance.png",
        "train/eval.json",
        "train/metrics.jsonl",
    ]:
        assert (head / f).is_file(), f
    cfg = json.loads((head / "config.json").read_text())
    assert cfg["format"] == "vocabbridge.mtp-head/1" and cfg["draft_vocab_size"] == 400
    assert cfg["target"]["tokenizer_fingerprint"] and len(cfg["target"]["weights_signature"]) == 80
    assert set(cfg["training"]["timings_s"]) >= {"load", "data", "train", "eval", "total"}
    ev = r.eval
    assert len(ev["acceptance_per_position"]) == 3 and ev["positions"] > 0
    assert ev["mean_acceptance_length"] == pytest.approx(1 + sum(ev["acceptance_per_position"]))
    assert len(ev["acceptance_per_position_full_vocab"]) == 3  # as the vLLM export drafts (no draft vocabulary)
    acc = ev["acceptance_per_position"]
    assert all(a >= b for a, b in zip(acc, acc[1:]))  # token j needs tokens < j


def test_training_loss_decreases(trained):
    losses = [h["loss"] for h in trained["result"].history if "loss" in h]
    assert len(losses) >= 6
    assert sum(losses[-3:]) / 3 < 0.95 * sum(losses[:3]) / 3


def test_the_least_squares_start_beats_repeating_the_hidden_state(trained, tmp_path):
    """Before any gradient step (the step-0 evaluation): the fitted eh_proj and down_proj predict the
    target's next distribution better than the identity start, and the head's record keeps the fits."""
    start = lambda history: next(h["eval"] for h in history if h.get("eval") and h["step"] == 0)  # noqa: E731
    fitted = start(trained["result"].history)
    ident = train_head(str(trained["target"]), tmp_path / "identity", replace(TINY_RECIPE, init="identity", epochs=1), quiet=True)
    assert fitted["loss"] < start(ident.history)["loss"]
    record = json.loads((trained["head"] / "config.json").read_text())["training"]["least_squares_r2"]
    assert set(record) == {"eh_proj", "mlp.down_proj"} and all(0 < r2 <= 1 for r2 in record.values())
    assert any(m.startswith("least-squares start: eh_proj R²") for m in trained["messages"])


def test_training_data_are_the_targets_own_greedy_continuations(trained):
    target = load_causal_lm(str(trained["target"]), dtype="float32")
    shard = sorted((trained["head"] / "train" / "data").glob("*.safetensors"))[0]
    s = load_shard(shard)[0]
    logits, hidden = target.session().extend(s.tokens[:-1].tolist(), keep=len(s.tokens) - 1, hidden=True)
    logits, hidden = logits.cpu(), hidden.cpu()
    assert s.positions == len(s.tokens) - 1
    assert torch.equal(logits.argmax(-1)[s.gen_start - 1 :], s.tokens[s.gen_start :])  # greedy continuation
    assert torch.equal(s.topk_ids[:, 0].long(), logits.argmax(-1))  # soft labels: the target's top-k
    assert torch.allclose(s.hidden.float(), hidden, atol=2e-2, rtol=1e-2)  # fp16 copies of the final hidden states


def test_rows_that_finish_leave_the_batch_and_the_others_continue_as_alone(trained):
    """generate_batch drops a finished row from the batch and its KV cache: the rows left decode
    exactly what each decodes alone, and the finished one keeps its features up to its stop."""
    from vocabbridge.training.data import generate_batch

    target = load_causal_lm(str(trained["target"]), dtype="float32", pack=False)
    prompts = [[5, 17, 30, 41], [7, 8, 9], [100, 3, 60, 61, 62]]
    alone = [generate_batch(target.model, [p], max_new_tokens=12, stop_ids=set(), top_k=5)[0] for p in prompts]
    others = {int(t) for s in (alone[0], alone[2]) for t in s.tokens[s.gen_start :]}
    cont = alone[1].tokens[alone[1].gen_start :].tolist()
    end = next((j for j, t in enumerate(cont[:-1]) if t not in others), None)  # row 1 stops there, early
    assert end is not None, "the tiny target's rows share every token: pick other prompts"
    stop_ids = {cont[end]}
    got = generate_batch(target.model, prompts, max_new_tokens=12, stop_ids=stop_ids, top_k=5)
    for i in (0, 2):
        assert torch.equal(got[i].tokens, alone[i].tokens)
        assert torch.allclose(got[i].hidden.float(), alone[i].hidden.float(), atol=1e-2)
        assert got[i].positions == len(got[i].tokens) - 1
    cut = alone[1].tokens[: len(prompts[1]) + end + 1]
    assert torch.equal(got[1].tokens, cut) and got[1].positions == len(cut) - 1
    assert torch.equal(got[1].topk_ids, alone[1].topk_ids[: len(cut) - 1])


@CPU_ONLY
def test_int8_data_are_the_int8_targets_own_continuations_and_other_settings_regenerate_them(trained, tmp_path):
    """data_dtype int8 (the CPU default): the continuations --dtype int8 serves; a change of the data
    settings does not reuse the shards on disk."""
    from vocabbridge.engine.invariant import INVARIANT_ROWS

    folder = tmp_path / "head"
    recipe = replace(TINY_RECIPE, data_dtype="int8", max_prompts=8, epochs=1)
    said = []
    train_head(str(trained["target"]), folder, recipe, say=said.append, quiet=True)
    assert any("data in int8" in m for m in said)
    target = load_causal_lm(str(trained["target"]), dtype="int8", rows=INVARIANT_ROWS)
    for s in load_shard(sorted((folder / "train" / "data").glob("*.safetensors"))[0]):
        prompt, cont = s.tokens[: s.gen_start].tolist(), s.tokens[s.gen_start :].tolist()
        want = SpecEngine(target).generate(prompt, SamplingParams(max_new_tokens=len(cont), ignore_eos=True)).tokens
        assert want == cont
    manifest = json.loads((folder / "train" / "data" / "manifest.json").read_text())
    assert manifest["settings"] == {"new_tokens": 16, "top_k": 20, "data_dtype": "int8"}
    r = train_head(str(trained["target"]), folder, replace(recipe, new_tokens=12), restart=True, quiet=True)
    assert all(
        len(s.tokens) - s.gen_start <= 12 for p in (folder / "train" / "data").glob("*.safetensors") for s in load_shard(p)
    )
    assert r.tokens["batches_generated"] == r.tokens["batches_planned"]


def test_resume_continues_from_the_checkpoint_and_keeps_the_data(trained, tmp_path):
    import shutil

    folder = tmp_path / "head"
    shutil.copytree(trained["head"], folder)
    said = []
    more = train_head(str(trained["target"]), folder, replace(TINY_RECIPE, epochs=3), say=said.append, quiet=True)
    steps_before = trained["result"].history[-1]["step"]
    assert any(m.startswith(f"resumed at step {steps_before}") for m in said)
    assert more.history[-1]["step"] > steps_before
    assert more.timings["data"] < trained["result"].timings["data"] + 5  # shards reused, not generated again
    with pytest.raises(ConfigError, match="--restart"):
        train_head(str(trained["target"]), folder, replace(TINY_RECIPE, lr=1e-3), quiet=True)


def test_a_budget_cuts_data_generation_and_plans_the_training_steps(trained, tmp_path):
    said = []
    recipe = replace(TINY_RECIPE, budget_minutes=1e-6, max_prompts=40)  # spent at once: whatever the machine's speed
    r = train_head(str(trained["target"]), tmp_path / "head", recipe, say=said.append, quiet=True)
    assert r.tokens["batches_generated"] == 2 < r.tokens["batches_planned"]  # two batches at least, then the deadline
    # nothing fits after the warm steps and the timed ones (2 + 4)
    assert any(m.startswith(f"budget: {WARM_STEPS + TIMING_STEPS} of ") for m in said)
    assert r.history[-1]["step"] == WARM_STEPS + TIMING_STEPS and "eval" in r.history[-1]


def test_a_head_is_refused_for_another_target(trained, tok_dirs, tmp_path):
    other_weights = load_causal_lm(str(tiny_model(tmp_path / "w", tok_dirs["base"], seed=5, layers=2)), dtype="float32")
    other_tokenizer = load_causal_lm(str(tiny_model(tmp_path / "t", tok_dirs["extended"], seed=0, layers=2)), dtype="float32")
    for other, why in [(other_weights, "other weights"), (other_tokenizer, "another tokenizer")]:
        with pytest.raises(ConfigError, match=f"trained for .*{why}.*vocabbridge train-head --target"):
            load_head(
                trained["head"], target_parts(other.model), tokenizer_fingerprint=other.view.fingerprint, source=other.source
            )
    spec = EngineSpec(target=other_weights.source, drafter=f"mtp:{trained['head']}")
    with pytest.raises(ConfigError, match="not for"):
        build_engine(spec, loaded={other_weights.source: other_weights})


# ==== the offline chain is what the engine computes ==================================================


def test_the_parallel_chain_equals_incremental_drafting(trained, engine_target):
    """Chained step s at position p (one parallel pass, chain_mask) equals feeding the committed pairs
    up to p−s+1 into a fresh cache, then stepping the head on its own output as the engine does."""
    head = _drafter(engine_target, trained["head"]).head
    seq = load_shard(sorted((trained["head"] / "train" / "data").glob("*.safetensors"))[0])[1]
    t2d = torch.full((engine_target.vocab_size,), -1, dtype=torch.long)
    t2d[head.d2t.cpu()] = torch.arange(head.draft_vocab_size)
    dev = engine_target.device
    b: Batch = collate([seq], t2d, 10_000).to(dev)
    with torch.inference_mode():
        outs = chain(head, b, 3)
        hidden, tokens = b.hidden[0], b.next_tokens[0]
        for p1 in (5, seq.gen_start, b.hidden.shape[1] - 3):
            cache = DynamicCache()
            pos = torch.arange(p1 + 1, device=dev)
            mask = causal_mask(p1 + 1, 0, device=dev)
            g = head(hidden[None, : p1 + 1], tokens[None, : p1 + 1], pos[None], cache=cache, mask=mask)[0, -1]
            assert torch.allclose(g, outs[0][0, p1], atol=1e-4)
            for s in (1, 2):
                at = torch.tensor([[p1 + s]], device=dev)
                g = head(g.view(1, 1, -1), tokens[None, p1 + s : p1 + s + 1], at, cache=cache)[0, -1]
                assert torch.allclose(g, outs[s][0, p1 + s], atol=1e-4), (p1, s)


def test_in_the_loop_the_head_drafts_what_it_predicts_teacher_forced(trained, engine_target):
    """Every first draft token the engine gets from the head is the head's teacher-forced argmax at
    that position over the finished text (one target forward, one head pass): the engine feeds the
    head the pairs the held-out evaluation scores, so in-loop and offline acceptance measure the same
    predictions (prefill chunks, rollbacks and chained steps included)."""
    d = _drafter(engine_target, trained["head"])
    proposals = []
    record_proposals(d, proposals)
    engine = SpecEngine(engine_target, d, num_speculative_tokens=3, prefill_chunk=5)
    checked = 0
    for p in PROMPTS:
        proposals.clear()
        ids = engine_target.view.encode(p)
        full = ids + engine.generate(ids, SamplingParams(max_new_tokens=32, ignore_eos=True)).tokens
        offline = d.teacher_forced(engine_target, full)  # offline[i]: the head's guess for full[i + 2]
        drafted = [(n_ctx, toks) for n_ctx, toks in proposals if toks]
        assert drafted
        for n_ctx, toks in drafted:
            assert toks[0] == offline[n_ctx - 2], (p, n_ctx)
        checked += len(drafted)
    assert checked > 10


# ==== the mtp drafter in the engine ===============================================================

PROMPTS = ["Hello world! It's a beautiful day", "def tokenize(text):", "안녕하세요. 오늘 날씨가"]


@pytest.mark.parametrize("k", [1, 3, 5])
def test_mtp_drafter_greedy_output_is_identical_to_plain(trained, engine_target, k):
    d = _drafter(engine_target, trained["head"])
    drafted = 0
    for p in PROMPTS:
        ids = engine_target.view.encode(p)
        params = SamplingParams(max_new_tokens=48, ignore_eos=True)
        want = SpecEngine(engine_target).generate(ids, params)
        got = SpecEngine(engine_target, d, num_speculative_tokens=k).generate(ids, params)
        assert got.tokens == want.tokens, p
        drafted += got.stats.draft_tokens
        assert got.stats.target_forwards < want.stats.target_forwards or got.stats.accepted == 0
    assert drafted > 0


@CPU_ONLY
def test_mtp_drafter_with_int8_and_prefill_chunks_stays_lossless(trained, engine_target):
    spec = EngineSpec(target=engine_target.source, drafter=f"mtp:{trained['head']}", drafter_dtype="int8")
    d = MTPDrafter.from_spec(spec, engine_target, None)
    ids = engine_target.view.encode(PROMPTS[0] * 4)
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    want = SpecEngine(engine_target).generate(ids, params)
    got = SpecEngine(engine_target, d, num_speculative_tokens=3, prefill_chunk=7).generate(ids, params)
    assert got.tokens == want.tokens


def test_ngram_first_with_the_mtp_head_stays_lossless_and_uses_both(trained, engine_target):
    """--ngram-first with mtp: prompt lookup proposes where the context repeats, the head elsewhere;
    the head's session keeps receiving the target's hidden states through the n-gram steps."""
    built = build_engine(
        EngineSpec(
            target=engine_target.source,
            drafter=f"mtp:{trained['head']}",
            dtype="float32",
            drafter_dtype="float32",
            ngram_first=True,
            cost_aware=False,  # fixed k: the timing-driven length may cut n-gram drafts to none on a busy machine
        ),
        loaded={engine_target.source: engine_target},
    )
    assert built.mode == "ngram+mtp"
    drafter, sessions = built.engine.drafter, []
    make = drafter.session
    drafter.session = lambda prompt: sessions.append(make(prompt)) or sessions[-1]
    params = SamplingParams(max_new_tokens=48, ignore_eos=True)
    drafts = 0
    for p in [PROMPTS[0] * 3, PROMPTS[1], PROMPTS[2] * 2]:
        ids = engine_target.view.encode(p)
        want = SpecEngine(engine_target).generate(ids, params)
        got = built.engine.generate(ids, params)
        assert got.tokens == want.tokens, p
        drafts += got.stats.drafts
    by_ngram = sum(s.ngram_drafts for s in sessions)
    assert by_ngram > 0 and drafts > by_ngram  # both proposed
    assert sum(s.model.forwards for s in sessions) > 0


class _Recording(MTPDrafter):
    def __init__(self, inner: MTPDrafter):
        self.__dict__.update(inner.__dict__)
        self.sessions = []

    def session(self, prompt):
        s = super().session(prompt)
        self.sessions.append(s)
        return s


def test_after_many_rejections_the_head_cache_equals_a_fresh_one(trained, engine_target):
    d = _Recording(_drafter(engine_target, trained["head"]))
    ids = engine_target.view.encode(PROMPTS[1])
    r = SpecEngine(engine_target, d, num_speculative_tokens=4).generate(ids, SamplingParams(max_new_tokens=60, ignore_eos=True))
    assert r.stats.draft_tokens > r.stats.accepted  # rejections happened (and were rolled back)
    used = d.sessions[-1]
    context = ids + r.tokens[:-1]  # the engine's last verification fed up to here
    fresh = d.session(ids)
    _, hidden = engine_target.session().extend(context[:-1], keep=1, hidden=True)
    fresh.observe_hidden(0, hidden)
    params = SamplingParams(temperature=1.0)
    a = used.propose(context, 3, params, torch.Generator().manual_seed(0))
    b = fresh.propose(context, 3, params, torch.Generator().manual_seed(0))
    assert a.tokens == b.tokens and torch.allclose(a.probs, b.probs, atol=1e-4)
    assert used.cached == fresh.cached == len(context) - 1 + len(a.tokens) - 1


def test_mtp_sampling_follows_the_target_distribution(trained, engine_target):
    d = _drafter(engine_target, trained["head"])
    prompt = engine_target.view.encode("Hello")
    params = lambda seed: SamplingParams(max_new_tokens=2, temperature=1.5, top_k=4, seed=seed, ignore_eos=True)  # noqa: E731
    n = 300
    a = Counter(tuple(SpecEngine(engine_target).generate(prompt, params(s)).tokens) for s in range(n))
    b = Counter(
        tuple(SpecEngine(engine_target, d, num_speculative_tokens=2).generate(prompt, params(9_000 + s)).tokens) for s in range(n)
    )
    tv = 0.5 * sum(abs(a[k] - b[k]) for k in set(a) | set(b)) / n
    assert len(set(a)) > 3 and tv < 0.15, (tv, a.most_common(4), b.most_common(4))


def test_the_target_defaults_to_the_one_the_head_was_trained_for(trained):
    assert EngineSpec(drafter=f"mtp:{trained['head']}").target_name == str(trained["target"])


def test_the_drafter_registry_builds_the_mtp_drafter(trained, engine_target):
    built = build_engine(
        EngineSpec(target=engine_target.source, drafter=f"mtp:{trained['head']}", dtype="float32", num_speculative_tokens=3),
        loaded={engine_target.source: engine_target},
    )
    assert built.mode == "mtp" and built.describe()["drafter"]["draft_vocab_size"] == 400
    ids = engine_target.view.encode(PROMPTS[0])
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    assert built.engine.generate(ids, params).tokens == SpecEngine(engine_target).generate(ids, params).tokens


@pytest.mark.parametrize("scale", [1.0, 7.0])
def test_a_fresh_head_outputs_the_targets_own_hidden_state(tiny, scale):
    """At initialisation the head's output is the target's hidden state (zero residual branches, the
    final norm's scale undone by hnorm and redone by the head's norm, whatever its size: Qwen2.5's
    is about 7): it proposes what the target predicted for the previous position."""
    t = tiny["target"]
    parts = target_parts(t.model)
    with torch.no_grad():
        parts.final_norm.weight.mul_(scale)
        try:
            ids = t.view.encode(PROMPTS[0])
            logits, hidden = t.session().extend(ids, keep=len(ids), hidden=True)
            dev = hidden.device
            head = new_head(parts, draft_ids=None).to(dev)
            nxt, pos = torch.tensor([ids[1:] + [0]], device=dev), torch.arange(len(ids), device=dev)[None]
            g = head(hidden[None], nxt, pos, mask=causal_mask(len(ids), 0, device=dev))
        finally:
            parts.final_norm.weight.div_(scale)
    assert torch.allclose(g[0], hidden, rtol=1e-3, atol=1e-3 * scale)
    assert torch.equal(head.logits(g)[0].argmax(-1), logits.argmax(-1))


# ==== the command line ============================================================================


def test_train_head_cli_trains_and_exports(trained, tmp_path):
    out = tmp_path / "cli-head"
    r = CliRunner().invoke(
        main,
        ["train-head", "--target", str(trained["target"]), "-o", str(out), "--max-prompts", "8", "--new-tokens", "8"]
        + ["--epochs", "1", "--dtype", "float32", "--draft-vocab", "300", "--export-vllm"],
    )
    assert r.exit_code == 0, r.output
    assert "Held-out greedy acceptance" in r.output and "mean acceptance length" in r.output
    assert '"method":"mtp"' in r.output and (out / "vllm" / "config.json").is_file()


def test_spec_parses_mtp_with_a_head_folder():
    spec = EngineSpec(target="t", drafter="mtp:heads/x", num_speculative_tokens=3)
    assert (spec.uses_model, spec.drafter_method, spec.drafter_path) == (False, "mtp", "heads/x")
    assert EngineSpec(target="t", drafter="mtp").drafter_path is None
    with pytest.raises(ConfigError, match="needs --target"):
        _ = EngineSpec(drafter="mtp:no/such/head").target_name
    with pytest.raises(ConfigError, match="mtp:heads/NAME"):
        EngineSpec(target="t", drafter="mtp:")


def test_batches_cover_every_sequence_once():
    from vocabbridge.training.chain import batches

    seqs = [type("S", (), {"positions": n})() for n in (5, 50, 7, 300, 12, 40)]
    out = batches(seqs, batch_tokens=64, rng=random.Random(0))
    assert sorted(id(s) for b in out for s in b) == sorted(id(s) for s in seqs)
    assert all(max(min(s.positions, 64) for s in b) * len(b) <= 64 or len(b) == 1 for b in out)


@CPU_ONLY
def test_mtp_drafter_on_the_int8_target_stays_lossless(trained):
    """The head over the batch-invariant int8 target (--dtype int8): its lm_head rows come from the
    target's int8 lm_head, its inputs are the int8 target's hidden states."""
    from vocabbridge.engine.invariant import INVARIANT_ROWS

    target = load_causal_lm(str(trained["target"]), dtype="int8", rows=INVARIANT_ROWS)
    d = _drafter(target, trained["head"])
    for p in PROMPTS:
        ids = target.view.encode(p)
        params = SamplingParams(max_new_tokens=40, ignore_eos=True)
        want = SpecEngine(target).generate(ids, params)
        got = SpecEngine(target, d, num_speculative_tokens=3).generate(ids, params)
        assert got.tokens == want.tokens, p
        assert got.stats.draft_tokens > 0
