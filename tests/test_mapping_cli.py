"""``vocabbridge build-map`` and ``vocabbridge coverage`` as a user meets them: exit codes, output, files."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from vocabbridge.cli import main
from vocabbridge.mapping import MapSide, TokenMap, build_token_map, default_texts, load_map, read_map, save_map


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def map_file(tok_dirs, tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "maps" / "spm_to_base.json"
    r = run("build-map", tok_dirs["spm"], tok_dirs["base"], "-o", out)
    assert r.exit_code == 0, r.output
    return out, r.output


def test_build_map_writes_the_map_and_shows_coverage(map_file, tok_dirs, spm_view, base_view):
    out, text = map_file
    assert out.is_file()
    for title in (
        "Token map",
        "Vocabulary coverage",
        "Target tokens by script",
        "Special tokens by role",
        "Corpus coverage",
        "vLLM hand-off",
    ):
        assert title in text
    assert "all texts" in text and "written to" in text
    tm, cov = read_map(out, drafter=spm_view, target=base_view)
    assert tm.mode == "bytes" and tm.pairs == build_token_map(spm_view, base_view).pairs
    assert cov is not None and cov.bridge_lossy == 0
    assert [t.file for t in cov.texts] == sorted(default_texts())  # the shipped texts by default


def test_build_map_prints_the_vllm_speculative_config(tok_dirs):
    r = run("build-map", tok_dirs["spm"], tok_dirs["base"], "--num-speculative-tokens", 5, "--format", "markdown")
    assert r.exit_code == 0, r.output
    cfg = {
        "method": "draft_model",
        "model": str(tok_dirs["spm"]),
        "num_speculative_tokens": 5,
        "use_heterogeneous_vocab": True,
        "draft_sample_method": "greedy",
    }  # what serve --backend vllm runs: one source for both
    assert f"--speculative-config '{json.dumps(cfg)}'" in r.output
    assert "Without the plugin, vLLM builds its own string map at start-up: the vllm column above" in r.output
    assert "## vocabbridge build-map:" in r.output


@pytest.mark.parametrize("k", [None, 5])
def test_build_map_hands_off_what_serve_runs_for_the_same_k(tok_dirs, tmp_path, k):
    """One default for -k, and the same --speculative-config as `serve --backend vllm --dry-run` for the pair."""
    from vocabbridge.spec import EngineSpec
    from vocabbridge.vllm.backend import vllm_command

    out = tmp_path / "m.json"
    r = run("build-map", tok_dirs["spm"], tok_dirs["base"], "-o", out, *(["-k", k] if k else []), "--json")
    assert r.exit_code == 0, r.output
    j = json.loads(r.output)["vllm"]
    spec = EngineSpec(
        target=str(tok_dirs["base"]),
        drafter=str(tok_dirs["spm"]),
        map_path=str(out),
        **({"num_speculative_tokens": k} if k else {}),
    )
    served = vllm_command(spec, cpu=False)
    assert j["speculative_config"] == served.speculative_config
    assert j["speculative_config"]["num_speculative_tokens"] == (k or EngineSpec.num_speculative_tokens)
    assert j["vocabbridge_serve"].startswith("vocabbridge serve --backend vllm --target ")
    assert j["serve_command"].startswith(f"VOCABBRIDGE_VLLM_MAP={out} vllm serve ")


def test_build_map_json_is_machine_readable(tok_dirs, spm_view, base_view, tmp_path):
    t = tmp_path / "ko.txt"
    t.write_text("안녕하세요. 도움이 필요하시다면 언제든지 문의해 주세요.", encoding="utf-8")
    r = run("build-map", tok_dirs["spm"], tok_dirs["base"], "--text", t, "--json")
    assert r.exit_code == 0, r.output
    j = json.loads(r.output)
    assert j["map"] is None and j["mode"] == "bytes" and set(j["coverage"]) == {"bytes", "vllm"}
    assert j["coverage"]["vllm"]["pairs"] == build_token_map(spm_view, base_view, mode="vllm").pairs
    (row,) = j["coverage"]["bytes"]["texts"]
    assert row["file"] == str(t) and row["partnered_share"] > 0.5
    assert j["coverage"]["bytes"]["all_texts"]["vllm_unk"] == row["vllm_unk"] > 0
    assert j["vllm"]["speculative_config"]["use_heterogeneous_vocab"] is True
    assert j["vllm"]["serve_command"].startswith("vllm serve ")


def test_build_map_vllm_mode(tok_dirs, tmp_path):
    out = tmp_path / "v.json"
    r = run("build-map", tok_dirs["base"], tok_dirs["extended"], "--mode", "vllm", "-o", out, "--json")
    assert r.exit_code == 0, r.output
    j = json.loads(r.output)
    assert set(j["coverage"]) == {"vllm"} and j["stats"]["space_markers"] == {"drafter": ["Ġ"], "target": ["Ġ"]}
    assert load_map(out).mode == "vllm"


def test_coverage_reloads_the_tokenizers_from_the_map(map_file):
    out, _ = map_file
    r = run("coverage", out)
    assert r.exit_code == 0, r.output
    assert "Vocabulary coverage" in r.output and "bytes map" in r.output and "vllm map" not in r.output


def test_coverage_compare_modes(map_file, spm_view, base_view):
    out, _ = map_file
    r = run("coverage", out, "--compare-modes", "--json")
    assert r.exit_code == 0, r.output
    j = json.loads(r.output)
    assert list(j["coverage"]) == ["bytes", "vllm"]
    assert j["coverage"]["bytes"]["pairs"] > j["coverage"]["vllm"]["pairs"]
    assert j["coverage"]["bytes"]["texts"][0]["vllm_unk"] == j["coverage"]["vllm"]["texts"][0]["vllm_unk"]


def test_coverage_refuses_other_tokenizers(map_file, tok_dirs):
    out, _ = map_file
    r = run("coverage", out, "--target", tok_dirs["extended"])
    assert r.exit_code == 1
    assert r.output.startswith("Error: ") and "built for other tokenizers" in r.output
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output


def test_coverage_says_how_to_point_at_moved_tokenizers(map_file, tok_dirs, tmp_path):
    out, _ = map_file
    tm = load_map(out)
    # The same map, recorded with a drafter source that no longer exists.
    gone = MapSide(str(tmp_path / "gone"), tm.drafter.fingerprint, tm.drafter.tokenizer_size, tm.drafter.model_vocab_size)
    moved = save_map(
        TokenMap(tm.mode, gone, tm.target, tm.draft_to_target, tm.target_to_draft, input_bridge=tm.input_bridge),
        tmp_path / "moved.json",
    )
    r = run("coverage", moved)
    assert r.exit_code == 1 and "Pass --drafter with where it is now" in r.output
    r = run("coverage", moved, "--drafter", tok_dirs["spm"], "--json")
    assert r.exit_code == 0, r.output


def test_truncated_map_is_one_line_error(map_file, tmp_path):
    out, _ = map_file
    bad = tmp_path / "cut.json"
    bad.write_text(out.read_text()[:1000])
    r = run("coverage", bad)
    assert r.exit_code == 1 and "truncated" in r.output and len(r.output.strip().splitlines()) == 1


def test_bad_mode_is_a_usage_error(tok_dirs):
    r = run("build-map", tok_dirs["spm"], tok_dirs["base"], "--mode", "strings")
    assert r.exit_code == 2 and "'strings' is not one of 'bytes', 'vllm'" in r.output


def test_missing_text_file_is_one_line_error(tok_dirs, tmp_path):
    r = run("build-map", tok_dirs["spm"], tok_dirs["base"], "--text", tmp_path / "nope.txt")
    assert r.exit_code == 1 and "no such text file" in r.output
