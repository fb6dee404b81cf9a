"""Bridged drafting through a token map, offline evaluation, the engine factory and the CLI."""

import json

import pytest
import torch
from click.testing import CliRunner

from vocabbridge.cli import main
from vocabbridge.engine import BridgedDrafter, DraftModelDrafter, NgramDrafter, SamplingParams, SpecEngine
from vocabbridge.engine.factory import EngineSpec, build_engine
from vocabbridge.engine.offline import eval_drafter, greedy_continuations
from vocabbridge.errors import ConfigError
from vocabbridge.mapping import build_token_map

PROMPT = "안녕하세요. 오늘 날씨가 정말 좋네요! Hello world, give them the results."


@pytest.mark.parametrize("drafter_name", ["spm", "extended"])
@pytest.mark.parametrize("map_mode", ["bytes", "vllm"])
def test_bridged_drafter_is_lossless(tiny, drafter_name, map_mode):
    t, d = tiny["target"], tiny[drafter_name]
    tm = build_token_map(d.view, t.view, mode=map_mode, drafter_vocab_size=d.vocab_size, target_vocab_size=t.vocab_size)
    drafter = BridgedDrafter(d, tm, target_vocab_size=t.vocab_size)
    prompt = t.view.encode(PROMPT)
    params = SamplingParams(max_new_tokens=60, ignore_eos=True)
    want = SpecEngine(t).generate(prompt, params).tokens
    r = SpecEngine(t, drafter, num_speculative_tokens=3).generate(prompt, params)
    assert r.tokens == want
    assert r.stats.draft_tokens > 0


def test_bridged_drafter_never_feeds_unk(tiny):
    t, d = tiny["target"], tiny["spm"]
    tm = build_token_map(d.view, t.view, mode="bytes", drafter_vocab_size=d.vocab_size, target_vocab_size=t.vocab_size)
    drafter = BridgedDrafter(d, tm, target_vocab_size=t.vocab_size)
    s = drafter.session([])
    ctx = t.view.encode(PROMPT)
    fed = s.drafter_context(ctx)
    assert d.view.roles["unk"] not in fed
    assert d.view.decode_bytes(fed) == t.view.decode_bytes(ctx)  # the bridge keeps every byte


def test_offline_eval_of_the_target_itself_is_perfect(tiny):
    t = tiny["target"]
    seqs = greedy_continuations(t, [t.view.encode(PROMPT)], 20)
    ev = eval_drafter(t, DraftModelDrafter(t, target_vocab_size=t.vocab_size), seqs, k=3)
    assert ev.acceptance_per_position == [1.0, 1.0, 1.0]
    assert ev.positions == 20 - 3 + 2 and ev.mean_target_prob > 0.2  # chains of 3 that fit in the 20 tokens
    assert ev.expected_acceptance_length == 4.0


def test_offline_eval_counts_chains_not_single_hits(tiny):
    t = tiny["target"]
    seqs = greedy_continuations(t, [t.view.encode(PROMPT)], 40)
    ev = eval_drafter(t, NgramDrafter(), seqs, k=4)
    acc = ev.acceptance_per_position
    assert all(a >= b for a, b in zip(acc, acc[1:]))  # position j needs positions < j


def test_factory_picks_the_mode_from_the_vocabularies(tiny):
    loaded = {tiny["target"].source: tiny["target"], tiny["draft"].source: tiny["draft"], tiny["spm"].source: tiny["spm"]}
    same = build_engine(EngineSpec(target=tiny["target"].source, drafter=tiny["draft"].source), loaded=loaded)
    other = build_engine(EngineSpec(target=tiny["target"].source, drafter=tiny["spm"].source), loaded=loaded)
    assert (same.mode, other.mode) == ("draft", "text")
    with pytest.raises(ConfigError, match="another vocabulary"):
        build_engine(EngineSpec(target=tiny["target"].source, drafter=tiny["spm"].source, mode="draft"), loaded=loaded)
    with pytest.raises(ConfigError, match="no MTP weights .* vocabbridge train-head"):
        build_engine(EngineSpec(target=tiny["target"].source, drafter="mtp"), loaded=loaded)


def test_factory_bridged_builds_and_caches_a_map(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("VOCABBRIDGE_CACHE", str(tmp_path))
    loaded = {tiny["target"].source: tiny["target"], tiny["spm"].source: tiny["spm"]}
    built = build_engine(EngineSpec(target=tiny["target"].source, drafter=tiny["spm"].source, mode="bridged"), loaded=loaded)
    assert built.mode == "bridged" and len(list((tmp_path / "maps").glob("*.json"))) == 1


def test_generate_cli_compares_with_plain(tiny):
    r = CliRunner().invoke(
        main,
        [
            "generate",
            "--target",
            tiny["target"].source,
            "--drafter",
            tiny["spm"].source,
            "--mode",
            "text",
            "--raw",
            "-p",
            PROMPT,
            "--max-tokens",
            "24",
            "--compare-plain",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    j = json.loads(r.stdout)
    assert j["plain"]["identical"] is True and j["stats"]["generated"] <= 24
    assert j["config"]["mode"] == "text" and 0 <= j["stats"]["acceptance_rate"] <= 1


def test_generate_cli_table_and_chat_template(tiny):
    r = CliRunner().invoke(
        main, ["generate", "--target", tiny["target"].source, "--drafter", "ngram", "-p", "hi", "--max-tokens", "8"]
    )
    assert r.exit_code == 0, r.output
    assert "acceptance rate" in r.output and "Speculative decoding (ngram)" in r.output


def test_the_text_leaves_out_the_stop_token_that_ended_it(tiny):
    """``GenerationResult.text`` is what a reader sees: no end-of-turn token (`<|im_end|>` printed by
    `generate` before); the tokens keep it, as vLLM's token ids do."""
    t = tiny["target"]
    prompt = t.view.encode(PROMPT)
    free = SpecEngine(t).generate(prompt, SamplingParams(max_new_tokens=12, ignore_eos=True)).tokens
    engine = SpecEngine(t, NgramDrafter(), num_speculative_tokens=3)
    engine.eos_ids = frozenset({free[5]})  # the model's 6th token (or an earlier copy of it) ends the turn
    r = engine.generate(prompt, SamplingParams(max_new_tokens=12))
    end = free.index(free[5])
    assert (r.finish_reason, r.tokens) == ("stop", free[: end + 1])
    assert r.text == t.view.decode_bytes(free[:end]).decode("utf-8", errors="replace")


def test_generate_cli_needs_a_prompt(tiny):
    r = CliRunner().invoke(main, ["generate", "--target", tiny["target"].source])
    assert r.exit_code == 1 and "exactly one of --prompt and --prompt-file" in r.output


def test_eval_drafter_cli(tiny, tmp_path):
    f = tmp_path / "t.txt"
    f.write_text(PROMPT * 3, encoding="utf-8")
    r = CliRunner().invoke(
        main, ["eval-drafter", "--target", tiny["target"].source, "--drafter", "ngram", "--text", str(f), "--json"]
    )
    assert r.exit_code == 0, r.output
    j = json.loads(r.stdout)
    assert len(j["eval"]["acceptance_per_position"]) == 4 and j["eval"]["positions"] > 10


@pytest.mark.parametrize("gate", [0.3, 0.9])
def test_confidence_gating_stays_lossless_and_drafts_less(tiny, gate):
    t = tiny["target"]
    prompt = t.view.encode(PROMPT)
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    want = SpecEngine(t).generate(prompt, params).tokens
    free = SpecEngine(t, DraftModelDrafter(tiny["draft"], target_vocab_size=t.vocab_size), num_speculative_tokens=4).generate(
        prompt, params
    )
    gated = SpecEngine(
        t, DraftModelDrafter(tiny["draft"], target_vocab_size=t.vocab_size, min_confidence=gate), num_speculative_tokens=4
    ).generate(prompt, params)
    assert gated.tokens == free.tokens == want
    assert gated.stats.draft_tokens < free.stats.draft_tokens


@pytest.mark.skipif(torch.cuda.is_available(), reason="int8 (fbgemm's dynamic quantization) runs on the CPU only")
@pytest.mark.parametrize("dtype", ["int8", "int8-dynamic", "q4"])
def test_each_cpu_drafter_dtype_is_lossless(tiny, dtype):
    """int8: row-int8 linears on the lean forward; int8-dynamic: quantize_dynamic's, one activation
    scale a forward; q4: our 4-bit kernels. Whatever the drafter computes, the output is plain greedy.
    The drafter is the target's own weights in that dtype, so that it drafts tokens the target
    accepts (and some it rejects)."""
    from vocabbridge.engine import q4
    from vocabbridge.engine.factory import load_drafter_lm
    from vocabbridge.engine.invariant import RowInt8Linear
    from vocabbridge.engine.lean import LeanSession

    if dtype == "q4" and not q4.available():
        pytest.skip(f"vocabbridge._q4 not built ({q4.BUILD_ERROR})")
    t = tiny["target"]
    d = load_drafter_lm(t.source, dtype, device="cpu")
    head = d.model.lm_head
    if dtype == "int8":
        assert isinstance(head, RowInt8Linear)
        assert isinstance(d.session(), LeanSession) == q4.available()  # the lean forward needs the extension's routines
    elif dtype == "int8-dynamic":
        assert "quantized" in type(head).__module__
    else:
        assert hasattr(head, "packed") and isinstance(d.session(), LeanSession) and d.rows is None  # a drafter: no row limit
    prompt = t.view.encode(PROMPT)
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    want = SpecEngine(t).generate(prompt, params).tokens
    got = SpecEngine(t, DraftModelDrafter(d, target_vocab_size=t.vocab_size), num_speculative_tokens=3).generate(prompt, params)
    assert got.tokens == want
    assert got.stats.accepted > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="int8 (fbgemm) runs on the CPU only")
def test_an_int8_drafter_scales_each_row_on_its_own(tiny):
    """A row-int8 drafter's logits for a row do not depend on the rows fed beside it (its prompt
    prefill and catch-up feeds keep one-row precision), on the lean forward as on transformers';
    quantize_dynamic's one scale a forward does not have that."""
    from vocabbridge.engine import q4
    from vocabbridge.engine.factory import load_drafter_lm

    src = tiny["draft"].source
    ids = tiny["target"].view.encode(PROMPT)[:12]

    def batched_and_one_by_one(lm):
        batched = lm.session().extend(ids, keep=len(ids))
        s = lm.session()
        return batched, torch.cat([s.extend([i]) for i in ids])

    row = load_drafter_lm(src, "int8", device="cpu")
    b, o = batched_and_one_by_one(row)
    assert float((b - o).abs().max()) < 1e-4
    if q4.available():
        assert row.lean is not None
        row.lean = None  # the same row-int8 linears through transformers' modules
        b2, o2 = batched_and_one_by_one(row)
        assert float((b2 - o2).abs().max()) < 1e-4 and float((b2 - b).abs().max()) < 1e-4
    dyn = load_drafter_lm(src, "int8-dynamic", device="cpu")
    b, o = batched_and_one_by_one(dyn)
    assert float((b - o).abs().max()) > 1e-3  # one activation scale for all the rows


def test_ngram_first_drafter_is_lossless_and_uses_both(tiny):
    from vocabbridge.engine.drafters import NgramFirstDrafter

    t = tiny["target"]
    prompt = t.view.encode("안녕하세요. Hello world, give them the results.")  # the target loops here (see test_engine)
    params = SamplingParams(max_new_tokens=64, ignore_eos=True)
    want = SpecEngine(t).generate(prompt, params).tokens
    drafter = NgramFirstDrafter(DraftModelDrafter(tiny["draft"], target_vocab_size=t.vocab_size))
    r = SpecEngine(t, drafter, num_speculative_tokens=4).generate(prompt, params)
    assert r.tokens == want
    assert r.stats.drafter_forwards > 0 and r.stats.accepted > 0


def test_tli_drafter_is_vllms_heterogeneous_path_and_stays_lossless(tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("VOCABBRIDGE_CACHE", str(tmp_path))
    t, spm = tiny["target"], tiny["spm"]
    spec = EngineSpec(target=t.source, drafter=spm.source, mode="tli", dtype="float32", drafter_dtype="float32")
    built = build_engine(spec, loaded={t.source: t, f"{spm.source}@float32": spm})
    d = built.engine.drafter
    assert built.mode == "tli" and d.unpaired == "unk" and d.token_map.mode == "vllm"  # vLLM's own map and fallback
    ids = t.view.encode(PROMPT)
    fed = d.session(ids).drafter_context(ids)
    assert len(fed) == len(ids)  # one drafter token per target token, as vLLM feeds its drafter
    unpaired = [i for i, tid in enumerate(ids) if d.token_map.target_to_draft[tid] < 0]
    assert unpaired and all(fed[i] == d.token_map.draft_unk_id for i in unpaired)
    params = SamplingParams(max_new_tokens=24)
    assert built.engine.generate(ids, params).tokens == SpecEngine(t).generate(ids, params).tokens


def test_an_int8_drafter_on_a_gpu_is_refused_with_the_fix():
    """int8 is fbgemm's and q4 our CPU kernels: --drafter-dtype int8 / q4 on CUDA says so and what to use."""
    from vocabbridge.engine.model import drafter_dtype_for

    with pytest.raises(ConfigError, match="CPU only.*--drafter-dtype auto"):
        drafter_dtype_for("int8", "cuda:0", "bfloat16")
    with pytest.raises(ConfigError, match="q4 kernels run on the CPU only.*--drafter-dtype auto"):
        drafter_dtype_for("q4", "cuda", "bfloat16")
    assert drafter_dtype_for("auto", "cuda", "bfloat16") == "bfloat16"
