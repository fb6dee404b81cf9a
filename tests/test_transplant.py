"""vocabbridge transplant: the row plan from the tokenizers alone, the --init methods, the folder
(transformers loads it, diff finds the target's vocabulary, our engine drafts with it losslessly,
greedy and sampling), healing, and the GGUF llama.cpp takes as a draft model. Tiny tokenizers and
random-weight models built on the spot."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from vocabbridge.cli import main
from vocabbridge.engine import DraftModelDrafter, SamplingParams, SpecEngine, load_causal_lm
from vocabbridge.engine.factory import build_engine
from vocabbridge.errors import ConfigError
from vocabbridge.spec import EngineSpec
from vocabbridge.testing import tiny_model
from vocabbridge.tokenizer import load_tokenizer, same_vocabulary
from vocabbridge.transplant import plan_rows
from vocabbridge.transplant.plan import COMPOSED, COPIED, EMPTY, SPECIAL
from vocabbridge.transplant.rows import Init, build_rows, pursue

PROMPTS = [
    "Hello world! It's a beautiful day, isn't it?",
    "def tokenize(text):\n    return text.split()\n",
    "안녕하세요. 오늘 날씨가",
]
HAS_LLAMA = importlib.util.find_spec("llama_cpp") is not None


# ==== the plan: tokenizers only ====================================================================


def test_plan_copies_shared_bytes_pairs_specials_by_role_and_spells_the_rest(base_view, extended_view, facts):
    plan = plan_rows(base_view, extended_view)
    c = plan.counts
    assert sum(c.values()) == plan.target.rows == extended_view.size
    # every base token survives in the extended vocabulary, byte for byte; the new multi-word ones are composed
    assert c["composed"] == facts.only_b + 1  # + [unused4], which the base tokenizer spells in pieces
    assert plan.special_pairs["end_of_turn"] == (facts.eot_b, facts.eot_a)  # <|endofturn|> ← [|endofturn|]
    for t in plan.rows_of(COPIED).tolist():
        assert base_view.tokens[plan.source[t]] == extended_view.tokens[t]
    for t, pieces in plan.pieces.items():  # the drafter's spelling of every composed token is exact
        assert base_view.decode_bytes(pieces) == extended_view.tokens[t] and len(pieces) >= 1
    assert plan.lossy == 0 and plan.piece_lengths["2"] >= 10


def test_plan_between_byte_level_and_sentencepiece_spells_by_bytes(spm_view, base_view):
    plan = plan_rows(spm_view, base_view, target_rows=base_view.size + 7)  # padding rows past the tokenizer
    assert plan.target.rows == base_view.size + 7 and plan.counts["empty"] >= 7
    assert set(plan.rows_of(EMPTY).tolist()) >= set(range(base_view.size, base_view.size + 7))
    assert plan.counts["copied"] > 100 and plan.counts["composed"] > 100
    for t, pieces in plan.pieces.items():
        assert spm_view.decode_bytes(pieces) == base_view.tokens[t]
    assert plan.special_pairs["bos"][1] == spm_view.roles["bos"]


def test_plan_only_cli_reports_coverage_as_json(tok_dirs):
    r = CliRunner().invoke(
        main, ["transplant", str(tok_dirs["base"]), "--to", str(tok_dirs["extended"]), "--plan-only", "--json"]
    )
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert (
        data["rows"]["copied"] + data["rows"]["special"] + data["rows"]["composed"] + data["rows"]["empty"]
        == data["target"]["rows"]
    )
    two = CliRunner().invoke(
        main, ["transplant", str(tok_dirs["spm"]), "--to", str(tok_dirs["base"]), "--to", str(tok_dirs["extended"]), "--dry-run"]
    )
    assert two.exit_code == 0 and "Transplant coverage" in two.output, two.output


# ==== the rows ====================================================================================


def test_init_methods_compose_the_pieces_rows(spm_view, base_view):
    plan = plan_rows(spm_view, base_view)
    d = 8
    emb_in, emb_out = torch.randn(spm_view.size, d), torch.randn(spm_view.size, d)
    t, pieces = next((t, p) for t, p in plan.pieces.items() if len(p) >= 3)
    mean = build_rows(plan, emb_in, emb_out, init="mean")
    first = build_rows(plan, emb_in, emb_out, init="first")
    decay = build_rows(plan, emb_in, emb_out, init="decay:0.5")
    for rows in (mean, first, decay):
        assert torch.allclose(rows.input[t], emb_in[list(pieces)].mean(0), atol=1e-6)  # the input row is always the mean
        copied = plan.rows_of(COPIED)
        assert torch.equal(rows.input[copied], emb_in[plan.source[copied]])
        assert torch.equal(rows.output[copied], emb_out[plan.source[copied]])
    assert torch.allclose(mean.output[t], emb_out[list(pieces)].mean(0), atol=1e-6)
    assert torch.equal(first.output[t], emb_out[pieces[0]])
    w = torch.tensor([0.5**i for i in range(len(pieces))])
    assert torch.allclose(decay.output[t], (w[:, None] * emb_out[list(pieces)]).sum(0) / w.sum(), atol=1e-6)


def test_a_tied_drafter_stays_tied_under_mean_and_gets_its_own_lm_head_under_first(spm_view, base_view):
    plan = plan_rows(spm_view, base_view)
    emb = torch.randn(spm_view.size, 8)
    assert build_rows(plan, emb, emb, init="mean").tied
    assert not build_rows(plan, emb, emb, init="first").tied
    assert not build_rows(plan, emb, emb, init="mean", untie=True).tied


def test_init_names_are_checked():
    assert str(Init.parse("decay:0.25")) == "decay:0.25" and Init.parse("omp:4").k == 4
    for bad in ("median", "decay:2", "omp:0", "first:1"):
        with pytest.raises(ConfigError, match="--init"):
            Init.parse(bad)


def test_omp_recovers_a_sparse_combination_of_anchors():
    g = torch.Generator().manual_seed(0)
    anchors = torch.randn(50, 16, generator=g)
    x = 2.0 * anchors[3] - 0.5 * anchors[17] + 0.25 * anchors[40]
    unit = anchors / anchors.norm(dim=1, keepdim=True)
    idx, coef = pursue(x[None], anchors, unit, k=3, pool=50)
    got = dict(zip(idx[0].tolist(), coef[0].tolist()))
    assert got.keys() == {3, 17, 40} and got[3] == pytest.approx(2.0, abs=1e-4) and got[17] == pytest.approx(-0.5, abs=1e-4)


def test_omp_needs_the_targets_weights(spm_view, base_view):
    plan = plan_rows(spm_view, base_view)
    with pytest.raises(ConfigError, match="target's weights"):
        build_rows(plan, torch.randn(spm_view.size, 4), None, init="omp:4")


# ==== the folder, end to end =======================================================================


@pytest.fixture(scope="module")
def models(tok_dirs, tmp_path_factory):
    """A target with the byte-level tokenizer and a drafter with the SentencePiece one (tied embeddings)."""
    root = tmp_path_factory.mktemp("transplant")
    target = tiny_model(root / "target", tok_dirs["base"], seed=0, layers=2)
    drafter = tiny_model(root / "drafter", tok_dirs["spm"], seed=3, layers=1)
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(drafter))
    m.lm_head.weight = m.model.embed_tokens.weight  # tied, as SmolLM2 is
    m.config.tie_word_embeddings = True
    m.save_pretrained(str(drafter))
    return {"root": root, "target": target, "drafter": drafter}


@pytest.fixture(scope="module")
def transplanted(models):
    from vocabbridge.transplant import transplant

    out = {}
    for init in ("mean", "decay:0.5", "omp:4"):
        folder = models["root"] / f"drafter-{init.replace(':', '')}"
        out[init] = transplant(
            str(models["drafter"]), str(models["target"]), folder, init=init, gguf=HAS_LLAMA, say=lambda m: None
        )
    return out


def test_the_folder_loads_in_transformers_with_the_targets_vocabulary(models, transplanted):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = load_tokenizer(str(models["target"]))
    for init, r in transplanted.items():
        m = AutoModelForCausalLM.from_pretrained(str(r.folder))
        assert m.config.vocab_size == target.size == m.get_output_embeddings().weight.shape[0]
        assert m.config.eos_token_id == target.roles["eos"] and m.config.bos_token_id == target.roles["bos"]
        assert AutoTokenizer.from_pretrained(str(r.folder)).encode("Hello world") == AutoTokenizer.from_pretrained(
            str(models["target"])
        ).encode("Hello world")
        # mean keeps a tied drafter tied; decay gives the lm_head its own rows; omp too, the target being untied
        assert m.config.tie_word_embeddings == (init == "mean") == r.tied
        view = load_tokenizer(str(r.folder))
        assert view.fingerprint == target.fingerprint and view.chat_template == target.chat_template
        rec = json.loads((r.folder / "transplant.json").read_text())
        assert rec["init"] == init and rec["tokenizer_fingerprint"] == target.fingerprint
        assert rec["drafter"]["fingerprint"] == load_tokenizer(str(models["drafter"])).fingerprint
        assert sum(rec["rows"].values()) == target.size
        gen = json.loads((r.folder / "generation_config.json").read_text())
        assert gen["eos_token_id"] == target.roles["eos"]


def test_diff_reports_the_targets_vocabulary(models, transplanted):
    r = CliRunner().invoke(main, ["diff", str(transplanted["mean"].folder), str(models["target"]), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    v = d["vocab"]
    assert v["only_a"] == v["only_b"] == v["moved"] == 0 and v["identical_prefix"] == d["a"]["ids"] == d["b"]["ids"]
    assert d["a"]["fingerprint"] == d["b"]["fingerprint"]


def test_copied_rows_are_the_drafters_own(models, transplanted):
    from transformers import AutoModelForCausalLM

    src = AutoModelForCausalLM.from_pretrained(str(models["drafter"])).get_input_embeddings().weight
    m = AutoModelForCausalLM.from_pretrained(str(transplanted["mean"].folder))
    plan = transplanted["mean"].plan
    ids = np.flatnonzero(np.isin(plan.kind, (COPIED, SPECIAL)))
    assert torch.equal(m.get_input_embeddings().weight[ids], src[plan.source[ids]])
    assert len(plan.rows_of(COMPOSED)) > 0


@pytest.fixture(scope="module")
def engines(models, transplanted):
    target = load_causal_lm(str(models["target"]), dtype="float32")
    plain = SpecEngine(target)
    out = {}
    for init, r in transplanted.items():
        drafter = load_causal_lm(str(r.folder), dtype="float32")
        out[init] = SpecEngine(
            target,
            DraftModelDrafter(drafter, target_vocab_size=target.vocab_size, target_view=target.view),
            num_speculative_tokens=3,
        )
    return target, plain, out


def test_the_engine_drafts_with_it_in_draft_mode_and_greedy_output_equals_plain(models, transplanted, engines):
    target, plain, spec = engines
    built = build_engine(
        EngineSpec(
            target=str(models["target"]), drafter=str(transplanted["mean"].folder), dtype="float32", drafter_dtype="float32"
        )
    )
    assert built.mode == "draft" and same_vocabulary(built.drafter_lm.view, built.target.view)
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    for p in PROMPTS:
        ids = target.view.encode(p)
        want = plain.generate(ids, params).tokens
        for init, engine in spec.items():
            got = engine.generate(ids, params)
            assert got.tokens == want, (init, p)
            assert got.stats.drafts > 0


def test_sampling_through_the_transplanted_drafter_follows_the_targets_distribution(engines):
    target, plain, spec = engines
    prompt = target.view.encode("Hello")
    params = lambda seed: SamplingParams(max_new_tokens=2, temperature=0.8, top_k=4, seed=seed, ignore_eos=True)  # noqa: E731
    n = 400
    a = Counter(tuple(plain.generate(prompt, params(s)).tokens) for s in range(n))
    b = Counter(tuple(spec["mean"].generate(prompt, params(10_000 + s)).tokens) for s in range(n))
    tv = 0.5 * sum(abs(a[k] - b[k]) for k in set(a) | set(b)) / n
    assert len(set(a) | set(b)) > 3 and tv < 0.15, (tv, a.most_common(4), b.most_common(4))


def test_an_existing_folder_is_kept_without_overwrite(models, transplanted):
    from vocabbridge.transplant import transplant

    with pytest.raises(ConfigError, match="--overwrite"):
        transplant(str(models["drafter"]), str(models["target"]), transplanted["mean"].folder, say=lambda m: None)


def test_the_cli_transplants_and_heals(models, tmp_path):
    out = tmp_path / "drafters" / "healed"
    args = ["transplant", str(models["drafter"]), "--to", str(models["target"]), "-o", str(out), "--init", "first", "--json"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["init"] == "first" and (out / "model.safetensors").is_file()
    from vocabbridge.transplant.heal import HealRecipe, heal

    recipe = HealRecipe(
        budget_minutes=0, max_prompts=12, new_tokens=24, epochs=6, batch_positions=64, gen_batch=4, heldout=0.25, lr_rows=3e-2
    )
    h = heal(out, str(models["target"]), recipe, quiet=True, say=lambda m: None)
    assert h.after["loss"] < h.before["loss"]
    assert (out / "heal" / "acceptance.png").is_file() and (out / "heal" / "checkpoint.pt").is_file()
    rec = json.loads((out / "transplant.json").read_text())
    assert rec["heal"]["steps_rows"] > 0 and rec["heal"]["after"] == h.after
    again = heal(out, str(models["target"]), recipe, quiet=True, say=lambda m: None)  # resumes: nothing left to do
    assert len(again.history) == len(h.history) and again.record["heal"]["steps_rows"] == rec["heal"]["steps_rows"]
    assert again.after["loss"] == pytest.approx(h.after["loss"], rel=1e-5)


def test_a_given_data_folder_is_read_whole_and_a_worse_whole_model_is_put_back(models, tmp_path):
    """--heal-data: a folder planned over other prompts (a train-head run's, Magpie prompts and all)
    is read as it is, nothing generated; one written by another target (ids past the drafter's rows)
    is refused. The whole-model stage keeps its weights only where they score no worse held out."""
    import shutil

    from vocabbridge.transplant import transplant
    from vocabbridge.transplant.heal import HealRecipe, folder_data, heal

    first = tmp_path / "first"
    transplant(str(models["drafter"]), str(models["target"]), first, say=lambda m: None)
    small = dict(max_prompts=8, new_tokens=16, epochs=2, batch_positions=64, gen_batch=4, heldout=0.25)
    heal(first, str(models["target"]), HealRecipe(budget_minutes=0, **small), quiet=True, say=lambda m: None)
    data = tmp_path / "train-head-data"
    shutil.copytree(first / "heal" / "data", data)
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["shards"] = {name: f"magpie-en-{i:06d}" for i, name in enumerate(manifest["shards"])}  # other prompts
    (data / "manifest.json").write_text(json.dumps(manifest))
    n_seqs = len(folder_data(data, vocab_size=10**6)[0])
    with pytest.raises(ConfigError, match="another target"):
        folder_data(data, vocab_size=10)

    second = tmp_path / "second"
    transplant(str(models["drafter"]), str(models["target"]), second, say=lambda m: None)
    said = []
    recipe = HealRecipe(budget_minutes=0, whole_share=0.5, lr_whole=0.5, **small)  # a step this large cannot help
    h = heal(second, str(models["target"]), recipe, data_folder=data, quiet=True, say=said.append)
    rec = h.record["heal"]
    assert rec["data"]["given_folder"] and rec["data"]["sequences"] == n_seqs
    assert not any("writes the data" in m for m in said)  # nothing generated
    assert rec["steps_whole"] > 0 and rec["kept_whole_model"] is False
    assert h.after == [e for e in h.history if e.get("stage") == "rows" and "eval" in e][-1]["eval"]
    assert any("put back" in m for m in said)


def test_padded_forwards_compute_what_one_sequence_at_a_time_does(transplanted):
    """On a GPU the feature pass and the whole-model stage pad sequences together (micro_tokens):
    the hidden states, and one whole-model step's loss and gradients, are those of one sequence at
    a time (the CPU's way), up to float rounding."""
    from transformers import AutoModelForCausalLM

    from vocabbridge.training.data import Sequence
    from vocabbridge.transplant.heal import HealRecipe, _Healing, drafter_hidden, micro_batches

    g = torch.Generator().manual_seed(5)
    model = AutoModelForCausalLM.from_pretrained(str(transplanted["mean"].folder), dtype=torch.float32)
    vocab, k = model.get_output_embeddings().weight.shape[0], 3
    seqs = []
    for n, start in ((9, 4), (17, 5), (6, 2), (12, 11), (3, 3)):  # the last one predicts nothing generated
        p = torch.rand(n - 1, k, generator=g)
        ids = torch.randint(0, vocab, (n - 1, k), generator=g, dtype=torch.int32)
        seqs.append(Sequence(torch.randint(0, vocab, (n,), generator=g), torch.zeros(n - 1, 1), ids, p.half(), start))
    assert [len(b) for b in micro_batches(seqs, 24)] == [2, 1, 1] and len(micro_batches(seqs, 0)) == 4
    one, padded = drafter_hidden(model, seqs), drafter_hidden(model, seqs, max_tokens=24)
    assert one.shape == (sum(len(s.tokens) - s.gen_start for s in seqs[:4]), model.config.hidden_size)
    assert torch.allclose(one, padded, atol=1e-5)

    def step(micro):
        m = AutoModelForCausalLM.from_pretrained(str(transplanted["mean"].folder), dtype=torch.float32)
        run = _Healing(m, None, None, None, HealRecipe(), Path("."), device="cpu", say=lambda s: None)
        params = list(m.parameters())
        opt = torch.optim.SGD(params, lr=0.0)  # the gradients stay to be read (zero_grad runs after the step)
        grads = []
        opt.step = lambda: grads.extend(p.grad.clone() for p in params)
        n = sum(len(s.tokens) - s.gen_start for s in seqs[:4])
        return run._whole_step(m.get_decoder(), opt, params, seqs, n, micro), grads

    (loss_one, g_one), (loss_pad, g_pad) = step(0), step(24)
    assert loss_one == pytest.approx(loss_pad, rel=1e-5)
    assert all(torch.allclose(a, b, atol=1e-6, rtol=1e-4) for a, b in zip(g_one, g_pad))


# ==== GGUF for llama.cpp ============================================================================


@pytest.mark.skipif(not HAS_LLAMA, reason="needs llama-cpp-python: pip install 'vocabbridge[llama]'")
def test_the_gguf_is_a_llama_cpp_draft_model_for_the_target(models, transplanted, tmp_path):
    from vocabbridge.engine.llama_cpp import load_llama_cpp_lm
    from vocabbridge.transplant.gguf_out import llama_draft_compatible, write_gguf

    target_gguf = write_gguf(models["target"], target=str(models["target"]), dest=tmp_path / "target.gguf", qtype="f32")
    for init, r in transplanted.items():
        ok, why = llama_draft_compatible(target_gguf, r.gguf)
        assert ok, (init, why)
    # our --kernels llama.cpp engine loads it as a drafter; greedy output equals plain on the target's GGUF
    target = load_llama_cpp_lm(str(target_gguf), tokenizer=str(models["target"]), invariant=True)
    drafter = load_llama_cpp_lm(str(transplanted["mean"].gguf), tokenizer=str(transplanted["mean"].folder))
    assert drafter.vocab_size == target.vocab_size
    engine = SpecEngine(
        target, DraftModelDrafter(drafter, target_vocab_size=target.vocab_size, target_view=target.view), num_speculative_tokens=3
    )
    params = SamplingParams(max_new_tokens=32, ignore_eos=True)
    for p in PROMPTS:
        ids = target.view.encode(p)
        assert engine.generate(ids, params).tokens == SpecEngine(target).generate(ids, params).tokens


@pytest.mark.skipif(not HAS_LLAMA, reason="needs llama-cpp-python")
def test_the_gguf_computes_what_the_folder_computes(transplanted):
    """The GGUF's logits (f32 weights: the names, the q/k permutation) match transformers' on the folder."""
    from vocabbridge.engine.llama_cpp import load_llama_cpp_lm
    from vocabbridge.transplant.gguf_out import write_gguf

    r = transplanted["decay:0.5"]
    f32 = write_gguf(r.folder, target=r.record["target"]["given"], dest=r.folder.parent / "f32.gguf", qtype="f32")
    hf = load_causal_lm(str(r.folder), dtype="float32")
    ll = load_llama_cpp_lm(str(f32), tokenizer=str(r.folder))
    ids = hf.view.encode(PROMPTS[0])
    a, b = hf.session().extend(ids, keep=3), ll.session().extend(ids, keep=3)
    assert (a - b).abs().max() < 1e-2 * a.abs().max() and torch.equal(a.argmax(-1), b.argmax(-1))


def test_vllm_gets_it_as_a_plain_draft_model(models, transplanted):
    """`serve --backend vllm --dry-run`: the same vocabulary, so draft_model without use_heterogeneous_vocab
    (tests/test_transplant_vllm.py serves it in the real vLLM)."""
    args = [
        "serve",
        "--backend",
        "vllm",
        "--dry-run",
        "--target",
        str(models["target"]),
        "--drafter",
        str(transplanted["mean"].folder),
    ]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    cfg = json.loads(r.stdout.split("--speculative-config", 1)[1].split()[0].strip("'"))
    assert cfg == {
        "method": "draft_model",
        "model": str(transplanted["mean"].folder),
        "num_speculative_tokens": cfg["num_speculative_tokens"],
    }


def test_the_exaone_preset_points_at_its_transplanted_folder(tmp_path, monkeypatch):
    from vocabbridge.presets import PRESETS, TRANSPLANT_EXAONE, describe_presets, resolve_model, vocab_family

    monkeypatch.setenv("VOCABBRIDGE_DRAFTERS", str(tmp_path))
    assert resolve_model("exaone-1.2b-4.5vocab") == str(tmp_path / "exaone-1.2b-4.5vocab")
    assert vocab_family("exaone-1.2b-4.5vocab") == vocab_family("exaone-4.5-33b") != vocab_family("exaone-1.2b")
    assert (
        PRESETS["exaone-1.2b-4.5vocab"].pairs_with == "exaone-4.5-33b" and "-o drafters/exaone-1.2b-4.5vocab" in TRANSPLANT_EXAONE
    )
    row = next(r for r in describe_presets() if r["name"] == "exaone-1.2b-4.5vocab")
    assert not row["local"] and TRANSPLANT_EXAONE in row["notes"]
    r = CliRunner().invoke(main, ["serve", "--backend", "vllm", "--dry-run", "--drafter", "exaone-1.2b-4.5vocab"])
    assert r.exit_code == 0, r.output
    cfg = json.loads(r.stdout.split("--speculative-config", 1)[1].split()[0].strip("'"))
    assert (
        cfg["method"] == "draft_model"
        and cfg["model"] == str(tmp_path / "exaone-1.2b-4.5vocab")
        and "use_heterogeneous_vocab" not in cfg
    )


def test_healing_keeps_the_rows_of_its_best_held_out_evaluation(tmp_path):
    """The rows stage ends on its best held-out rows (mean acceptance length, then loss): a later,
    overfit evaluation does not replace them, and only the new rows are put back."""
    from vocabbridge.transplant.heal import HealRecipe, _Healing

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(4, 6, bias=False)

        def get_output_embeddings(self):
            return self.head

    model, said = Tiny(), []
    new = torch.tensor([False, True, True, False, True, True])
    run = _Healing(model, new, None, None, HealRecipe(), tmp_path, device="cpu", say=said.append)
    w = model.head.weight

    def evaluated(step, length, loss):
        run.step = step
        run.history.append({"step": step, "stage": "rows", "eval": {"mean_acceptance_length": length, "loss": loss}})
        run._consider()

    evaluated(0, 2.0, 4.0)  # zero-shot
    with torch.no_grad():
        w.add_(1.0)
    evaluated(30, 2.2, 3.0)
    best = w.detach().clone()
    with torch.no_grad():
        w.add_(1.0)
    evaluated(60, 2.2, 3.2)  # as long, but a higher loss: overfit
    copied_now = w.detach()[~new].clone()
    run._keep_best()
    assert run.kept_step == 30 and run.history[-1]["kept_step"] == 30
    assert run.history[-1]["eval"] == {"mean_acceptance_length": 2.2, "loss": 3.0}
    assert torch.equal(w.detach()[new], best[new]) and torch.equal(w.detach()[~new], copied_now)
    assert any("kept step 30" in m for m in said)

    # the last evaluation the best: nothing changes
    run = _Healing(model, new, None, None, HealRecipe(), tmp_path, device="cpu", say=said.append)
    evaluated(0, 2.0, 4.0)
    evaluated(30, 2.3, 3.5)
    before = w.detach().clone()
    run._keep_best()
    assert run.kept_step is None and torch.equal(w.detach(), before)


@pytest.mark.parametrize("rows_loss", ["candidates", "exact"])
def test_the_rows_stage_learns_the_new_rows_with_either_loss(tmp_path, rows_loss):
    """The rows stage on a linear head over fixed features: with the exact full-vocabulary loss (the
    default) or the candidates' gradient, the held-out loss falls and only the new rows move; a loss
    of another name is refused."""
    from vocabbridge.transplant.heal import HealRecipe, Positions, _Healing

    g = torch.Generator().manual_seed(2)
    vocab, d, n, k = 300, 16, 2048, 4
    truth = torch.randn(vocab, d, generator=g)

    def positions(m):
        h = torch.randn(m, d, generator=g)
        top = torch.softmax(h @ truth.T, -1).topk(k, -1)
        p = top.values / top.values.sum(-1, keepdim=True)
        return Positions(top.indices, p, top.indices[:, 0], torch.arange(m) // 8, hidden=h)

    class Linear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(d, vocab, bias=False)
            with torch.no_grad():
                self.head.weight.copy_(truth + torch.randn(vocab, d, generator=g))

        def get_output_embeddings(self):
            return self.head

    model = Linear()
    new = torch.rand(vocab, generator=g) < 0.7
    start = model.head.weight.detach().clone()
    recipe = HealRecipe(rows_loss=rows_loss, epochs=3, batch_positions=256, lr_rows=3e-2)
    run = _Healing(model, new, positions(n), positions(512), recipe, tmp_path, device="cpu", say=lambda m: None)
    before = run.evaluate(step=0, stage="rows")
    run.rows_stage(deadline=None, quiet=True)
    after = run._last_evaluated()["eval"]
    assert after["loss"] < before["loss"] - 0.1
    w = model.head.weight.detach()
    assert torch.equal(w[~new], start[~new]) and not torch.equal(w[new], start[new])
    with pytest.raises(ConfigError, match="rows_loss"):
        HealRecipe(rows_loss="sampled")


def test_the_shared_row_map_starts_at_zero_shot_writes_its_logits_rows_and_moves_unseen_rows():
    """The shared map (every composed row moved by the same few parameters) is the zero-shot rows at
    the start; its logits equal the rows it writes out and carry a gradient to every parameter;
    and training it on a teacher that prefers longer tokens lowers the loss for rows no batch names."""
    from vocabbridge.transplant.heal import soft_ce
    from vocabbridge.transplant.shared_map import SharedRowMap

    g = torch.Generator().manual_seed(0)
    V, d = 40, 8
    base, first = torch.randn(V, d, generator=g), torch.randn(V, d, generator=g)
    composed = torch.arange(10, 40)
    pieces = 2 + torch.arange(30) % 4
    m = SharedRowMap(base, first, composed, pieces)
    assert torch.equal(m.rows(), base)
    h = torch.randn(16, d, generator=g)
    with torch.no_grad():
        m.A.normal_(0, 0.1, generator=g), m.B.normal_(0, 0.1, generator=g), m.log_scale.normal_(0, 0.3, generator=g)
    assert torch.allclose(m.logits(h), h @ m.rows().T, atol=1e-5)
    ids = torch.randint(0, V, (16, 3), generator=g)
    p = torch.softmax(torch.randn(16, 3, generator=g), -1)
    soft_ce(m.logits(h), ids, p).backward()
    assert m.A.grad is not None and m.log_scale.grad.abs().sum() > 0

    # a teacher whose next token is always a composed one of 5+ pieces, seen on half of them only
    m = SharedRowMap(base, first, composed, pieces)
    long_rows = composed[pieces == 5]
    seen, unseen = long_rows[::2], long_rows[1::2]
    opt = torch.optim.Adam(m.parameters(), lr=3e-2)

    def teacher(rows):
        hh = torch.randn(64, d, generator=g)
        return hh, rows[torch.randint(0, len(rows), (64,), generator=g)][:, None], torch.ones(64, 1)

    before = float(soft_ce(m.logits(teacher(unseen)[0]).detach(), *teacher(unseen)[1:]))
    for _ in range(60):
        hh, t, pp = teacher(seen)
        loss = soft_ce(m.logits(hh), t, pp)
        opt.zero_grad()
        loss.backward()
        opt.step()
    hh, t, pp = teacher(unseen)
    assert float(soft_ce(m.logits(hh).detach(), t, pp)) < before  # the rows no batch named moved with them
    assert torch.equal(m.rows()[:10], base[:10])  # copied rows stay the drafter's


def test_the_cli_hands_its_heal_options_to_the_recipe(tmp_path, monkeypatch):
    """--heal-minutes, --heal-data-share, --heal-whole and --heal-data-dtype reach heal()'s recipe as given."""
    from vocabbridge.transplant import heal as heal_module

    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "transplant.json").write_text("{}")
    got = {}

    def stop(folder, target, recipe, **kw):
        got["recipe"] = recipe
        raise ConfigError("stopped after reading the recipe")

    monkeypatch.setattr(heal_module, "heal", stop)
    args = ["transplant", "d0", "--to", "t", "-o", str(folder), "--heal-only", "--heal-minutes", "12"]
    r = CliRunner().invoke(main, [*args, "--heal-data-share", "0.7", "--heal-whole", "0.25", "--heal-data-dtype", "bfloat16"])
    assert r.exit_code == 1 and "stopped after reading the recipe" in r.output, r.output
    recipe = got["recipe"]
    assert (recipe.budget_minutes, recipe.data_share, recipe.whole_share, recipe.data_dtype) == (12, 0.7, 0.25, "bfloat16")
    CliRunner().invoke(main, args)
    assert got["recipe"].data_dtype == "auto"
    r = CliRunner().invoke(main, [*args, "--heal-data-share", "1"])
    assert r.exit_code == 2 and "--heal-data-share" in r.output
